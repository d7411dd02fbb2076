"""Build (once) the C bridge between Python and llama.cpp; ``llama/bindings.py`` loads it.

llama-cpp-python installs llama.cpp's shared libraries and C headers but no way to feed embedding rows
without a Python loop per call, so ``bridge/moss_bridge.c`` is compiled against that very install, on
first use, and cached under ``$XDG_CACHE_HOME/moss_tts_node/``. The cache key covers the C sources, the
compiler command and the exact libllama file (path and mtime), so reinstalling llama-cpp-python or
editing the bridge triggers a rebuild and never loads a stale library. ``MOSS_TTS_BRIDGE_LIB`` may name a
prebuilt library instead (e.g. one built at image-creation time on a machine without a compiler at run time).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from moss_tts_node.errors import BridgeError

BRIDGE_LIB_ENV = "MOSS_TTS_BRIDGE_LIB"
LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the version the bridge is written and tested against

_INSTALL_HINT = (
    f"run `make demo`, or install it with `pip install llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}` "
    "(a source build: about 10 minutes)"
)
_SOURCES = ("moss_bridge.c", "moss_bridge.h")
_PACKAGE = __name__.partition(".")[0]
# Where setup.py installs the C sources, relative to the install prefix.
INSTALLED_SOURCES = Path("share", _PACKAGE, "bridge")


def bridge_source_dir() -> Path:
    """The C sources: ``bridge/`` of the source checkout, else the copy installed with this module.

    The checkout serves editable installs and ``colcon build --symlink-install`` (their modules resolve to
    the checkout). setup.py installs the sources as data files under ``<prefix>/share/moss_tts_node/bridge``:
    looked for beside this module's own install (``<prefix>/lib/pythonX.Y/site-packages``), then through the
    ament index (``AMENT_PREFIX_PATH``, which ``source install/setup.bash`` sets) for other install layouts.
    """
    module = Path(__file__)
    candidates = [module.resolve().parents[2] / "bridge"]
    installed = module.absolute().parents  # <prefix>/lib/pythonX.Y/site-packages/moss_tts_node/llama/bridge.py
    if len(installed) > 5:
        candidates.append(installed[5] / INSTALLED_SOURCES)
    share = _ament_share_dir()
    if share is not None:
        candidates.append(share / INSTALLED_SOURCES.name)
    for directory in candidates:
        if (directory / _SOURCES[0]).is_file():
            return directory
    raise BridgeError(
        f"the bridge's C sources are missing (looked in {', '.join(map(str, candidates))}); "
        f"reinstall {_PACKAGE} (pip install, or colcon build and `source install/setup.bash`)"
    )


def _ament_share_dir() -> Path | None:
    """The package's share directory in the ament index, when ROS's ament_index_python is there and knows it."""
    try:
        from ament_index_python.packages import get_package_share_directory
    except ImportError:
        return None
    try:
        return Path(get_package_share_directory(_PACKAGE))
    except (LookupError, OSError):  # not in the index, or AMENT_PREFIX_PATH unset
        return None


def llama_cpp_paths() -> tuple[Path, Path]:
    """(include dir, lib dir) of the installed llama-cpp-python, found without importing it."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise BridgeError(f"llama-cpp-python is not installed for {sys.executable}: {_INSTALL_HINT}")
    package = Path(next(iter(spec.submodule_search_locations)))
    include, libdir = package.parent / "include", package / "lib"
    if not (include / "llama.h").is_file():
        raise BridgeError(
            f"llama-cpp-python at {package} has no C headers ({include / 'llama.h'} is missing); it must be "
            f"built from source: `pip install --force-reinstall --no-binary llama-cpp-python "
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}`"
        )
    if not (libdir / "libllama.so").exists():
        raise BridgeError(f"llama-cpp-python at {package} has no {libdir / 'libllama.so'}: {_INSTALL_HINT}")
    return include, libdir


def _compiler() -> list[str]:
    command = shlex.split(os.environ.get("CC", "cc"))
    if not command or shutil.which(command[0]) is None:
        raise BridgeError(
            f"no C compiler found ({command[0] if command else '$CC is empty'}) to build the llama.cpp bridge: "
            "install one with `apt-get install gcc`, or set $CC"
        )
    return command


def compile_command(
    compiler: list[str], source_dir: Path, include: Path, libdir: Path, rpath: Path | None = None
) -> list[str]:
    """The command that compiles the bridge (``-o`` and the output path to be added) against one llama.cpp install.

    ``rpath`` is where the library finds libllama at run time, ``libdir`` by default; they differ only where the
    bridge is built for another root file system (scripts/aarch64_check.sh cross-compiles it for its aarch64 one).
    """
    return [
        *compiler,
        "-std=c11",
        "-O2",
        "-Wall",
        "-shared",
        "-fPIC",
        "-pthread",
        str(source_dir / _SOURCES[0]),
        f"-I{include}",
        f"-L{libdir}",
        "-lllama",
        "-lggml",  # the backend registry: the CPU device and its extra buffer types
        "-lggml-base",
        f"-Wl,-rpath,{rpath or libdir}",
    ]


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "moss_tts_node"


def build_bridge_library() -> Path:
    """Return the cached bridge library, compiling it first when no up-to-date one exists.

    The library is linked with an rpath to llama-cpp-python's own ``llama_cpp/lib`` so that it shares the
    very libllama that llama-cpp-python's bindings load, should both be used in one process.
    """
    source_dir = bridge_source_dir()
    include, libdir = llama_cpp_paths()
    libllama = (libdir / "libllama.so").resolve()
    command = compile_command(_compiler(), source_dir, include, libdir)
    key = hashlib.sha256()
    for name in _SOURCES:
        key.update((source_dir / name).read_bytes())
    key.update(f"{libllama}\0{libllama.stat().st_mtime_ns}\0{shlex.join(command)}".encode())
    cache = _cache_dir()
    target = cache / f"libmoss_bridge-{key.hexdigest()[:20]}.so"
    if target.is_file():
        return target

    cache.mkdir(parents=True, exist_ok=True)
    # Compile to a private name, then rename: concurrent builders never see (or load) a half-written file.
    fd, tmp_name = tempfile.mkstemp(dir=cache, prefix=".libmoss_bridge-", suffix=".so.tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        result = subprocess.run([*command, "-o", str(tmp)], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BridgeError(
                f"compiling the llama.cpp bridge failed (exit {result.returncode}):\n"
                f"{shlex.join(command)}\n{result.stderr.strip()}"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def bridge_library_path() -> Path:
    """The bridge library to load: ``$MOSS_TTS_BRIDGE_LIB`` if set, else the cached build (built if needed).

    Loading it, and declaring its functions, is ``llama/bindings.py``'s.
    """
    prebuilt = os.environ.get(BRIDGE_LIB_ENV)
    if not prebuilt:
        return build_bridge_library()
    path = Path(prebuilt)
    if not path.is_file():
        raise BridgeError(f"{BRIDGE_LIB_ENV} names {path}, which does not exist")
    return path
