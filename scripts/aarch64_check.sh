#!/usr/bin/env bash
# The package on aarch64 (a Jetson Orin's CPU, an ARM server's), emulated with qemu-user on an x86-64 Debian host:
#
#   scripts/aarch64_check.sh            # `make aarch64-check`; as root (debootstrap, chroot, mount namespaces)
#   scripts/aarch64_check.sh --prepare  # only build what the check needs into the cache
#   scripts/aarch64_check.sh --ci       # CI's part, from the cache; without one it says so and exits 0
#
# From nothing it builds, each piece cached under $MOSS_AARCH64_CACHE (default ~/.cache/moss_tts_node/aarch64) by
# what makes it differ: an arm64 Debian bookworm root file system (debootstrap, with gcc: the bridge is compiled
# there on first use, as on a user's machine); llama-cpp-python cross-compiled on the host at native speed, once
# per CPU below (-march of GGML_CPU_ARM_ARCH instead of GGML_NATIVE's -mcpu=native); the other requirements.txt
# pins as PyPI's aarch64 wheels. Then, in the root file system, without network, under qemu's model of each CPU:
#   orin    QEMU_CPU=cortex-a76  built for armv8.2-a+dotprod+fp16: an Orin's Cortex-A78AE (no SVE, no i8mm),
#           also a Raspberry Pi 5's Cortex-A76
#   server  QEMU_CPU=max with 256-bit SVE, built for armv8.4-a+...+sve+i8mm: a Neoverse-V1 (Graviton3)
# it decodes one real-width GGUF layer in F32, F16, Q8_0, Q4_0 and Q4_K_M and runs `make demo`'s synthesis, and
# test/cross_arch.py compares both with the same done by the x86-64 venv ($VENV, default .venv). Under orin it
# also runs the core's tests (all but ROS and playback). --ci: orin only, the quantized types, the demo and of
# the tests only CI_TESTS; a cache without all it needs is a skip (building it takes longer than CI can wait).
# Results: $MOSS_AARCH64_OUT (default /tmp/moss-aarch64-check); docs/development.md, "aarch64, emulated".
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
src=$PWD
ci=false prepare=false
case ${1-} in
  --ci) ci=true ;;
  --prepare) prepare=true ;;
  "") ;;
  *) echo "usage: $0 [--ci | --prepare]" >&2 && exit 2 ;;
esac
venv=${VENV:-.venv}
cache=${MOSS_AARCH64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/moss_tts_node/aarch64}
out=${MOSS_AARCH64_OUT:-/tmp/moss-aarch64-check}
shared=$(realpath -m "${MOSS_SHARED_DIR:-../shared}")  # codec-tiny (test/conftest.py), read-only in the chroot
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
root_packages=python3,python3-venv,gcc,libc6-dev,make
host_packages=(qemu-user-static binfmt-support debootstrap gcc-aarch64-linux-gnu g++-aarch64-linux-gnu cmake)
llama_version=$(sed -n 's/^llama-cpp-python==//p' requirements.txt)
llama_cmake_args=${LLAMA_CMAKE_ARGS:--DLLAVA_BUILD=OFF}  # the Makefile's default
read -r -a variants <<< "${AARCH64_VARIANTS:-orin server}"  # a subset by hand: AARCH64_VARIANTS=server
$ci && variants=(orin)
declare -A arm_arch=([orin]=armv8.2-a+dotprod+fp16 [server]=armv8.4-a+dotprod+fp16+sve+i8mm)
declare -A qemu_cpu=([orin]=cortex-a76 [server]=max,sve-default-vector-length=32)
# /proc/cpuinfo as each CPU's Linux writes it (an A78AE's part number, a Neoverse-V1's): qemu-user shows the x86-64
# host's, on which ONNX Runtime 1.32.0's cpuinfo segfaults at import (docs/development.md, "aarch64, emulated").
declare -A cpu_part=([orin]=0xd42 [server]=0xd40)
arm_features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
declare -A cpu_features=([orin]="$arm_features" [server]="$arm_features sha3 sha512 sve asimdfhm svei8mm i8mm bf16")
# The core: every test that needs neither ROS nor a sound device. CI_TESTS: what fits CI's time (--ci).
core_tests=$(cd test && ls test_*.py | grep -vE '^test_(ros_|playback)')
CI_TESTS="test_sampling.py test_delay.py test_heads.py test_pcm.py"
$ci && core_tests=$CI_TESTS
core_tests=${AARCH64_TESTS-$core_tests}  # by hand: another list of test files, or "" for none
types=""  # test/cross_arch.py decode's default: all
$ci && types="--types Q8_0 Q4_0 Q4_K_M"

