"""The codec run by ONNX Runtime from the published ``decoder.onnx`` / ``encoder.onnx``."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from moss_tts_node.codec.base import ONNX_SOURCE, AudioCodec, read_attention_span
from moss_tts_node.codec.quantizer import CODEC_QUANTIZERS, checked_quantizers
from moss_tts_node.errors import CodecError, WeightsError

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class TensorSpec:
    """What one graph input or output must look like; None dims are free (dynamic)."""

    name: str | None  # None: outputs are read by position, their names do not matter
    onnx_type: str
    dims: tuple[int | None, ...]


_ENCODER_INPUTS = (
    TensorSpec("input_values", "tensor(float)", (None, 1, None)),
    TensorSpec("n_quantizers", "tensor(int64)", ()),
)


_ENCODER_OUTPUTS = (
    TensorSpec(None, "tensor(int64)", (CODEC_QUANTIZERS, None, None)),
    TensorSpec(None, "tensor(int64)", (None,)),
)


_DECODER_INPUTS = (
    TensorSpec("audio_codes", "tensor(int64)", (CODEC_QUANTIZERS, None, None)),
    TensorSpec("n_quantizers", "tensor(int64)", ()),
)


_DECODER_OUTPUTS = (
    TensorSpec(None, "tensor(float)", (None, 1, None)),
    TensorSpec(None, "tensor(int64)", (None,)),
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
    most frames per graph call; longer audio is processed in windows, overlapping by a multiple
    of the attention span that the ``config.json`` beside the graphs states (``read_attention_span``).
    ``n_quantizers``: the model's codebooks, which the graphs are told to decode and encode with.
    """

    def __init__(
        self,
        decoder_path: Path | None,
        encoder_path: Path | None = None,
        provider: str = "auto",
        threads: int = 0,
        max_frames: int | None = None,
        n_quantizers: int = CODEC_QUANTIZERS,
    ) -> None:
        self.n_quantizers = checked_quantizers(n_quantizers)
        self._providers = resolve_providers(provider)
        self._require_cuda = provider == "cuda"
        self._threads = threads
        self.max_frames = max_frames
        self._decoder_path = None if decoder_path is None else _existing_file(Path(decoder_path), "decoder")
        self._encoder_path = None if encoder_path is None else _existing_file(Path(encoder_path), "encoder")
        graph = self._decoder_path or self._encoder_path
        self.attention_span_frames = read_attention_span(None if graph is None else graph.parent)
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
        """Graph inputs: the data plus ``n_quantizers``, the codebooks the model uses."""
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

    def _load(self, path: Path, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> Any:
        """Create a session for ``path`` and check its I/O against the published graphs."""
        session = open_session(path, self._providers, self._threads, self._require_cuda)
        _check_io(path, "input", session.get_inputs(), inputs)
        _check_io(path, "output", session.get_outputs(), outputs)
        return session


def open_session(path: Path, providers: list[str], threads: int, require_cuda: bool) -> Any:
    """An ONNX Runtime session for the codec graph ``path``; CodecError when it cannot be loaded or, with
    ``require_cuda``, when CUDA did not start."""
    import onnxruntime as ort  # imported here so TensorRT-only installs can use AudioCodec

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # Idle ORT workers would otherwise spin on the cores llama.cpp needs for the next step.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # warnings about unused initializers etc. are noise here
    try:
        session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as error:  # onnxruntime raises several unrelated types for a bad file
        raise CodecError(f"{path} is not a loadable ONNX model: {error}") from error
    if require_cuda and "CUDAExecutionProvider" not in session.get_providers():
        raise CodecError(
            f"{path}: onnxruntime could not start CUDA (see its log for the missing CUDA/cuDNN "
            "library); fix the CUDA install or set the codec provider to 'cpu' or 'auto'"
        )
    return session


def resolve_providers(provider: str) -> list[str]:
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
            f"{ONNX_SOURCE} (e.g. hf download {ONNX_SOURCE} --local-dir <dir>) "
            "and point the config at it"
        )
    return path


def _check_io(path: Path, kind: str, actual: list[Any], expected: tuple[TensorSpec, ...]) -> None:
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
        check_tensor(path, label, arg, spec)


def check_tensor(path: Path, label: str, arg: Any, spec: TensorSpec) -> None:
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
