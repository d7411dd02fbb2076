"""The audio codec (MOSS-Audio-Tokenizer): 24 kHz waveforms <-> (T, 32) RVQ codes.

``AudioCodec`` is the backend-neutral interface the synthesizer talks to; it owns the
input checks so every backend (ONNX Runtime here, TensorRT in ``codec_tensorrt``) rejects
bad audio and codes with the same messages, and it owns the length limit: a backend states
the most frames one graph call may take (``max_frames``, or a TensorRT profile's maximum)
and longer audio is encoded or decoded in windows with left context, never refused.
``OnnxCodec`` runs the published ONNX graphs (``OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX``);
``open_codec`` picks the backend a config asks for.

Codes are always laid out (frames, codebooks) in this package. The graphs want
(codebooks, batch, frames); the transposition happens in one place, inside the backend,
so that a (32, 32) matrix can never be transposed by guesswork.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np

from moss_tts_node.errors import CodecError, WeightsError

if TYPE_CHECKING:
    from moss_tts_node.config import Config

ONNX_SOURCE = "OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX"
CODEBOOK_SIZE = 1024
FRAMES_PER_SECOND = 12.5
# The real codec's transformers attend over 10 s per stage: a window that starts this many
# frames before the audio it keeps sees what a whole-sequence call would have seen.
WINDOW_CONTEXT_FRAMES = 125

_Codec = TypeVar("_Codec", bound="AudioCodec")


def frames_for_seconds(seconds: float) -> int:
    """Whole codec frames (80 ms each) in ``seconds``, rounded down; at least 1."""
    return max(1, int(seconds * FRAMES_PER_SECOND + 1e-9))


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
    """A causal neural audio codec with a 12.5 Hz frame rate and 32 residual codebooks.

    Subclasses implement ``_encode`` and ``_decode`` on already-validated inputs of at most
    ``_frame_limit`` frames; the public methods here validate and window, so the contract is
    the same for every backend. Usable as a context manager that calls ``close``.
    """

    sample_rate: ClassVar[int] = 24000
    samples_per_frame: ClassVar[int] = 1920
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


@dataclass(frozen=True)
class _TensorSpec:
    """What one graph input or output must look like; None dims are free (dynamic)."""

    name: str | None  # None: outputs are read by position, their names do not matter
    onnx_type: str
    dims: tuple[int | None, ...]


_ENCODER_INPUTS = (
    _TensorSpec("input_values", "tensor(float)", (None, 1, None)),
    _TensorSpec("n_quantizers", "tensor(int64)", ()),
)
_ENCODER_OUTPUTS = (
    _TensorSpec(None, "tensor(int64)", (AudioCodec.n_quantizers, None, None)),
    _TensorSpec(None, "tensor(int64)", (None,)),
)
_DECODER_INPUTS = (
    _TensorSpec("audio_codes", "tensor(int64)", (AudioCodec.n_quantizers, None, None)),
    _TensorSpec("n_quantizers", "tensor(int64)", ()),
)
_DECODER_OUTPUTS = (
    _TensorSpec(None, "tensor(float)", (None, 1, None)),
    _TensorSpec(None, "tensor(int64)", (None,)),
)


class OnnxCodec(AudioCodec):
    """The codec run by ONNX Runtime from ``decoder.onnx`` and (optionally) ``encoder.onnx``.

    The decoder session is created at once, so a bad file fails at start-up rather than
    mid-sentence. The encoder is about half of the 1.6 B-parameter codec and is only
    needed to clone a voice from raw audio, which most robots do offline, so it is loaded
    on the first ``encode`` (its file's existence is still checked here).
    ``decoder_path=None`` makes an encoder-only codec (``low_memory`` loads one stage at a time).

    ``provider``: ``auto`` (CUDA when this onnxruntime build has it, else CPU), ``cpu`` or
    ``cuda``. ``threads``: intra-op CPU threads, 0 lets onnxruntime choose. ``max_frames``:
    most frames per graph call; longer audio is processed in windows.
    """

    def __init__(
        self,
        decoder_path: Path | None,
        encoder_path: Path | None = None,
        provider: str = "auto",
        threads: int = 0,
        max_frames: int | None = None,
    ) -> None:
        self._providers = _resolve_providers(provider)
        self._require_cuda = provider == "cuda"
        self._threads = threads
        self.max_frames = max_frames
        self._decoder_path = None if decoder_path is None else _existing_file(Path(decoder_path), "decoder")
        self._encoder_path = None if encoder_path is None else _existing_file(Path(encoder_path), "encoder")
        self._decoder: Any = None
        if self._decoder_path is not None:
            self._decoder = self._load(self._decoder_path, _DECODER_INPUTS, _DECODER_OUTPUTS)
        self._encoder: Any = None
        self._encoder_lock = threading.Lock()
        self._closed = False

    @property
    def providers(self) -> list[str]:
        """Execution providers the sessions actually use (for start-up logs)."""
        self._check_open()
        session = self._decoder if self._decoder is not None else self._encoder_session()
        return list(session.get_providers())

    def close(self) -> None:
        """Drop both sessions so their (GPU) memory can be reclaimed."""
        self._decoder = None
        self._encoder = None
        self._closed = True

    def _encode(self, waveform: np.ndarray) -> np.ndarray:
        session = self._encoder_session()
        codes, lengths = session.run(None, self._feeds("input_values", waveform[None, None, :]))[:2]
        n_frames = waveform.shape[0] // self.samples_per_frame
        return self._codes_from_graph(codes, lengths, n_frames, self._encoder_path)

    def _decode(self, codes: np.ndarray) -> np.ndarray:
        self._check_open()
        if self._decoder is None:
            raise CodecError("this codec was opened without its decoder (encoder only); open one with decoder.onnx")
        audio, lengths = self._decoder.run(None, self._feeds("audio_codes", self._graph_codes(codes)))[:2]
        return self._samples_from_graph(audio, lengths, codes.shape[0], self._decoder_path)

    def _feeds(self, name: str, values: np.ndarray) -> dict[str, np.ndarray]:
        """Graph inputs: the data plus ``n_quantizers`` (always all 32 codebooks)."""
        return {name: values, "n_quantizers": np.array(self.n_quantizers, dtype=np.int64)}

    def _encoder_session(self) -> Any:
        """The encoder session, created on first use; lock-guarded for concurrent callers."""
        self._check_open()
        if self._encoder_path is None:
            raise CodecError(
                "this codec has no encoder: pass encoder_path (encoder.onnx from "
                f"{ONNX_SOURCE}) to encode reference audio, or use pre-encoded voice codes"
            )
        with self._encoder_lock:
            if self._encoder is None:
                self._encoder = self._load(self._encoder_path, _ENCODER_INPUTS, _ENCODER_OUTPUTS)
            return self._encoder

    def _check_open(self) -> None:
        if self._closed:
            raise CodecError("this codec was closed; create a new OnnxCodec")

    def _load(self, path: Path, inputs: tuple[_TensorSpec, ...], outputs: tuple[_TensorSpec, ...]) -> Any:
        """Create a session for ``path`` and check its I/O against the published graphs."""
        import onnxruntime as ort  # imported here so TensorRT-only installs can use AudioCodec

        options = ort.SessionOptions()
        options.intra_op_num_threads = self._threads
        # Idle ORT workers would otherwise spin on the cores llama.cpp needs for the next step.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # warnings about unused initializers etc. are noise here
        try:
            session = ort.InferenceSession(str(path), sess_options=options, providers=self._providers)
        except Exception as error:  # onnxruntime raises several unrelated types for a bad file
            raise CodecError(f"{path} is not a loadable ONNX model: {error}") from error
        if self._require_cuda and "CUDAExecutionProvider" not in session.get_providers():
            raise CodecError(
                f"{path}: onnxruntime could not start CUDA (see its log for the missing CUDA/cuDNN "
                "library); fix the CUDA install or set the codec provider to 'cpu' or 'auto'"
            )
        _check_io(path, "input", session.get_inputs(), inputs)
        _check_io(path, "output", session.get_outputs(), outputs)
        return session


def _resolve_providers(provider: str) -> list[str]:
    """Map the ``provider`` setting to an onnxruntime provider list (CPU always last as fallback)."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    has_cuda = "CUDAExecutionProvider" in available
    if provider == "cpu" or (provider == "auto" and not has_cuda):
        return ["CPUExecutionProvider"]
    if provider in ("auto", "cuda") and has_cuda:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if provider == "cuda":
        raise CodecError(
            f"codec provider 'cuda' requested but this onnxruntime has only {', '.join(available)}; "
            "install onnxruntime-gpu (matching your CUDA) or set the provider to 'cpu' or 'auto'"
        )
    raise CodecError(f"unknown codec provider {provider!r}; use 'auto', 'cpu' or 'cuda'")


def _existing_file(path: Path, role: str) -> Path:
    """Return ``path`` if it is a file, else raise WeightsError saying where to get it."""
    if not path.is_file():
        raise WeightsError(
            f"codec {role} file {path} not found; download {role}.onnx from the Hugging Face repo "
            f"{ONNX_SOURCE} (e.g. huggingface-cli download {ONNX_SOURCE} --local-dir <dir>) "
            "and point the config at it"
        )
    return path


def _check_io(path: Path, kind: str, actual: list[Any], expected: tuple[_TensorSpec, ...]) -> None:
    """Raise CodecError naming ``path`` unless the graph's inputs/outputs match ``expected``.

    Inputs are fed by name, so their names must match exactly; outputs are read by
    position, so only their count, dtypes and ranks are checked. Dims the graph declares
    symbolically are not checked.
    """
    if kind == "input":
        names = sorted(arg.name for arg in actual)
        wanted = sorted(str(spec.name) for spec in expected)
        if names != wanted:
            raise CodecError(f"{path}: graph inputs are {names}, expected {wanted}; is this the right file?")
        by_name = {arg.name: arg for arg in actual}
        pairs = [(by_name[str(spec.name)], spec) for spec in expected]
    else:
        if len(actual) < len(expected):
            raise CodecError(f"{path}: graph has {len(actual)} outputs, expected {len(expected)}")
        pairs = list(zip(actual[: len(expected)], expected, strict=True))
    for position, (arg, spec) in enumerate(pairs):
        label = f"{kind} {arg.name!r}" if spec.name else f"{kind} #{position} ({arg.name!r})"
        _check_tensor(path, label, arg, spec)


def _check_tensor(path: Path, label: str, arg: Any, spec: _TensorSpec) -> None:
    """Check one graph tensor's element type, rank and static dims against ``spec``."""
    if arg.type != spec.onnx_type:
        raise CodecError(f"{path}: {label} has type {arg.type}, expected {spec.onnx_type}")
    shape = arg.shape
    if shape is None:  # rank unknown to the graph: nothing more to check
        return
    if len(shape) != len(spec.dims):
        raise CodecError(f"{path}: {label} has rank {len(shape)} {shape}, expected rank {len(spec.dims)}")
    for axis, (have, want) in enumerate(zip(shape, spec.dims, strict=True)):
        if want is not None and isinstance(have, int) and have != want:
            raise CodecError(f"{path}: {label} has size {have} on axis {axis}, expected {want}")


def open_codec(config: Config, *, encoder: bool = True, decoder: bool = True) -> AudioCodec:
    """The codec backend ``config.audio.backend`` names, holding the graphs asked for.

    The one place a backend is chosen: the synthesizer and the CLI open their codec here.
    ``encoder``/``decoder`` let ``low_memory`` hold one stage at a time. With both, a missing
    encoder (never downloaded or built) only fails when something is encoded, since most
    robots use voices pre-encoded with encode-voice; opened to encode only, it fails at once.
    """
    audio = config.audio
    max_frames = frames_for_seconds(audio.max_codec_seconds)
    if audio.backend == "tensorrt":
        from moss_tts_node.codec_tensorrt import TensorRTCodec  # needs TensorRT: import only when chosen

        return TensorRTCodec(Path(config.model.engine_dir), encoder=encoder, decoder=decoder, max_frames=max_frames)
    codec_dir = Path(config.model.codec_dir)
    encoder_path = codec_dir / "encoder.onnx"
    return OnnxCodec(
        codec_dir / "decoder.onnx" if decoder else None,
        encoder_path if encoder and (encoder_path.is_file() or not decoder) else None,
        provider=audio.onnx_provider,
        threads=audio.codec_threads,
        max_frames=max_frames,
    )
