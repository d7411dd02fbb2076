#!/usr/bin/env bash
# Install llama-cpp-python, built from source with the given CMake arguments, into the environment of PYTHON.
#
#   scripts/install_llama.sh PYTHON "CMAKE_ARGS"        # the Makefile runs it with $(LLAMA_CMAKE_ARGS)
#
# pip's wheel cache keys a source build by the sdist alone: after a CPU install, a CUDA build asked for later
# would get the cached CPU wheel back. Here each build has a folder of its own, named after what makes one build
# differ from another (the version, the machine, the compiler, the CMake arguments and the flags added below), so
# the same arguments reuse their wheel (seconds) and new ones build anew (about 10 minutes on 2 cores).
#
# On x86-64 every build leaves out Intel AMX (-mno-amx-*): with this llama.cpp, AMX's matrix kernel segfaults on
# quantized weights on some Xeons (llama.cpp issue 20824). GCC drops AMX even under GGML_NATIVE's -march=native,
# which keeps every other instruction set the CPU has (docs/install.md, "Intel CPUs with AMX").
#
# Environment: MOSS_LLAMA_WHEELS (default ${XDG_CACHE_HOME:-~/.cache}/moss_tts_node/llama-wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
python=$1
cmake_args=${2-}
version=$(sed -n 's/^llama-cpp-python==//p' requirements.txt)
flags=""
if [ "$(uname -m)" = x86_64 ]; then
  flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
compiler=$("${CC:-cc}" --version 2>/dev/null | head -n 1 || true)
key=$(printf '%s\n' "$version" "$(uname -m)" "$compiler" "$cmake_args" "$flags" | sha256sum | cut -c1-16)
wheels=${MOSS_LLAMA_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/moss_tts_node/llama-wheels}
build=$wheels/$version-$key

if ! compgen -G "$build/llama_cpp_python-*.whl" > /dev/null; then
  echo "install_llama: building llama-cpp-python $version with CMAKE_ARGS=\"$cmake_args\" into $build"
  mkdir -p "$wheels"
  partial=$(mktemp -d "$build.partial.XXXXXX")
  trap 'rm -rf "$partial"' EXIT
  CMAKE_ARGS="$cmake_args" CFLAGS="$flags ${CFLAGS-}" CXXFLAGS="$flags ${CXXFLAGS-}" \
    CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    "$python" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python --wheel-dir "$partial" \
    "llama-cpp-python==$version"
  printf 'llama-cpp-python %s\nCMAKE_ARGS=%s\nCFLAGS/CXXFLAGS=%s\ncompiler %s\n' "$version" "$cmake_args" "$flags" \
    "$compiler" > "$partial/BUILD"
  # whole or not at all: an interrupted build leaves a .partial folder; a concurrent one's finished folder wins
  mv -T "$partial" "$build" 2> /dev/null || true
else
  echo "install_llama: llama-cpp-python $version with CMAKE_ARGS=\"$cmake_args\" from $build"
fi
"$python" -m pip install --quiet --no-deps --force-reinstall "$build"/llama_cpp_python-*.whl
