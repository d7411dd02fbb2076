"""MOSS-Audio-Tokenizer-Nano's graphs in upstream's published ONNX layout, written from a checkpoint without PyTorch.

``write_nano_codec(checkpoint_dir, out_dir)`` reads upstream's ``config.json`` and ``model.safetensors`` (its
state-dict names) and writes the directory upstream's runtime opens: ``codec_browser_onnx_meta.json`` and the
encode, decode_full and decode_step graphs, with upstream's input and output names, dtypes and streaming state
(docs/nano.md, "Writing a Nano codec"). ``write_random_nano_codec(out_dir, size)`` does the same for a random checkpoint
of the real architecture, initialized as upstream initializes a new model (``tiny``: the demo weights;
``real``: the real codec's sizes, for the bench). Its audio means nothing.

The codec, as upstream computes it: the stereo signal interleaved into one (left, right, left, ...), patches
of 240 samples, four causal Transformers (RoPE, LayerNorm, layer scale, each attending ``context`` positions
back) with patch merges between them, then 16 residual LFQ quantizers of 1024 codes; the decoder mirrors it.
Graphs are sequence-major, (1, positions, channels), where upstream keeps (1, channels, positions).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.errors import WeightsError
from moss_tts_node.tools.dev.random_codec import RandomTensors
from moss_tts_node.tools.prepare.config_reader import ConfigReader, read_json_object
from moss_tts_node.tools.prepare.safetensors_io import SafetensorsCheckpoint
from moss_tts_node.tools.prepare.stream_decoder_checkpoint import (
    TRANSFORMER_KEYS,
    TRANSFORMER_SUPPORTED,
    CodecWeights,
    Patch,
)
from moss_tts_node.tools.prepare.stream_decoder_layers import OnnxGraph, unpatch

# Upstream's published layout (OpenMOSS-Team/MOSS-Audio-Tokenizer-Nano-ONNX) as its runtime reads it.
META_FILE = "codec_browser_onnx_meta.json"
META_FORMAT = "moss_audio_tokenizer_browser_onnx"
GRAPH_FILES = {
    "encode": "moss_audio_tokenizer_encode.onnx",
    "decode_full": "moss_audio_tokenizer_decode_full.onnx",
    "decode_step": "moss_audio_tokenizer_decode_step.onnx",
}
ENCODE_INPUTS = ("waveform", "input_lengths")
ENCODE_OUTPUTS = ("audio_codes", "audio_code_lengths")
DECODE_INPUTS = ("audio_codes", "audio_code_lengths")
DECODE_OUTPUTS = ("audio", "audio_lengths")
OPSET = 17  # what upstream's exports declare; Gelu is written out (the Gelu op comes with opset 20)
IR_VERSION = 8  # the oldest IR that carries opset 17
SIZES = ("tiny", "real")
_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which upstream's layer_norm uses
_NORMALIZE_EPS = 1e-12  # F.normalize's default, in the LFQ's nearest-code search
_INT64_MAX = np.iinfo(np.int64).max
# Transformer keys the graphs implement; anything else would compute something else, so it is refused.
_TRANSFORMER_DEFAULTS: dict[str, Any] = {
    **TRANSFORMER_KEYS,  # the codec family's Transformer keys and defaults
    "context_duration": None,  # seconds; None: the model's own (see read_nano_config)
}


@dataclass(frozen=True)
class NanoStage:
    """One of upstream's ProjectedTransformers: input projection, causal layers, output projection."""

    prefix: str  # "encoder.<i>" or "decoder.<i>"
    input_dim: int
    output_dim: int
    d_model: int
    heads: int
    layers: int
    ffn: int
    layer_scale: float | None
    max_period: float
    context: int  # positions each query attends back, itself included

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


@dataclass(frozen=True)
class NanoSpec:
    """The codec's shapes: rates, the quantizer's widths, the encoder's and decoder's modules in order."""

    sample_rate: int
    channels: int  # interleaved into one signal inside the codec
    samples_per_frame: int  # a channel's samples per frame
    quantizers: int
    codebook_size: int
    codebook_dim: int
    quantizer_input_dim: int
    rvq_dim: int
    quantizer_output_dim: int
    encoder: tuple[NanoStage | Patch, ...]
    decoder: tuple[NanoStage | Patch, ...]

    def stages(self, side: str) -> list[NanoStage]:
        return [m for m in getattr(self, side) if isinstance(m, NanoStage)]


