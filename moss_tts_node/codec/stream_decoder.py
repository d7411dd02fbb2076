"""Stateful streaming decode of the MOSS audio codec: each call decodes only the new frames.

The graph (written by ``moss_tts_node.tools.prepare.stream_decoder_build``) is the codec's decode path with
every attention layer reading a ring cache of the keys and values of the positions before the call,
so a chunk costs what its own frames cost instead of re-decoding seconds of left context. This module
owns the graph's contract (the names below); docs/stream-decoder.md explains the state and how the
result relates to the offline decode.

Contract, for the graph of a codec whose decoder has transformer stages ``s`` = 0, 1, ...:

- inputs ``audio_codes`` (32, 1, n) int64, the new frames; ``frames_done`` () int64, frames decoded
  before them; per stage ``s`` and layer ``l`` the caches ``key_cache.s{s}.l{l}`` (heads, head_dim,
  capacity) and ``value_cache.s{s}.l{l}`` (heads, capacity, head_dim) float32. The caches are separate
  inputs rather than one stacked tensor per stage because slicing a graph input copies it: this way
  each layer reads its cache where it lies.
- outputs ``audio`` (1, 1, n * 1920) float32; ``frames_done_out`` (); per stage ``new_keys.s{s}``
  (layers, heads, head_dim, w) and ``new_values.s{s}`` (layers, heads, w, head_dim), the rows to store,
  and ``write_slots.s{s}`` (w,) int64, the ring slots to store them in.

The graph returns the rows to store instead of whole new caches, and ``StreamDecoder`` writes them
into its cache arrays in place: a graph output can never alias an input, so returning the caches
would copy all of them (about 170 MB at full size) on every call.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.codec.onnx import TensorSpec, check_tensor
from moss_tts_node.errors import CodecError

CODES_INPUT = "audio_codes"
FRAMES_INPUT = "frames_done"
AUDIO_OUTPUT = "audio"
FRAMES_OUTPUT = "frames_done_out"
# The metadata key that marks a stream decoder graph, and its format version.
FORMAT_KEY = "moss_tts_node.stream_decoder"
FORMAT_VERSION = "1"
# Metadata of graphs that limit the frames of one call (ring attention), with that limit.
MAX_FRAMES_KEY = "max_frames_per_call"
# Frames per call when a whole utterance decodes on the stream decoder: from about 10 on a frame costs no
# less (docs/stream-decoder.md, "What it costs"), while each call's attention scores grow with its frames squared.
WHOLE_DECODE_FRAMES_PER_CALL = 25


def key_cache_name(stage: int, layer: int) -> str:
    return f"key_cache.s{stage}.l{layer}"


def value_cache_name(stage: int, layer: int) -> str:
    return f"value_cache.s{stage}.l{layer}"


def new_keys_name(stage: int) -> str:
    return f"new_keys.s{stage}"


def new_values_name(stage: int) -> str:
    return f"new_values.s{stage}"


def write_slots_name(stage: int) -> str:
    return f"write_slots.s{stage}"


_BUILD_HINT = "build one from the codec checkpoint with `python -m moss_tts_node build-stream-decoder`"


@dataclass
class _StageCache:
    """One transformer stage's caches: all its layers stacked, so each stage is two arrays."""

    keys: np.ndarray  # (layers, heads, head_dim, capacity)
    values: np.ndarray  # (layers, heads, capacity, head_dim)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class StreamDecoder:
    """Decode one utterance's codes chunk by chunk, keeping the codec's attention state between calls.

    ``decode`` takes only the new frames (n, 32) and returns their n * 1920 samples; ``reset`` starts
    the next utterance. One utterance at a time: the state is this object's, so concurrent streams
    need one decoder each (they share nothing but the file). CPU only: the caches are NumPy arrays
    that ONNX Runtime reads in place through IO binding.
    """

    def __init__(self, graph_path: Path | str, threads: int = 0) -> None:
        import onnxruntime as ort

        self.path = Path(graph_path)
        if not self.path.is_file():
            raise CodecError(f"stream decoder graph {self.path} not found; {_BUILD_HINT}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # Idle ORT workers would otherwise spin on the cores llama.cpp needs for the next step.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(
                str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as error:  # onnxruntime raises several unrelated types for a bad file
            raise CodecError(f"{self.path} is not a loadable ONNX model: {error}") from error
        self._stages = self._caches_from_graph()
        self._binding = self._session.io_binding()
        for stage, cache in enumerate(self._stages):
            for layer in range(cache.keys.shape[0]):
                self._bind_in_place(key_cache_name(stage, layer), cache.keys[layer])
                self._bind_in_place(value_cache_name(stage, layer), cache.values[layer])
        self._frames_done = 0
        limit = self._session.get_modelmeta().custom_metadata_map.get(MAX_FRAMES_KEY)
        self.max_frames = None if limit is None else int(limit)  # frames per call, None: any number

    @property
    def frames_done(self) -> int:
        """Frames decoded since the last reset (or since loading)."""
        return self._frames_done

    @property
    def state_bytes(self) -> int:
        """Memory held by the attention caches."""
        return sum(cache.nbytes for cache in self._stages)

    def reset(self) -> None:
        """Forget the utterance: the next ``decode`` starts a new one, exactly as after loading."""
        # Stale rows are masked out anyway (their slots are marked empty by frames_done = 0); zeroing
        # them also keeps a NaN from a bad call out of the next utterance (0 x NaN would be NaN).
        for cache in self._stages:
            cache.keys.fill(0.0)
            cache.values.fill(0.0)
        self._frames_done = 0

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """Decode the next frames' codes (n, 32), integers in [0, 1023], to their float32 samples (n * 1920,)."""
        codes = AudioCodec._checked_codes(codes)
        n_frames = codes.shape[0]
        if self.max_frames is not None and n_frames > self.max_frames:
            raise CodecError(
                f"{self.path} decodes at most {self.max_frames} frames per call (ring attention, as the codec's own "
                f"streaming), got {n_frames}; pass the frames in smaller chunks, or build the graph with "
                "attention='window', which takes any number"
            )
        self._binding.bind_cpu_input(CODES_INPUT, AudioCodec._graph_codes(codes))
        self._binding.bind_cpu_input(FRAMES_INPUT, np.array(self._frames_done, dtype=np.int64))
        # Outputs change size with the chunk: bound afresh, ONNX Runtime allocates them for each call.
        self._binding.clear_binding_outputs()
        for name in self._output_names:
            self._binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(self._binding)
        outputs = dict(zip(self._output_names, self._binding.get_outputs(), strict=True))
        for stage, cache in enumerate(self._stages):
            slots = outputs[write_slots_name(stage)].numpy()
            cache.keys[:, :, :, slots] = outputs[new_keys_name(stage)].numpy()
            cache.values[:, :, slots, :] = outputs[new_values_name(stage)].numpy()
        self._frames_done = int(outputs[FRAMES_OUTPUT].numpy())
        audio = outputs[AUDIO_OUTPUT].numpy()
        expected = n_frames * AudioCodec.samples_per_frame
        if audio.shape != (1, 1, expected):
            raise CodecError(
                f"{self.path} returned audio of shape {audio.shape} for {n_frames} frames; expected {expected}"
            )
        return audio.reshape(-1)

    def _bind_in_place(self, name: str, array: np.ndarray) -> None:
        """Let the graph read ``array`` (a contiguous view into a stage's cache) without copying it."""
        self._binding.bind_input(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)

    def _caches_from_graph(self) -> list[_StageCache]:
        """Check the graph against the contract and allocate zeroed caches of the shapes its inputs declare."""
        meta = self._session.get_modelmeta().custom_metadata_map
        if meta.get(FORMAT_KEY) != FORMAT_VERSION:
            found = f"format {meta[FORMAT_KEY]!r}" if FORMAT_KEY in meta else "no stream decoder metadata"
            raise CodecError(
                f"{self.path} is not a stream decoder graph of format {FORMAT_VERSION} ({found}); {_BUILD_HINT}"
            )
        inputs = {arg.name: arg for arg in self._session.get_inputs()}
        outputs = {arg.name: arg for arg in self._session.get_outputs()}
        self._output_names = [arg.name for arg in self._session.get_outputs()]
        layers: dict[int, int] = {}
        for name in inputs:
            match = re.fullmatch(r"key_cache\.s(\d+)\.l(\d+)", name)
            if match:
                stage, layer = int(match[1]), int(match[2])
                layers[stage] = max(layers.get(stage, 0), layer + 1)
        if not layers or sorted(layers) != list(range(len(layers))):
            raise CodecError(f"{self.path}: no key_cache.s<stage>.l<layer> inputs for stages 0, 1, ...; {_BUILD_HINT}")
        expected_inputs = {CODES_INPUT, FRAMES_INPUT}
        expected_outputs = {AUDIO_OUTPUT, FRAMES_OUTPUT}
        for stage, count in layers.items():
            expected_inputs |= {f(stage, layer) for layer in range(count) for f in (key_cache_name, value_cache_name)}
            expected_outputs |= {f(stage) for f in (new_keys_name, new_values_name, write_slots_name)}
        for kind, names, wanted in (("inputs", inputs, expected_inputs), ("outputs", outputs, expected_outputs)):
            if set(names) != wanted:
                missing, extra = sorted(wanted - set(names)), sorted(set(names) - wanted)
                raise CodecError(f"{self.path}: graph {kind} missing {missing}, unexpected {extra}; {_BUILD_HINT}")
        self._check(
            inputs[CODES_INPUT], "input", TensorSpec(CODES_INPUT, "tensor(int64)", (AudioCodec.n_quantizers, 1, None))
        )
        self._check(inputs[FRAMES_INPUT], "input", TensorSpec(FRAMES_INPUT, "tensor(int64)", ()))
        self._check(outputs[AUDIO_OUTPUT], "output", TensorSpec(AUDIO_OUTPUT, "tensor(float)", (1, 1, None)))
        self._check(outputs[FRAMES_OUTPUT], "output", TensorSpec(FRAMES_OUTPUT, "tensor(int64)", ()))
        return [self._stage_cache(stage, count, inputs, outputs) for stage, count in layers.items()]

    def _stage_cache(self, stage: int, count: int, inputs: dict[str, Any], outputs: dict[str, Any]) -> _StageCache:
        key_shape = inputs[key_cache_name(stage, 0)].shape
        if len(key_shape) != 3 or not all(isinstance(d, int) and d > 0 for d in key_shape):
            raise CodecError(
                f"{self.path}: input {key_cache_name(stage, 0)} has shape {key_shape}; a cache needs fixed "
                f"(heads, head_dim, capacity) sizes; {_BUILD_HINT}"
            )
        heads, head_dim, capacity = key_shape
        for layer in range(count):
            self._check(
                inputs[key_cache_name(stage, layer)],
                "input",
                TensorSpec(key_cache_name(stage, layer), "tensor(float)", (heads, head_dim, capacity)),
            )
            self._check(
                inputs[value_cache_name(stage, layer)],
                "input",
                TensorSpec(value_cache_name(stage, layer), "tensor(float)", (heads, capacity, head_dim)),
            )
        rows = (count, heads, None, None)
        self._check(outputs[new_keys_name(stage)], "output", TensorSpec(None, "tensor(float)", rows))
        self._check(outputs[new_values_name(stage)], "output", TensorSpec(None, "tensor(float)", rows))
        self._check(outputs[write_slots_name(stage)], "output", TensorSpec(None, "tensor(int64)", (None,)))
        return _StageCache(
            keys=np.zeros((count, heads, head_dim, capacity), dtype=np.float32),
            values=np.zeros((count, heads, capacity, head_dim), dtype=np.float32),
        )

    def _check(self, arg: Any, kind: str, spec: TensorSpec) -> None:
        check_tensor(self.path, f"{kind} {arg.name!r}", arg, spec)


class StreamDecoderCodec(AudioCodec):
    """The codec with a ``StreamDecoder`` for its decoder: one decode graph resident, not two.

    A stream decoder's output equals the offline decode of the same codes whatever the chunking
    (docs/stream-decoder.md), so whole-utterance decodes run on it too, in calls of at most
    ``frames_per_call`` frames (a bound on each call's memory), and the published ``decoder.onnx``
    stays on disk. Any length decodes in one pass, exactly: no windows. The decoder's state is
    reset after every decode. Encoding is ``encoder``'s (opened without its decoder).
    """

    def __init__(
        self, decoder: StreamDecoder, encoder: AudioCodec, frames_per_call: int = WHOLE_DECODE_FRAMES_PER_CALL
    ) -> None:
        self.decoder = decoder
        self._encoder = encoder
        self.frames_per_call = min(frames_per_call, decoder.max_frames or frames_per_call)
        self.attention_span_frames = encoder.attention_span_frames

    def close(self) -> None:
        self._encoder.close()
        self.decoder = None  # type: ignore[assignment]  # its session, caches and graph go with the codec

    def _frame_limit(self, graph: str) -> int | None:
        return self._encoder._frame_limit(graph) if graph == "encoder" else None

    def _encode(self, waveform: np.ndarray) -> np.ndarray:
        return self._encoder._encode(waveform)

    def _decode(self, codes: np.ndarray) -> np.ndarray:
        # The state must be this decode's: another decode of the same graph (a stream) would corrupt both. One
        # found before the first call is refused and left as it is; one found later was mixed in already.
        self._check_state(0)
        pieces = []
        try:
            for start in range(0, codes.shape[0], self.frames_per_call):
                self._check_state(start)
                pieces.append(self.decoder.decode(codes[start : start + self.frames_per_call]))
        finally:
            self.decoder.reset()
        return np.concatenate(pieces)

    def _check_state(self, frames: int) -> None:
        if self.decoder.frames_done != frames:
            raise CodecError(
                f"the stream decoder holds {self.decoder.frames_done} frames of state, not the {frames} of this "
                "decode: two decodes of one synthesizer ran at once; run them one after the other"
            )
