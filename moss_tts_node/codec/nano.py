"""MOSS-Audio-Tokenizer-Nano run by ONNX Runtime from its published directory (MOSS-Audio-Tokenizer-Nano-ONNX).

The directory says what it is in ``codec_browser_onnx_meta.json`` (``layout.NANO_META_FILE``): the file names
of its three graphs (``files``: encode, decode_full, decode_step), the codec's settings (``codec_config``:
sample_rate, channels, num_quantizers) and the decode-step graph's state (``streaming_decode``), in the schema
upstream's runtime (``ort_cpu_runtime.py``) reads. The graphs' I/O, as that runtime calls them:

- encode: ``waveform`` (1, channels, samples) float32, ``input_lengths`` (1,) int32 -> ``audio_codes``
  (1, frames, quantizers) int32, ``audio_code_lengths`` (1,) int32;
- decode_full: ``audio_codes``, ``audio_code_lengths`` -> ``audio`` (1, channels, samples) float32,
  ``audio_lengths`` (1,) int32;
- decode_step: decode_full's inputs and outputs plus the state the meta lists: per decoder Transformer an
  offset (``transformer_offsets``: int32, zeros), per attention layer (``attention_caches``) an offset (int32,
  zeros), the cached keys and values (float32 zeros, (1, heads, context, head_dim)) and their positions
  (int32, -1: empty); each state output is the next call's input. Each layer keeps its last ``context``
  positions and every query attends to the ``context`` positions before it, as the whole decode does, so the
  stream equals decode_full's output however the frames are cut.

Stereo is interleaved into one signal inside the graphs; here samples are (n, 2) float32 and codes
(frames, 16) int64, as everywhere in the package.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from moss_tts_node.codec.base import AudioCodec, read_attention_span
from moss_tts_node.codec.layout import NANO_META_FILE
from moss_tts_node.codec.onnx import TensorSpec, check_tensor, open_session, resolve_providers
from moss_tts_node.errors import CodecError, WeightsError

NANO_ONNX_SOURCE = "OpenMOSS-Team/MOSS-Audio-Tokenizer-Nano-ONNX"
GRAPH_ROLES = ("encode", "decode_full", "decode_step")  # the meta's ``files`` keys

CODES = "audio_codes"
CODE_LENGTHS = "audio_code_lengths"
AUDIO = "audio"
AUDIO_LENGTHS = "audio_lengths"
WAVEFORM = "waveform"
INPUT_LENGTHS = "input_lengths"

# The kinds of state an attention layer carries, the meta's key prefixes: (kind, shape key, dtype, initial value).
_ATTENTION_STATE = (
    ("offset", "offset_shape", np.int32, 0),
    ("cached_keys", "cache_shape", np.float32, 0),
    ("cached_values", "cache_shape", np.float32, 0),
    ("cached_positions", "positions_shape", np.int32, -1),
)
_ONNX_TYPES = {np.int32: "tensor(int32)", np.float32: "tensor(float)"}


@dataclass(frozen=True)
class StateSpec:
    """One tensor of the decode-step graph's state: fed as ``input_name``, returned as ``output_name``."""

    input_name: str
    output_name: str
    shape: tuple[int, ...]
    dtype: type
    initial: int

    def zeros(self) -> np.ndarray:
        return np.full(self.shape, self.initial, dtype=self.dtype)

    def tensor_specs(self) -> tuple[TensorSpec, TensorSpec]:
        onnx_type = _ONNX_TYPES[self.dtype]
        return TensorSpec(self.input_name, onnx_type, self.shape), TensorSpec(self.output_name, onnx_type, self.shape)


@dataclass(frozen=True)
class NanoMeta:
    """What ``codec_browser_onnx_meta.json`` says: the graphs' paths and the decode-step graph's state."""

    graphs: dict[str, Path]  # by GRAPH_ROLES
    state: tuple[StateSpec, ...]


def is_nano_directory(directory: Path) -> bool:
    """Whether ``directory`` holds a MOSS-Audio-Tokenizer-Nano ONNX export (its meta file)."""
    return (Path(directory) / NANO_META_FILE).is_file()