def read_nano_config(path: Path) -> NanoSpec:
    """The codec's shapes from upstream's config.json; WeightsError names any key the graphs cannot reproduce.

    Attention spans as upstream sizes them: each Transformer's ``context_duration`` (default: the shortest of
    the encoder's, or ``causal_transformer_context_duration``) times the rate of positions where it sits,
    walking from the interleaved signal's rate (sampling rate x channels) down the encoder and up the decoder.
    """
    config = read_json_object(
        path, WeightsError, "point at the Nano codec checkpoint (config.json + model.safetensors)"
    )
    reader = ConfigReader(path, WeightsError)
    sample_rate = reader.integer(config, "sampling_rate", "")
    channels = reader.integer(config, "number_channels", "")
    if channels > 1 and not config.get("enable_channel_interleave", True):
        raise reader.fail("enable_channel_interleave", "= false is not implemented: the graphs interleave the channels")
    quantizer = reader.mapping(config, "quantizer_kwargs", "")
    quantizer_type = quantizer.get("quantizer_type", config.get("quantizer_type", "rvq"))
    if quantizer_type not in ("rlfq", "random_prefix_rlfq"):
        raise reader.fail("quantizer_kwargs.quantizer_type", f"= {quantizer_type!r}; the graphs implement rlfq only")
    input_dim = reader.integer(quantizer, "input_dim", "quantizer_kwargs")
    encoder_entries = _entries(reader, config, "encoder_kwargs")
    decoder_entries = _entries(reader, config, "decoder_kwargs")
    durations = [float(e["context_duration"]) for e in encoder_entries if "context_duration" in e]
    others = [e for e in encoder_entries if e.get("module_type") == "Transformer" and "context_duration" not in e]
    if others or not durations:
        durations.append(float(reader.number(config, "causal_transformer_context_duration", "")))
    default_duration = min(durations)
    rate = float(sample_rate * channels)
    encoder: list[NanoStage | Patch] = []
    for index, entry in enumerate(encoder_entries):
        module = _module(reader, entry, f"encoder_kwargs[{index}]", f"encoder.{index}", rate, default_duration)
        rate /= module.size if isinstance(module, Patch) else 1
        encoder.append(module)
    decoder: list[NanoStage | Patch] = []
    for index, entry in enumerate(decoder_entries):
        module = _module(reader, entry, f"decoder_kwargs[{index}]", f"decoder.{index}", rate, default_duration)
        rate *= module.size if isinstance(module, Patch) else 1
        decoder.append(module)
    spec = NanoSpec(
        sample_rate=sample_rate,
        channels=channels,
        samples_per_frame=reader.integer(config, "downsample_rate", ""),
        quantizers=reader.integer(quantizer, "num_quantizers", "quantizer_kwargs"),
        codebook_size=reader.integer(quantizer, "codebook_size", "quantizer_kwargs"),
        codebook_dim=reader.integer(quantizer, "codebook_dim", "quantizer_kwargs"),
        quantizer_input_dim=input_dim,
        rvq_dim=int(quantizer.get("rvq_dim") or input_dim),
        quantizer_output_dim=int(quantizer.get("output_dim") or input_dim),
        encoder=tuple(encoder),
        decoder=tuple(decoder),
    )
    _check_widths(reader, spec)
    return spec


