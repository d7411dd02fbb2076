"""The speech API's audio bodies, each written as the audio is generated: MP3, Opus (in Ogg), AAC (ADTS), FLAC,
WAV and raw PCM, at the audio's own sample rate and channels, at the speed a request asks for.

PyAV (FFmpeg's libraries, bundled in its wheels) encodes and muxes the compressed formats. A streamed body goes
into a sink that is not seekable, so that each muxer writes what a stream can hold: an MP3 without a Xing header,
an Ogg whose pages are cut every ``_OGG_PAGE_US``, ADTS frames, a FLAC whose STREAMINFO says "length unknown"; a
whole one into memory, where the muxers go back to write the length. WAV and PCM are S16LE from
``pcm.py``, as everywhere else; a streamed WAV's header comes before its length is known, so its sizes say "as
long as the stream", 0xFFFFFFFF, as OpenAI's API sends them. A speed other than 1 goes through FFmpeg's ``atempo``
filter first (WSOLA: the pitch is kept), chained for factors outside its 0.5 to 2 (docs/http.md, "Formats").
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np

from moss_tts_node.pcm import channels_of, float_to_pcm16

_UNKNOWN_SIZE = 0xFFFFFFFF
_HEADER_BYTES = 44
_OGG_PAGE_US = 100_000  # an Ogg page at least every 100 ms of audio (FFmpeg's default is 1 s)
_ATEMPO_RANGE = (0.5, 2.0)  # what one atempo filter takes


@dataclass(frozen=True)
class Codec:
    """How PyAV writes one compressed format: FFmpeg's muxer and encoder, the bit rate per channel (None: the
    encoder's own, lossless FLAC), and the muxer's options."""

    muxer: str
    encoder: str
    bit_rate: int | None
    options: dict[str, str] = field(default_factory=dict)


CODECS = {
    "mp3": Codec("mp3", "libmp3lame", 64_000, {"id3v2_version": "0"}),
    "opus": Codec("ogg", "libopus", 32_000, {"page_duration": str(_OGG_PAGE_US)}),
    "aac": Codec("adts", "aac", 64_000),
    "flac": Codec("flac", "flac", None),
}


def wav_header(sample_rate: int, channels: int, frames: int | None = None) -> bytes:
    """The 44-byte header of an S16LE WAV of ``frames`` frames (None: not known yet, a stream)."""
    block = 2 * channels
    data = _UNKNOWN_SIZE if frames is None else frames * block
    riff = _UNKNOWN_SIZE if frames is None else data + _HEADER_BYTES - 8
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, 16)
        + b"data"
        + struct.pack("<I", data)
    )


class Encoder:
    """One response's audio: float samples in (``encode``, chunk by chunk), its format's bytes out as soon as the
    encoder gives them, then the rest (``close``: the codec's delay and the container's trailer)."""

    def __init__(
        self, response_format: str, sample_rate: int, channels: int, speed: float = 1.0, whole: bool = False
    ) -> None:
        self.response_format = response_format
        self.sample_rate = sample_rate
        self.channels = channels
        self._tempo = _Tempo(sample_rate, channels, speed) if speed != 1.0 else None
        codec = CODECS.get(response_format)
        self._codec = None if codec is None else _Muxed(codec, sample_rate, channels, whole)
        self._started = False

    def encode(self, samples: np.ndarray) -> bytes:
        if self._tempo is None:
            return self._write(samples)
        return b"".join(self._write(piece) for piece in self._tempo.push(samples))

    def close(self) -> bytes:
        tail = b"" if self._tempo is None else b"".join(self._write(piece) for piece in self._tempo.push(None))
        if self._codec is not None:
            tail += self._codec.close()
        return self._header() + tail

    def _write(self, samples: np.ndarray) -> bytes:
        if self._codec is not None:
            return self._codec.encode(samples)
        return self._header() + float_to_pcm16(samples.reshape(-1))  # (n, channels) row-major: interleaved

    def _header(self) -> bytes:
        """A streamed WAV's header, before its first samples."""
        if self._started or self.response_format != "wav":
            return b""
        self._started = True
        return wav_header(self.sample_rate, self.channels)


def whole_body(samples: np.ndarray, sample_rate: int, response_format: str, speed: float = 1.0) -> bytes:
    """A whole utterance's body; a WAV's header then holds its length."""
    encoder = Encoder(response_format, sample_rate, channels_of(samples), speed, whole=True)
    body = encoder.encode(samples) + encoder.close()
    if response_format == "wav":
        frames = (len(body) - _HEADER_BYTES) // (2 * encoder.channels)
        body = wav_header(sample_rate, encoder.channels, frames) + body[_HEADER_BYTES:]
    return body


