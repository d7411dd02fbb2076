#!/usr/bin/env bash
# The package on aarch64 (a Jetson Orin's CPU, an ARM server's), emulated with qemu-user on an x86-64 Debian host:
#
#   scripts/aarch64_check.sh            # `make aarch64-check`; as root (chroot, mount namespaces)
#   scripts/aarch64_check.sh --prepare  # only build what the check needs into the cache
#   scripts/aarch64_check.sh --ci       # CI's part; skips, saying why, only where the host cannot emulate aarch64
#
# It builds what it needs, each piece cached under $MOSS_AARCH64_CACHE (default ~/.cache/moss_tts_node/aarch64) by
# what makes it differ, all at native speed, none of it emulated: an arm64 Debian bookworm root file system (its
# python3 and what that depends on, fetched by an apt of its own and unpacked with dpkg-deb: nothing there needs
# configuring); llama.cpp and ggml from llama-cpp-python's sdist, cross-compiled once per CPU below (-march of
# GGML_CPU_ARM_ARCH instead of GGML_NATIVE's -mcpu=native), laid out as its wheel installs them; the other
# requirements.txt pins as PyPI's aarch64 wheels, installed by the host's pip into a venv of that file system; the
# bridge, cross-compiled from this checkout on each run. Then, in the root file system, without network, under
# qemu's model of each CPU:
#   orin    QEMU_CPU=cortex-a76  built for armv8.2-a+dotprod+fp16: an Orin's Cortex-A78AE (no SVE, no i8mm),
#           also a Raspberry Pi 5's Cortex-A76
#   server  QEMU_CPU=max with 256-bit SVE, built for armv8.4-a+...+sve+i8mm: a Neoverse-V1 (Graviton3)
# it decodes one real-width GGUF layer in F32, F16, Q8_0, Q4_0 and Q4_K_M and runs `make demo`'s synthesis, and
# test/cross_arch.py compares both with the same done by the x86-64 venv ($VENV, default .venv). Under orin it
# also runs the core's tests (all but ROS and playback). --ci: both CPUs, the quantized types, the demo and of
# the tests only CI_TESTS, from whatever the cache holds (from nothing too: docs/development.md, "aarch64, emulated").
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
# python3 for the package; bash, coreutils and dash for the commands run there (and /bin/sh); libgomp1 and
# libstdc++6 for llama.cpp (OpenMP, C++) and ONNX Runtime. No compiler: the bridge comes cross-compiled.
root_packages="python3 bash coreutils dash libgomp1 libstdc++6"
host_packages=(qemu-user-static binfmt-support debian-archive-keyring gcc-aarch64-linux-gnu g++-aarch64-linux-gnu
  cmake)
read -r -a variants <<< "${AARCH64_VARIANTS:-orin server}"  # a subset by hand: AARCH64_VARIANTS=server
declare -A arm_arch=([orin]=armv8.2-a+dotprod+fp16 [server]=armv8.4-a+dotprod+fp16+sve+i8mm)
declare -A qemu_cpu=([orin]=cortex-a76 [server]=max,sve-default-vector-length=32)
# /proc/cpuinfo as each CPU's Linux writes it (an A78AE's part number, a Neoverse-V1's): qemu-user shows the x86-64
# host's, on which ONNX Runtime 1.32.0's cpuinfo segfaults at import (docs/development.md, "aarch64, emulated").
declare -A cpu_part=([orin]=0xd42 [server]=0xd40)
arm_features="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
declare -A cpu_features=([orin]="$arm_features" [server]="$arm_features sha3 sha512 sve asimdfhm svei8mm i8mm bf16")
# The core: every test that needs neither ROS nor a sound device. CI_TESTS: what fits CI's time (--ci).
core_tests=$(cd test && ls test_*.py | grep -vE '^test_(ros_|playback)')
CI_TESTS="test_sampling.py test_delay.py test_heads.py test_pcm.py test_nano_local.py"
$ci && core_tests=$CI_TESTS
core_tests=${AARCH64_TESTS-$core_tests}  # by hand: another list of test files, or "" for none
types=""  # test/cross_arch.py decode's default: all
$ci && types="--types Q8_0 Q4_0 Q4_K_M"

say() { echo "aarch64_check [${SECONDS}s]: $*"; }
die() { echo "aarch64_check: $*" >&2; exit 1; }
# What the host cannot do at all: under --ci a skip that says why (CI goes on), else a failure.
cannot() {
  if $ci; then
    say "skipped: $*"
    exit 0
  fi
  die "$*"
}

[ "$(uname -m)" = x86_64 ] \
  || cannot "this check emulates aarch64 on an x86-64 host; on an aarch64 machine run \`make test\`"
