"""The audio the package gives out: the model's, or converted to the rate and channels the owner asks for.

``audio.output_sample_rate`` and ``audio.output_channels`` (config.py) say what leaves the synthesizer; every
adapter (the node, the CLI, the Python API, ``serve``) reads its chunks from there, so this is applied once, to the
stream, in ``Synthesizer`` (docs/usage.md, "Output audio"). Left at their defaults nothing is touched: the
model's own samples go out as they were decoded (MOSS-TTS 24 kHz mono, MOSS-TTS-Nano 48 kHz stereo).

- **Rate**: soxr (libsoxr, "HQ"), one ``soxr.ResampleStream`` per utterance fed chunk by chunk, so the streamed
  conversion is the whole utterance's conversion: a filter's memory runs across the joins, where resampling each
  chunk on its own would restart it at every join and click there. Its delay is soxr's to keep: the first chunk
  comes out a few milliseconds short and the final one flushes the rest.
- **Channels**: mono from stereo is the mean of the channels (half each: the level of a centred voice is kept,
  and nothing clips); stereo from mono copies the one channel to both. Mixed down before resampling and copied
  after it, so the resampler runs on as few channels as it can.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import soxr

from moss_tts_node.choices import OUTPUT_CHANNEL_COUNTS, OUTPUT_CHANNELS_MODEL
from moss_tts_node.config import AudioConfig
from moss_tts_node.pcm import channels_of
from moss_tts_node.synthesis.results import AudioChunk

RESAMPLE_QUALITY = "HQ"  # soxr's default: 20-bit precision, a passband to 91 % of Nyquist

Result = TypeVar("Result")


@dataclass(frozen=True)
class AudioFormat:
    """A rate and a channel count: samples are ``(n,)`` for one channel, ``(n, channels)`` (interleaved in memory)
    for more."""

    sample_rate: int
    channels: int

    def given_out(self, audio: AudioConfig) -> AudioFormat:
        """The format audio of this one leaves the synthesizer in under ``audio`` (its output keys)."""
        rate = audio.output_sample_rate or self.sample_rate
        channels = (
            self.channels
            if audio.output_channels == OUTPUT_CHANNELS_MODEL
            else OUTPUT_CHANNEL_COUNTS[audio.output_channels]
        )
        return AudioFormat(rate, channels)

    def silence(self, samples: int) -> np.ndarray:
        """``samples`` samples of silence in this format."""
        return np.zeros((samples,) if self.channels == 1 else (samples, self.channels), np.float32)


def remix(samples: np.ndarray, channels: int) -> np.ndarray:
    """``samples`` ((n,) or (n, c)) as ``channels`` channels: the mean of the channels for one, a copy of the one
    channel to each for more; the same array where it has them already."""
    have = channels_of(samples)
    if have == channels:
        return samples
    if channels == 1:
        return samples.mean(axis=1, dtype=np.float32)
    if have != 1:
        raise ValueError(f"{have} channels cannot become {channels}: only to mono, or from mono")
    return np.repeat(samples.reshape(-1, 1), channels, axis=1)


class Conversion:
    """One utterance's conversion from ``source`` to ``target``, fed its chunks in order."""

    def __init__(self, source: AudioFormat, target: AudioFormat) -> None:
        self._target = target
        self._mixed = min(source.channels, target.channels)  # the resampler's channels (module docstring)
        self._resampler = (
            None
            if source.sample_rate == target.sample_rate
            else soxr.ResampleStream(
                source.sample_rate, target.sample_rate, self._mixed, dtype="float32", quality=RESAMPLE_QUALITY
            )
        )

    def convert(self, samples: np.ndarray, last: bool) -> np.ndarray:
        """The converted samples of the next chunk, float32; ``last``: the utterance's final one, which flushes
        what the resampler still holds."""
        samples = np.ascontiguousarray(remix(samples, self._mixed), dtype=np.float32)
        if self._resampler is not None:
            samples = self._resampler.resample_chunk(samples, last=last)
        return remix(samples, self._target.channels)


def converted(
    chunks: Generator[AudioChunk, None, Result], source: AudioFormat, target: AudioFormat
) -> Generator[AudioChunk, None, Result]:
    """The stream ``chunks`` of ``source`` audio in ``target``'s: the same generator where they are the same.

    Each chunk keeps its index and stop reason; its start is where its first converted sample falls. A stream that
    ends without a final chunk (cancelled) drops what the resampler held. Closing this one closes ``chunks``.
    """
    if source == target:
        return chunks
    return _converting(chunks, Conversion(source, target), target.sample_rate)


def _converting(
    chunks: Generator[AudioChunk, None, Result], conversion: Conversion, rate: int
) -> Generator[AudioChunk, None, Result]:
    given = 0  # samples given out so far
    try:
        while True:
            try:
                chunk = next(chunks)
            except StopIteration as end:
                return end.value
            samples = conversion.convert(chunk.samples, last=chunk.is_final)
            yield AudioChunk(samples, rate, chunk.index, given / rate, chunk.stop_reason)
            given += samples.shape[0]
    finally:
        chunks.close()
