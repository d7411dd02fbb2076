"""Build (once) and load the C bridge between Python and llama.cpp.

llama-cpp-python installs llama.cpp's shared libraries and C headers but no way to feed embedding rows
without a Python loop per call, so ``bridge/moss_bridge.c`` is compiled against that very install, on
first use, and cached under ``$XDG_CACHE_HOME/moss_tts_node/``. The cache key covers the C sources, the
compiler command and the exact libllama file (path and mtime), so reinstalling llama-cpp-python or
editing the bridge triggers a rebuild and never loads a stale library. ``MOSS_TTS_BRIDGE_LIB`` may name a
prebuilt library instead (e.g. one built at image-creation time on a machine without a compiler at run time).
"""

from __future__ import annotations

import ctypes
import functools
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


class MossBridgeParams(ctypes.Structure):
    """Mirror of ``struct moss_bridge_params`` in bridge/moss_bridge.h (same field order and types)."""

    _fields_ = (
        ("model_path", ctypes.c_char_p),
        ("n_ctx", ctypes.c_int32),
        ("n_batch", ctypes.c_int32),
        ("n_threads", ctypes.c_int32),
        ("n_gpu_layers", ctypes.c_int32),
        ("type_k", ctypes.c_int32),
        ("type_v", ctypes.c_int32),
        ("flash_attn", ctypes.c_int32),
    )


def bridge_source_dir() -> Path:
    """The C sources: ``bridge/`` of the source checkout, else the copy installed with this module.

    The checkout serves editable installs and ``colcon build --symlink-install`` (their modules resolve to
    the checkout). setup.py installs the sources as data files under ``<prefix>/share/moss_tts_node/bridge``:
    looked for beside this module's own install (``<prefix>/lib/pythonX.Y/site-packages``), then through the
    ament index (``AMENT_PREFIX_PATH``, which ``source install/setup.bash`` sets) for other install layouts.
    """
    module = Path(__file__)
    candidates = [
        module.resolve().parents[2] / "bridge",
        module.absolute().parents[2].parents[2] / INSTALLED_SOURCES,
    ]
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
    command = [
        *_compiler(),
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
        "-lggml-base",
        f"-Wl,-rpath,{libdir}",
    ]
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


def _declare(lib: ctypes.CDLL) -> None:
    handle, status = ctypes.c_void_p, ctypes.c_int32
    floats, int_out = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32)
    signatures: dict[str, tuple[type | None, list[type]]] = {
        "moss_bridge_default_params": (MossBridgeParams, []),
        "moss_bridge_create": (status, [ctypes.POINTER(MossBridgeParams), ctypes.POINTER(handle)]),
        "moss_bridge_free": (None, [handle]),
        "moss_bridge_n_embd": (status, [handle, int_out]),
        "moss_bridge_n_vocab": (status, [handle, int_out]),
        "moss_bridge_n_ctx": (status, [handle, int_out]),
        "moss_bridge_n_pos": (status, [handle, int_out]),
        "moss_bridge_prefill": (status, [handle, floats, ctypes.c_int32]),
        "moss_bridge_decode": (status, [handle, floats]),
        "moss_bridge_get_hidden": (status, [handle, floats]),
        "moss_bridge_get_text_logits": (status, [handle, floats]),
        "moss_bridge_clear": (status, [handle]),
        "moss_bridge_set_text_logits": (status, [handle, ctypes.c_int32]),
        "moss_bridge_status_string": (ctypes.c_char_p, [status]),
        "moss_bridge_last_error": (ctypes.c_char_p, [handle]),
        "moss_bridge_set_verbose": (status, [ctypes.c_int32]),
        "moss_bridge_quantize": (status, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32]),
    }
    for name, (restype, argtypes) in signatures.items():
        try:
            function = getattr(lib, name)
        except AttributeError:
            raise BridgeError(f"the bridge library {lib._name} lacks {name}: it is out of date, rebuild it") from None
        function.restype = restype
        function.argtypes = argtypes


@functools.cache
def load_bridge_library() -> ctypes.CDLL:
    """The bridge as a ``ctypes.CDLL`` with every function's signature declared (built and loaded once)."""
    prebuilt = os.environ.get(BRIDGE_LIB_ENV)
    if prebuilt:
        path = Path(prebuilt)
        if not path.is_file():
            raise BridgeError(f"{BRIDGE_LIB_ENV} names {path}, which does not exist")
    else:
        path = build_bridge_library()
    # llama.cpp's CPU threads are OpenMP threads (libgomp, loaded with the bridge), which by default spin
    # ~300k rounds after each decode and take a core from the audio heads that run next (measured: heads
    # 2.0 -> 3.5 ms a step). 10k rounds still bridge the waits between a decode's ops (0 would not: its
    # barriers would sleep, 29 -> 44 ms a decode). Read by libgomp when it loads; a user's value wins.
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as error:
        raise BridgeError(f"cannot load the llama.cpp bridge {path}: {error}") from error
    _declare(lib)
    return lib
