"""Stateful streaming decode of the MOSS audio codec: each call decodes only the new frames.

The graph (written by ``moss_tts_node.tools.prepare.stream_decoder_build``) is the codec's decode path with
every attention layer reading a ring cache of the keys and values of the positions before the call,
so a chunk costs what its own frames cost instead of re-decoding seconds of left context. This module
owns the graph's contract (the names below); docs/stream-decoder.md explains the state and how the
result relates to the offline decode.

Contract, for the graph of a codec whose decoder has transformer stages ``s`` = 0, 1, ...:

- inputs ``audio_codes`` (q, 1, n) int64, the new frames' codes of the codec's first q quantizers (the
  graph's count: 32, or fewer for a model that uses the coarse levels only); ``frames_done`` () int64,
  frames decoded before them; per stage ``s`` and layer ``l`` the caches ``key_cache.s{s}.l{l}`` and
  ``value_cache.s{s}.l{l}`` (1, heads, rows, head_dim) float32. A stage's first ``span`` rows are its
  ring (position p in row p mod span), the rows after it take the call's own keys and values: a call
  holds at most (rows - span) positions of the stage.
- outputs ``audio`` (1, 1, n * 1920) float32; ``frames_done_out`` (); per stage and layer
  ``present_key.s{s}.l{l}`` and ``present_value.s{s}.l{l}``, the caches again: bound to the caches' own
  memory, so the call's rows are written where they lie (ONNX Runtime's GroupQueryAttention reads and
  writes a cache in place when its past and present are one buffer); per stage ``write_slots.s{s}``
  (w,) int64, the ring rows of the call's newest w positions, which ``StreamDecoder`` copies there from
  the rows after the ring (the positions of a call start in row ``span``).
- metadata: ``FORMAT_KEY``, the attention mode, and per stage its span and positions per frame.

Caches are separate inputs per layer rather than one stacked tensor per stage because slicing a graph
input copies it: this way each layer reads and writes its cache where it lies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.codec.onnx import TensorSpec, check_tensor
from moss_tts_node.codec.quantizer import checked_quantizers
from moss_tts_node.errors import CodecError

CODES_INPUT = "audio_codes"
FRAMES_INPUT = "frames_done"
AUDIO_OUTPUT = "audio"
FRAMES_OUTPUT = "frames_done_out"
# The metadata key that marks a stream decoder graph, and its format version.
FORMAT_KEY = "moss_tts_node.stream_decoder"
FORMAT_VERSION = "2"  # 1: the unfused graph of before 2026-12, which returned the rows to store
# Metadata: one of ATTENTION_MODES, and per stage, comma-separated, its attention span and its positions per frame.
# "window": every query attends to its whole span, as the offline decode does, at any chunk size.
# "ring": the codec's own streaming, which stores a chunk's keys before attending, so within a chunk
# the earlier queries lose the oldest keys the later ones overwrite.
ATTENTION_MODES = ("window", "ring")
ATTENTION_KEY = "attention"
SPANS_KEY = "attention_spans"
POSITIONS_KEY = "positions_per_frame"
# Frames per call when a whole utterance decodes on the stream decoder, and the most a window graph's call
# holds (the builder sizes the caches for it; longer decodes are cut into calls of this many): from about 10
# on a frame costs no less (docs/stream-decoder.md, "Cost"), while each call's attention scores grow with
# its frames squared.
WHOLE_DECODE_FRAMES_PER_CALL = 25


def key_cache_name(stage: int, layer: int) -> str:
    return f"key_cache.s{stage}.l{layer}"


def value_cache_name(stage: int, layer: int) -> str:
    return f"value_cache.s{stage}.l{layer}"


def present_key_name(stage: int, layer: int) -> str:
    return f"present_key.s{stage}.l{layer}"


def present_value_name(stage: int, layer: int) -> str:
    return f"present_value.s{stage}.l{layer}"


def write_slots_name(stage: int) -> str:
    return f"write_slots.s{stage}"


_BUILD_HINT = "build one from the codec checkpoint with `python -m moss_tts_node build-stream-decoder`"


@dataclass
class _StageCache:
    """One transformer stage's caches, all its layers stacked, and where a call's positions go in them."""

    keys: np.ndarray  # (layers, 1, heads, rows, head_dim)
    values: np.ndarray
    span: int  # ring rows; a call's positions follow them
    per_frame: int  # positions per frame at this stage

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    @property
    def frames_per_call(self) -> int:
        """The most frames one call can hold: the rows after the ring."""
        return (self.keys.shape[3] - self.span) // self.per_frame

    def store(self, slots: np.ndarray, n_frames: int) -> None:
        """Copy the call's newest positions (rows after the ring) into their ring ``slots``."""
        end = self.span + n_frames * self.per_frame
        for cache in (self.keys, self.values):
            cache[:, :, :, slots] = cache[:, :, :, end - len(slots) : end]