def read_nano_meta(directory: Path) -> NanoMeta:
    """Read and check ``directory``'s meta file against ``NanoOnnxCodec``'s settings.

    WeightsError when the file or a graph it names is missing; CodecError when it says something else."""
    path = Path(directory) / NANO_META_FILE
    if not path.is_file():
        raise WeightsError(
            f"{path} not found: {directory} is not a MOSS-Audio-Tokenizer-Nano ONNX directory; download it with "
            f"hf download {NANO_ONNX_SOURCE} --local-dir <dir>"
        )
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
        files, config = meta["files"], meta["codec_config"]
        settings = {key: int(config[key]) for key in ("sample_rate", "channels", "num_quantizers")}
        streaming = meta.get("streaming_decode", {})
        state = tuple(
            StateSpec(str(s["input_name"]), str(s["output_name"]), _shape(s["shape"]), np.int32, 0)
            for s in streaming.get("transformer_offsets", [])
        ) + tuple(
            StateSpec(str(s[f"{kind}_input_name"]), str(s[f"{kind}_output_name"]), _shape(s[shape_key]), dtype, initial)
            for s in streaming.get("attention_caches", [])
            for kind, shape_key, dtype, initial in _ATTENTION_STATE
        )
        graphs = {role: Path(directory) / str(files[role]) for role in GRAPH_ROLES}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise CodecError(f"{path} is not a readable codec meta file ({error!r}); download it again") from error
    wanted = {
        "sample_rate": NanoOnnxCodec.sample_rate,
        "channels": NanoOnnxCodec.channels,
        "num_quantizers": NanoOnnxCodec.codec_quantizers,
    }
    if settings != wanted:
        raise CodecError(f"{path}: codec_config {settings}; this package runs MOSS-Audio-Tokenizer-Nano, {wanted}")
    for role, graph in graphs.items():
        if not graph.is_file():
            raise WeightsError(f"codec {role} graph {graph} (named in {path}) not found; download {NANO_ONNX_SOURCE}")
    return NanoMeta(graphs=graphs, state=state)


def _shape(value: Any) -> tuple[int, ...]:
    shape = tuple(int(d) for d in value)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative size in shape {shape}")
    return shape


