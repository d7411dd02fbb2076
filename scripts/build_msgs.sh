#!/usr/bin/env bash
# Build and install ROS 2 interface packages into a virtualenv that holds the ROS 2 wheels
# (requirements-ros.txt), with plain CMake: colcon and a ROS install are not needed.
#
#   scripts/build_msgs.sh [VENV] [AUDIO_COMMON_MSGS_TARBALL]      (default: .venv, ../shared/ros-interfaces/...)
#
# - moss_tts_msgs, this repository's interfaces;
# - audio_common_msgs (ros-drivers'), which the node publishes where it is installed, from the sources in
#   ../shared/ros-interfaces/ when that tarball is there (apt ROS releases have it; PyPI has no wheel of it).
#
# Each package's ~45 s build is skipped when the installed copy was built from the same sources and imports.
# With an apt ROS install, build moss_tts_msgs with colcon instead (docs/install.md, "ROS 2").
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/.venv}"
AUDIO_COMMON_TARBALL="$(realpath -m "${2:-$ROOT/../shared/ros-interfaces/audio_common_msgs-src.tar.gz}")"
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "error: no virtualenv at $VENV; create it and install requirements-ros.txt first" >&2
    exit 1
fi
VENV="$(cd "$VENV" && pwd)"
PY="$VENV/bin/python"

if ! "$PY" -c "import rclpy, rosidl_generator_py" 2>/dev/null; then
    echo "error: the ROS 2 wheels are not in $VENV: $PY -m pip install -r requirements-ros.txt" >&2
    exit 1
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

# build NAME SOURCE_DIR FINGERPRINT IMPORTS: configure, build and install one package into the venv, unless the
# stamp says the installed copy was built from the same FINGERPRINT and IMPORTS (a Python statement) still runs.
build() {
    local name="$1" src="$2" wanted="$3" imports="$4"
    local build="$VENV/build/$name" stamp="$VENV/share/$name/source.sha256"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$wanted" ]] && "$PY" -W ignore -c "$imports" 2>/dev/null; then
        echo "$name is up to date in $VENV"
        return
    fi
    # Fix 2: find ament and rosidl in the venv, and install there so the types import with no variables.
    rm -rf "$build"
    mkdir -p "$build"
    AMENT_PREFIX_PATH="$VENV" cmake -S "$src" -B "$build" -DCMAKE_PREFIX_PATH="$VENV" \
        -DCMAKE_INSTALL_PREFIX="$VENV" -DPython3_EXECUTABLE="$PY" -DBUILD_TESTING=OFF \
        -DCMAKE_BUILD_TYPE=Release > "$build/configure.log" || { cat "$build/configure.log" >&2; exit 1; }
    cmake --build "$build" -j"$(nproc)" > "$build/build.log" 2>&1 || { tail -50 "$build/build.log" >&2; exit 1; }
    cmake --install "$build" > "$build/install.log"
    "$PY" -W ignore -c "$imports"
    echo "$wanted" > "$stamp"
    echo "built $name into $VENV"
}

# Everything the generated code depends on: the interface files (or their tarball), this script, the wheel
# versions. Contents only, so that the same sources give the same stamp wherever they lie.
fingerprint() {
    (cd "$ROOT" && find "$@" scripts/build_msgs.sh requirements-ros.txt -type f -print0 \
        | sort -z | xargs -0 sha256sum | cut -d' ' -f1) | sha256sum | cut -d' ' -f1
}

build moss_tts_msgs "$ROOT/moss_tts_msgs" "$(fingerprint moss_tts_msgs)" \
    "import moss_tts_msgs.msg, moss_tts_msgs.srv, moss_tts_msgs.action"

if [[ -f "$AUDIO_COMMON_TARBALL" ]]; then
    sources="$VENV/build/audio_common_msgs-src"
    rm -rf "$sources"
    mkdir -p "$sources"
    tar xzf "$AUDIO_COMMON_TARBALL" -C "$sources"
    build audio_common_msgs "$sources/audio_common_msgs" "$(fingerprint "$AUDIO_COMMON_TARBALL")" \
        "import audio_common_msgs.msg"
else
    echo "audio_common_msgs sources not found at $AUDIO_COMMON_TARBALL: the node's audio_common topics stay untested"
fi