class _Sink(io.RawIOBase):
    """Where a muxer writes: kept until taken, and not seekable, so that it writes what a stream can hold."""

    def __init__(self) -> None:
        self._data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._data += data
        return len(data)

    def take(self) -> bytes:
        out = bytes(self._data)
        self._data.clear()
        return out


def _layout(channels: int) -> str:
    """FFmpeg's name of the layout of ``channels`` channels ("3c": three, in no order it names)."""
    return {1: "mono", 2: "stereo"}.get(channels, f"{channels}c")


def _frame(samples: np.ndarray, sample_rate: int, channels: int, pts: int, s16: bool = False) -> av.AudioFrame:
    """Float samples, (n,) or (n, channels), as a packed frame: of floats, or ``s16`` of S16 from ``pcm.py`` (so
    that a lossless format holds the samples WAV and PCM hold)."""
    if s16:
        interleaved = np.frombuffer(float_to_pcm16(samples.reshape(-1)), "<i2").reshape(1, -1)
    else:
        interleaved = np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(interleaved, format="s16" if s16 else "flt", layout=_layout(channels))
    frame.sample_rate = sample_rate
    frame.pts = pts
    frame.time_base = Fraction(1, sample_rate)
    return frame


class _Muxed:
    """A compressed format: PyAV's encoder (which re-cuts frames to its frame size, and resamples where the codec
    does not take the rate, as Opus takes none of 44.1 kHz) and muxer, into a ``_Sink`` (a stream) or memory (a
    ``whole`` body, given at ``close``)."""

    def __init__(self, codec: Codec, sample_rate: int, channels: int, whole: bool) -> None:
        self._whole = io.BytesIO() if whole else None
        self._sink = _Sink()
        sink = self._sink if self._whole is None else self._whole
        self._container = av.open(sink, "w", format=codec.muxer, options=codec.options)
        encoder = av.codec.Codec(codec.encoder, "w")
        rates = encoder.audio_rates
        self._s16 = not {"flt", "fltp"} & {f.name for f in encoder.audio_formats or ()}  # FLAC: integers only
        rate = sample_rate if not rates or sample_rate in rates else min(r for r in rates if r >= sample_rate)
        self._stream = self._container.add_stream(codec.encoder, rate=rate, layout=_layout(channels))
        if codec.bit_rate is not None:
            self._stream.bit_rate = codec.bit_rate * channels
        self._sample_rate = sample_rate
        self._channels = channels
        self._pts = 0

    def encode(self, samples: np.ndarray) -> bytes:
        if samples.shape[0]:
            frame = _frame(samples, self._sample_rate, self._channels, self._pts, self._s16)
            self._pts += samples.shape[0]
            self._container.mux(self._stream.encode(frame))
        return self._sink.take()

    def close(self) -> bytes:
        self._container.mux(self._stream.encode(None))
        self._container.close()
        return self._sink.take() if self._whole is None else self._whole.getvalue()


def tempo_factors(speed: float) -> list[float]:
    """``speed`` as atempo factors, each in the 0.5 to 2 one filter takes, whose product is ``speed``."""
    low, high = _ATEMPO_RANGE
    factors = []
    while speed > high:
        factors.append(high)
        speed /= high
    while speed < low:
        factors.append(low)
        speed /= low
    return [*factors, speed]


class _Tempo:
    """FFmpeg's atempo filters over a stream of float samples: the same pitch, ``speed`` times as fast."""

    def __init__(self, sample_rate: int, channels: int, speed: float) -> None:
        self._graph = av.filter.Graph()
        layout = _layout(channels)
        nodes = [
            self._graph.add_abuffer(
                format="flt", sample_rate=sample_rate, layout=layout, time_base=Fraction(1, sample_rate)
            )
        ]
        nodes += [self._graph.add("atempo", f"{factor:.6f}") for factor in tempo_factors(speed)]
        nodes.append(self._graph.add("aformat", "sample_fmts=flt"))
        nodes.append(self._graph.add("abuffersink"))
        self._graph.link_nodes(*nodes).configure()
        self._sample_rate = sample_rate
        self._channels = channels
        self._pts = 0

    def push(self, samples: np.ndarray | None) -> Iterator[np.ndarray]:
        """Filter ``samples`` (None: the end, flushing what the filters hold); the samples they give back."""
        if samples is None:
            self._graph.push(None)
        elif samples.shape[0]:
            self._graph.push(_frame(samples, self._sample_rate, self._channels, self._pts))
            self._pts += samples.shape[0]
        while True:
            try:
                frame = self._graph.pull()
            except (av.BlockingIOError, av.EOFError):
                return
            out = frame.to_ndarray().reshape(-1, self._channels)
            yield out[:, 0] if self._channels == 1 else out
