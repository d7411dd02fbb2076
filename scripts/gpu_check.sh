#!/usr/bin/env bash
# GPU check of the TensorRT codec (and, as a second stage, llama.cpp with CUDA), in one prepared run on a
# machine with an NVIDIA GPU and no internet. Everything Python needs travels in a wheel folder:
#
#   bash scripts/device_bundle.sh        # here, with PyPI: fills .whl (wheels, pycuda sdist, llama.cpp source)
#   bash scripts/gpu_check.sh            # there, from the repository root; results under $OUT (or /tmp/gpu_check)
#
# Stage 0  what the machine has: GPU, driver, CUDA toolkit, Python, TensorRT, preinstalled packages.
# Stage 1  wheels from $WHEELS (cp312, x86_64) into a private site dir; the doctor; engines built from the
#          demo codec with build-engines (40 s profile); test/test_tensorrt.py (engines vs ONNX Runtime, on
#          every CUDA binding present); encode/decode timings. pycuda, if absent, is built from its sdist in
#          the background meanwhile (needs the CUDA headers and Python.h) and tested once ready.
# Stage 2  (SKIP_LLAMA=1 skips it) llama.cpp built with CUDA by scripts/llama_gpu_check.sh from the vendored
#          source tarball (hidden states n_gpu_layers -1 vs 0 vs a NumPy reference), then a synthesis with
#          the TensorRT codec on that build. It gets whatever time is left of BUDGET_S.
#
# Environment: WHEELS (default .whl), BUDGET_S (whole run, default 420), SKIP_TRT, SKIP_LLAMA, BUILD_PYCUDA (default 1),
# CUDA_ARCH (default 90), PYTHON (default python3.12, else python3). TensorRT itself cannot travel (its libraries are >1 GB and only on NVIDIA's index):
# stage 1 uses whatever TensorRT the machine has and says so when there is none.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
out=${OUT:-/tmp/gpu_check}
wheels=${WHEELS:-.whl}
budget=${BUDGET_S:-420}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
note() { echo "== $*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - start)); }

note "stage 0: the machine"
{
  date -u
  uname -srm
  echo "cores: $(nproc)"
  free -g | head -2
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv || echo "nvidia-smi: none"
  nvidia-smi | head -4
  command -v nvcc && nvcc --version | tail -2 || echo "nvcc: none"
  command -v cmake && cmake --version | head -1 || echo "cmake: none"
  command -v gcc && gcc --version | head -1 || echo "gcc: none"
  ls -d /usr/local/cuda*/include/cuda.h 2>/dev/null || echo "cuda.h: none under /usr/local"
  ldconfig -p | grep -E "libnvinfer\.so|libcudart\.so|libcublas\.so|libcuda\.so" | head
  for py in python3.12 python3; do command -v $py && $py --version; done
  python3 -c 'import tensorrt; print("tensorrt", tensorrt.__version__, tensorrt.__file__)' 2>&1 | tail -1
  python3 -m pip list 2>/dev/null | grep -i -E "tensorrt|cuda|onnx|torch|numpy|pycuda" || echo "pip list: nothing relevant"
  python3 -c 'import sysconfig, os; h = sysconfig.get_paths()["include"]; print("Python.h:", os.path.exists(h + "/Python.h"))'
} 2>&1 | tee "$out/machine.txt"

python=${PYTHON:-$(command -v python3.12 || command -v python3)}
pyver=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
[ "$pyver" = "3.12" ] || note "WARNING: Python is $pyver; the carried binary wheels are for 3.12"
site=/tmp/gpu_check_site
rm -rf "$site" && mkdir -p "$site"
export PYTHONPATH=$site:$PWD PYTHONDONTWRITEBYTECODE=1

note "stage 1: wheels -> $site ($(elapsed) s)"
if "$python" -m pip --version >/dev/null 2>&1; then
  "$python" -m pip install -q --no-index --no-deps --target "$site" "$wheels"/*.whl 2>&1 | tail -3
else  # no pip on the machine: a wheel is a zip of site-packages content
  for wheel in "$wheels"/*.whl; do "$python" -m zipfile -e "$wheel" "$site"; done
fi
"$python" -c 'import numpy, onnxruntime, onnx, tokenizers, yaml, gguf; print("imports ok")' 2>&1 | tee -a "$summary"

note "doctor ($(elapsed) s)"
"$python" -m moss_tts_node doctor 2>&1 | tee "$out/doctor.txt" | grep -E "tensorrt|pycuda|cuda-python|cuda device|onnxruntime|GPU offload" | tee -a "$summary"

# Stage 1's TensorRT part. (The heredoc's lines start at column 0: it is Python.)
trt_checks() {
  local pycuda_pid=
  local work=/tmp/gpu_check_work
  rm -rf "$work" && mkdir -p "$work"
  if ! "$python" -c 'import pycuda.driver' 2>/dev/null && [ "${BUILD_PYCUDA:-1}" = 1 ] && ls "$wheels"/pycuda-*.tar.gz >/dev/null 2>&1; then
    local cuda_root
    for cuda_root in "${CUDA_HOME:-}" /usr/local/cuda "$(dirname "$(dirname "$(command -v nvcc || echo /x/x)")")"; do
      [ -f "$cuda_root/include/cuda.h" ] && break
    done
    note "building pycuda in the background (CUDA_ROOT=$cuda_root)"
    # pycuda's build reads ~/.aksetup-defaults.py: a private HOME holds this machine's CUDA layout.
    mkdir -p "$work/home/lib"
    # The driver may ship only libcuda.so.1, which the linker's -lcuda does not find.
    local driver
    driver=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
    [ -n "$driver" ] && ln -sf "$driver" "$work/home/lib/libcuda.so"
    local libs="'$work/home/lib', '$cuda_root/lib64', '$cuda_root/lib64/stubs', '$cuda_root/lib', '$cuda_root/lib/stubs'"
    local curand=False
    [ -f "$cuda_root/include/curand.h" ] && curand=True
    printf 'CUDA_ROOT = "%s"\nCUDA_ENABLE_CURAND = %s\nCUDADRV_LIB_DIR = [%s]\nCUDART_LIB_DIR = [%s]\n' \
      "$cuda_root" "$curand" "$libs" "$libs" >"$work/home/.aksetup-defaults.py"
    (HOME=$work/home PATH=$cuda_root/bin:$PATH timeout 300 "$python" -m pip install --no-index --no-deps \
      --no-build-isolation --target "$site" "$wheels"/pycuda-*.tar.gz) >"$out/pycuda_build.log" 2>&1 &
    pycuda_pid=$!
  fi

  "$python" -c "from moss_tts_node.tools.dev.demo_codec import write_demo_codec; write_demo_codec('$work/codec')"
  note "build-engines, 40 s profile ($(elapsed) s)"
  "$python" -m moss_tts_node build-engines --encoder "$work/codec/encoder.onnx" --decoder "$work/codec/decoder.onnx" \
    --out "$work/engines40" --max-seconds 40 2>&1 | tail -4 | tee -a "$summary"

  note "test/test_tensorrt.py ($(elapsed) s)"
  # The synthesis test needs llama.cpp, which stage 2 builds: it runs there.
  "$python" -m pytest -q -rs -p no:cacheprovider test/test_tensorrt.py -k "not synthesis" 2>&1 | tee "$out/pytest_trt.txt" | tail -15 | tee -a "$summary"

  note "codec timings ($(elapsed) s)"
  "$python" - "$work" <<'EOF' 2>&1 | tee -a "$summary"
import sys, time
from pathlib import Path
import numpy as np
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.codec.tensorrt import TensorRTCodec

work = Path(sys.argv[1])
rng = np.random.default_rng(0)

def per_call(call, repeats=10):
    call()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats * 1000

onnx = OnnxCodec(work / "codec/decoder.onnx", work / "codec/encoder.onnx", provider="cpu")
try:
    trt = TensorRTCodec(work / "engines40")
except Exception as error:  # no TensorRT or no GPU: the reason is the result
    print("tensorrt codec:", error)
    trt = None
for frames in (25, 100, 500):
    codes = rng.integers(0, 1024, size=(frames, 32))
    audio = (0.1 * rng.standard_normal(frames * 1920)).astype(np.float32)
    line = [f"{frames} frames ({frames / 12.5:g} s):"]
    for name, codec in (("trt", trt), ("ort-cpu", onnx)):
        if codec is not None:
            decode = per_call(lambda: codec.decode(codes))
            encode = per_call(lambda: codec.encode(audio))
            line.append(f"{name} decode {decode:.2f} ms, encode {encode:.2f} ms;")
    if trt is not None:
        line.append(f"max |trt-ort| decode {np.abs(trt.decode(codes) - onnx.decode(codes)).max():.2e}")
    print(" ".join(line))
EOF

  if [ -n "$pycuda_pid" ]; then
    note "waiting for the pycuda build ($(elapsed) s)"
    wait "$pycuda_pid"
    tail -3 "$out/pycuda_build.log" | tee -a "$summary"
    if "$python" -c 'import pycuda.driver' 2>/dev/null; then
      note "test/test_tensorrt.py with pycuda ($(elapsed) s)"
      "$python" -m pytest -q -rs -p no:cacheprovider test/test_tensorrt.py -k "pycuda and not synthesis" 2>&1 | tail -5 | tee -a "$summary"
    fi
  fi
}

if [ "${SKIP_TRT:-0}" = 1 ]; then
  note "TensorRT checks skipped (SKIP_TRT=1)"
else
  trt_checks
fi

if [ "${SKIP_LLAMA:-0}" = 1 ]; then
  note "stage 2 skipped (SKIP_LLAMA=1)"
else
  left=$((budget - $(elapsed) - 30))
  note "stage 2: llama.cpp with CUDA, ${left} s left ($(elapsed) s)"
  if [ "$left" -lt 120 ]; then
    note "stage 2 skipped: not enough time left"
  elif ! command -v nvcc >/dev/null || ! command -v cmake >/dev/null; then
    note "stage 2 skipped: nvcc or cmake missing"
  else
    SKIP_SPEED=1 CUDA_ARCH=${CUDA_ARCH:-90} PYTHON=$python timeout "$left" \
      bash scripts/llama_gpu_check.sh "$wheels/llama_cpp_vendor_src.tar.gz" "" "$out/llama" 2>&1 | tail -40 | tee -a "$summary"
    if [ -f /tmp/llama_cuda/libmoss_bridge.so ]; then
      note "synthesis with the TensorRT codec on the CUDA llama.cpp ($(elapsed) s)"
      MOSS_TTS_BRIDGE_LIB=/tmp/llama_cuda/libmoss_bridge.so "$python" -m pytest -q -rs -p no:cacheprovider \
        test/test_tensorrt.py -k synthesis 2>&1 | tail -5 | tee -a "$summary"
    fi
  fi
fi
nvidia-smi --query-gpu=memory.used --format=csv 2>/dev/null | tail -1 | sed 's/^/GPU memory used at the end: /' | tee -a "$summary"
note "done in $(elapsed) s; logs in $out"
