"""The audio codec (MOSS-Audio-Tokenizer): 24 kHz waveforms <-> (T, 32) RVQ codes.

``AudioCodec`` is the backend-neutral interface the synthesizer talks to; it owns the
input checks so every backend (ONNX Runtime here, TensorRT in ``codec/tensorrt.py``) rejects
bad audio and codes with the same messages, and it owns the length limit: a backend states
the most frames one graph call may take (``max_frames``, or a TensorRT profile's maximum)
and longer audio is encoded or decoded in windows with left context, never refused.
``OnnxCodec`` runs the published ONNX graphs (``OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX``);
``open_codec`` picks the backend a config asks for.

Codes are always laid out (frames, codebooks) in this package. The graphs want
(codebooks, batch, frames); the transposition happens in one place, inside the backend,
so that a (32, 32) matrix can never be transposed by guesswork."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, TypeVar

import numpy as np

from moss_tts_node.errors import CodecError
from moss_tts_node.model.rates import SAMPLE_RATE, SAMPLES_PER_FRAME

if TYPE_CHECKING:
    pass


ONNX_SOURCE = "OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX"


CODEBOOK_SIZE = 1024


# The real codec's transformers attend over 10 s per stage: a window that starts this many
# frames before the audio it keeps sees what a whole-sequence call would have seen.
WINDOW_CONTEXT_FRAMES = 125


_Codec = TypeVar("_Codec", bound="AudioCodec")


def run_windowed(
    frames: np.ndarray, limit: int | None, run: Callable[[np.ndarray], np.ndarray], context: int | None = None
) -> np.ndarray:
    """Apply a causal per-frame graph ``run`` to ``frames`` (T, ...) in calls of at most ``limit`` frames.

    ``run`` maps (n, ...) inputs to (n, ...) outputs, one output row per frame. Each window
    starts ``context`` frames (default: the codec's attention span, at most half the limit)
    before the first frame it contributes, and only its new frames are kept, so for a causal
    graph whose receptive field fits in the context the result equals one whole call.
    """
    total = frames.shape[0]
    if limit is None or total <= limit:
        return run(frames)
    if context is None:
        context = min(WINDOW_CONTEXT_FRAMES, limit // 2)
    if not 0 <= context < limit:
        raise ValueError(f"window context {context} must be in [0, {limit})")
    pieces = []
    start = 0
    while start < total:
        left = max(0, start - context)
        end = min(total, left + limit)
        pieces.append(run(frames[left:end])[start - left :])
        start = end
    return np.concatenate(pieces)


class AudioCodec(ABC):
    """A causal neural audio codec: SAMPLES_PER_FRAME samples per frame of 32 residual codebooks.

    Subclasses implement ``_encode`` and ``_decode`` on already-validated inputs of at most
    ``_frame_limit`` frames; the public methods here validate and window, so the contract is
    the same for every backend. Usable as a context manager that calls ``close``.
    """

    sample_rate: ClassVar[int] = SAMPLE_RATE
    samples_per_frame: ClassVar[int] = SAMPLES_PER_FRAME
    n_quantizers: ClassVar[int] = 32
    # Most frames one graph call may take (a configured bound on memory and latency);
    # None: unbounded. Longer input is processed in windows by encode/decode.
    max_frames: int | None = None

    def encode(self, waveform: np.ndarray) -> np.ndarray:
        """Encode float mono 24 kHz samples (n,), n a positive multiple of 1920.

        Returns codes (n / 1920, 32) int64 in [0, 1023]. Audio longer than the backend's
        limit is encoded in windows with left context.
        """
        frames = self._checked_waveform(waveform).reshape(-1, self.samples_per_frame)
        return run_windowed(frames, self._frame_limit("encoder"), lambda window: self._encode(window.reshape(-1)))

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Decode codes (T, 32), T >= 1, integers in [0, 1023], to float32 samples (T * 1920,).

        Codes longer than the backend's limit are decoded in windows with left context.
        """

        def decode_window(window: np.ndarray) -> np.ndarray:  # one row of samples per frame
            return self._decode(window).reshape(-1, self.samples_per_frame)

        codes = self._checked_codes(codes)
        return run_windowed(codes, self._frame_limit("decoder"), decode_window).reshape(-1)

    def _frame_limit(self, graph: str) -> int | None:
        """Most frames one call of ``graph`` ("encoder" or "decoder") may take.

        Backends whose graphs have their own bound (a TensorRT profile) override this.
        """
        return self.max_frames

    @abstractmethod
    def close(self) -> None:
        """Release the backend's sessions and device memory; the codec is unusable after."""

    @abstractmethod
    def _encode(self, waveform: np.ndarray) -> np.ndarray:
        """Encode a validated float32 (n,) waveform to (n / 1920, 32) int64 codes."""

    @abstractmethod
    def _decode(self, codes: np.ndarray) -> np.ndarray:
        """Decode validated (T, 32) int64 codes to (T * 1920,) float32 samples."""

    def __enter__(self: _Codec) -> _Codec:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @classmethod
    def _checked_waveform(cls, waveform: np.ndarray) -> np.ndarray:
        """Return the waveform as contiguous float32, or raise CodecError saying what is wrong."""
        if not isinstance(waveform, np.ndarray) or waveform.ndim != 1:
            shape = getattr(waveform, "shape", type(waveform).__name__)
            raise CodecError(f"encode expects mono samples of shape (n,), got {shape}; mix to mono first")
        if not np.issubdtype(waveform.dtype, np.floating):
            raise CodecError(
                f"encode expects float samples in [-1, 1], got dtype {waveform.dtype}; "
                "convert integer PCM with samples / 32768"
            )
        n = waveform.shape[0]
        if n == 0 or n % cls.samples_per_frame:
            raise CodecError(
                f"encode expects a positive multiple of {cls.samples_per_frame} samples, got {n}; "
                "zero-pad the end (audio_io.load_reference_audio does)"
            )
        if not np.all(np.isfinite(waveform)):
            raise CodecError("encode was given NaN or infinite samples")
        return np.ascontiguousarray(waveform, dtype=np.float32)

    @classmethod
    def _checked_codes(cls, codes: np.ndarray) -> np.ndarray:
        """Return the codes as contiguous int64, or raise CodecError saying what is wrong."""
        if not isinstance(codes, np.ndarray) or codes.ndim != 2 or codes.shape[1] != cls.n_quantizers:
            shape = getattr(codes, "shape", type(codes).__name__)
            raise CodecError(f"decode expects codes of shape (frames, {cls.n_quantizers}), got {shape}")
        if codes.shape[0] == 0:
            raise CodecError("decode expects at least one frame of codes, got 0")
        if not np.issubdtype(codes.dtype, np.integer):
            raise CodecError(f"decode expects integer codes, got dtype {codes.dtype}")
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= CODEBOOK_SIZE:
            raise CodecError(
                f"decode expects codes in [0, {CODEBOOK_SIZE - 1}], got values in [{low}, {high}]; "
                f"the audio pad code {CODEBOOK_SIZE} must be removed (de-delayed) before decoding"
            )
        return np.ascontiguousarray(codes, dtype=np.int64)

    @staticmethod
    def _graph_codes(codes: np.ndarray) -> np.ndarray:
        """(T, 32) codes as the decoder graph's (32, 1, T) input."""
        return np.ascontiguousarray(codes.T[:, None, :])

    @classmethod
    def _codes_from_graph(
        cls, codes: np.ndarray, lengths: np.ndarray, n_frames: int, source: Path | None
    ) -> np.ndarray:
        """The encoder graph's (32, 1, T) codes and (1,) lengths as (T, 32) int64, checked against ``n_frames``."""
        codes = codes[:, 0, : int(lengths[0])]
        if codes.shape != (cls.n_quantizers, n_frames):
            raise CodecError(
                f"{source} returned codes of shape {codes.shape} for {n_frames} frames; "
                f"expected ({cls.n_quantizers}, {n_frames})"
            )
        return np.ascontiguousarray(codes.T, dtype=np.int64)

    @classmethod
    def _samples_from_graph(
        cls, audio: np.ndarray, lengths: np.ndarray, n_frames: int, source: Path | None
    ) -> np.ndarray:
        """The decoder graph's (1, 1, n) audio and (1,) lengths as (n_frames * 1920,) float32, checked."""
        expected = n_frames * cls.samples_per_frame
        samples = audio[0, 0, : int(lengths[0])]
        if samples.shape[0] != expected:
            raise CodecError(f"{source} returned {samples.shape[0]} samples for {n_frames} frames; expected {expected}")
        return np.ascontiguousarray(samples, dtype=np.float32)