say() { echo "aarch64_check [${SECONDS}s]: $*"; }
die() { echo "aarch64_check: $*" >&2; exit 1; }
# Under --ci a piece missing from the cache ends the check here, as a skip that says why.
cold() {
  if $ci; then
    say "skipped: $1 is not in $cache; fill it with \`scripts/aarch64_check.sh --prepare\` (docs/development.md)"
    exit 0
  fi
}

[ "$(uname -m)" = x86_64 ] || die "this check emulates aarch64 on an x86-64 host; on an aarch64 machine run \`make test\`"
[ "$(id -u)" = 0 ] || die "run as root: debootstrap, chroot and the mount namespaces need it"
[ -x "$venv/bin/python" ] || die "no x86-64 venv at $venv to compare with: run \`make venv\` first"

missing=()
for tool in qemu-aarch64-static update-binfmts debootstrap aarch64-linux-gnu-gcc aarch64-linux-gnu-g++ cmake; do
  command -v "$tool" > /dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get > /dev/null || die "missing ${missing[*]}: install ${host_packages[*]}"
  say "installing ${host_packages[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${host_packages[@]}"
fi
# The kernel runs aarch64 programs through qemu only when binfmt_misc says so; "F" (fix binary) makes that work
# inside a chroot. Containers without systemd mount and register it here.
binfmt=/proc/sys/fs/binfmt_misc
[ -e $binfmt/register ] || mount -t binfmt_misc binfmt_misc $binfmt
[ -e $binfmt/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
grep -q '^flags:.*F' $binfmt/qemu-aarch64 \
  || die "binfmt_misc's qemu-aarch64 entry lacks the F flag (a chroot cannot reach qemu): reinstall qemu-user-static"

key() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }
# Build into DIR.partial, then rename: an interrupted build is never taken for a finished one.
fresh_partial() { rm -rf "$1.partial" && mkdir -p "$1.partial"; }
mkdir -p "$cache"

root=$cache/rootfs-$(key "$suite" "$mirror" "$root_packages")
if [ ! -d "$root" ]; then
  cold "the arm64 root file system"
  say "debootstrap: arm64 $suite with $root_packages into $root"
  fresh_partial "$root"
  debootstrap --arch=arm64 --variant=minbase --include="$root_packages" "$suite" "$root.partial" "$mirror" \
    > "$cache/debootstrap.log" 2>&1 || die "debootstrap failed: see $cache/debootstrap.log"
  chroot "$root.partial" apt-get clean
  mkdir -p "$root.partial"/{mnt/cache,mnt/out,mnt/shared,src}
  mv -T "$root.partial" "$root"
fi
python_tag=$(chroot "$root" python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')

# llama-cpp-python as a user's machine builds it, only cross-compiled: its wheel is Python and shared libraries,
# so the host's pip builds it with the cross compilers and names it for aarch64 (_PYTHON_HOST_PLATFORM).
sdist=$cache/sdist/llama_cpp_python-$llama_version.tar.gz
if [ ! -f "$sdist" ]; then
  cold "llama-cpp-python's sdist"
  say "downloading llama-cpp-python $llama_version's sdist"
  python3 -m pip download --quiet --no-deps --no-binary :all: -d "$cache/sdist" "llama-cpp-python==$llama_version"
fi
cross_compiler=$(aarch64-linux-gnu-gcc --version | head -n 1)
cross=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64
  -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++)
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
cmake_args="$llama_cmake_args -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH=${arm_arch[orin]}"
dir=$cache/llama-$(key "$llama_version" "$cross_compiler" "$cmake_args")
if [ ! -d "$dir" ]; then
  cold "the cross-compiled llama-cpp-python"
  say "cross-compiling llama-cpp-python $llama_version ($cmake_args) into $dir"
  fresh_partial "$dir"
  _PYTHON_HOST_PLATFORM=linux-aarch64 CMAKE_BUILD_PARALLEL_LEVEL=$jobs CMAKE_ARGS="$cmake_args ${cross[*]}" \
    python3 -m pip wheel --no-deps --no-cache-dir --wheel-dir "$dir.partial" "$sdist" \
    > "$dir.partial/build.log" 2>&1 || die "the cross build failed: see $dir.partial/build.log"
  mv -T "$dir.partial" "$dir"
