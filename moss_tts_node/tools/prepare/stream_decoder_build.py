"""Write the streaming decoder graph of a MOSS-Audio-Tokenizer checkpoint (``config.json`` + safetensors).

The graph follows the contract in ``moss_tts_node.codec.stream_decoder``: codes of the new frames and
the attention caches in, their audio and the cache rows to store out. It is the codec's decode path
(RLFQ codebook lookup, the causal Transformer stages, the patch reshapes) written op by op with the
``onnx`` helpers, from the checkpoint's own tensors; no PyTorch. docs/stream-decoder.md describes the
state and how each attention mode relates to the codec's offline and streaming decodes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from moss_tts_node.codec.base import CODEBOOK_SIZE, AudioCodec
from moss_tts_node.codec.layout import STREAM_DECODER_FILE
from moss_tts_node.codec.stream_decoder import (
    AUDIO_OUTPUT,
    CODES_INPUT,
    FORMAT_KEY,
    FORMAT_VERSION,
    FRAMES_INPUT,
    FRAMES_OUTPUT,
    MAX_FRAMES_KEY,
    key_cache_name,
    new_keys_name,
    new_values_name,
    value_cache_name,
    write_slots_name,
)
from moss_tts_node.errors import WeightsError
from moss_tts_node.model.rates import FRAMES_PER_SECOND
from moss_tts_node.tools.safetensors_io import SafetensorsCheckpoint

# "window": every query attends to its whole span, as the offline decode does, at any chunk size.
# "ring": the codec's own streaming, which stores a chunk's keys before attending, so within a chunk
# the earlier queries lose the oldest keys the later ones overwrite.
ATTENTION_MODES = ("window", "ring")
OPSET = 20  # Gelu is a standard op from 20 on
IR_VERSION = 9  # the oldest IR that carries opset 20, so older ONNX Runtimes load the graph too
_QUANTIZER_TYPES = ("rlfq", "random_prefix_rlfq")  # both decode codes the same way
# Protobuf cannot hold a model over 2 GiB; above this the weights go to a side file.
_EXTERNAL_DATA_BYTES = 1_800_000_000
_EXTERNAL_ALIGN = 4096  # lets ONNX Runtime map the side file instead of reading it
_LAYER_NORM_EPS = 1e-5  # the codec's nn.LayerNorm default
_INT64_MAX = np.iinfo(np.int64).max
# The 32 codebooks' projections are one (32, 8, 512) weight: int8 would give all of them one scale,
# which costs more accuracy (about 3 dB on codec-tiny) than the 0.5 M weights are worth. Kept in float.
_CODEBOOK_PROJECTIONS = "quantizer.out_projs.matmul"

# The codec's defaults for keys a decoder Transformer entry may leave out; None: the key is required.
_TRANSFORMER_KEYS: dict[str, Any] = {
    "module_type": None,
    "input_dimension": None,
    "output_dimension": None,
    "d_model": None,
    "num_heads": None,
    "num_layers": None,
    "dim_feedforward": 2048,
    "causal": False,
    "positional_embedding": "sin",
    "max_period": 10000,
    "norm": "layer_norm",
    "layer_scale": None,
    "gating": "none",
    "conv_layout": False,  # a layout flag the codec ignores at inference
}
# Values the graph implements; anything else would decode wrongly, so it is refused.
_TRANSFORMER_SUPPORTED = {
    "causal": (True,),
    "positional_embedding": ("rope",),
    "norm": ("layer_norm",),
    "gating": ("none",),
}


@dataclass(frozen=True)
class TransformerStage:
    """One decoder Transformer stage as the config describes it, plus its attention span in positions."""

    prefix: str  # tensor name prefix, "decoder.<index>"
    input_dim: int
    output_dim: int
    d_model: int
    heads: int
    layers: int
    ffn: int
    layer_scale: bool
    max_period: float
    context: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


@dataclass(frozen=True)
class Patch:
    """A PatchedPretransform: splits each position's channels into ``size`` consecutive positions."""

    size: int


@dataclass(frozen=True)
class CodecSpec:
    """The decode path's shapes: the quantizer's widths, then the decoder modules in order."""

    codebook_dim: int
    rvq_dim: int
    quantizer_output_dim: int
    decoder: tuple[TransformerStage | Patch, ...]


