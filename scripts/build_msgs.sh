#!/usr/bin/env bash
# Build and install the moss_tts_msgs interfaces into a virtualenv that holds the ROS 2 wheels
# (requirements-ros.txt), with plain CMake: colcon and a ROS install are not needed.
#
#   scripts/build_msgs.sh [VENV]      (default: .venv)
#
# Skips the ~45 s build when the installed copy was built from the same sources and imports.
# With an apt ROS install, build both packages with colcon instead (see README.md).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/.venv}"
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "error: no virtualenv at $VENV; create it and install requirements-ros.txt first" >&2
    exit 1
fi
VENV="$(cd "$VENV" && pwd)"
PY="$VENV/bin/python"
SRC="$ROOT/moss_tts_msgs"
BUILD="$ROOT/build/moss_tts_msgs"
STAMP="$VENV/share/moss_tts_msgs/source.sha256"

# Everything the generated code depends on: the interface files, this script, the wheel versions.
fingerprint() {
    (cd "$ROOT" && find moss_tts_msgs scripts/build_msgs.sh requirements-ros.txt -type f -print0 \
        | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1
}

if ! "$PY" -c "import rclpy, rosidl_generator_py" 2>/dev/null; then
    echo "error: the ROS 2 wheels are not in $VENV: $PY -m pip install -r requirements-ros.txt" >&2
    exit 1
fi

WANTED="$(fingerprint)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANTED" ]] \
    && "$PY" -W ignore -c "import moss_tts_msgs.msg, moss_tts_msgs.srv, moss_tts_msgs.action" 2>/dev/null; then
    echo "moss_tts_msgs is up to date in $VENV"
    exit 0
fi

# Fix 1: the wheels' exported CMake files name the Python and NumPy headers of the machine that
# built them (/opt/python/cp311-cp311/...); point them at this interpreter's. Idempotent.
"$PY" - "$VENV" <<'PYFIX'
import pathlib, re, sys, sysconfig
import numpy
include = pathlib.Path(sysconfig.get_paths()["include"])
if not (include / "Python.h").is_file():
    sys.exit(f"error: {include}/Python.h not found; install the Python headers (apt-get install python3-dev)")
numpy_pattern = re.compile(r"/opt/python/cp\d+-cp\d+/lib/python[\d.]+/site-packages/numpy/_core/include")
python_pattern = re.compile(r"/opt/python/cp\d+-cp\d+/include/python[\d.]+")
for cmake in pathlib.Path(sys.argv[1], "share").rglob("*.cmake"):
    text = cmake.read_text()
    fixed = python_pattern.sub(str(include), numpy_pattern.sub(numpy.get_include(), text))
    if fixed != text:
        cmake.write_text(fixed)
PYFIX

# Fix 2: find ament and rosidl in the venv, and install there so the types import with no variables.
rm -rf "$BUILD"
mkdir -p "$BUILD"
export AMENT_PREFIX_PATH="$VENV"
cmake -S "$SRC" -B "$BUILD" -DCMAKE_PREFIX_PATH="$VENV" -DCMAKE_INSTALL_PREFIX="$VENV" \
    -DPython3_EXECUTABLE="$PY" -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=Release > "$BUILD/configure.log" \
    || { cat "$BUILD/configure.log" >&2; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" > "$BUILD/build.log" 2>&1 || { tail -50 "$BUILD/build.log" >&2; exit 1; }
cmake --install "$BUILD" > "$BUILD/install.log"
"$PY" -W ignore -c "import moss_tts_msgs.msg, moss_tts_msgs.srv, moss_tts_msgs.action"
echo "$WANTED" > "$STAMP"
echo "built moss_tts_msgs into $VENV"
