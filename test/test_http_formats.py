"""The speech API's audio bodies (http/formats.py) without a socket, read back by decoders nobody here wrote: FFmpeg's
(through PyAV) for every format and libsndfile for WAV and FLAC. Each streams: its bytes begin with the first
chunk, and a body cut after a chunk decodes as far as it goes; at any rate and channel count; at a speed, with the
pitch kept."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("av", reason="the [http] extra is not installed: pip install -r requirements-http.txt")

import av

from moss_tts_node.http.api import FORMATS
from moss_tts_node.http.formats import Encoder, tempo_factors, wav_header, whole_body
from moss_tts_node.pcm import float_to_pcm16

TONE_HZ = 440.0


def tone(rate: int, seconds: float, channels: int) -> np.ndarray:
    """A 440 Hz tone, (n,) for one channel, (n, channels) for more (each channel quieter than the last)."""
    t = np.arange(int(rate * seconds)) / rate
    mono = (0.4 * np.sin(2 * np.pi * TONE_HZ * t)).astype(np.float32)
    return mono if channels == 1 else np.stack([mono / (1 + c) for c in range(channels)], axis=1)


def streamed(response_format: str, samples: np.ndarray, rate: int, speed: float = 1.0) -> tuple[list[bytes], bytes]:
    """The body as the server sends it, chunk by chunk (80 ms each), and the encoder's last bytes."""
    channels = 1 if samples.ndim == 1 else samples.shape[1]
    encoder = Encoder(response_format, rate, channels, speed)
    step = rate * 8 // 100
    return [encoder.encode(samples[i : i + step]) for i in range(0, samples.shape[0], step)], encoder.close()


def decoded(body: bytes) -> tuple[np.ndarray, int, int]:
    """FFmpeg's decode of a body: (channels, n) samples (in the decoder's own type), the rate and the channel count
    it reports."""
    with av.open(io.BytesIO(body)) as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray() for frame in container.decode(stream)]
        rate, channels = stream.codec_context.sample_rate, stream.codec_context.channels
    planar = [f if f.shape[0] == channels else f.reshape(-1, channels).T for f in frames]
    return np.concatenate(planar, axis=1), rate, channels


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[np.argmax(spectrum)])


COMPRESSED = [name for name in FORMATS if name != "pcm"]


@pytest.mark.parametrize("response_format", COMPRESSED)
@pytest.mark.parametrize(("rate", "channels"), [(24000, 1), (48000, 2), (44100, 1)])
def test_every_format_streams_and_decodes_at_the_audios_rate_and_channels(
    response_format: str, rate: int, channels: int
) -> None:
    samples = tone(rate, 1.0, channels)
    pieces, tail = streamed(response_format, samples, rate)
    assert any(pieces[:3]), "no bytes in the first 240 ms: the format would not stream"
    body = b"".join(pieces) + tail
    audio, decoded_rate, decoded_channels = decoded(body)
    assert decoded_channels == channels
    assert decoded_rate == (48000 if response_format == "opus" else rate)  # Ogg Opus decodes at 48 kHz
    assert audio.shape[1] / decoded_rate == pytest.approx(1.0, abs=0.1)
    assert dominant_hz(audio[0], decoded_rate) == pytest.approx(TONE_HZ, abs=5)
    if channels == 2:  # the channels are not swapped nor mixed
        assert np.abs(audio[1]).max() == pytest.approx(np.abs(audio[0]).max() / 2, rel=0.2)
    half = decoded(b"".join(pieces[: len(pieces) // 2]))[0]  # what a client has half-way decodes
    assert half.shape[1] > 0
    whole, _, _ = decoded(whole_body(samples, rate, response_format))  # an MP3's Xing header trims the codec's delay
    assert whole.shape[1] / decoded_rate == pytest.approx(audio.shape[1] / decoded_rate, abs=0.1)


def test_the_lossless_bodies_hold_the_samples_exactly() -> None:
    samples = tone(24000, 0.3, 1)
    pcm = float_to_pcm16(samples)
    assert whole_body(samples, 24000, "pcm") == pcm
    for response_format in ("wav", "flac"):
        read, rate = sf.read(io.BytesIO(whole_body(samples, 24000, response_format)), dtype="int16")
        assert rate == 24000
        np.testing.assert_array_equal(read, np.frombuffer(pcm, "<i2"))
    pieces, tail = streamed("wav", samples, 24000)
    stream = b"".join(pieces) + tail
    streamed_flac, _, _ = decoded(b"".join(streamed("flac", samples, 24000)[0]) + streamed("flac", samples, 24000)[1])
    np.testing.assert_array_equal(streamed_flac[0], np.frombuffer(pcm, "<i2"))  # FFmpeg's FLAC decodes to int16
    assert stream[:44] == wav_header(24000, 1)  # sizes unknown: readers take the data to the end
    read, _ = sf.read(io.BytesIO(stream), dtype="int16")
    np.testing.assert_array_equal(read, np.frombuffer(pcm, "<i2"))


def test_stereo_pcm_is_interleaved() -> None:
    samples = tone(48000, 0.1, 2)
    read, rate = sf.read(io.BytesIO(whole_body(samples, 48000, "wav")), dtype="float32")
    assert rate == 48000 and read.shape == samples.shape
    np.testing.assert_allclose(read, samples, atol=1 / 16000)


@pytest.mark.parametrize("speed", [0.25, 0.5, 1.5, 4.0])
def test_a_speed_changes_the_length_and_keeps_the_pitch(speed: float) -> None:
    rate = 24000
    pieces, tail = streamed("wav", tone(rate, 2.0, 1), rate, speed)
    audio, _ = sf.read(io.BytesIO(b"".join(pieces) + tail), dtype="float32")
    assert audio.size / rate == pytest.approx(2.0 / speed, rel=0.05)
    assert dominant_hz(audio, rate) == pytest.approx(TONE_HZ, abs=5)


def test_speeds_outside_one_atempo_are_chained() -> None:
    for speed in (0.25, 0.3, 1.0, 3.9, 4.0):
        factors = tempo_factors(speed)
        assert all(0.5 <= f <= 2.0 for f in factors) and np.prod(factors) == pytest.approx(speed)
