#!/usr/bin/env bash
# What the playback tests need beyond the venv: PortAudio and a PulseAudio server to play into a null
# sink (the tests start their own). Installs them with apt-get as root on Debian/Ubuntu; elsewhere it
# says why and exits 0, and those tests skip with the reason.
set -euo pipefail
PACKAGES=(libportaudio2 pulseaudio pulseaudio-utils libasound2-plugins)
if command -v pulseaudio >/dev/null && command -v parec >/dev/null && ldconfig -p | grep -q libportaudio.so.2; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "audio_test_deps: not root with apt-get: install ${PACKAGES[*]} by hand, or the playback tests skip" >&2
    exit 0
fi
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" \
    || echo "audio_test_deps: apt-get failed: the playback tests skip" >&2
