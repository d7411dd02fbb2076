#!/usr/bin/env bash
# Build llama.cpp with CUDA from llama-cpp-python's vendored source, link the bridge against it, run
# scripts/llama_gpu_smoke.c (the bridge without Python, n_gpu_layers 0 and -1), then
# scripts/llama_gpu_check.py (hidden states GPU vs CPU vs a NumPy reference, step timings, a synthesis).
# A crash leaves a native backtrace and the mapped libraries (gdb or cuda-gdb), and the Python check is
# retried once with the system libstdc++ preloaded.
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
ldd "$lib/libggml-cuda.so" | grep -E "cublas|cudart|nccl|stdc\+\+" || true
{  # what the build was made with, and which C++ library code the CUDA library carries itself
  env | grep -E "^(CC|CXX|C(XX|PP)?FLAGS|LDFLAGS|CUDAFLAGS|CUDACXX|CUDA_[A-Z_]+|NVCC_[A-Z_]+|LD_LIBRARY_PATH|LD_PRELOAD)=" ||
    true
  c++ --version | head -n 1
  grep -E "compiler identification|CUDA host compiler|CMAKE_CUDA_HOST" "$out/cmake.log" || true
  echo "std::basic_ostream symbols defined in libggml-cuda.so: $(nm -DC --defined-only "$lib/libggml-cuda.so" |
    grep -c "std::basic_ostream" || true)"
} 2>&1 | tee "$out/build_env.txt"
export MOSS_TTS_BRIDGE_LIB="$build/libmoss_bridge.so"

# Native backtrace and the libraries mapped (two libstdc++ copies?) when a command crashes.
crash_report() {
  local debugger
  debugger=$(command -v gdb || command -v cuda-gdb) || { echo "no gdb: no backtrace"; return; }
  "$debugger" -q -batch -ex "set pagination off" -ex run -ex bt -ex "info sharedlibrary" --args "$@" 2>&1 | tail -80
}

# 1. No Python in the process: the bridge alone, all layers on the CPU, then on the GPU.
cc -O2 scripts/llama_gpu_smoke.c -Ibridge -L"$build" -lmoss_bridge -Wl,-rpath,"$build" -Wl,-rpath,"$lib" \
  -o "$build/llama_gpu_smoke"
"$python" -c 'import sys; from pathlib import Path; sys.path.insert(0, "."); \
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape, random_qwen3_tensors, write_qwen3_gguf; \
s = Qwen3Shape(hidden=256, layers=4, heads=8, kv_heads=4, head_dim=32, ffn=512, vocab=1000); \
write_qwen3_gguf(Path(sys.argv[1]), s, random_qwen3_tensors(s, seed=1).items(), dtype="f32")' "$build/tiny.gguf"
for ngl in 0 -1; do
  if ! "$build/llama_gpu_smoke" "$build/tiny.gguf" "$ngl" 2>&1 | tee -a "$out/smoke.txt"; then
    echo "smoke n_gpu_layers=$ngl failed" | tee -a "$out/smoke.txt"
    crash_report "$build/llama_gpu_smoke" "$build/tiny.gguf" "$ngl" | tee -a "$out/smoke.txt"
  fi
done

# 2. From Python. libstdc++ copies the interpreter maps before llama.cpp loads, for a crash's post-mortem.
"$python" -c 'import numpy, onnxruntime; print("".join(sorted({l.split()[-1] + "\n" for l in open("/proc/self/maps") if "libstdc++" in l})), end="")' \
  2>&1 | tee "$out/python_libstdcxx.txt"
set +e  # a failing check is reported, not the end of the script
"$python" scripts/llama_gpu_check.py | tee "$out/report.json"
status=${PIPESTATUS[0]}
if [ "$status" -gt 128 ]; then  # killed by a signal: a backtrace, then once more with the system libstdc++ first
  echo "python check died with signal $((status - 128))" | tee -a "$out/report.json"
  SKIP_SPEED=1 crash_report "$python" scripts/llama_gpu_check.py | tee "$out/crash.txt"
  system_cxx=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64|libstdc\+\+\.so\.6 .*AArch64/ {print $NF; exit}')
  if [ -n "$system_cxx" ]; then
    echo "again with LD_PRELOAD=$system_cxx" | tee -a "$out/report.json"
    LD_PRELOAD=$system_cxx "$python" scripts/llama_gpu_check.py | tee -a "$out/report.json"
    status=${PIPESTATUS[0]}
  fi
fi
exit "$status"
