"""What a synthesis gives back: chunks as they are produced, the whole utterance, and the figures.

Only NumPy and the timing types: the player node and other consumers of audio import these without the
synthesis stack (tokenizers, llama.cpp, ONNX Runtime).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass

import numpy as np

from moss_tts_node.errors import Cancelled
from moss_tts_node.timing import StageClock, StopReason, TimingReport


@dataclass(frozen=True)
class AudioChunk:
    """A piece of the utterance: float32 samples in [-1, 1], ``(n,)`` for a mono model, ``(n, channels)`` for a
    stereo one (MOSS-TTS-Nano)."""

    samples: np.ndarray
    sample_rate: int
    index: int
    start_s: float  # offset of the first sample from the start of the utterance
    stop_reason: StopReason | None = None  # why the utterance ended, on its final chunk only

    @property
    def is_final(self) -> bool:
        """The utterance's last chunk (a cancelled one has none: the stream just ends)."""
        return self.stop_reason is not None


@dataclass(frozen=True)
class Synthesis:
    """A whole utterance with what produced it (for ``--save-tokens`` and for tests)."""

    audio: np.ndarray
    sample_rate: int
    report: TimingReport
    prompt: np.ndarray  # (S, 1 + n_vq)
    generated: np.ndarray  # (N, 1 + n_vq)
    codes: np.ndarray  # (T, n_vq)


@dataclass(frozen=True)
class StreamResult:
    """What a stream produced besides its chunks: what its producer returns when it ends."""

    generated: np.ndarray  # (N, 1 + n_vq)
    codes: np.ndarray  # (T, n_vq)
    report: TimingReport
    clock: StageClock  # every stage call's timing, for per-step figures
    prompt: np.ndarray | None = None  # the first piece's (S, 1 + n_vq) prompt; None if no piece ran


class AudioStream:
    """Iterate for AudioChunks; ``report``, ``generated``, ``codes`` and ``clock`` are there once it ends.

    A text too long for one generation is spoken in pieces, still as one stream: ``prompt`` is
    then the first piece's, ``generated`` and ``codes`` are the pieces' one after the other. Text that
    arrives in pieces (``Synthesizer.stream_text``) has no prompt before its first piece is cut: ``prompt``
    is None until the stream ends. ``estimated_seconds`` is what the text is expected to take, known before
    anything is generated (None for text that arrives in pieces).
    """

    def __init__(
        self,
        prompt: np.ndarray | None,
        chunks: Generator[AudioChunk, None, StreamResult],
        estimated_seconds: float | None = None,
    ) -> None:
        self.prompt = prompt
        self.estimated_seconds = estimated_seconds
        self.result: StreamResult | None = None
        self._chunks = self._run(chunks)

    def _run(self, chunks: Generator[AudioChunk, None, StreamResult]) -> Iterator[AudioChunk]:
        self.result = yield from chunks
        if self.prompt is None:
            self.prompt = self.result.prompt

    def __iter__(self) -> Iterator[AudioChunk]:
        return self._chunks

    @property
    def report(self) -> TimingReport | None:
        return None if self.result is None else self.result.report

    @property
    def generated(self) -> np.ndarray | None:
        return None if self.result is None else self.result.generated

    @property
    def codes(self) -> np.ndarray | None:
        return None if self.result is None else self.result.codes

    @property
    def clock(self) -> StageClock | None:
        return None if self.result is None else self.result.clock

    @property
    def cancelled(self) -> bool:
        return self.report is not None and self.report.stop_reason is StopReason.CANCELLED

    def whole(self, sample_rate: int) -> Synthesis:
        """Read to its end: the whole utterance, with what produced it; Cancelled when it was cancelled."""
        chunks = [chunk.samples for chunk in self]
        result = self.result
        if result is None or self.cancelled:  # None: never, the stream was read to its end
            raise Cancelled("synthesis cancelled")
        audio = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.float32)
        assert self.prompt is not None  # the result's, where the stream had none before it began
        return Synthesis(audio, sample_rate, result.report, self.prompt, result.generated, result.codes)