def _entries(reader: ConfigReader, config: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = reader.value(config, key, "")
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise reader.fail(key, "must be a list of module objects")
    return value


def _module(
    reader: ConfigReader, entry: Mapping[str, Any], where: str, prefix: str, rate: float, default_duration: float
) -> NanoStage | Patch:
    module_type = entry.get("module_type")
    if module_type == "PatchedPretransform":
        return Patch(reader.integer(entry, "patch_size", where))
    if module_type != "Transformer":
        raise reader.fail(f"{where}.module_type", f"= {module_type!r}; expected Transformer or PatchedPretransform")
    unknown = sorted(set(entry) - set(_TRANSFORMER_DEFAULTS))
    if unknown:
        raise reader.fail(f"{where}.{unknown[0]}", "is a setting the Nano graph writer does not implement")
    values = {key: entry.get(key, default) for key, default in _TRANSFORMER_DEFAULTS.items()}
    for key, supported in TRANSFORMER_SUPPORTED.items():
        if values[key] not in supported:
            raise reader.fail(f"{where}.{key}", f"= {values[key]!r}; the graphs implement {supported[0]!r} only")
    d_model, heads = reader.integer(entry, "d_model", where), reader.integer(entry, "num_heads", where)
    if d_model % heads or (d_model // heads) % 2:
        raise reader.fail(f"{where}.num_heads", f"= {heads} must split d_model {d_model} into even head sizes")
    duration = default_duration if values["context_duration"] is None else float(values["context_duration"])
    context = round(rate * duration)  # Python rounds half to even, as upstream does with the same round()
    if context < 1:
        raise reader.fail(f"{where}.context_duration", f"gives an attention span of {context} positions")
    return NanoStage(
        prefix=prefix,
        input_dim=reader.integer(entry, "input_dimension", where),
        output_dim=reader.integer(entry, "output_dimension", where),
        d_model=d_model,
        heads=heads,
        layers=reader.integer(entry, "num_layers", where),
        ffn=int(values["dim_feedforward"]),
        layer_scale=None if values["layer_scale"] is None else float(values["layer_scale"]),
        max_period=float(values["max_period"]),
        context=context,
    )


def _check_widths(reader: ConfigReader, spec: NanoSpec) -> None:
    """Each module's input width is what reaches it, and a frame is samples_per_frame x channels samples."""
    for side, start, end in (
        ("encoder", 1, spec.quantizer_input_dim),
        ("decoder", spec.quantizer_output_dim, 1),
    ):
        width, positions = start, 1
        for index, module in enumerate(getattr(spec, side)):
            where = f"{side}_kwargs[{index}]"
            if isinstance(module, Patch):
                if side == "decoder" and width % module.size:
                    raise reader.fail(f"{where}.patch_size", f"{module.size} does not divide the {width} channels")
                width = width * module.size if side == "encoder" else width // module.size
                positions *= module.size
                continue
            if module.input_dim != width:
                raise reader.fail(f"{where}.input_dimension", f"is {module.input_dim}, but {width} channels reach it")
            width = module.output_dim
        if width != end or positions != spec.samples_per_frame * spec.channels:
            raise reader.fail(
                f"{side}_kwargs",
                f"turn a frame into {positions} positions of {width} channels; expected "
                f"{spec.samples_per_frame * spec.channels} of {end}",
            )


# --- graph pieces -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _LayerState:
    """One attention layer's streaming state as the decode-step graph's inputs name it (upstream's MHAState)."""

    offset: str  # (1,) int32: positions seen so far
    keys: str  # (1, heads, context, head_dim) float32, rotated: the last `context` positions' keys
    values: str
    positions: str  # (1, context) int32: each cached row's position, -1 where empty


def _state_names(index: int) -> dict[str, str]:
    """Upstream's names of attention layer ``index``'s state, inputs and outputs, by the meta's field names."""
    names = {"offset": f"attn_offset_{index}"}
    for kind in ("keys", "values", "positions"):
        names[f"cached_{kind}"] = f"attn_cached_{kind}_{index}"
    fields: dict[str, str] = {}
    for kind, name in names.items():
        fields[f"{kind}_input_name"] = name
        fields[f"{kind}_output_name"] = name.replace(f"_{index}", f"_out_{index}")
    return fields


def _transformer_offset_names(index: int) -> tuple[str, str]:
    return f"transformer_offset_{index}", f"transformer_offset_out_{index}"


class _Writer:
    """The three graphs' shared pieces, over one checkpoint."""

    def __init__(self, spec: NanoSpec, weights: CodecWeights) -> None:
        self.spec = spec
        self.weights = weights

    # A weight-normed 1x1 convolution (upstream's WNConv1d) as an (in, out) matrix and its bias.
    def conv(self, graph: OnnxGraph, x: str, prefix: str, out_dim: int, in_dim: int) -> str:
        matrix, bias = self.weights.weight_normed(prefix, out_dim, in_dim)
        return graph.op("Add", graph.linear(x, prefix, matrix), graph.weight(f"{prefix}.bias", bias))

    def stage(
        self, graph: OnnxGraph, stage: NanoStage, x: str, states: list[_LayerState] | None
    ) -> tuple[str, list[tuple[str, str, str, str]]]:
        """(1, T, input_dim) -> (1, T, output_dim); with ``states``, each layer's new state (offset, keys,
        values, positions) too."""
        w = self.weights
        x = graph.linear(
            x,
            f"{stage.prefix}.input_proj",
            w.linear(f"{stage.prefix}.input_proj.weight", stage.d_model, stage.input_dim),
        )
        new_states = []
        for layer in range(stage.layers):
            prefix = f"{stage.prefix}.transformer.layers.{layer}"
            attended, state = self._attention(
                graph, stage, prefix, self._norm(graph, stage, prefix, "norm1", x), states and states[layer]
            )
            x = graph.op("Add", x, attended)
            if state is not None:
                new_states.append(state)
            hidden = graph.linear(
                self._norm(graph, stage, prefix, "norm2", x),
                f"{prefix}.ffn.0",
                w.linear(f"{prefix}.ffn.0.weight", stage.ffn, stage.d_model),
            )
            down = self._scaled(
                stage, prefix, "layer_scale_2", w.linear(f"{prefix}.ffn.2.weight", stage.d_model, stage.ffn)
            )
            x = graph.op("Add", x, graph.linear(_gelu(graph, hidden), f"{prefix}.ffn.2", down))
        x = graph.linear(
            x,
            f"{stage.prefix}.output_proj",
            w.linear(f"{stage.prefix}.output_proj.weight", stage.output_dim, stage.d_model),
        )
        return x, new_states

    def _norm(self, graph: OnnxGraph, stage: NanoStage, prefix: str, name: str, x: str) -> str:
        scale, bias = (self.weights.read(f"{prefix}.{name}.{part}", (stage.d_model,)) for part in ("weight", "bias"))
        return graph.op(
            "LayerNormalization",
            x,
            graph.weight(f"{prefix}.{name}.weight", scale),
            graph.weight(f"{prefix}.{name}.bias", bias),
            axis=-1,
            epsilon=_LAYER_NORM_EPS,
        )

    def _scaled(self, stage: NanoStage, prefix: str, name: str, matrix: np.ndarray) -> np.ndarray:
        """An (in, out) projection with the layer scale that multiplies its output folded into its columns."""
        if stage.layer_scale is None:
            return matrix
        return matrix * self.weights.read(f"{prefix}.{name}.scale", (stage.d_model,))[None, :]

    def _attention(
        self, graph: OnnxGraph, stage: NanoStage, prefix: str, x: str, state: _LayerState | None
    ) -> tuple[str, tuple[str, str, str, str] | None]:
        """Causal self-attention of the (1, T, d_model) normed inputs, as upstream's MHA computes it.

        Without a state, positions 0..T-1 (the whole decode). With one, the call's positions follow the
        state's offset, and its keys are the cached ones then the call's, masked by position (empty rows are
        -1) and span: upstream's streaming attention, which then keeps the last ``context`` rows."""
        from onnx import TensorProto

        heads, head_dim, width = stage.heads, stage.head_dim, stage.d_model
        in_proj = self.weights.linear(f"{prefix}.self_attn.in_proj.weight", 3 * width, width)
        qkv = graph.linear(x, f"{prefix}.self_attn.in_proj", in_proj)  # channels: q, k, v, each heads x head_dim
        qkv = graph.op(
            "Transpose",
            graph.op("Reshape", qkv, graph.constant("qkv_shape", [0, 0, 3, heads, head_dim])),
            perm=[2, 0, 3, 1, 4],
        )
        q, k, v = (
            graph.op("Squeeze", part, graph.constant("axis", [0])) for part in graph.op("Split", qkv, axis=0, outputs=3)
        )
        # (1,) int64 each (OnnxGraph stores a scalar constant as (1,)); Range takes them squeezed.
        length = graph.op("Shape", x, start=1, end=2)
        start = graph.constant("zero", [0]) if state is None else graph.op("Cast", state.offset, to=TensorProto.INT64)
        end = graph.op("Add", start, length)
        scalar = [graph.op("Squeeze", t, graph.constant("axis", [0])) for t in (start, end)]
        new_positions = graph.op("Range", *scalar, graph.constant("one", 1))
        q, k = (self._rope(graph, stage, t, new_positions) for t in (q, k))
        key_positions = new_positions
        if state is not None:
            k = graph.op("Concat", state.keys, k, axis=2)
            v = graph.op("Concat", state.values, v, axis=2)
            cached = graph.op(
                "Squeeze", graph.op("Cast", state.positions, to=TensorProto.INT64), graph.constant("axis", [0])
            )
            key_positions = graph.op("Concat", cached, new_positions, axis=0)
        delta = graph.op(
            "Sub",
            graph.op("Unsqueeze", new_positions, graph.constant("axis", [1])),
            graph.op("Unsqueeze", key_positions, graph.constant("axis", [0])),
        )
        visible = graph.op(
            "And",
            graph.op(
                "And",
                graph.op("GreaterOrEqual", key_positions, graph.constant("zero", 0)),
                graph.op("GreaterOrEqual", delta, graph.constant("zero", 0)),
            ),
            graph.op("Less", delta, graph.constant("span", stage.context)),
        )
        bias = graph.op(
            "Where", visible, graph.constant("visible", 0.0, np.float32), graph.constant("hidden", -np.inf, np.float32)
        )
        scores = graph.op(
            "Mul",
            graph.op("MatMul", q, graph.op("Transpose", k, perm=[0, 1, 3, 2])),
            graph.constant("scale", 1 / math.sqrt(head_dim), np.float32),
        )
        probs = graph.op("Softmax", graph.op("Add", scores, bias), axis=-1)
        out = graph.op("Transpose", graph.op("MatMul", probs, v), perm=[0, 2, 1, 3])
        out = graph.op("Reshape", out, graph.constant("merge_heads", [0, 0, width]))
        out_proj = self._scaled(
            stage, prefix, "layer_scale_1", self.weights.linear(f"{prefix}.self_attn.out_proj.weight", width, width)
        )
        attended = graph.linear(out, f"{prefix}.self_attn.out_proj", out_proj)
        if state is None:
            return attended, None
        last = graph.constant("last_rows", [-stage.context]), graph.constant("end", [_INT64_MAX])
        new_state = (
            graph.op("Cast", end, to=TensorProto.INT32),
            graph.op("Slice", k, *last, graph.constant("axis", [2])),
            graph.op("Slice", v, *last, graph.constant("axis", [2])),
            graph.op(
                "Cast",
                graph.op("Unsqueeze", graph.op("Slice", key_positions, *last), graph.constant("axis", [0])),
                to=TensorProto.INT32,
            ),
        )
        return attended, new_state

    def _rope(self, graph: OnnxGraph, stage: NanoStage, x: str, positions: str) -> str:
        """Upstream's RoPE on (1, heads, T, head_dim): pair (2i, 2i+1) turns by position x max_period^(-2i/head_dim),
        in float32: x * cos + swap(x) * sin, swap(x) = (-x1, x0, -x3, x2, ...) as a MatMul with a +-1 matrix."""
        from onnx import TensorProto

        half = stage.head_dim // 2
        freqs = np.exp(np.arange(half, dtype=np.float32) * np.float32(-math.log(stage.max_period) * 2 / stage.head_dim))
        angle = graph.op(
            "Mul",
            graph.op("Unsqueeze", graph.op("Cast", positions, to=TensorProto.FLOAT), graph.constant("axis", [1])),
            graph.weight("rope_freqs", np.repeat(freqs, 2)[None, :]),  # each frequency for both of its pair
        )
        swap = np.zeros((stage.head_dim, stage.head_dim), np.float32)
        swap[np.arange(1, stage.head_dim, 2), np.arange(0, stage.head_dim, 2)] = -1.0
        swap[np.arange(0, stage.head_dim, 2), np.arange(1, stage.head_dim, 2)] = 1.0
        turned = graph.op("Mul", graph.op("MatMul", x, graph.weight("rope_swap", swap)), graph.op("Sin", angle))
        return graph.op("Add", graph.op("Mul", x, graph.op("Cos", angle)), turned)

    def quantizer_decode(self, graph: OnnxGraph, codes: str) -> str:
        """(1, F, nq) int32 codes -> (1, F, output_dim): each quantizer's code vector projected, summed, projected."""
        spec, prefix = self.spec, "quantizer.quantizers"
        table = np.concatenate(
            [
                self.weights.read(f"{prefix}.{i}.codebook.weight", (spec.codebook_size, spec.codebook_dim))
                for i in range(spec.quantizers)
            ]
        )
        from onnx import TensorProto

        rows = graph.op(
            "Transpose",
            graph.op("Squeeze", graph.op("Cast", codes, to=TensorProto.INT64), graph.constant("axis", [0])),
            perm=[1, 0],
        )
        rows = graph.op(
            "Add", rows, graph.constant("codebook_starts", np.arange(spec.quantizers)[:, None] * spec.codebook_size)
        )
        x = graph.op("Gather", graph.weight("quantizer.codebooks", table), rows, axis=0)  # (nq, F, codebook_dim)
        if spec.rvq_dim != spec.codebook_dim:  # upstream projects a code vector only where the widths differ
            projections = [
                self.weights.weight_normed(f"{prefix}.{i}.out_proj", spec.rvq_dim, spec.codebook_dim)
                for i in range(spec.quantizers)
            ]
            x = graph.op(
                "Add",
                graph.op("MatMul", x, graph.weight("quantizer.out_projs", np.stack([m for m, _ in projections]))),
                graph.weight("quantizer.out_proj_biases", np.stack([b[None, :] for _, b in projections])),
            )
        x = graph.op("ReduceSum", x, graph.constant("axis", [0]), keepdims=0)
        if spec.rvq_dim != spec.quantizer_output_dim:
            x = self.conv(graph, x, "quantizer.output_proj", spec.quantizer_output_dim, spec.rvq_dim)
        return graph.op("Unsqueeze", x, graph.constant("axis", [0]))

    def quantizer_encode(self, graph: OnnxGraph, x: str) -> str:
        """(1, F, input_dim) latents -> (1, F, nq) int32 codes: upstream's residual LFQ, each level's code the
        nearest of the normalized codebook to the normalized projected residual, its vector taken off."""
        from onnx import TensorProto

        spec, prefix = self.spec, "quantizer.quantizers"
        residual = graph.op("Squeeze", x, graph.constant("axis", [0]))  # (F, input_dim)
        if spec.quantizer_input_dim != spec.rvq_dim:
            residual = self.conv(graph, residual, "quantizer.input_proj", spec.rvq_dim, spec.quantizer_input_dim)
        codes = []
        for i in range(spec.quantizers):
            codebook = self.weights.read(f"{prefix}.{i}.codebook.weight", (spec.codebook_size, spec.codebook_dim))
            latent = residual
            if spec.rvq_dim != spec.codebook_dim:
                latent = self.conv(graph, residual, f"{prefix}.{i}.in_proj", spec.codebook_dim, spec.rvq_dim)
            unit = graph.op(
                "Div",
                latent,
                graph.op("Max", _row_norm(graph, latent), graph.constant("eps", _NORMALIZE_EPS, np.float32)),
            )
            norms = np.maximum(np.sqrt(np.sum(np.square(codebook), axis=1, keepdims=True)), np.float32(_NORMALIZE_EPS))
            units = (codebook / norms).astype(np.float32)
            # -distance = 2 e.c - |e|^2 - |c|^2, as upstream computes it (the same ties and roundings)
            dot = graph.op("MatMul", unit, graph.weight(f"{prefix}.{i}.unit_codebook_t", np.ascontiguousarray(units.T)))
            distance = graph.op(
                "Add",
                graph.op(
                    "Sub",
                    graph.op("ReduceSum", graph.op("Mul", unit, unit), graph.constant("axis", [1]), keepdims=1),
                    graph.op("Mul", dot, graph.constant("two", 2.0, np.float32)),
                ),
                graph.weight(f"{prefix}.{i}.unit_norms", np.sum(np.square(units), axis=1)[None, :]),
            )
            index = graph.op("ArgMax", graph.op("Neg", distance), axis=1, keepdims=0)  # (F,) int64: the first best
            codes.append(graph.op("Unsqueeze", index, graph.constant("axis", [1])))
            vector = graph.op("Gather", graph.weight(f"{prefix}.{i}.codebook", codebook), index, axis=0)
            if spec.rvq_dim != spec.codebook_dim:
                vector = self.conv(graph, vector, f"{prefix}.{i}.out_proj", spec.rvq_dim, spec.codebook_dim)
            residual = graph.op("Sub", residual, vector)
        stacked = graph.op("Concat", *codes, axis=1)  # (F, nq)
        return graph.op("Cast", graph.op("Unsqueeze", stacked, graph.constant("axis", [0])), to=TensorProto.INT32)


def _row_norm(graph: OnnxGraph, x: str) -> str:
    return graph.op("Sqrt", graph.op("ReduceSum", graph.op("Mul", x, x), graph.constant("axis", [1]), keepdims=1))


def _gelu(graph: OnnxGraph, x: str) -> str:
    """nn.GELU (exact): x/2 (1 + erf(x / sqrt 2)); ONNX Runtime fuses it back into one Gelu."""
    erf = graph.op("Erf", graph.op("Mul", x, graph.constant("inv_sqrt2", 1 / math.sqrt(2), np.float32)))
    return graph.op(
        "Mul",
        graph.op("Mul", x, graph.constant("half", 0.5, np.float32)),
        graph.op("Add", erf, graph.constant("one_f", 1.0, np.float32)),
    )


def _patch_merge(graph: OnnxGraph, x: str, channels: int, size: int) -> str:
    """Upstream's encoder patch: (1, T * size, channels) -> (1, T, channels * size), channel c * size + j at t
    taken from channel c at position t * size + j."""
    split = graph.op("Reshape", x, graph.constant("patch_shape", [1, -1, size, channels]))
    return graph.op(
        "Reshape",
        graph.op("Transpose", split, perm=[0, 1, 3, 2]),
        graph.constant("merged_shape", [1, -1, channels * size]),
    )


# --- the three graphs ---------------------------------------------------------------------------------------


def _decode_graph(writer: _Writer, step: bool) -> tuple[OnnxGraph, list[Any], list[Any], dict[str, Any]]:
    """decode_full, or with ``step`` decode_step: the decode path and its declared inputs, outputs and the meta's
    streaming_decode section."""
    from onnx import TensorProto, helper

    spec = writer.spec
    graph = OnnxGraph(None, "")
    codes_name, lengths_name = DECODE_INPUTS
    inputs = [
        helper.make_tensor_value_info(codes_name, TensorProto.INT32, (1, "frames", spec.quantizers)),
        helper.make_tensor_value_info(lengths_name, TensorProto.INT32, (1,)),
    ]
    outputs = [
        helper.make_tensor_value_info(DECODE_OUTPUTS[0], TensorProto.FLOAT, (1, spec.channels, "samples")),
        helper.make_tensor_value_info(DECODE_OUTPUTS[1], TensorProto.INT32, (1,)),
    ]
    offsets_meta: list[dict[str, Any]] = []
    caches_meta: list[dict[str, Any]] = []
    offset_inputs: list[Any] = []
    offset_outputs: list[Any] = []
    cache_inputs: list[Any] = []
    cache_outputs: list[Any] = []
    x, width = writer.quantizer_decode(graph, codes_name), spec.quantizer_output_dim
    for module in spec.decoder:
        if isinstance(module, Patch):
            width //= module.size
            x = unpatch(graph, x, width, module.size)
            continue
        states, layer_names = None, []
        if step:
            stage_index = len(offsets_meta)
            in_name, out_name = _transformer_offset_names(stage_index)
            offsets_meta.append(
                {"index": stage_index, "input_name": in_name, "output_name": out_name, "shape": [1], "dtype": "int32"}
            )
            offset_inputs.append(helper.make_tensor_value_info(in_name, TensorProto.INT32, (1,)))
            offset_outputs.append(helper.make_tensor_value_info(out_name, TensorProto.INT32, (1,)))
            length = graph.op("Cast", graph.op("Shape", x, start=1, end=2), to=TensorProto.INT32)
            graph.op("Add", in_name, length, out=out_name)  # upstream only counts: RoPE reads the attention offsets
            states = []
            for _ in range(module.layers):
                index = len(caches_meta)
                names = _state_names(index)
                cache_shape = [1, module.heads, module.context, module.head_dim]
                caches_meta.append(
                    {
                        "index": index,
                        "context": module.context,
                        "num_heads": module.heads,
                        "head_dim": module.head_dim,
                        **names,
                        "offset_shape": [1],
                        "cache_shape": cache_shape,
                        "positions_shape": [1, module.context],
                        "cache_dtype": "float32",
                    }
                )
                kinds = (
                    ("offset", TensorProto.INT32, [1]),
                    ("cached_keys", TensorProto.FLOAT, cache_shape),
                    ("cached_values", TensorProto.FLOAT, cache_shape),
                    ("cached_positions", TensorProto.INT32, [1, module.context]),
                )
                for kind, dtype, shape in kinds:
                    cache_inputs.append(helper.make_tensor_value_info(names[f"{kind}_input_name"], dtype, shape))
                    cache_outputs.append(helper.make_tensor_value_info(names[f"{kind}_output_name"], dtype, shape))
                states.append(_LayerState(*(names[f"{kind}_input_name"] for kind, _, _ in kinds)))
                layer_names.append([names[f"{kind}_output_name"] for kind, _, _ in kinds])
        x, new_states = writer.stage(graph, module, x, states)
        for names, produced in zip(layer_names, new_states, strict=True):
            for name, value in zip(names, produced, strict=True):
                graph.op("Identity", value, out=name)
        width = module.output_dim
    # The interleaved signal (1, F * frame * channels, 1) back to (1, channels, F * frame).
    samples = graph.op("Reshape", x, graph.constant("interleaved_shape", [1, -1, spec.channels]))
    graph.op("Transpose", samples, perm=[0, 2, 1], out=DECODE_OUTPUTS[0])
    graph.op(
        "Mul",
        lengths_name,
        graph.constant("samples_per_frame", [spec.samples_per_frame], np.int32),
        out=DECODE_OUTPUTS[1],
    )
    streaming = {"batch_size": 1, "transformer_offsets": offsets_meta, "attention_caches": caches_meta}
    return graph, inputs + offset_inputs + cache_inputs, outputs + offset_outputs + cache_outputs, streaming


def _encode_graph(writer: _Writer) -> tuple[OnnxGraph, list[Any], list[Any]]:
    """(1, channels, samples) float32 and its length -> (1, frames, nq) int32 codes and the whole frames' count.

    The end is zero-padded to whole frames, as upstream pads it. Upstream also masks what lies past the given
    length; causal attention keeps that from reaching any whole frame, so the codes of the frames the length
    counts are upstream's, and the padded frame's (past audio_code_lengths) are not."""
    from onnx import TensorProto, helper

    spec = writer.spec
    graph = OnnxGraph(None, "")
    waveform, lengths = ENCODE_INPUTS
    inputs = [
        helper.make_tensor_value_info(waveform, TensorProto.FLOAT, (1, spec.channels, "samples")),
        helper.make_tensor_value_info(lengths, TensorProto.INT32, (1,)),
    ]
    outputs = [
        helper.make_tensor_value_info(ENCODE_OUTPUTS[0], TensorProto.INT32, (1, "frames", spec.quantizers)),
        helper.make_tensor_value_info(ENCODE_OUTPUTS[1], TensorProto.INT32, (1,)),
    ]
    frame = graph.constant("frame", [spec.samples_per_frame])
    total = graph.op("Shape", waveform, start=2, end=3)
    missing = graph.op("Mod", graph.op("Sub", frame, graph.op("Mod", total, frame)), frame)
    pads = graph.op("Concat", graph.constant("no_pad", [0, 0, 0, 0, 0]), missing, axis=0)
    padded = graph.op("Pad", waveform, pads)
    x = graph.op("Reshape", graph.op("Transpose", padded, perm=[0, 2, 1]), graph.constant("signal_shape", [1, -1, 1]))
    width = 1
    for module in spec.encoder:
        if isinstance(module, Patch):
            x = _patch_merge(graph, x, width, module.size)
            width *= module.size
            continue
        x, _ = writer.stage(graph, module, x, None)
        width = module.output_dim
    graph.op("Identity", writer.quantizer_encode(graph, x), out=ENCODE_OUTPUTS[0])
    graph.op(
        "Div", lengths, graph.constant("samples_per_frame", [spec.samples_per_frame], np.int32), out=ENCODE_OUTPUTS[1]
    )
    return graph, inputs, outputs


def write_nano_codec(checkpoint_dir: Path | str, out_dir: Path | str) -> Path:
    """Write the codec directory of the checkpoint in ``checkpoint_dir`` (upstream's config.json and
    model.safetensors) to ``out_dir`` in upstream's published ONNX layout; return ``out_dir``."""
    import onnx
    from onnx import helper

    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    spec = read_nano_config(checkpoint_dir / "config.json")
    writer = _Writer(spec, CodecWeights(SafetensorsCheckpoint(checkpoint_dir)))
    out_dir.mkdir(parents=True, exist_ok=True)
    full, full_in, full_out, _ = _decode_graph(writer, step=False)
    step, step_in, step_out, streaming = _decode_graph(writer, step=True)
    encode, encode_in, encode_out = _encode_graph(writer)
    for role, (graph, graph_in, graph_out) in {
        "encode": (encode, encode_in, encode_out),
        "decode_full": (full, full_in, full_out),
        "decode_step": (step, step_in, step_out),
    }.items():
        body = helper.make_graph(graph.nodes, f"moss_audio_tokenizer_{role}", graph_in, graph_out, graph.initializers)
        model = helper.make_model(body, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=__name__)
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        onnx.save_model(model, out_dir / GRAPH_FILES[role])
    meta = {
        "format": META_FORMAT,
        "files": dict(GRAPH_FILES),
        "codec_config": {
            "sample_rate": spec.sample_rate,
            "channels": spec.channels,
            "downsample_rate": spec.samples_per_frame,
            "num_quantizers": spec.quantizers,
            "codebook_size": spec.codebook_size,
        },
        "onnx": {
            "opset": OPSET,
            "encode_input_names": list(ENCODE_INPUTS),
            "encode_output_names": list(ENCODE_OUTPUTS),
            "decode_input_names": list(DECODE_INPUTS),
            "decode_output_names": list(DECODE_OUTPUTS),
            "decode_step_input_names": [v.name for v in step_in],
            "decode_step_output_names": [v.name for v in step_out],
        },
        "streaming_decode": streaming,
    }
    (out_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return out_dir


# --- random checkpoints of the real architecture ------------------------------------------------------------


def nano_config(size: str) -> dict[str, Any]:
    """An upstream config.json for the Nano architecture, ``real`` (its published sizes) or ``tiny``.

    Real, from published facts (docs/nano.md, "Writing a Nano codec", says how they were chosen):
    48 kHz, 2 channels interleaved, 3840 samples a channel per frame, 16 RLFQ quantizers of 1024 codes, codebook
    dim 8, rvq 512, output 768, the decoder's patches 4, 2, 2, 2, 240 between Transformers 192->768, 384->768,
    384->768, 384->240 (upstream's Nano config checker); every decoder Transformer 4 heads of 64 (d_model 256)
    of 4, 2, 2 and 4 layers attending 500, 800, 1200 and 1600 positions back, that is 10, 8, 6 and 4 s (the
    published decode_step's attention caches). Chosen from the evidence: a feed-forward of 1024 (4 x d_model:
    the published graphs' 42 MiB encoder and 86 MiB codec hold about 21 M float32 parameters with it) and an
    encoder mirroring the decoder; layer scale 0.01, RoPE period 10000 as the codec family's configs have.
    Tiny: the same layout with Transformers of 1 layer, width 32 (2 heads of 16), spans of 1 s.
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    real = size == "real"
    widths = (
        {"d_model": 256, "num_heads": 4, "dim_feedforward": 1024}
        if real
        else {"d_model": 32, "num_heads": 2, "dim_feedforward": 64}
    )
    code_dim = 768 if real else 64
    first = 192 if real else 16  # the decoder's first Transformer's input: the code vector split in 4
    inner = 384 if real else 32  # what every other patch merge or split carries

    def transformer(input_dimension: int, output_dimension: int, layers: int, seconds: float) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "module_type": "Transformer",
            "input_dimension": input_dimension,
            "output_dimension": output_dimension,
            **widths,
            "num_layers": layers if real else 1,
            "causal": True,
            "norm": "layer_norm",
            "positional_embedding": "rope",
            "max_period": 10000,
            "gating": "none",
            "layer_scale": 0.01,
            "conv_layout": True,
        }
        if real:
            entry["context_duration"] = seconds
        return entry

    def patch(size: int) -> dict[str, Any]:
        return {"module_type": "PatchedPretransform", "patch_size": size}

    # (layers, seconds) of the decoder's Transformers in order; the encoder's are the same from the other end.
    stages = ((4, 10.0), (2, 8.0), (2, 6.0), (4, 4.0))
    decoder = [patch(4), transformer(first, 2 * inner, *stages[0])]
    decoder += [
        patch(2),
        transformer(inner, 2 * inner, *stages[1]),
        patch(2),
        transformer(inner, 2 * inner, *stages[2]),
    ]
    decoder += [patch(2), transformer(inner, 240, *stages[3]), patch(240)]
    encoder = [patch(240), transformer(240, inner, *stages[3]), patch(2), transformer(2 * inner, inner, *stages[2])]
    encoder += [
        patch(2),
        transformer(2 * inner, inner, *stages[1]),
        patch(2),
        transformer(2 * inner, first, *stages[0]),
    ]
    encoder.append(patch(4))
    return {
        "architectures": ["MossAudioTokenizerModel"],
        "model_type": "moss-audio-tokenizer",
        "sampling_rate": 48000,
        "downsample_rate": 3840,
        "number_channels": 2,
        "enable_channel_interleave": True,
        "attention_implementation": "sdpa",
        "compute_dtype": "fp32",
        "causal_transformer_context_duration": 10.0 if real else 1.0,
        "code_dim": code_dim,
        "encoder_kwargs": encoder,
        "decoder_kwargs": decoder,
        "quantizer_type": "rlfq",
        "quantizer_kwargs": {
            "quantizer_type": "rlfq",
            "input_dim": code_dim,
            "rvq_dim": 512 if real else 32,
            "output_dim": code_dim,
            "num_quantizers": 16,
            "codebook_size": 1024,
            "codebook_dim": 8,
        },
    }


def write_random_nano_checkpoint(
    config: Mapping[str, Any], out_dir: Path | str, seed: int = 0, output_gain: float = 1.0
) -> Path:
    """``config`` as config.json and every tensor of upstream's state dict for it in model.safetensors, random
    and initialized as upstream initializes a new model (random_codec's scheme: linear and embedding weights
    N(0, 0.02), norms 1 and 0, layer scales at their configured value, weight-normed convolutions as torch
    makes them with zero biases); return ``out_dir``. ``output_gain`` multiplies the decoder's last projection,
    and so its audio (only a patch reshape follows it): upstream's init decodes to a few 1e-9, silence."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    spec = read_nano_config(out_dir / "config.json")
    tensors = RandomTensors(seed)
    last = spec.stages("decoder")[-1]
    for stage in (*spec.stages("encoder"), *spec.stages("decoder")):
        gain = output_gain if stage is last else 1.0
        tensors.add(f"{stage.prefix}.input_proj.weight", (stage.d_model, stage.input_dim))
        tensors.add(f"{stage.prefix}.output_proj.weight", (stage.output_dim, stage.d_model), scale=gain)
        for layer in range(stage.layers):
            prefix = f"{stage.prefix}.transformer.layers.{layer}"
            tensors.add(f"{prefix}.self_attn.in_proj.weight", (3 * stage.d_model, stage.d_model))
            tensors.add(f"{prefix}.self_attn.out_proj.weight", (stage.d_model, stage.d_model))
            tensors.add(f"{prefix}.ffn.0.weight", (stage.ffn, stage.d_model))
            tensors.add(f"{prefix}.ffn.2.weight", (stage.d_model, stage.ffn))
            tensors.add_layer_norms(prefix, stage.d_model)
            if stage.layer_scale is not None:
                tensors.add_layer_scales(prefix, stage.d_model, stage.layer_scale)
    if spec.quantizer_input_dim != spec.rvq_dim:
        tensors.add_weight_normed("quantizer.input_proj", spec.rvq_dim, spec.quantizer_input_dim)
    if spec.rvq_dim != spec.quantizer_output_dim:
        tensors.add_weight_normed("quantizer.output_proj", spec.quantizer_output_dim, spec.rvq_dim)
    for i in range(spec.quantizers):
        prefix = f"quantizer.quantizers.{i}"
        tensors.add(f"{prefix}.codebook.weight", (spec.codebook_size, spec.codebook_dim))
        if spec.rvq_dim != spec.codebook_dim:
            tensors.add_weight_normed(f"{prefix}.in_proj", spec.codebook_dim, spec.rvq_dim)
            tensors.add_weight_normed(f"{prefix}.out_proj", spec.rvq_dim, spec.codebook_dim)
    tensors.write(out_dir / "model.safetensors")
    return out_dir


def write_random_nano_codec(out_dir: Path | str, size: str = "tiny", seed: int = 0, output_gain: float = 1.0) -> Path:
    """A random Nano codec (``nano_config(size)``, seeded, its audio times ``output_gain``) written in upstream's
    published ONNX layout to ``out_dir``; its checkpoint is made in a temporary directory and dropped. Return
    ``out_dir``."""
    with tempfile.TemporaryDirectory(prefix="nano-codec-") as scratch:
        checkpoint = write_random_nano_checkpoint(nano_config(size), scratch, seed, output_gain)
        return write_nano_codec(checkpoint, out_dir)
