"""The audio codec (MOSS-Audio-Tokenizer): 24 kHz waveforms <-> (T, 32) RVQ codes.

``AudioCodec`` is the backend-neutral interface the synthesizer talks to; it owns the
input checks so every backend (ONNX Runtime here, TensorRT later) rejects bad audio and
codes with the same messages. ``OnnxCodec`` runs the published ONNX graphs
(``OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX``).

Codes are always laid out (frames, codebooks) in this package. The graphs want
(codebooks, batch, frames); the transposition happens in one place, inside the backend,
so that a (32, 32) matrix can never be transposed by guesswork.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import numpy as np

from moss_tts_node.errors import CodecError, WeightsError

ONNX_SOURCE = "OpenMOSS-Team/MOSS-Audio-Tokenizer-ONNX"
CODEBOOK_SIZE = 1024

_Codec = TypeVar("_Codec", bound="AudioCodec")


class AudioCodec(ABC):
    """A causal neural audio codec with a 12.5 Hz frame rate and 32 residual codebooks.

    Subclasses implement ``_encode`` and ``_decode`` on already-validated inputs; the
    public methods here do the validation so the contract is the same for every backend.
    Usable as a context manager that calls ``close``.
    """

    sample_rate: ClassVar[int] = 24000
    samples_per_frame: ClassVar[int] = 1920
    n_quantizers: ClassVar[int] = 32

    def encode(self, waveform: np.ndarray) -> np.ndarray:
        """Encode float mono 24 kHz samples (n,), n a positive multiple of 1920.

        Returns codes (n / 1920, 32) int64 in [0, 1023].
        """
        return self._encode(self._checked_waveform(waveform))

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Decode codes (T, 32), T >= 1, integers in [0, 1023], to float32 samples (T * 1920,)."""
        return self._decode(self._checked_codes(codes))

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

    ``provider``: ``auto`` (CUDA when this onnxruntime build has it, else CPU), ``cpu`` or
    ``cuda``. ``threads``: intra-op CPU threads, 0 lets onnxruntime choose.
    """

    def __init__(
        self, decoder_path: Path, encoder_path: Path | None = None, provider: str = "auto", threads: int = 0
    ) -> None:
        self._providers = _resolve_providers(provider)
        self._require_cuda = provider == "cuda"
        self._threads = threads
        self._decoder_path = _existing_file(Path(decoder_path), "decoder")
        self._encoder_path = None if encoder_path is None else _existing_file(Path(encoder_path), "encoder")
        self._decoder: Any = self._load(self._decoder_path, _DECODER_INPUTS, _DECODER_OUTPUTS)
        self._encoder: Any = None
        self._encoder_lock = threading.Lock()
        self._closed = False

    @property
    def providers(self) -> list[str]:
        """Execution providers the decoder session actually uses (for start-up logs)."""
        self._check_open()
        return list(self._decoder.get_providers())

    def close(self) -> None:
        """Drop both sessions so their (GPU) memory can be reclaimed."""
        self._decoder = None
        self._encoder = None
        self._closed = True

    def _encode(self, waveform: np.ndarray) -> np.ndarray:
        session = self._encoder_session()
        codes, lengths = session.run(None, self._feeds("input_values", waveform[None, None, :]))[:2]
        codes = codes[:, 0, : int(lengths[0])]
        n_frames = waveform.shape[0] // self.samples_per_frame
        if codes.shape != (self.n_quantizers, n_frames):
            raise CodecError(
                f"{self._encoder_path} returned codes of shape {codes.shape} for {n_frames} frames; "
                f"expected ({self.n_quantizers}, {n_frames})"
            )
        return np.ascontiguousarray(codes.T, dtype=np.int64)

    def _decode(self, codes: np.ndarray) -> np.ndarray:
        self._check_open()
        graph_codes = np.ascontiguousarray(codes.T[:, None, :])
        audio, lengths = self._decoder.run(None, self._feeds("audio_codes", graph_codes))[:2]
        expected = codes.shape[0] * self.samples_per_frame
        samples = audio[0, 0, : int(lengths[0])]
        if samples.shape[0] != expected:
            raise CodecError(
                f"{self._decoder_path} returned {samples.shape[0]} samples for {codes.shape[0]} frames; "
                f"expected {expected}"
            )
        return np.ascontiguousarray(samples, dtype=np.float32)

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
