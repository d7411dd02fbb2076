#!/usr/bin/env bash
# Build llama.cpp with CUDA from llama-cpp-python's vendored source, link the bridge against it, and run
# scripts/llama_gpu_check.py (hidden states GPU vs CPU vs a NumPy reference, step timings, a synthesis).
#
# Usage, on a machine with an NVIDIA GPU, nvcc and cmake, from the repository root:
#   bash scripts/llama_gpu_check.sh LLAMA_SRC.tar.gz [WHEEL_DIR] [OUT_DIR]
# LLAMA_SRC.tar.gz: vendor/llama.cpp of the llama-cpp-python sdist (CMakeLists.txt, cmake, ggml, src,
# include, common, vendor, app). WHEEL_DIR: extra Python wheels to install first (optional).
# CUDA_ARCH (default 90: H100/H200; 87: Jetson Orin; 86: RTX 30xx) selects the GPU architecture.
set -euo pipefail
src_tgz=$1
wheels=${2:-}
out=${3:-/tmp/llama_gpu_check}
arch=${CUDA_ARCH:-90}
mkdir -p "$out"
python=${PYTHON:-python3}

if [ -n "$wheels" ]; then
  "$python" -m pip install -q --no-index --no-deps --target /tmp/site "$wheels"/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
"$python" -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())' || true
"$python" -c 'import tensorrt as t; print("tensorrt", t.__version__)' 2>/dev/null || echo "tensorrt: not installed"
nvcc --version | tail -n 2

build=/tmp/llama_cuda
rm -rf "$build" && mkdir -p "$build/src"
tar xzf "$src_tgz" -C "$build/src"
cmake -S "$build/src" -B "$build/out" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_CURL=OFF \
  -DGGML_CUDA_NO_VMM=ON >"$out/cmake.log" 2>&1
start=$(date +%s)
cmake --build "$build/out" -j"$(nproc)" --target llama >"$out/build.log" 2>&1
echo "llama.cpp CUDA build: $(( $(date +%s) - start )) s"

lib=$(dirname "$(find "$build/out" -name 'libllama.so' | head -n1)")
cc -O2 -shared -fPIC bridge/moss_bridge.c -I"$build/src/include" -I"$build/src/ggml/include" \
  -L"$lib" -lllama -Wl,-rpath,"$lib" -o "$build/libmoss_bridge.so"
ldd "$lib/libggml-cuda.so" | grep -E "cublas|cudart|nccl" || true
export MOSS_TTS_BRIDGE_LIB="$build/libmoss_bridge.so"
if command -v cuda-gdb >/dev/null && [ -n "${DEBUG_CRASH:-}" ]; then
  # A crash inside llama.cpp/CUDA then leaves a native backtrace instead of "Segmentation fault".
  cuda-gdb -q -batch -ex "set pagination off" -ex run -ex bt --args "$python" scripts/llama_gpu_check.py 2>&1 |
    tee "$out/report.txt"
else
  "$python" scripts/llama_gpu_check.py | tee "$out/report.json"
fi