class NanoOnnxCodec(AudioCodec):
    """MOSS-Audio-Tokenizer-Nano (48 kHz stereo, 16 codebooks) from its published ONNX directory.

    The graphs asked for are loaded and their I/O checked at once, so a wrong file fails at start-up.
    ``encoder``/``decoder``: which graphs to hold (``low_memory`` holds one at a time). ``provider``, ``threads``
    and ``max_frames`` as ``OnnxCodec``'s; longer audio is coded in windows, overlapping by the attention span
    the ``config.json`` beside the graphs states (``read_attention_span``). ``stream_decoder`` opens the
    decode-step graph.
    """

    sample_rate: ClassVar[int] = 48000
    samples_per_frame: ClassVar[int] = 3840
    channels: ClassVar[int] = 2
    codec_quantizers: ClassVar[int] = 16  # the codebooks of every frame: the Nano model's n_vq too
    # Upstream's runtime encodes a clip as it is (no loudness change), and its encoder counts whole frames only.
    reference_loudness: ClassVar[bool] = False
    reference_pads_last_frame: ClassVar[bool] = False

    def __init__(
        self,
        directory: Path | str,
        provider: str = "auto",
        threads: int = 0,
        max_frames: int | None = None,
        encoder: bool = True,
        decoder: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.meta = read_nano_meta(self.directory)
        self.n_quantizers = self.codec_quantizers
        self.max_frames = max_frames
        self.attention_span_frames = read_attention_span(self.directory)
        self._providers = resolve_providers(provider)
        self._require_cuda = provider == "cuda"
        self._threads = threads
        self._encoder = self._load("encode", _ENCODE_INPUTS, _ENCODE_OUTPUTS) if encoder else None
        self._decoder = self._load("decode_full", _DECODE_INPUTS, _DECODE_OUTPUTS) if decoder else None

    @property
    def providers(self) -> list[str]:
        """Execution providers the sessions actually use (for start-up logs)."""
        session = self._decoder or self._encoder
        if session is None:
            raise CodecError("this codec was closed; create a new NanoOnnxCodec")
        return list(session.get_providers())

    def close(self) -> None:
        self._encoder = self._decoder = None

    def stream_decoder(self) -> NanoStreamDecoder:
        """A stream decoder over this directory's decode-step graph (its own session and state)."""
        pairs = [state.tensor_specs() for state in self.meta.state]
        inputs = _DECODE_INPUTS + tuple(fed for fed, _ in pairs)
        outputs = _DECODE_OUTPUTS + tuple(returned for _, returned in pairs)
        return NanoStreamDecoder(self.meta.graphs["decode_step"], self._load("decode_step", inputs, outputs), self.meta)

    def _encode(self, waveform: np.ndarray) -> np.ndarray:
        if self._encoder is None:
            raise CodecError("this codec was opened without its encoder (decoder only) or closed")
        feeds = {
            WAVEFORM: np.ascontiguousarray(waveform.T[None]),
            INPUT_LENGTHS: np.array([waveform.shape[0]], dtype=np.int32),
        }
        out = _named_run(self._encoder, feeds)
        n_frames = waveform.shape[0] // self.samples_per_frame
        codes, lengths = out[CODES], out[CODE_LENGTHS]
        if codes.shape != (1, n_frames, self.n_quantizers) or int(lengths.reshape(-1)[0]) != n_frames:
            raise CodecError(
                f"{self.meta.graphs['encode']} returned codes of shape {codes.shape} (length {lengths.reshape(-1)}) "
                f"for {n_frames} frames of audio; expected (1, {n_frames}, {self.n_quantizers})"
            )
        return codes[0].astype(np.int64)

    def _decode(self, codes: np.ndarray) -> np.ndarray:
        if self._decoder is None:
            raise CodecError("this codec was opened without its decoder (encoder only) or closed")
        out = _named_run(self._decoder, code_feeds(codes))
        return samples_from_graph(out, codes.shape[0], self.meta.graphs["decode_full"])

    def _load(self, role: str, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> Any:
        path = self.meta.graphs[role]
        session = open_session(path, self._providers, self._threads, self._require_cuda)
        check_graph(path, session, inputs, outputs)
        return session


_CODES_SPEC = TensorSpec(CODES, "tensor(int32)", (None, None, NanoOnnxCodec.codec_quantizers))
_LENGTHS = "tensor(int32)", (None,)
_ENCODE_INPUTS = (
    TensorSpec(WAVEFORM, "tensor(float)", (None, NanoOnnxCodec.channels, None)),
    TensorSpec(INPUT_LENGTHS, *_LENGTHS),
)
_ENCODE_OUTPUTS = (_CODES_SPEC, TensorSpec(CODE_LENGTHS, *_LENGTHS))
_DECODE_INPUTS = (_CODES_SPEC, TensorSpec(CODE_LENGTHS, *_LENGTHS))
_DECODE_OUTPUTS = (
    TensorSpec(AUDIO, "tensor(float)", (None, NanoOnnxCodec.channels, None)),
    TensorSpec(AUDIO_LENGTHS, *_LENGTHS),
)


def check_graph(path: Path, session: Any, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]) -> None:
    """Raise CodecError naming ``path`` unless the graph has exactly ``inputs`` (all are fed) and at least
    ``outputs`` (read by name), each of its type, rank and static sizes."""
    for kind, actual, expected, exact in (
        ("input", session.get_inputs(), inputs, True),
        ("output", session.get_outputs(), outputs, False),
    ):
        by_name = {arg.name: arg for arg in actual}
        wanted = {str(spec.name) for spec in expected}
        missing, extra = sorted(wanted - set(by_name)), sorted(set(by_name) - wanted)
        if missing or (exact and extra):
            raise CodecError(
                f"{path}: graph {kind}s missing {missing}, unexpected {extra if exact else []}; is this the "
                f"{NANO_ONNX_SOURCE} graph its meta file names?"
            )
        for spec in expected:
            check_tensor(path, f"{kind} {spec.name!r}", by_name[str(spec.name)], spec)


def code_feeds(codes: np.ndarray) -> dict[str, np.ndarray]:
    """Checked (n, 16) int64 codes as a decode graph's inputs."""
    return {
        CODES: np.ascontiguousarray(codes[None], dtype=np.int32),
        CODE_LENGTHS: np.array([codes.shape[0]], dtype=np.int32),
    }


def samples_from_graph(out: dict[str, np.ndarray], n_frames: int, path: Path) -> np.ndarray:
    """A decode graph's ``audio`` (1, 2, n) and ``audio_lengths`` as (n_frames * 3840, 2) float32, checked."""
    audio, length = out[AUDIO], int(out[AUDIO_LENGTHS].reshape(-1)[0])
    expected = n_frames * NanoOnnxCodec.samples_per_frame
    if audio.ndim != 3 or audio.shape[:2] != (1, NanoOnnxCodec.channels) or length != expected:
        raise CodecError(f"{path} returned audio of shape {audio.shape}, length {length}, for {n_frames} frames")
    return np.ascontiguousarray(audio[0, :, :length].T, dtype=np.float32)


def _named_run(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [arg.name for arg in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


class NanoStreamDecoder:
    """Decode one utterance's codes chunk by chunk on the decode-step graph, carrying its state between calls.

    The duck interface of ``stream_decoder.StreamDecoder`` that ``streaming.StatefulStreamDecoding`` uses:
    ``decode`` takes only the new frames (n, 16) and returns their (n * 3840, 2) samples, ``reset`` starts the
    next utterance, ``frames_done`` counts the frames since, ``max_frames`` is None (any number per call).
    One utterance at a time: concurrent streams need one decoder each.
    """

    max_frames: int | None = None
    n_quantizers = NanoOnnxCodec.codec_quantizers

    def __init__(self, path: Path, session: Any, meta: NanoMeta) -> None:
        self.path = path
        self._session = session
        self._specs = meta.state
        self._state: dict[str, np.ndarray] = {}
        self.reset()

    @property
    def frames_done(self) -> int:
        return self._frames_done

    @property
    def state_bytes(self) -> int:
        """Memory held by the state (the attention caches, mostly)."""
        return sum(array.nbytes for array in self._state.values())

    def reset(self) -> None:
        """Forget the utterance: the next ``decode`` starts a new one, exactly as after loading."""
        self._state = {spec.input_name: spec.zeros() for spec in self._specs}
        self._frames_done = 0

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Decode the next frames' codes (n, 16), integers in [0, 1023], to float32 samples (n * 3840, 2)."""
        codes = NanoOnnxCodec._checked_codes(codes, self.n_quantizers)
        out = _named_run(self._session, {**code_feeds(codes), **self._state})
        samples = samples_from_graph(out, codes.shape[0], self.path)
        self._state = {spec.input_name: out[spec.output_name] for spec in self._specs}
        self._frames_done += codes.shape[0]
        return samples