fi
llama_wheel=${dir#"$cache/"}/$(cd "$dir" && ls llama_cpp_python-*.whl)
# -march reaches one library only: libggml-cpu (the kernels; ggml's CMake gives the others no ARCH_FLAGS). Another
# CPU gets that library built from the same vendored source with its own -march, installed over the wheel's.
declare -A cpu_library
for variant in "${variants[@]}"; do
  [ "$variant" = orin ] && continue
  lib=$cache/ggml-cpu-$variant-$(key "$llama_version" "$cross_compiler" "${arm_arch[$variant]}")
  if [ ! -d "$lib" ]; then
    say "cross-compiling libggml-cpu for $variant (-march=${arm_arch[$variant]}) into $lib"
    fresh_partial "$lib"
    tar -xzf "$sdist" -C "$lib.partial" --strip-components=2 "llama_cpp_python-$llama_version/vendor/llama.cpp"
    (
      cmake -S "$lib.partial/llama.cpp" -B "$lib.partial/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH="${arm_arch[$variant]}" \
        "${cross[@]}" && cmake --build "$lib.partial/build" --target ggml-cpu -j "$jobs"
    ) > "$lib.partial/build.log" 2>&1 || die "the cross build failed: see $lib.partial/build.log"
    cp "$lib.partial"/build/bin/libggml-cpu.so.*.*.* "$lib.partial/libggml-cpu.so"
    rm -rf "$lib.partial/llama.cpp" "$lib.partial/build"
    mv -T "$lib.partial" "$lib"
  fi
  cpu_library[$variant]=${lib#"$cache/"}/libggml-cpu.so
done

# The other pins, as PyPI's aarch64 wheels for the root file system's Python.
requirements=$(grep -v '^llama-cpp-python==' requirements.txt)
wheels=wheels-$(key "$requirements" "$python_tag")
if [ ! -d "$cache/$wheels" ]; then
  cold "the aarch64 wheels"
  say "downloading the aarch64 wheels of requirements.txt for Python $python_tag"
  fresh_partial "$cache/$wheels"
  # pip takes --platform literally: every manylinux level up to bookworm's glibc (2.36) is named
  platforms=$(for minor in $(seq 36 -1 17); do echo "--platform manylinux_2_${minor}_aarch64"; done)
  # shellcheck disable=SC2086
  python3 -m pip download --quiet --only-binary=:all: $platforms --platform manylinux2014_aarch64 \
    --python-version "$python_tag" --implementation cp -d "$cache/$wheels.partial" -r <(echo "$requirements") \
    2>&1 | grep -v "^WARNING: Location" || true
  ls "$cache/$wheels.partial"/numpy-*.whl > /dev/null || die "pip download of the aarch64 wheels failed"
  echo "$requirements" > "$cache/$wheels.partial/requirements.txt"
  mv -T "$cache/$wheels.partial" "$cache/$wheels"
fi

# Everything below runs inside the root file system, under qemu's model of the CPU of variant $1, with no network
# (a loopback only), a fresh /tmp and a fresh bridge cache (so the bridge is compiled there each time, as on first use).
in_aarch64() {
  local variant=$1
  shift
  for core in 0 1; do
    printf 'processor\t: %s\nFeatures\t: %s\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\n' \
      "$core" "${cpu_features[$variant]}"
    printf 'CPU part\t: %s\nCPU revision\t: 1\n\n' "${cpu_part[$variant]}"
  done > "$out/.cpuinfo-$variant"
  QEMU_CPU=${qemu_cpu[$variant]} unshare --mount --net --propagation private bash -ec '
    root=$1 cache=$2 out=$3 shared=$4 variant=$5
    shift 5
    ip link set lo up
    mount -t proc proc "$root/proc"
    mount --bind "$out/.cpuinfo-$variant" "$root/proc/cpuinfo"
    mount --rbind /dev "$root/dev"
    mount --rbind /sys "$root/sys"
    mount -t tmpfs tmpfs "$root/tmp"
    mount --bind "$cache" "$root/mnt/cache"
    mount --bind "$out" "$root/mnt/out"
    [ -d "$shared" ] && mount --bind -o ro "$shared" "$root/mnt/shared"
    exec chroot "$root" /usr/bin/env -i QEMU_CPU="$QEMU_CPU" HOME=/root LANG=C.UTF-8 XDG_CACHE_HOME=/tmp/cache \
      PATH=/opt/venv/bin:/usr/bin:/bin MOSS_SHARED_DIR=/mnt/shared MOSS_REQUIRE_CODEC_TINY="${MOSS_REQUIRE_CODEC_TINY-}" \
      /bin/bash -ec "cd /src && $*"
  ' in_aarch64 "$root" "$cache" "$out" "$shared" "$variant" "$@"
}

if [ ! -f "$root/opt/venv/$wheels" ]; then
  cold "the root file system's venv"
  say "installing the wheels into $root/opt/venv (emulated)"
  rm -rf "$root/opt/venv"
  mkdir -p "$out"
  in_aarch64 orin "python3 -m venv /opt/venv && pip install --quiet --no-index --find-links /mnt/cache/$wheels \
    -r /mnt/cache/$wheels/requirements.txt && touch /opt/venv/$wheels"
fi
if $prepare; then
  say "prepared: $cache holds all the check needs ($(du -sh "$cache" | cut -f1))"
  exit 0
fi

# This checkout's files (tracked and untracked, not ignored), and nothing built here.
rm -rf "$root/src" "$out"
mkdir -p "$root/src" "$out"
git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} find {} -maxdepth 0 -type f -print0 \
  | tar --null -T - -cf - | tar -xf - -C "$root/src"

say "x86-64: the real-width layer's GGUFs, their hidden states, the demo"
demo_text=${DEMO_TEXT:-$(sed -n 's/^DEMO_TEXT ?= //p' Makefile)}
demo() {  # what `make demo` does, with the tokens saved and into $1
  echo "python -m moss_tts_node demo-weights $1/demo_weights > /dev/null &&
    python -m moss_tts_node build-stream-decoder $1/demo_weights/codec_checkpoint \
      --out $1/demo_weights/codec/decoder_stream.onnx --force > /dev/null &&
    python -m moss_tts_node synth --config $1/demo_weights/config.yaml --text '$demo_text' \
      --output $1/demo.wav --seed 1 --save-tokens $1/tokens.npz"
}
(
  PATH=$src/$venv/bin:$PATH
  python test/cross_arch.py write "$out/gguf"
  # shellcheck disable=SC2086
  python test/cross_arch.py decode "$out/gguf" "$out/x86-64" $types > "$out/x86-64.log"
  bash -ec "$(demo "$out/x86-64")" >> "$out/x86-64.log"
  python test/cross_arch.py speak "$out/x86-64/demo_weights" "$out/x86-64" --text "$demo_text" \
    --codes "$out/x86-64/tokens.npz" >> "$out/x86-64.log"
)
say "x86-64: $(grep '^system_info' "$out/x86-64.log")"

failed=()
for variant in "${variants[@]}"; do
  say "$variant (QEMU_CPU=${qemu_cpu[$variant]}): install, hidden states, demo (emulated)"
  swap=":"
  if [ -n "${cpu_library[$variant]-}" ]; then
    swap="for f in /opt/venv/lib/python*/site-packages/{llama_cpp/,}lib/libggml-cpu.so*; do
      cp /mnt/cache/${cpu_library[$variant]} \$f; done"
  fi
  if ! in_aarch64 "$variant" "
    pip install --quiet --no-index --no-deps --force-reinstall /mnt/cache/$llama_wheel
    $swap
    pip install --quiet --no-index --no-deps --no-build-isolation -e .
    python test/cross_arch.py decode /mnt/out/gguf /mnt/out/$variant $types
    $(demo "/mnt/out/$variant")
    python test/cross_arch.py speak /mnt/out/$variant/demo_weights /mnt/out/$variant --text '$demo_text' \
      --codes /mnt/out/x86-64/tokens.npz" > "$out/$variant.log" 2>&1; then
    failed+=("$variant (see $out/$variant.log)")
  fi
  tail -n 5 "$out/$variant.log"
  say "$variant: $(grep '^system_info' "$out/$variant.log" || echo 'no system_info line')"
done

say "comparing with x86-64"
(cd test && "$src/$venv/bin/python" cross_arch.py compare "$out/x86-64" "${variants[@]/#/$out/}") | tee "$out/compare.txt" \
  || failed+=("the comparison (see $out/compare.txt)")

say "orin: the core's tests (emulated): $(echo $core_tests)"
# shellcheck disable=SC2086
if [ -n "$core_tests" ] && ! in_aarch64 orin "
    pip install --quiet --no-index --no-deps --force-reinstall /mnt/cache/$llama_wheel
    pip install --quiet --no-index --no-deps --no-build-isolation -e .
    python -m pytest -q -p no:cacheprovider $(printf 'test/%s ' $core_tests)" 2>&1 | tee "$out/tests.log"; then
  failed+=("the tests (see $out/tests.log)")
fi
[ ${#failed[@]} -eq 0 ] || die "failed under emulation: ${failed[*]}"
say "done: all within tolerance, all tests passed"