def build_stream_decoder(
    checkpoint_dir: Path | str, out_path: Path | str, *, int8: bool = False, attention: str = "window"
) -> Path:
    """Write the stream decoder graph of the checkpoint in ``checkpoint_dir`` to ``out_path``; return it.

    ``int8``: MatMul weights quantized dynamically to int8 (ONNX Runtime's quantizer; activations stay
    float). ``attention``: "window" (each new position sees exactly what the offline decode shows it) or
    "ring" (reproduces the codec's own streaming). Weights go to ``<out_path>.data`` when the graph
    would pass protobuf's 2 GiB limit. Raises WeightsError for a missing, inconsistent or unsupported
    checkpoint.
    """
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
    checkpoint_dir, out_path = Path(checkpoint_dir), Path(out_path)
    spec = read_codec_config(checkpoint_dir / "config.json")
    checkpoint = SafetensorsCheckpoint(checkpoint_dir)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if not int8:
        _write_graph(spec, checkpoint, out_path, attention)
        return out_path
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=out_path.parent, prefix=".stream-decoder-fp32-") as scratch:
        fp32_path = Path(scratch) / "fp32.onnx"
        external = _write_graph(spec, checkpoint, fp32_path, attention)
        quantize_dynamic(
            fp32_path,
            out_path,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],
            use_external_data_format=external,
            # Attention multiplies activations by the caches: only weight MatMuls may be quantized.
            extra_options={"MatMulConstBOnly": True},
            nodes_to_exclude=[_CODEBOOK_PROJECTIONS],
        )
        if external:  # the quantizer creates its side file owner-only; give it the fp32 file's permissions
            shutil.copymode(fp32_path.with_name(f"{fp32_path.name}.data"), out_path.with_name(f"{out_path.name}.data"))
    return out_path


