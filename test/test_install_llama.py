"""``make venv`` and scripts/install_llama.sh with a stand-in for Python that only records what it is asked: which
llama-cpp-python build runs for which CMake arguments, and which wheel each venv gets (no compiler, no GPU)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Records each call as "CMAKE_ARGS|CFLAGS|argv"; `-m venv DIR` makes DIR/bin/python a copy of itself, and
# `-m pip wheel ... --wheel-dir DIR` leaves a wheel there, as a real build would.
STUB = r"""#!/usr/bin/env bash
echo "$CMAKE_ARGS|$CFLAGS|$*" >> "$STUB_LOG"
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi
if [ "$1 $2 $3" = "-m pip wheel" ]; then
  while [ $# -gt 0 ]; do
    [ "$1" = --wheel-dir ] && touch "$2/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    shift
  done
fi
exit 0
"""


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    python = tmp_path / "python"
    python.write_text(STUB)
    python.chmod(0o755)
    return python


def make_venv(tmp_path: Path, stub: Path, cmake_args: str) -> list[str]:
    """``make venv`` into tmp_path/venv with ``cmake_args``: the stand-in's calls of this run."""
    log = tmp_path / "calls.log"
    log.write_text("")
    env = {**os.environ, "STUB_LOG": str(log), "MOSS_LLAMA_WHEELS": str(tmp_path / "wheels")}
    command = ["make", "-C", str(REPO), "venv", f"VENV={tmp_path / 'venv'}", f"PYTHON={stub}"]
    done = subprocess.run([*command, f"LLAMA_CMAKE_ARGS={cmake_args}"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return log.read_text().splitlines()


def builds(calls: list[str]) -> list[str]:
    """The CMake arguments of each llama-cpp-python build among the calls."""
    return [call.split("|")[0] for call in calls if "-m pip wheel" in call and "llama-cpp-python==" in call]


def installed_wheel(calls: list[str]) -> str:
    (install,) = [call for call in calls if "--force-reinstall" in call]
    return install.rsplit(" ", 1)[-1]


def test_a_cuda_build_asked_for_after_a_cpu_one_is_built_and_switching_back_reuses_the_cpu_wheel(
    tmp_path: Path, stub: Path
) -> None:
    cpu = make_venv(tmp_path, stub, "-DLLAVA_BUILD=OFF")
    assert builds(cpu) == ["-DLLAVA_BUILD=OFF"]
    assert make_venv(tmp_path, stub, "-DLLAVA_BUILD=OFF") == []  # up to date: nothing runs
    cuda = make_venv(tmp_path, stub, "-DLLAVA_BUILD=OFF -DGGML_CUDA=on")
    assert builds(cuda) == ["-DLLAVA_BUILD=OFF -DGGML_CUDA=on"]  # pip's cached CPU wheel is not reused
    assert installed_wheel(cuda) != installed_wheel(cpu)
    back = make_venv(tmp_path, stub, "-DLLAVA_BUILD=OFF")
    assert builds(back) == [] and installed_wheel(back) == installed_wheel(cpu)


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="AMX is an x86-64 extension")
def test_every_x86_64_build_leaves_amx_out(tmp_path: Path, stub: Path) -> None:
    (build,) = [call for call in make_venv(tmp_path, stub, "-DGGML_CUDA=on") if "-m pip wheel" in call]
    assert build.split("|")[1].split() == ["-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]
