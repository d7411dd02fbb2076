"""By hand (docs/http.md, "Formats"): the encoders' cost per second of audio and the audio a first byte waits for,
PyAV (http/formats.py) against libsndfile (soundfile) where libsndfile writes the format.

    PYTHONPATH=. python test/http_helpers/encode_bench.py [RATE CHANNELS]

The audio is 10 s of a tone and noise, given in 80 ms chunks as the server gives a stream's; libsndfile writes into
memory and its new bytes are taken after each chunk.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable

import numpy as np
import soundfile as sf

from moss_tts_node.http.formats import Encoder

SECONDS = 10.0
LIBSNDFILE = {"mp3": ("MP3", "MPEG_LAYER_III"), "opus": ("OGG", "OPUS"), "flac": ("FLAC", "PCM_16")}

Encode = Callable[[np.ndarray], bytes]


def audio(rate: int, channels: int) -> np.ndarray:
    t = np.arange(int(rate * SECONDS)) / rate
    rng = np.random.default_rng(0)
    mono = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    return mono if channels == 1 else np.stack([mono] * channels, axis=1)


def measured(encode: Encode, close: Callable[[], object], samples: np.ndarray, rate: int) -> tuple[float, float]:
    """ms of encoding per second of audio, and ms of audio given before the first byte came out."""
    step = rate * 8 // 100
    first = None
    started = time.perf_counter()
    for i in range(0, samples.shape[0], step):
        if encode(samples[i : i + step]) and first is None:
            first = i + step
    close()
    spent = time.perf_counter() - started
    return spent * 1000 / SECONDS, (first or samples.shape[0]) * 1000 / rate


def libsndfile(fmt: str, rate: int, channels: int) -> tuple[Encode, Callable[[], None]]:
    """libsndfile writing ``fmt`` into memory: a chunk in, the bytes it added out; and its close."""
    buffer = io.BytesIO()
    kind, subtype = LIBSNDFILE[fmt]
    out = sf.SoundFile(buffer, "w", rate, channels, subtype, format=kind)
    taken = 0

    def encode(samples: np.ndarray) -> bytes:
        nonlocal taken
        out.write(samples)
        new = buffer.getbuffer()[taken:].tobytes()
        taken += len(new)
        return new

    return encode, out.close


def main(rate: int, channels: int) -> None:
    samples = audio(rate, channels)
    for fmt in ("mp3", "opus", "aac", "flac", "wav"):
        encoder = Encoder(fmt, rate, channels)
        cost, first = measured(encoder.encode, encoder.close, samples, rate)
        print(f"PyAV       {fmt:5} {cost:6.1f} ms/s  first byte after {first:5.0f} ms of audio")
        if fmt in LIBSNDFILE:
            cost, first = measured(*libsndfile(fmt, rate, channels), samples, rate)
            print(f"libsndfile {fmt:5} {cost:6.1f} ms/s  first byte after {first:5.0f} ms of audio")


if __name__ == "__main__":
    main(*((int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (24000, 1)))