def read_codec_config(path: Path) -> CodecSpec:
    """The decode path's shapes from the codec's config.json; WeightsError names any key it cannot use."""
    if not path.is_file():
        raise WeightsError(
            f"{path} not found; point at the codec checkpoint directory (config.json + model.safetensors)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WeightsError(f"{path}: not a readable JSON config ({error})") from error
    if not isinstance(config, dict):
        raise WeightsError(f"{path}: not a codec config (the JSON is not an object)")
    reader = _ConfigReader(path)
    sampling_rate = reader.number(config, "sampling_rate", "")
    downsample_rate = reader.number(config, "downsample_rate", "")
    if downsample_rate != AudioCodec.samples_per_frame or sampling_rate / downsample_rate != FRAMES_PER_SECOND:
        raise WeightsError(
            f"{path}: sampling_rate {sampling_rate} / downsample_rate {downsample_rate} is not the "
            f"{FRAMES_PER_SECOND} frames/s of {AudioCodec.samples_per_frame} samples this package decodes"
        )
    duration = reader.number(config, "causal_transformer_context_duration", "")
    quantizer = reader.mapping(config, "quantizer_kwargs", "")
    quantizer_type = quantizer.get("quantizer_type", config.get("quantizer_type", "rvq"))
    reader.check_supported("quantizer_kwargs.quantizer_type", quantizer_type, _QUANTIZER_TYPES)
    where = "quantizer_kwargs"
    reader.check_supported(f"{where}.num_quantizers", quantizer.get("num_quantizers"), (AudioCodec.n_quantizers,))
    reader.check_supported(f"{where}.codebook_size", quantizer.get("codebook_size"), (CODEBOOK_SIZE,))
    input_dim = reader.integer(quantizer, "input_dim", where)
    rvq_dim = int(quantizer.get("rvq_dim") or input_dim)
    output_dim = int(quantizer.get("output_dim") or input_dim)

    # The codec sizes each stage's attention span as int(stage rate x duration), the rate reached by
    # walking the encoder down from the sampling rate and the decoder back up; the same float steps
    # here give the same spans.
    rate = float(sampling_rate)
    for index, entry in enumerate(reader.entries(config, "encoder_kwargs")):
        if entry.get("module_type") == "PatchedPretransform":
            rate /= reader.integer(entry, "patch_size", f"encoder_kwargs[{index}]")
    modules: list[TransformerStage | Patch] = []
    channels, positions = output_dim, 1
    for index, entry in enumerate(reader.entries(config, "decoder_kwargs")):
        where = f"decoder_kwargs[{index}]"
        module_type = entry.get("module_type")
        if module_type == "PatchedPretransform":
            size = reader.integer(entry, "patch_size", where)
            if channels % size:
                raise WeightsError(
                    f"{path}: {where}.patch_size {size} does not divide the {channels} channels before it"
                )
            modules.append(Patch(size))
            channels, positions, rate = channels // size, positions * size, rate * size
        elif module_type == "Transformer":
            stage = reader.transformer(entry, where, f"decoder.{index}", int(rate * duration))
            if stage.input_dim != channels:
                raise WeightsError(
                    f"{path}: {where}.input_dimension is {stage.input_dim}, but {channels} channels reach it"
                )
            modules.append(stage)
            channels = stage.output_dim
        else:
            reader.check_supported(f"{where}.module_type", module_type, ("Transformer", "PatchedPretransform"))
    if channels != 1 or positions != downsample_rate:
        raise WeightsError(
            f"{path}: decoder_kwargs turn a frame into {positions} positions of {channels} channels; "
            f"expected {downsample_rate} samples of 1 channel"
        )
    codebook_dim = reader.integer(quantizer, "codebook_dim", "quantizer_kwargs")
    return CodecSpec(codebook_dim, rvq_dim, output_dim, tuple(modules))


class _ConfigReader:
    """Typed access to config.json values, each failure naming the key and what to do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _fail(self, key: str, problem: str) -> WeightsError:
        return WeightsError(f"{self.path}: {key} {problem}")

    def _value(self, mapping: Mapping[str, Any], key: str, where: str) -> Any:
        if key not in mapping:
            raise self._fail(f"{where}.{key}".lstrip("."), "is missing; is this a MOSS-Audio-Tokenizer config.json?")
        return mapping[key]

    def number(self, mapping: Mapping[str, Any], key: str, where: str) -> float:
        value = self._value(mapping, key, where)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise self._fail(f"{where}.{key}".lstrip("."), f"must be a positive number, got {value!r}")
        return value

    def integer(self, mapping: Mapping[str, Any], key: str, where: str) -> int:
        value = self.number(mapping, key, where)
        if not isinstance(value, int):
            raise self._fail(f"{where}.{key}", f"must be a positive integer, got {value!r}")
        return value

    def mapping(self, mapping: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
        value = self._value(mapping, key, where)
        if not isinstance(value, dict):
            raise self._fail(f"{where}.{key}".lstrip("."), f"must be an object, got {type(value).__name__}")
        return value

    def entries(self, config: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
        value = self._value(config, key, "")
        if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
            raise self._fail(key, "must be a list of module objects")
        return value

    def check_supported(self, key: str, value: Any, supported: tuple[Any, ...]) -> None:
        if value not in supported:
            raise self._fail(
                key,
                f"= {value!r} is not supported by the stream decoder "
                f"(it implements {', '.join(map(repr, supported))}); "
                "use the published decoder.onnx for this codec, or extend moss_tts_node.tools.stream_decoder_build",
            )

    def transformer(self, entry: Mapping[str, Any], where: str, prefix: str, context: int) -> TransformerStage:
        unknown = sorted(set(entry) - set(_TRANSFORMER_KEYS))
        if unknown:
            raise self._fail(
                f"{where}.{unknown[0]}",
                "is a setting the stream decoder does not know, so it cannot reproduce it; "
                "extend moss_tts_node.tools.stream_decoder_build or remove it if it is the default",
            )
        values = {key: entry.get(key, default) for key, default in _TRANSFORMER_KEYS.items()}
        for key, supported in _TRANSFORMER_SUPPORTED.items():
            self.check_supported(f"{where}.{key}", values[key], supported)
        dims = {key: self.integer(entry, key, where) for key in ("input_dimension", "output_dimension", "d_model")}
        heads, layers = self.integer(entry, "num_heads", where), self.integer(entry, "num_layers", where)
        if dims["d_model"] % heads or (dims["d_model"] // heads) % 2:
            raise self._fail(
                f"{where}.num_heads", f"= {heads} must split d_model {dims['d_model']} into even head sizes"
            )
        if context < 1:
            raise self._fail("causal_transformer_context_duration", f"gives {prefix} an attention span of {context}")
        return TransformerStage(
            prefix=prefix,
            input_dim=dims["input_dimension"],
            output_dim=dims["output_dimension"],
            d_model=dims["d_model"],
            heads=heads,
            layers=layers,
            ffn=int(values["dim_feedforward"]),
            layer_scale=values["layer_scale"] is not None,
            max_period=float(values["max_period"]),
            context=context,
        )


class _Weights:
    """Checkpoint tensors as float32, each checked against the shape the config implies."""

    def __init__(self, checkpoint: SafetensorsCheckpoint) -> None:
        self.checkpoint = checkpoint

    def read(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        info = self.checkpoint.tensors.get(name)
        if info is None:
            raise WeightsError(
                f"{self.checkpoint.directory}: tensor {name} is missing; the safetensors file does not match "
                "its config.json (re-download the checkpoint)"
            )
        if info.shape != shape:
            raise WeightsError(
                f"{self.checkpoint.directory}: tensor {name} has shape {list(info.shape)}, but config.json implies "
                f"{list(shape)}; the safetensors file does not match its config.json"
            )
        return self.checkpoint.read(name)

    def linear(self, name: str, out_dim: int, in_dim: int) -> np.ndarray:
        """A bias-free nn.Linear weight, transposed to (in, out) for x @ W."""
        return np.ascontiguousarray(self.read(name, (out_dim, in_dim)).T)

    def weight_normed(self, prefix: str, out_dim: int, in_dim: int) -> tuple[np.ndarray, np.ndarray]:
        """A weight-normed 1x1 Conv1d as (in, out) matrix and bias: W = g * v / |v| per output channel."""
        g = self.read(f"{prefix}.parametrizations.weight.original0", (out_dim, 1, 1))[:, 0, 0]
        v = self.read(f"{prefix}.parametrizations.weight.original1", (out_dim, in_dim, 1))[:, :, 0]
        norm = np.sqrt(np.sum(np.square(v, dtype=np.float64), axis=1))
        matrix = (v * (g / norm)[:, None]).astype(np.float32)
        return np.ascontiguousarray(matrix.T), self.read(f"{prefix}.bias", (out_dim,))


class _Graph:
    """Nodes and initializers of the graph being written; big weights stream to the side file if there is one."""

    def __init__(self, data_file: BinaryIO | None, data_name: str) -> None:
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._data_file = data_file
        self._data_name = data_name
        self._used: dict[str, int] = {}

    def name(self, hint: str) -> str:
        count = self._used.get(hint, 0)
        self._used[hint] = count + 1
        return hint if count == 0 else f"{hint}_{count}"

    def constant(self, hint: str, value: Any, dtype: type = np.int64) -> str:
        return self.weight(hint, np.asarray(value, dtype=dtype))

    def weight(self, hint: str, array: np.ndarray) -> str:
        from onnx import TensorProto, helper, numpy_helper

        name = self.name(hint)
        array = np.ascontiguousarray(array)
        if self._data_file is None or array.nbytes < _EXTERNAL_ALIGN:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        offset = self._data_file.seek(0, os.SEEK_END)
        offset += -offset % _EXTERNAL_ALIGN
        self._data_file.seek(offset)
        self._data_file.write(array.tobytes())
        tensor = TensorProto(name=name, dims=array.shape, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self._data_name), ("offset", offset), ("length", array.nbytes)):
            tensor.external_data.add(key=key, value=str(value))
        self.initializers.append(tensor)
        return name

    def op(self, op_type: str, *inputs: str, outputs: int = 1, out: str | None = None, **attributes: Any) -> Any:
        """Add a node; return its output name (``out`` if given), or a list of ``outputs`` names.

        The node is named after its first output, so that profiles and the quantizer can refer to it.
        """
        from onnx import helper

        names = [out] if out is not None else [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0], **attributes))
        return names[0] if len(names) == 1 else names


def _write_graph(spec: CodecSpec, checkpoint: SafetensorsCheckpoint, out_path: Path, attention: str) -> bool:
    """Write the fp32 graph to ``out_path``; return whether its weights went to a side file."""
    import onnx
    from onnx import helper

    weight_bytes = 4 * sum(  # the graph is float32 whatever the checkpoint stores
        int(np.prod(info.shape))
        for name, info in checkpoint.tensors.items()
        if name.startswith(("decoder.", "quantizer."))
    )
    external = weight_bytes > _EXTERNAL_DATA_BYTES
    data_name = f"{out_path.name}.data"
    data_path = out_path.with_name(data_name)
    try:
        with contextlib.ExitStack() as stack:
            data_file = stack.enter_context(data_path.open("wb")) if external else None
            graph = _Graph(data_file, data_name)
            inputs, outputs = _decode_path(graph, _Weights(checkpoint), spec, attention)
    except BaseException:
        if external:
            data_path.unlink(missing_ok=True)  # gigabytes of weights for a graph that will not exist
        raise
    body = helper.make_graph(graph.nodes, "moss_stream_decoder", inputs, outputs, graph.initializers)
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=__name__)
    model.ir_version = IR_VERSION
    properties = {FORMAT_KEY: FORMAT_VERSION, "attention": attention}
    if attention == "ring":
        properties[MAX_FRAMES_KEY] = str(_ring_max_frames(spec))
    helper.set_model_props(model, properties)
    onnx.save_model(model, out_path)
    onnx.checker.check_model(str(out_path))  # by path, so that external data and > 2 GiB models are checked too
    return external


def _ring_max_frames(spec: CodecSpec) -> int:
    """Most frames per call in ring mode: a chunk longer than a stage's span overwrites keys it still needs.

    That is the codec's own rule (its streaming chunks may not exceed the attention duration).
    """
    spans, positions_per_frame = [], 1
    for module in spec.decoder:
        if isinstance(module, Patch):
            positions_per_frame *= module.size
        else:
            spans.append(module.context // positions_per_frame)
    return min(spans)


def _decode_path(graph: _Graph, weights: _Weights, spec: CodecSpec, attention: str) -> tuple[list[Any], list[Any]]:
    """Add the whole decode to ``graph``; return the graph's input and output declarations."""
    from onnx import TensorProto, helper

    inputs = [
        helper.make_tensor_value_info(CODES_INPUT, TensorProto.INT64, (AudioCodec.n_quantizers, 1, "frames")),
        helper.make_tensor_value_info(FRAMES_INPUT, TensorProto.INT64, ()),
    ]
    outputs = [
        helper.make_tensor_value_info(AUDIO_OUTPUT, TensorProto.FLOAT, (1, 1, "samples")),
        helper.make_tensor_value_info(FRAMES_OUTPUT, TensorProto.INT64, ()),
    ]
    frames = graph.op("Squeeze", graph.op("Shape", CODES_INPUT, start=2, end=3), graph.constant("axis", [0]))
    x, channels = _quantizer_decode(graph, weights, spec), spec.quantizer_output_dim
    positions_per_frame = 1
    stage = 0
    for module in spec.decoder:
        if isinstance(module, Patch):
            channels //= module.size
            x = _unpatch(graph, x, channels, module.size)
            positions_per_frame *= module.size
            continue
        clock = _stage_clock(graph, module, stage, frames, positions_per_frame, attention)
        x = _transformer(graph, weights, module, stage, clock, x)
        channels = module.output_dim
        heads, head_dim, span = module.heads, module.head_dim, module.context
        for layer in range(module.layers):
            inputs.append(
                helper.make_tensor_value_info(key_cache_name(stage, layer), TensorProto.FLOAT, (heads, head_dim, span))
            )
            inputs.append(
                helper.make_tensor_value_info(
                    value_cache_name(stage, layer), TensorProto.FLOAT, (heads, span, head_dim)
                )
            )
        rows = f"rows_{stage}"
        outputs += [
            helper.make_tensor_value_info(
                new_keys_name(stage), TensorProto.FLOAT, (module.layers, heads, head_dim, rows)
            ),
            helper.make_tensor_value_info(
                new_values_name(stage), TensorProto.FLOAT, (module.layers, heads, rows, head_dim)
            ),
            helper.make_tensor_value_info(write_slots_name(stage), TensorProto.INT64, (rows,)),
        ]
        stage += 1
    graph.op("Reshape", x, graph.constant("audio_shape", [1, 1, -1]), out=AUDIO_OUTPUT)
    graph.op("Add", FRAMES_INPUT, frames, out=FRAMES_OUTPUT)
    return inputs, outputs


def _quantizer_decode(graph: _Graph, weights: _Weights, spec: CodecSpec) -> str:
    """Codes (32, 1, n) -> (n, channels): each codebook's vector, projected, summed, projected again."""
    count, width, rvq = AudioCodec.n_quantizers, spec.codebook_dim, spec.rvq_dim
    prefix = "quantizer.quantizers"
    # One table for all codebooks: codebook i's rows start at i * CODEBOOK_SIZE.
    table = np.concatenate(
        [weights.read(f"{prefix}.{i}.codebook.weight", (CODEBOOK_SIZE, width)) for i in range(count)]
    )
    codes = graph.op("Reshape", CODES_INPUT, graph.constant("codes_shape", [count, -1]))
    rows = graph.op("Add", codes, graph.constant("codebook_starts", np.arange(count)[:, None] * CODEBOOK_SIZE))
    x = graph.op("Gather", graph.weight("quantizer.codebooks", table), rows, axis=0)  # (32, n, width)
    if width != rvq:  # the codec projects each codebook's vector only when the widths differ
        projections = [weights.weight_normed(f"{prefix}.{i}.out_proj", rvq, width) for i in range(count)]
        matrices = graph.weight("quantizer.out_projs", np.stack([m for m, _ in projections]))
        biases = graph.weight("quantizer.out_proj_biases", np.stack([b[None, :] for _, b in projections]))
        x = graph.op("Add", graph.op("MatMul", x, matrices, out=_CODEBOOK_PROJECTIONS), biases)
    x = graph.op("ReduceSum", x, graph.constant("axis", [0]), keepdims=0)
    if rvq != spec.quantizer_output_dim:
        matrix, bias = weights.weight_normed("quantizer.output_proj", spec.quantizer_output_dim, rvq)
        x = graph.op(
            "Add",
            graph.op("MatMul", x, graph.weight("quantizer.output_proj", matrix)),
            graph.weight("quantizer.output_proj.bias", bias),
        )
    return x


def _unpatch(graph: _Graph, x: str, channels: int, size: int) -> str:
    """(T, channels * size) -> (T * size, channels): channel c * size + j at t moves to position t * size + j."""
    split = graph.op("Reshape", x, graph.constant("patch_shape", [-1, channels, size]))
    return graph.op(
        "Reshape", graph.op("Transpose", split, perm=[0, 2, 1]), graph.constant("unpatch_shape", [-1, channels])
    )


@dataclass(frozen=True)
class _Clock:
    """What every layer of a stage shares in one call: rotary tables and which keys each query sees."""

    cos: str  # (T, head_dim / 2, 1)
    sin: str
    visible: str  # (T, span + T) bool: the cached keys, then the new ones


def _stage_clock(
    graph: _Graph, stage: TransformerStage, index: int, frames: str, per_frame: int, attention: str
) -> _Clock:
    """Positions of this call at one stage, the visibility mask, rotary tables, and the ring slots to write."""
    from onnx import TensorProto

    span = graph.constant("span", stage.context)
    one = graph.constant("one", 1)
    zero = graph.constant("zero", 0)
    start = graph.op("Mul", FRAMES_INPUT, graph.constant("positions_per_frame", per_frame))
    end = graph.op("Add", start, graph.op("Mul", frames, graph.constant("positions_per_frame", per_frame)))
    new = graph.op("Range", start, end, one)
    # Position p is stored in ring slot p % span, so before this call slot i holds the latest
    # p < start with p = i (mod span), or nothing yet when that p is negative.
    last = graph.op("Sub", start, one)
    slots = graph.constant("slot_index", np.arange(stage.context))
    cached = graph.op("Sub", last, graph.op("Mod", graph.op("Sub", last, slots), span, fmod=0))
    keys = graph.op("Concat", cached, new, axis=0)
    delta = graph.op(
        "Sub",
        graph.op("Unsqueeze", new, graph.constant("axis", [1])),
        graph.op("Unsqueeze", keys, graph.constant("axis", [0])),
    )
    visible = graph.op(
        "And",
        graph.op("And", graph.op("GreaterOrEqual", keys, zero), graph.op("GreaterOrEqual", delta, zero)),
        graph.op("Less", delta, span),
    )
    if attention == "ring":  # the codec stores the chunk first: keys its newest `span` positions overwrite are gone
        visible = graph.op("And", visible, graph.op("GreaterOrEqual", keys, graph.op("Sub", end, span)))
    # Only the newest `span` positions are stored (more would overwrite each other in the ring).
    newest = graph.op(
        "Slice",
        new,
        graph.constant("newest", [-stage.context]),
        graph.constant("end", [_INT64_MAX]),
    )
    graph.op("Mod", newest, span, fmod=0, out=write_slots_name(index))
    half = stage.head_dim // 2
    # The codec's RoPE: pair (2i, 2i+1) turns by position x max_period^(-2i / head_dim), in float32.
    freqs = np.exp(np.arange(half, dtype=np.float32) * np.float32(-math.log(stage.max_period) * 2 / stage.head_dim))
    angle = graph.op(
        "Mul",
        graph.op("Unsqueeze", graph.op("Cast", new, to=TensorProto.FLOAT), graph.constant("axis", [1])),
        graph.weight("rope_freqs", freqs[None, :]),
    )
    last_axis = graph.constant("axis", [2])
    return _Clock(
        cos=graph.op("Unsqueeze", graph.op("Cos", angle), last_axis),
        sin=graph.op("Unsqueeze", graph.op("Sin", angle), last_axis),
        visible=visible,
    )


def _transformer(graph: _Graph, weights: _Weights, stage: TransformerStage, index: int, clock: _Clock, x: str) -> str:
    """One decoder Transformer stage on (T, input_dim); outputs its cache rows by the contract's names."""
    width = stage.d_model
    if stage.input_dim != width:  # the codec has no projection where the widths agree
        x = graph.op(
            "MatMul",
            x,
            graph.weight(
                f"{stage.prefix}.input_proj",
                weights.linear(f"{stage.prefix}.input_proj.weight", width, stage.input_dim),
            ),
        )
    key_rows, value_rows = [], []
    for layer in range(stage.layers):
        x, key_row, value_row = _layer(graph, weights, stage, index, layer, clock, x)
        key_rows.append(key_row)
        value_rows.append(value_row)
    graph.op("Concat", *key_rows, axis=0, out=new_keys_name(index))
    graph.op("Concat", *value_rows, axis=0, out=new_values_name(index))
    if stage.output_dim != width:
        x = graph.op(
            "MatMul",
            x,
            graph.weight(
                f"{stage.prefix}.output_proj",
                weights.linear(f"{stage.prefix}.output_proj.weight", stage.output_dim, width),
            ),
        )
    return x


def _layer(
    graph: _Graph, weights: _Weights, stage: TransformerStage, index: int, layer: int, clock: _Clock, x: str
) -> tuple[str, str, str]:
    """One pre-norm layer: x + scale * attention(norm(x)), then x + scale * ffn(norm(x)).

    Returns the new x and this layer's rows to store: keys (1, heads, head_dim, w), values (1, heads, w, head_dim).
    """
    prefix = f"{stage.prefix}.transformer.layers.{layer}"
    width, heads, head_dim, span = stage.d_model, stage.heads, stage.head_dim, stage.context

    def norm(name: str, value: str) -> str:
        scale = graph.weight(f"{prefix}.{name}.weight", weights.read(f"{prefix}.{name}.weight", (width,)))
        bias = graph.weight(f"{prefix}.{name}.bias", weights.read(f"{prefix}.{name}.bias", (width,)))
        return graph.op("LayerNormalization", value, scale, bias, axis=-1, epsilon=_LAYER_NORM_EPS)

    def residual(name: str, update: str) -> str:
        if stage.layer_scale:
            update = graph.op(
                "Mul", update, graph.weight(f"{prefix}.{name}.scale", weights.read(f"{prefix}.{name}.scale", (width,)))
            )
        return graph.op("Add", x, update)

    def split_heads(value: str) -> str:  # (T, width) -> (heads, T, head_dim)
        return graph.op(
            "Transpose",
            graph.op("Reshape", value, graph.constant("heads_shape", [-1, heads, head_dim])),
            perm=[1, 0, 2],
        )

    def rotate(value: str) -> str:  # RoPE on (heads, T, head_dim), pairs of adjacent channels
        pairs = graph.op("Reshape", value, graph.constant("pairs_shape", [heads, -1, head_dim // 2, 2]))
        real, imag = graph.op("Split", pairs, axis=3, num_outputs=2, outputs=2)
        turned_real = graph.op("Sub", graph.op("Mul", real, clock.cos), graph.op("Mul", imag, clock.sin))
        turned_imag = graph.op("Add", graph.op("Mul", real, clock.sin), graph.op("Mul", imag, clock.cos))
        return graph.op(
            "Reshape",
            graph.op("Concat", turned_real, turned_imag, axis=3),
            graph.constant("heads_shape", [heads, -1, head_dim]),
        )

    normed = norm("norm1", x)
    in_proj = weights.read(f"{prefix}.self_attn.in_projs.0.weight", (3 * width, width))
    query, key, value = (
        split_heads(
            graph.op(
                "MatMul",
                normed,
                graph.weight(
                    f"{prefix}.self_attn.{part}", np.ascontiguousarray(in_proj[i * width : (i + 1) * width].T)
                ),
            )
        )
        for i, part in enumerate(("query", "key", "value"))
    )
    query = graph.op("Mul", rotate(query), graph.constant("attention_scale", 1 / math.sqrt(head_dim), np.float32))
    key_t = graph.op("Transpose", rotate(key), perm=[0, 2, 1])  # (heads, head_dim, T), the cache's layout
    # Scores against the cache and against the new keys are computed apart: concatenating the
    # cache with the new keys first would copy the whole cache on every call.
    scores = graph.op(
        "Concat", graph.op("MatMul", query, key_cache_name(index, layer)), graph.op("MatMul", query, key_t), axis=2
    )
    masked = graph.op("Where", clock.visible, scores, graph.constant("minus_inf", -np.inf, np.float32))
    probs = graph.op("Softmax", masked, axis=-1)
    old = graph.op(
        "Slice", probs, graph.constant("zero_1d", [0]), graph.constant("span_1d", [span]), graph.constant("axis", [2])
    )
    new = graph.op(
        "Slice",
        probs,
        graph.constant("span_1d", [span]),
        graph.constant("end", [_INT64_MAX]),
        graph.constant("axis", [2]),
    )
    attended = graph.op("Add", graph.op("MatMul", old, value_cache_name(index, layer)), graph.op("MatMul", new, value))
    merged = graph.op(
        "Reshape", graph.op("Transpose", attended, perm=[1, 0, 2]), graph.constant("width_shape", [-1, width])
    )
    out_proj = weights.linear(f"{prefix}.self_attn.out_projs.0.weight", width, width)
    x = residual("layer_scale_1", graph.op("MatMul", merged, graph.weight(f"{prefix}.self_attn.out_proj", out_proj)))
    hidden = graph.op(
        "MatMul",
        norm("norm2", x),
        graph.weight(f"{prefix}.linear1", weights.linear(f"{prefix}.linear1.weight", stage.ffn, width)),
    )
    ffn = graph.op(
        "MatMul",
        graph.op("Gelu", hidden),
        graph.weight(f"{prefix}.linear2", weights.linear(f"{prefix}.linear2.weight", width, stage.ffn)),
    )
    x = residual("layer_scale_2", ffn)
    # Keep only the newest `span` positions: the rows the ring will hold.
    newest = graph.constant("newest", [-span])
    end = graph.constant("end", [_INT64_MAX])
    first = graph.constant("axis", [0])
    key_row = graph.op("Unsqueeze", graph.op("Slice", key_t, newest, end, graph.constant("axis", [2])), first)
    value_row = graph.op("Unsqueeze", graph.op("Slice", value, newest, end, graph.constant("axis", [1])), first)
    return x, key_row, value_row


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``build-stream-decoder`` to the CLI (tools/cli.py's EXTRA_COMMAND_MODULES)."""
    parser = commands.add_parser(
        "build-stream-decoder",
        help="build the stateful streaming decoder graph from the codec checkpoint",
        description=(
            "Write the codec's streaming decoder (attention state kept between calls, so each chunk decodes "
            "only its new frames) from the MOSS-Audio-Tokenizer checkpoint: config.json + model.safetensors."
        ),
    )
    parser.add_argument("checkpoint", type=Path, help="codec checkpoint directory (config.json, model.safetensors)")
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help=f"graph to write; put it in the config's model.codec_dir as {STREAM_DECODER_FILE} to have it used",
    )
    parser.add_argument("--int8", action="store_true", help="int8 weights: faster on a CPU, slightly less exact")
    parser.add_argument(
        "--attention",
        choices=ATTENTION_MODES,
        default=ATTENTION_MODES[0],
        help="window: equals the offline decode (default); ring: reproduces the codec's own streaming",
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing output")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.force:
        raise WeightsError(f"{args.out} exists; pass --force to overwrite it")
    path = build_stream_decoder(args.checkpoint, args.out, int8=args.int8, attention=args.attention)
    print(f"wrote {path} ({'int8' if args.int8 else 'fp32'}, {args.attention} attention)")
    return 0
