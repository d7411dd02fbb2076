"""The audio codec (MOSS-Audio-Tokenizer): 24 kHz waveforms <-> (T, n) RVQ codes, n the model's codebooks.

``AudioCodec`` is the backend-neutral interface the synthesizer talks to; it owns the
input checks so every backend (ONNX Runtime here, TensorRT in ``codec/tensorrt.py``) rejects
bad audio and codes with the same messages, and it owns the length limit: a backend states
the most frames one graph call may take (``max_frames``, or a TensorRT profile's maximum)
and longer audio is encoded or decoded in windows with left context, never refused.
``OnnxCodec`` runs the published ONNX graphs (``OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX``);
``open_codec`` picks the backend a config asks for.

Codes are always laid out (frames, codebooks) in this package. The graphs want
(codebooks, batch, frames); the transposition happens in one place, inside the backend,
so that a (32, 32) matrix can never be transposed by guesswork.

The codec's residual quantizer has ``CODEC_QUANTIZERS`` levels (``codec/quantizer.py``) and its graphs always carry
that many rows of codes; a codec opened for a model of fewer codebooks (``n_quantizers``: the model's ``n_vq``, 16 for
MOSS-TTSD, -VoiceGenerator and -SoundEffect) passes that count as the graphs' ``n_quantizers`` input, pads the codes it
decodes to the graphs' rows, and keeps the first ``n_quantizers`` rows of what the encoder returns (docs/model.md,
"Codec I/O")."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, TypeVar

import numpy as np

from moss_tts_node.codec.layout import CHECKPOINT_CONFIG
from moss_tts_node.codec.quantizer import CODEBOOK_SIZE, CODEC_QUANTIZERS
from moss_tts_node.errors import CodecError
from moss_tts_node.model.rates import FRAMES_PER_SECOND, SAMPLE_RATE, SAMPLES_PER_FRAME

if TYPE_CHECKING:
    pass


ONNX_SOURCE = "OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX"


# The key of the codec checkpoint's config.json that holds how far back (seconds) each of its Transformer
# layers attends.
ATTENTION_SPAN_KEY = "causal_transformer_context_duration"


# The published codec's attention span (10 s), used when no config.json sits beside the graphs (the
# ONNX repository and TensorRT engine directories may carry none).
PUBLISHED_ATTENTION_SPAN_FRAMES = 125


# Long audio is coded in windows that overlap by this many attention spans. The layers stack, so a
# frame's receptive field is (layers x span) and no affordable window reaches it at full size; the
# error of each overlap, measured on codec-tiny, is in docs/stream-decoder.md, "Long audio: windows".
WINDOW_OVERLAP_SPANS = 5


# ... capped so that a window always brings at least this share of new frames (a bound on the cost).
WINDOW_MIN_NEW_SHARE = 4


_Codec = TypeVar("_Codec", bound="AudioCodec")


def read_attention_span(directory: Path | None) -> int:
    """Frames each Transformer layer of the codec attends back, from ``directory/config.json``.

    Without that file (or without a directory) the published codec's span: the graphs carry it only
    as a constant inside their attention masks. A file that is there but unreadable is an error.
    """
    path = None if directory is None else Path(directory) / CHECKPOINT_CONFIG
    if path is None or not path.is_file():
        return PUBLISHED_ATTENTION_SPAN_FRAMES
    try:
        seconds = json.loads(path.read_text(encoding="utf-8"))[ATTENTION_SPAN_KEY]
        frames = round(float(seconds) * FRAMES_PER_SECOND)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CodecError(
            f"{path}: no readable {ATTENTION_SPAN_KEY!r} in seconds ({error!r}); "
            "restore the codec checkpoint's config.json or remove it to use the published codec's span"
        ) from error
    if frames < 1:
        raise CodecError(f"{path}: {ATTENTION_SPAN_KEY} {seconds} is shorter than one frame (80 ms)")
    return frames


def window_context(limit: int, attention_span: int) -> int:
    """Frames of left context each window after the first re-codes: the chosen overlap, capped by the limit."""
    return max(0, min(WINDOW_OVERLAP_SPANS * attention_span, limit - max(1, limit // WINDOW_MIN_NEW_SHARE)))


def run_windowed(
    frames: np.ndarray, limit: int | None, run: Callable[[np.ndarray], np.ndarray], context: int
) -> np.ndarray:
    """Apply a causal per-frame graph ``run`` to ``frames`` (T, ...) in calls of at most ``limit`` frames.

    ``run`` maps (n, ...) inputs to (n, ...) outputs, one output row per frame. Each window
    starts ``context`` frames before the first frame it contributes, and only its new frames
    are kept, so for a causal graph whose receptive field fits in the context the result
    equals one whole call.
    """
    total = frames.shape[0]
    if limit is None or total <= limit:
        return run(frames)
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
    """A causal neural audio codec: SAMPLES_PER_FRAME samples per frame of ``n_quantizers`` residual codebooks.

    Subclasses implement ``_encode`` and ``_decode`` on already-validated inputs of at most
    ``_frame_limit`` frames; the public methods here validate and window, so the contract is
    the same for every backend. Usable as a context manager that calls ``close``.
    """

    sample_rate: ClassVar[int] = SAMPLE_RATE
    samples_per_frame: ClassVar[int] = SAMPLES_PER_FRAME  # per channel
    # Audio channels: mono samples are (n,), those of a codec of more channels (n, channels), C-contiguous.
    channels: ClassVar[int] = 1
    # How audio_io.load_reference_audio prepares a voice clip for this codec, as the model's upstream does: whether
    # it scales the clip toward -20 dBFS, and whether a partial last frame is zero-padded (else dropped).
    reference_loudness: ClassVar[bool] = True
    reference_pads_last_frame: ClassVar[bool] = True
    # Codebooks coded: the model's n_vq, set by each backend when it opens (checked_quantizers), the first
    # n_quantizers of the codec's CODEC_QUANTIZERS levels. An instance's count: the class has none.
    n_quantizers: int
    # Most frames one graph call may take (a configured bound on memory and latency);
    # None: unbounded. Longer input is processed in windows by encode/decode.
    max_frames: int | None = None
    # Frames each Transformer layer attends back (read_attention_span): sets the windows' overlap.
    attention_span_frames: int = PUBLISHED_ATTENTION_SPAN_FRAMES

    def encode(self, waveform: np.ndarray) -> np.ndarray:
        """Encode float samples at ``sample_rate``: mono (n,), or (n, channels) for a codec of more channels; n a
        positive multiple of ``samples_per_frame``.

        Returns codes (n / samples_per_frame, n_quantizers) int64 in [0, 1023]. Audio longer than the backend's
        limit is encoded in windows with left context.
        """
        waveform = self._checked_waveform(waveform)
        channel_shape = waveform.shape[1:]  # () for mono
        frames = waveform.reshape(-1, self.samples_per_frame, *channel_shape)
        return self._windowed(frames, "encoder", lambda window: self._encode(window.reshape(-1, *channel_shape)))

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Decode codes (T, n_quantizers), T >= 1, integers in [0, 1023], to float32 samples: (T * samples_per_frame,)
        mono, (T * samples_per_frame, channels) for a codec of more channels.

        Codes longer than the backend's limit are decoded in windows with left context.
        """
        channel_shape = () if self.channels == 1 else (self.channels,)

        def decode_window(window: np.ndarray) -> np.ndarray:  # one row of samples per frame
            return self._decode(window).reshape(-1, self.samples_per_frame, *channel_shape)

        codes = self._checked_codes(codes, self.n_quantizers)
        return self._windowed(codes, "decoder", decode_window).reshape(-1, *channel_shape)

    def _windowed(self, frames: np.ndarray, graph: str, run: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """``run`` over ``frames`` in calls within ``graph``'s frame limit, overlapping by the chosen context."""
        limit = self._frame_limit(graph)
        context = 0 if limit is None else window_context(limit, self.attention_span_frames)
        return run_windowed(frames, limit, run, context)

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
        """Encode a validated float32 waveform, (n,) or (n, channels), to (n / samples_per_frame, n_quantizers)
        int64 codes."""

    @abstractmethod
    def _decode(self, codes: np.ndarray) -> np.ndarray:
        """Decode validated (T, n_quantizers) int64 codes to float32 samples, (T * samples_per_frame,) or
        (T * samples_per_frame, channels)."""

    def __enter__(self: _Codec) -> _Codec:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @classmethod
    def _checked_waveform(cls, waveform: np.ndarray) -> np.ndarray:
        """Return the waveform as contiguous float32, or raise CodecError saying what is wrong."""
        shape = getattr(waveform, "shape", type(waveform).__name__)
        if cls.channels == 1 and (not isinstance(waveform, np.ndarray) or waveform.ndim != 1):
            raise CodecError(f"encode expects mono samples of shape (n,), got {shape}; mix to mono first")
        if cls.channels > 1 and (
            not isinstance(waveform, np.ndarray) or waveform.ndim != 2 or waveform.shape[1] != cls.channels
        ):
            raise CodecError(
                f"encode expects {cls.channels}-channel samples of shape (n, {cls.channels}), got {shape}; "
                "audio_io.load_reference_audio converts a clip to the codec's channels"
            )
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
    def _checked_codes(cls, codes: np.ndarray, n_quantizers: int) -> np.ndarray:
        """Return (T, ``n_quantizers``) codes as contiguous int64, or raise CodecError saying what is wrong."""
        if not isinstance(codes, np.ndarray) or codes.ndim != 2 or codes.shape[1] != n_quantizers:
            shape = getattr(codes, "shape", type(codes).__name__)
            raise CodecError(f"decode expects codes of shape (frames, {n_quantizers}), got {shape}")
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
        """(T, n) codes as the decoder graph's (32, 1, T) input: rows past n are zeros, which a decode with
        ``n_quantizers`` n never reads."""
        graph = np.zeros((CODEC_QUANTIZERS, 1, codes.shape[0]), dtype=np.int64)
        graph[: codes.shape[1], 0, :] = codes.T
        return graph

    def _codes_from_graph(
        self, codes: np.ndarray, lengths: np.ndarray, n_frames: int, source: Path | None
    ) -> np.ndarray:
        """The encoder graph's (32, 1, T) codes and (1,) lengths as (T, n_quantizers) int64, checked against
        ``n_frames``; the rows past ``n_quantizers`` (zeros from a graph told to use fewer) are dropped."""
        if codes.ndim != 3 or codes.shape[0] < self.n_quantizers:
            raise CodecError(
                f"{source} returned codes of shape {codes.shape}; expected ({CODEC_QUANTIZERS}, 1, {n_frames})"
            )
        codes = codes[: self.n_quantizers, 0, : int(lengths[0])]
        if codes.shape != (self.n_quantizers, n_frames):
            raise CodecError(f"{source} returned {codes.shape[1]} frames of codes for {n_frames} frames of audio")
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