class StreamDecoder:
    """Decode one utterance's codes chunk by chunk, keeping the codec's attention state between calls.

    ``decode`` takes only the new frames (n, quantizers) and returns their n * 1920 samples; ``reset``
    starts the next utterance. One utterance at a time: the state is this object's, so concurrent streams
    need one decoder each (they share nothing but the file). CPU only: the caches are NumPy arrays
    that ONNX Runtime reads and writes in place through IO binding.

    ``quantizers``: the codebooks the caller's codes hold; a graph built for another count is refused.
    None: the graph's count, whatever it is.
    """

    def __init__(self, graph_path: Path | str, threads: int = 0, quantizers: int | None = None) -> None:
        import onnxruntime as ort

        self.path = Path(graph_path)
        if not self.path.is_file():
            raise CodecError(f"stream decoder graph {self.path} not found; {_BUILD_HINT}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        # Idle workers sleep, within a call too: spinning gains little on a quiet machine and holds a core another
        # thread needs on a loaded one (docs/stream-decoder.md, "Threads"); between calls llama.cpp needs them.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(
                str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as error:  # onnxruntime raises several unrelated types for a bad file
            raise CodecError(f"{self.path} is not a loadable ONNX model: {error}") from error
        self._stages = self._caches_from_graph()
        if quantizers is not None and quantizers != self.n_quantizers:
            raise CodecError(
                f"{self.path} decodes codes of {self.n_quantizers} quantizers, but this model's codes have "
                f"{quantizers}; build the graph for them with `python -m moss_tts_node build-stream-decoder "
                f"--quantizers {quantizers}`"
            )
        self._binding = self._session.io_binding()
        self._bound_outputs: list[str] = []  # the binding's outputs, in the order it returns them
        for stage, cache in enumerate(self._stages):
            for layer in range(cache.keys.shape[0]):
                for names, array in (
                    ((key_cache_name, present_key_name), cache.keys[layer]),
                    ((value_cache_name, present_value_name), cache.values[layer]),
                ):
                    self._binding.bind_input(names[0](stage, layer), *self._in_place(array))
                    self._bind_output(names[1](stage, layer), *self._in_place(array))
        for name in self._sized_outputs:
            self._bind_output(name, "cpu")
        self._frames_done = 0
        calls = min(cache.frames_per_call for cache in self._stages)
        ring = self._session.get_modelmeta().custom_metadata_map[ATTENTION_KEY] == "ring"
        # A window graph's output is the offline decode however the frames are cut, so longer decodes are cut
        # into calls it holds; a ring graph's depends on the calls, as the codec's own streaming does.
        self._frames_per_call = calls
        self.max_frames = calls if ring else None  # frames per call, None: any number

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
        """Decode the next frames' codes (n, quantizers), integers in [0, 1023], to float32 samples (n * 1920,)."""
        codes = AudioCodec._checked_codes(codes, self.n_quantizers)
        n_frames = codes.shape[0]
        if self.max_frames is not None and n_frames > self.max_frames:
            raise CodecError(
                f"{self.path} decodes at most {self.max_frames} frames per call (ring attention, as the codec's own "
                f"streaming), got {n_frames}; pass the frames in smaller chunks, or build the graph with "
                "attention='window', which takes any number"
            )
        step = self._frames_per_call
        return np.concatenate([self._call(codes[start : start + step]) for start in range(0, n_frames, step)])

    def _call(self, codes: np.ndarray) -> np.ndarray:
        """One run of the graph on at most ``_frames_per_call`` frames."""
        n_frames = codes.shape[0]
        # (quantizers, 1, n): the graph sums the codebooks it was built for, no padding rows (unlike decoder.onnx)
        self._binding.bind_cpu_input(CODES_INPUT, np.ascontiguousarray(codes.T[:, None, :]))
        self._binding.bind_cpu_input(FRAMES_INPUT, np.array(self._frames_done, dtype=np.int64))
        # These outputs change size with the chunk: bound afresh, ONNX Runtime allocates them for each call.
        for name in self._sized_outputs:
            self._binding.bind_output(name, "cpu")
        self._session.run_with_iobinding(self._binding)
        outputs = dict(zip(self._bound_outputs, self._binding.get_outputs(), strict=True))
        for stage, cache in enumerate(self._stages):
            cache.store(outputs[write_slots_name(stage)].numpy(), n_frames)
        self._frames_done = int(outputs[FRAMES_OUTPUT].numpy())
        audio = outputs[AUDIO_OUTPUT].numpy()
        expected = n_frames * AudioCodec.samples_per_frame
        if audio.shape != (1, 1, expected):
            raise CodecError(
                f"{self.path} returned audio of shape {audio.shape} for {n_frames} frames; expected {expected}"
            )
        return audio.reshape(-1)

    def _bind_output(self, name: str, *where: Any) -> None:
        """Bind an output at load, noting its place among the binding's outputs (a call binds the sized ones
        again, which keeps their places)."""
        self._binding.bind_output(name, *where)
        self._bound_outputs.append(name)

    @staticmethod
    def _in_place(array: np.ndarray) -> tuple[Any, ...]:
        """``bind_input``/``bind_output`` arguments that let the graph use ``array`` (contiguous) where it lies."""
        return "cpu", 0, np.float32, list(array.shape), array.ctypes.data

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
            for layer in range(count):
                expected_inputs |= {key_cache_name(stage, layer), value_cache_name(stage, layer)}
                expected_outputs |= {present_key_name(stage, layer), present_value_name(stage, layer)}
            expected_outputs.add(write_slots_name(stage))
        for kind, names, wanted in (("inputs", inputs, expected_inputs), ("outputs", outputs, expected_outputs)):
            if set(names) != wanted:
                missing, extra = sorted(wanted - set(names)), sorted(set(names) - wanted)
                raise CodecError(f"{self.path}: graph {kind} missing {missing}, unexpected {extra}; {_BUILD_HINT}")
        self._sized_outputs = [AUDIO_OUTPUT, FRAMES_OUTPUT, *(write_slots_name(stage) for stage in layers)]
        quantizers = inputs[CODES_INPUT].shape[0]
        try:
            self.n_quantizers = checked_quantizers(quantizers)  # the codebooks each frame's codes hold
        except CodecError as error:
            raise CodecError(f"{self.path}: input {CODES_INPUT}: {error}; {_BUILD_HINT}") from error
        self._check(inputs[CODES_INPUT], "input", TensorSpec(CODES_INPUT, "tensor(int64)", (quantizers, 1, None)))
        self._check(inputs[FRAMES_INPUT], "input", TensorSpec(FRAMES_INPUT, "tensor(int64)", ()))
        self._check(outputs[AUDIO_OUTPUT], "output", TensorSpec(AUDIO_OUTPUT, "tensor(float)", (1, 1, None)))
        self._check(outputs[FRAMES_OUTPUT], "output", TensorSpec(FRAMES_OUTPUT, "tensor(int64)", ()))
        spans, per_frame = (self._stage_numbers(meta, key, len(layers)) for key in (SPANS_KEY, POSITIONS_KEY))
        if meta.get(ATTENTION_KEY) not in ATTENTION_MODES:
            raise CodecError(f"{self.path}: metadata {ATTENTION_KEY}={meta.get(ATTENTION_KEY)!r}; {_BUILD_HINT}")
        return [
            self._stage_cache(stage, count, spans[stage], per_frame[stage], inputs, outputs)
            for stage, count in layers.items()
        ]

    def _stage_numbers(self, meta: dict[str, str], key: str, stages: int) -> list[int]:
        """A metadata entry of one positive integer per stage."""
        try:
            numbers = [int(text) for text in meta[key].split(",")]
        except (KeyError, ValueError):
            numbers = []
        if len(numbers) != stages or min(numbers) < 1:
            raise CodecError(f"{self.path}: metadata {key}={meta.get(key)!r} is not {stages} positive integers")
        return numbers

    def _stage_cache(
        self, stage: int, count: int, span: int, per_frame: int, inputs: dict[str, Any], outputs: dict[str, Any]
    ) -> _StageCache:
        key_shape = inputs[key_cache_name(stage, 0)].shape
        if len(key_shape) != 4 or not all(isinstance(d, int) and d > 0 for d in key_shape) or key_shape[0] != 1:
            raise CodecError(
                f"{self.path}: input {key_cache_name(stage, 0)} has shape {key_shape}; a cache needs fixed "
                f"(1, heads, rows, head_dim) sizes; {_BUILD_HINT}"
            )
        if key_shape[2] < span + per_frame:
            raise CodecError(
                f"{self.path}: stage {stage}'s caches hold {key_shape[2]} rows, no room for a frame after its "
                f"span of {span}; {_BUILD_HINT}"
            )
        for layer in range(count):
            for kind, names, name in (
                ("input", inputs, key_cache_name(stage, layer)),
                ("input", inputs, value_cache_name(stage, layer)),
                ("output", outputs, present_key_name(stage, layer)),
                ("output", outputs, present_value_name(stage, layer)),
            ):
                self._check(names[name], kind, TensorSpec(name, "tensor(float)", tuple(key_shape)))
        self._check(outputs[write_slots_name(stage)], "output", TensorSpec(None, "tensor(int64)", (None,)))
        return _StageCache(
            keys=np.zeros((count, *key_shape), dtype=np.float32),
            values=np.zeros((count, *key_shape), dtype=np.float32),
            span=span,
            per_frame=per_frame,
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
        self.n_quantizers = decoder.n_quantizers  # the codes it decodes: the graph's count, the model's
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