[ "$(id -u)" = 0 ] || cannot "not root: the chroot and the mount namespaces need it"
[ -x "$venv/bin/python" ] || die "no x86-64 venv at $venv to compare with: run \`make venv\` first"

missing=()
for tool in qemu-aarch64-static update-binfmts aarch64-linux-gnu-gcc aarch64-linux-gnu-g++ cmake; do
  command -v "$tool" > /dev/null || missing+=("$tool")
done
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get > /dev/null || cannot "missing ${missing[*]} and no apt-get: install ${host_packages[*]}"
  say "installing ${host_packages[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${host_packages[@]}"
fi
# The kernel runs aarch64 programs through qemu only when binfmt_misc says so; "F" (fix binary) makes that work
# inside a chroot. Containers without systemd mount and register it here; one that may not has no qemu-user.
binfmt=/proc/sys/fs/binfmt_misc
[ -e $binfmt/register ] || mount -t binfmt_misc binfmt_misc $binfmt \
  || cannot "binfmt_misc cannot be mounted here, so the kernel cannot hand aarch64 programs to qemu"
[ -e $binfmt/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
grep -q '^flags:.*F' $binfmt/qemu-aarch64 \
  || die "binfmt_misc's qemu-aarch64 entry lacks the F flag (a chroot cannot reach qemu): reinstall qemu-user-static"

key() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }
# Build into DIR.partial, then rename: an interrupted build is never taken for a finished one.
fresh_partial() { rm -rf "$1.partial" && mkdir -p "$1.partial"; }
mkdir -p "$cache"

