#!/usr/bin/env bash
# Fill the wheel folder scripts/gpu_check.sh carries to a GPU machine without internet: Python wheels for
# its Python (cp312, x86_64, by default) and llama.cpp's source as vendored by the pinned llama-cpp-python,
# trimmed to what a CUDA build needs. Run here, where PyPI is reachable; the folder must stay under the
# device tool's 64 MiB carry limit: with numpy left out (the lent machines' Python has numpy 2) it is ~57 MB.
#
#   bash scripts/device_bundle.sh [OUT_DIR]          # default .whl (git-ignored)
# Environment: PY_VERSION (default 312), PLATFORM (default manylinux_2_28_x86_64), EXCLUDE (requirements
# not to carry, default "numpy"; EXCLUDE= carries everything).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.whl}
py=${PY_VERSION:-312}
platform=${PLATFORM:-manylinux_2_28_x86_64}
llama_version=$(sed -n 's/^llama-cpp-python==//p' requirements.txt)
mkdir -p "$out"
pip=(.venv/bin/python -m pip)

# Binary wheels for the target Python, at the versions requirements.txt pins, and the dependencies they need
# at run time (tokenizers' huggingface-hub is only for downloads: left out). cuda-bindings 12.x runs on CUDA 12
# and 13 drivers.
exclude=${EXCLUDE-numpy}
pinned=$(.venv/bin/python scripts/pins.py --python "${py:0:1}.${py:1}" numpy PyYAML tokenizers soundfile \
  onnxruntime onnx gguf pytest threadpoolctl | grep -v -x -E "(${exclude// /|})==.*" || true)
# shellcheck disable=SC2086  # one requirement per word
"${pip[@]}" download -q --dest "$out" --no-deps --only-binary :all: --python-version "$py" \
  --platform "$platform" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_27_x86_64 $pinned protobuf ml_dtypes typing_extensions flatbuffers packaging cffi \
  pycparser iniconfig pluggy "cuda-bindings>=12,<13" cuda-pathfinder
# pycuda has no binary wheel: its sdist, built on the machine (gpu_check.sh does it in the background).
"${pip[@]}" download -q --dest "$out" --no-deps --no-binary pycuda pycuda
"${pip[@]}" download -q --dest "$out" --no-deps pytools platformdirs siphash24 --only-binary siphash24 \
  --python-version "$py" --platform "$platform" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64

# llama.cpp's source from the llama-cpp-python sdist, without the backends a CUDA build never reads.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"${pip[@]}" download -q --dest "$work" --no-deps --no-binary llama-cpp-python "llama-cpp-python==$llama_version"
tar xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
vendor=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
unused=(blas cann et hexagon hip metal musa opencl openvino rpc sycl virtgpu vulkan webgpu zdnn zendnn)
tar czf "$out/llama_cpp_vendor_src.tar.gz" -C "$vendor" "${unused[@]/#/--exclude=ggml/src/ggml-}" \
  CMakeLists.txt cmake ggml src include common vendor app
bytes=$(du -sb "$out" | cut -f1)
echo "$out: $((bytes / 1048576)) MiB"
if [ "$bytes" -gt $((64 * 1048576)) ]; then
  echo "over the 64 MiB the device tool carries: leave out what the machine has (EXCLUDE=\"numpy ...\")" >&2
  exit 1
fi