root=$cache/rootfs-$(key "$suite" "$mirror" "$root_packages")
if [ ! -d "$root" ]; then
  say "arm64 $suite: $root_packages and what they depend on, unpacked into $root"
  fresh_partial "$root"
  # An apt of its own, for arm64: none of the host's configuration, package lists or dpkg database, and an empty
  # status file, so that it fetches the whole closure of what is asked for.
  apt=$root.partial.apt
  rm -rf "$apt" && mkdir -p "$apt"/{etc,state/lists/partial,cache/archives/partial}
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" > "$apt/etc/sources.list"
  touch "$apt/status"
  apt_arm64=(apt-get -qq -o Dir::Etc="$apt/etc" -o Dir::State="$apt/state" -o Dir::State::status="$apt/status"
    -o Dir::Cache="$apt/cache" -o APT::Architecture=arm64 -o APT::Architectures::=arm64 -o Debug::NoLocking=1)
  # shellcheck disable=SC2086
  { "${apt_arm64[@]}" update && "${apt_arm64[@]}" install -y --download-only --no-install-recommends $root_packages; } \
    > "$cache/apt.log" 2>&1 || die "fetching the arm64 packages failed: see $cache/apt.log"
  # Unpacked only: their maintainer scripts (what debootstrap's second stage runs, emulated) set up nothing that
  # python3, a venv and the shell need.
  for deb in "$apt"/cache/archives/*.deb; do
    dpkg-deb -x "$deb" "$root.partial"
  done
  rm -rf "$apt"
  mkdir -p "$root.partial"/{mnt/out,mnt/shared,src}
  mv -T "$root.partial" "$root"
fi
python_tag=$(readlink "$root/usr/bin/python3")  # python3.11
python_tag=${python_tag#python}

# llama.cpp and ggml as llama-cpp-python's CMakeLists builds them (shared libraries with a $ORIGIN rpath, no curl),
# for one CPU, without what neither its bindings nor the bridge load (llama-common; mtmd, which LLAVA_BUILD=OFF
# drops too): `build_llama VARIANT TARGET DIR` builds that cmake target in DIR.
llama_version=$("$venv/bin/python" scripts/pins.py llama-cpp-python | sed 's/^llama-cpp-python==//')
sdist=$cache/sdist/llama_cpp_python-$llama_version.tar.gz
if [ ! -f "$sdist" ]; then
  say "downloading llama-cpp-python $llama_version's sdist"
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python -d "$cache/sdist" "llama-cpp-python==$llama_version"
fi
cross_compiler=$(aarch64-linux-gnu-gcc --version | head -n 1)
jobs=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
build_llama() {
  local variant=$1 target=$2 dir=$3
  tar -xzf "$sdist" -C "$dir" --strip-components=2 "llama_cpp_python-$llama_version/vendor/llama.cpp"
  # shellcheck disable=SC2016  # $ORIGIN is the dynamic loader's, not the shell's
  cmake -S "$dir/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH="${arm_arch[$variant]}" \
    -DCMAKE_INSTALL_RPATH='$ORIGIN' -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
    -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
    -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
    && cmake --build "$dir/build" --target "$target" -j "$jobs"
}
llama=$cache/llama-$(key "$llama_version" "$cross_compiler" "${arm_arch[orin]}")
if [ ! -d "$llama" ]; then
  say "cross-compiling llama.cpp $llama_version for orin (-march=${arm_arch[orin]}) into $llama"
  fresh_partial "$llama"
  build_llama orin llama "$llama.partial" > "$llama.partial/build.log" 2>&1 \
    || die "the cross build failed: see $llama.partial/build.log"
  # What llama-cpp-python's wheel puts into site-packages: the bindings, llama_cpp/lib, the C headers, and the
  # metadata that importlib.metadata reads (`doctor`'s llama-cpp-python line).
  site=$llama.partial/site-packages
  mkdir -p "$site/llama_cpp/lib" "$site/include" "$site/llama_cpp_python-$llama_version.dist-info"
  tar -xzf "$sdist" -C "$site" --strip-components=1 "llama_cpp_python-$llama_version/llama_cpp"
  cp -P "$llama.partial"/build/bin/lib*.so* "$site/llama_cpp/lib/"
  cp "$llama.partial"/llama.cpp/include/*.h "$llama.partial"/llama.cpp/ggml/include/*.h "$site/include/"
  printf 'Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: %s\n' "$llama_version" \
    > "$site/llama_cpp_python-$llama_version.dist-info/METADATA"
  rm -rf "$llama.partial/llama.cpp" "$llama.partial/build"
  mv -T "$llama.partial" "$llama"
fi
# -march reaches one library only: libggml-cpu (the kernels; ggml's CMake gives the others no ARCH_FLAGS). Another
# CPU gets that library built from the same source with its own -march, put over orin's.
declare -A cpu_library
for variant in "${variants[@]}"; do
  [ "$variant" = orin ] && continue
  lib=$cache/ggml-cpu-$variant-$(key "$llama_version" "$cross_compiler" "${arm_arch[$variant]}")
  if [ ! -d "$lib" ]; then
    say "cross-compiling libggml-cpu for $variant (-march=${arm_arch[$variant]}) into $lib"
    fresh_partial "$lib"
    build_llama "$variant" ggml-cpu "$lib.partial" > "$lib.partial/build.log" 2>&1 \
      || die "the cross build failed: see $lib.partial/build.log"
    cp "$lib.partial"/build/bin/libggml-cpu.so.*.*.* "$lib.partial/libggml-cpu.so"
    rm -rf "$lib.partial/llama.cpp" "$lib.partial/build"
    mv -T "$lib.partial" "$lib"
  fi
  cpu_library[$variant]=$lib/libggml-cpu.so
done

# The other pins, as PyPI's aarch64 wheels for the root file system's Python; pip takes --platform literally:
# every manylinux level up to bookworm's glibc (2.36) is named.
requirements=$("$venv/bin/python" scripts/pins.py --python "$python_tag" | grep -v '^llama-cpp-python==')
wheels=wheels-$(key "$requirements" "$python_tag")
aarch64_pip=(--only-binary=:all: --platform manylinux2014_aarch64 --python-version "$python_tag" --implementation cp)
for minor in $(seq 36 -1 17); do aarch64_pip+=(--platform "manylinux_2_${minor}_aarch64"); done
if [ ! -d "$cache/$wheels" ]; then
  say "downloading the aarch64 wheels of requirements.txt for Python $python_tag"
  fresh_partial "$cache/$wheels"
  python3 -m pip download --quiet "${aarch64_pip[@]}" -d "$cache/$wheels.partial" -r <(echo "$requirements") \
    2>&1 | grep -v "^WARNING: Location" || true
  ls "$cache/$wheels.partial"/numpy-*.whl > /dev/null || die "pip download of the aarch64 wheels failed"
  mv -T "$cache/$wheels.partial" "$cache/$wheels"
fi
# A venv as `python3 -m venv` lays it out, filled by the host's pip: installing a wheel is unpacking it, the same
# on either side. This checkout (/src there) is on its path as `pip install -e .` puts it.
site=/opt/venv/lib/python$python_tag/site-packages  # as the root file system sees it
if [ ! -f "$root/opt/venv/$wheels" ]; then
  say "installing the aarch64 wheels into $root/opt/venv"
  rm -rf "$root/opt/venv"
  mkdir -p "$root/opt/venv/bin"
  ln -s /usr/bin/python3 "$root/opt/venv/bin/python"
  ln -s python "$root/opt/venv/bin/python3"
  printf 'home = /usr/bin\ninclude-system-site-packages = false\n' > "$root/opt/venv/pyvenv.cfg"
  python3 -m pip install --quiet --no-index --find-links "$cache/$wheels" "${aarch64_pip[@]}" --target "$root$site" \
    -r <(echo "$requirements") 2>&1 | grep -v "^WARNING: \(Location\|Running pip as\)" || true
  [ -d "$root$site/numpy" ] || die "installing the aarch64 wheels into $root/opt/venv failed"
  echo /src > "$root$site/moss_tts_node.pth"
  touch "$root/opt/venv/$wheels"
fi
# `use_llama VARIANT`: that CPU's llama.cpp in the venv, as `pip install` of its wheel would leave it.
use_llama() {
  rm -rf "$root$site"/{llama_cpp,include,llama_cpp_python-*.dist-info}
  cp -a "$llama/site-packages/." "$root$site/"
  [ -z "${cpu_library[$1]-}" ] || cp "${cpu_library[$1]}" "$(readlink -f "$root$site/llama_cpp/lib/libggml-cpu.so")"
}

# Everything below runs inside the root file system, under qemu's model of the CPU of variant $1, with no network
# (a loopback only), a fresh /tmp, and the bridge cross-compiled from this checkout ($MOSS_TTS_BRIDGE_LIB).
in_aarch64() {
  local variant=$1
  shift
  for core in 0 1; do
    printf 'processor\t: %s\nFeatures\t: %s\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\n' \
      "$core" "${cpu_features[$variant]}"
    printf 'CPU part\t: %s\nCPU revision\t: 1\n\n' "${cpu_part[$variant]}"
  done > "$out/.cpuinfo-$variant"
  QEMU_CPU=${qemu_cpu[$variant]} unshare --mount --net --propagation private bash -ec '
    root=$1 out=$2 shared=$3 variant=$4
    shift 4
    ip link set lo up
    mount -t proc proc "$root/proc"
    mount --bind "$out/.cpuinfo-$variant" "$root/proc/cpuinfo"
    mount --rbind /dev "$root/dev"
    mount --rbind /sys "$root/sys"
    mount -t tmpfs tmpfs "$root/tmp"
    mount --bind "$out" "$root/mnt/out"
    [ -d "$shared" ] && mount --bind -o ro "$shared" "$root/mnt/shared"
    exec chroot "$root" /usr/bin/env -i QEMU_CPU="$QEMU_CPU" HOME=/root LANG=C.UTF-8 XDG_CACHE_HOME=/tmp/cache \
      PATH=/opt/venv/bin:/usr/bin:/bin MOSS_SHARED_DIR=/mnt/shared MOSS_REQUIRE_CODEC_TINY="${MOSS_REQUIRE_CODEC_TINY-}" \
      MOSS_TTS_BRIDGE_LIB=/mnt/out/libmoss_bridge.so /bin/bash -ec "cd /src && $*"
  ' in_aarch64 "$root" "$out" "$shared" "$variant" "$@"
}

if $prepare; then
  say "prepared: $cache holds all the check needs ($(du -sh "$cache" | cut -f1))"
  exit 0
fi

# This checkout's files (tracked and untracked, not ignored), and nothing built here.
rm -rf "$root/src" "$out"
mkdir -p "$root/src" "$out"
git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} find {} -maxdepth 0 -type f -print0 \
  | tar --null -T - -cf - | tar -xf - -C "$root/src"
say "cross-compiling the bridge into $out/libmoss_bridge.so"
"$venv/bin/python" - "$llama/site-packages" "$site/llama_cpp/lib" "$out/libmoss_bridge.so" << 'EOF'
import subprocess
import sys
from pathlib import Path

from moss_tts_node.llama.bridge import bridge_source_dir, compile_command

built, rpath, library = map(Path, sys.argv[1:])
command = compile_command(
    ["aarch64-linux-gnu-gcc"], bridge_source_dir(), built / "include", built / "llama_cpp/lib", rpath
)
subprocess.run([*command, "-o", str(library)], check=True)
EOF

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
  say "$variant (QEMU_CPU=${qemu_cpu[$variant]}): hidden states, demo (emulated)"
  use_llama "$variant"
  if ! in_aarch64 "$variant" "
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
use_llama orin
# shellcheck disable=SC2086
if [ -n "$core_tests" ] && ! in_aarch64 orin "
    python -m pytest -q -p no:cacheprovider $(printf 'test/%s ' $core_tests)" 2>&1 | tee "$out/tests.log"; then
  failed+=("the tests (see $out/tests.log)")
fi
[ ${#failed[@]} -eq 0 ] || die "failed under emulation: ${failed[*]}"
say "done: all within tolerance, all tests passed"
