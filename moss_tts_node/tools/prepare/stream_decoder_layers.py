"""The stream decoder graph's building blocks, each adding its ONNX nodes to an ``OnnxGraph``.

``OnnxGraph`` holds the nodes and initializers being written (big weights stream to a side file). The
decode path's pieces: the quantizer's codebook lookup (``quantizer_decode``), the patch reshape
(``unpatch``), a stage's clock (positions, visibility, rotary tables, ring slots: ``stage_clock``) and a
causal Transformer stage with its layers (``transformer_stage``), each layer a few of ONNX Runtime's fused
operators. ``stream_decoder_build`` puts them in order; docs/stream-decoder.md, "The graph", says which
operators and why, and describes the state they keep.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from moss_tts_node.codec.quantizer import CODEBOOK_SIZE
from moss_tts_node.codec.stream_decoder import (
    CODES_INPUT,
    FRAMES_INPUT,
    key_cache_name,
    present_key_name,
    present_value_name,
    value_cache_name,
    write_slots_name,
)
from moss_tts_node.errors import WeightsError
from moss_tts_node.model.q8_blocks import quantize_q8_blocks
from moss_tts_node.tools.prepare.stream_decoder_checkpoint import CodecSpec, CodecWeights, TransformerStage

_EXTERNAL_ALIGN = 4096  # lets ONNX Runtime map the side file instead of reading it
_LAYER_NORM_EPS = 1e-5  # the codec's nn.LayerNorm default
_INT64_MAX = np.iinfo(np.int64).max
CONTRIB_DOMAIN = "com.microsoft"  # ONNX Runtime's own operators (GroupQueryAttention, MatMulNBits, ...)
# GroupQueryAttention's CPU kernel rotates heads whose size is a multiple of 16 only.
_ROTARY_HEAD_MULTIPLE = 16


@dataclass(frozen=True)
class WeightPrecision:
    """Which weight MatMuls are 8-bit: ONNX Runtime's MatMulNBits, weights in blocks of ``block`` input
    channels with one scale each (symmetric), activations quantized per row and block of the same size
    (``accuracy_level`` 4: int8 dot products) so that each output row depends on its own input row only,
    whatever the chunking. Everything else (norms, attention, the caches) stays float32."""

    quantized: Callable[[str], bool]  # by weight name (the ``linear`` hint), True: 8-bit
    block: int = 32
    accuracy_level: int = 4


class OnnxGraph:
    """Nodes and initializers of the graph being written; big weights stream to the side file if there is one."""

    def __init__(self, data_file: BinaryIO | None, data_name: str, precision: WeightPrecision | None = None) -> None:
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._data_file = data_file
        self._data_name = data_name
        self._precision = precision
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

    def linear(self, x: str, hint: str, matrix: np.ndarray) -> str:
        """``x @ matrix`` for a (in, out) weight named ``hint``: float32, or 8-bit where the precision says so."""
        if self._precision is None or not self._precision.quantized(hint):
            return self.op("MatMul", x, self.weight(hint, matrix))
        block = self._precision.block
        codes, scales = quantize_q8_blocks(matrix.T, block)
        return self.op(
            "MatMulNBits",
            x,
            self.weight(f"{hint}.q8", codes),
            self.weight(f"{hint}.scales", scales.reshape(-1)),
            domain=CONTRIB_DOMAIN,
            K=matrix.shape[0],
            N=matrix.shape[1],
            bits=8,
            block_size=block,
            accuracy_level=self._precision.accuracy_level,
        )

    def op(
        self, op_type: str, *inputs: str, outputs: int = 1, out: str | list[str] | None = None, **attributes: Any
    ) -> Any:
        """Add a node; return its output name (``out`` if given), or a list of ``outputs`` names.

        ``out`` as a list names every output ("" for an optional one left out). The node is named after its
        first output, so that profiles and the quantizer can refer to it.
        """
        from onnx import helper

        if isinstance(out, list):
            names = out
        else:
            names = [out] if out is not None else [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0], **attributes))
        return names[0] if len(names) == 1 else names


def quantizer_decode(graph: OnnxGraph, weights: CodecWeights, spec: CodecSpec, count: int) -> str:
    """Codes (count, 1, n) -> (1, n, channels): each codebook's vector, projected, summed, projected again.

    ``count``: how many of the codec's codebooks the codes hold, the first ones (a residual quantizer's
    coarse levels): the codec decodes fewer quantizers by summing fewer codebooks."""
    width, rvq = spec.codebook_dim, spec.rvq_dim
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
        # One batched (count, 8, 512) MatMul, always float32: its 0.5 M weights are not worth a precision loss.
        x = graph.op("Add", graph.op("MatMul", x, matrices), biases)
    x = graph.op("ReduceSum", x, graph.constant("axis", [0]), keepdims=0)
    if rvq != spec.quantizer_output_dim:
        matrix, bias = weights.weight_normed("quantizer.output_proj", spec.quantizer_output_dim, rvq)
        x = graph.op(
            "Add", graph.linear(x, "quantizer.output_proj", matrix), graph.weight("quantizer.output_proj.bias", bias)
        )
    return graph.op("Unsqueeze", x, graph.constant("axis", [0]))  # (1, n, channels): attention wants a batch


def unpatch(graph: OnnxGraph, x: str, channels: int, size: int) -> str:
    """(1, T, channels * size) -> (1, T * size, channels): channel c * size + j at t moves to position t * size + j."""
    split = graph.op("Reshape", x, graph.constant("patch_shape", [-1, channels, size]))
    return graph.op(
        "Reshape", graph.op("Transpose", split, perm=[0, 2, 1]), graph.constant("unpatch_shape", [1, -1, channels])
    )


@dataclass(frozen=True)
class StageClock:
    """What every layer of a stage shares in one call: GroupQueryAttention's lengths, rotary tables and mask."""

    seqlens: str  # (1,) int32: keys of the call minus one (the ring's slots, then the new positions)
    total: str  # () int32: keys of the call
    cos: str  # (rows, head_dim / 2): cache row r holds position start - span + r
    sin: str
    bias: str  # (1, 1, T, span + T) float32: 0 where a query sees the key, -inf where it does not


def stage_clock(
    graph: OnnxGraph, stage: TransformerStage, index: int, frames: str, per_frame: int, attention: str, rows: int
) -> StageClock:
    """Positions of this call at one stage, the visibility mask, rotary tables, and the ring slots to write.

    The caches hold ``rows`` positions per layer: the ring's ``span`` slots, then room for the call's new
    keys, which GroupQueryAttention writes after them (docs/stream-decoder.md, "The ring").
    """
    from onnx import TensorProto

    span = graph.constant("span", stage.context)
    one = graph.constant("one", 1)
    zero = graph.constant("zero", 0)
    start = graph.op("Mul", FRAMES_INPUT, graph.constant("positions_per_frame", per_frame))
    count = graph.op("Mul", frames, graph.constant("positions_per_frame", per_frame))
    end = graph.op("Add", start, count)
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
    # The mask goes in as an additive bias, not as GroupQueryAttention's local window: ONNX Runtime 1.23
    # changed what local_window_size counts (the query's own key in or out), the bias means one thing.
    bias = graph.op(
        "Where", visible, graph.constant("visible", 0.0, np.float32), graph.constant("hidden", -np.inf, np.float32)
    )
    # Only the newest `span` positions are stored (more would overwrite each other in the ring).
    newest = graph.op(
        "Slice",
        new,
        graph.constant("newest", [-stage.context]),
        graph.constant("end", [_INT64_MAX]),
    )
    graph.op("Mod", newest, span, fmod=0, out=write_slots_name(index))
    total = graph.op("Add", count, span)
    half = stage.head_dim // 2
    # The codec's RoPE: pair (2i, 2i+1) turns by position x max_period^(-2i / head_dim), in float32.
    # GroupQueryAttention reads the angles of key row r at row r of the tables: position start - span + r.
    freqs = np.exp(np.arange(half, dtype=np.float32) * np.float32(-math.log(stage.max_period) * 2 / stage.head_dim))
    first = graph.op("Sub", start, span)
    positions = graph.op("Range", first, graph.op("Add", first, graph.constant("cache_rows", rows)), one)
    angle = graph.op(
        "Mul",
        graph.op("Unsqueeze", graph.op("Cast", positions, to=TensorProto.FLOAT), graph.constant("axis", [1])),
        graph.weight("rope_freqs", freqs[None, :]),
    )
    return StageClock(
        seqlens=graph.op("Cast", graph.op("Reshape", graph.op("Sub", total, one), one), to=TensorProto.INT32),
        total=graph.op("Cast", total, to=TensorProto.INT32),
        cos=graph.op("Cos", angle),
        sin=graph.op("Sin", angle),
        bias=graph.op("Unsqueeze", bias, graph.constant("axes", [0, 1])),
    )


def check_stage(stage: TransformerStage) -> None:
    """Refuse a stage the fused attention cannot run, naming the setting."""
    if stage.head_dim % _ROTARY_HEAD_MULTIPLE:
        raise WeightsError(
            f"{stage.prefix}: heads of {stage.head_dim} channels (d_model {stage.d_model} / {stage.heads} heads); "
            f"the stream decoder's attention (ONNX Runtime's GroupQueryAttention) rotates heads of a multiple of "
            f"{_ROTARY_HEAD_MULTIPLE} channels only"
        )


def transformer_stage(
    graph: OnnxGraph, weights: CodecWeights, stage: TransformerStage, index: int, clock: StageClock, x: str
) -> str:
    """One decoder Transformer stage on (1, T, input_dim); its layers write their caches by the contract's names.

    Pre-norm layers, x + scale * attention(norm1(x)), then x + scale * ffn(norm2(x)), written so that each
    residual sum and the norm after it are one SkipLayerNormalization: the sum of one layer's feed-forward
    branch is normed by the next layer's norm1, and the layer scales are folded into the projections
    before them (a per-channel scale of a MatMul's output is a scale of its weight's columns).
    """
    width = stage.d_model
    if stage.input_dim != width:  # the codec has no projection where the widths agree
        x = graph.linear(
            x,
            f"{stage.prefix}.input_proj",
            weights.linear(f"{stage.prefix}.input_proj.weight", width, stage.input_dim),
        )
    normed = graph.op(
        "LayerNormalization", x, *_norm(graph, weights, stage, 0, "norm1"), axis=-1, epsilon=_LAYER_NORM_EPS
    )
    for layer in range(stage.layers):
        prefix = f"{stage.prefix}.transformer.layers.{layer}"
        attended = _attention(graph, weights, stage, index, layer, clock, normed)
        normed, x = _add_and_norm(graph, x, attended, _norm(graph, weights, stage, layer, "norm2"))
        hidden = graph.linear(normed, f"{prefix}.linear1", weights.linear(f"{prefix}.linear1.weight", stage.ffn, width))
        ffn = graph.linear(
            graph.op("Gelu", hidden),
            f"{prefix}.linear2",
            _scaled(
                weights, stage, layer, "layer_scale_2", weights.linear(f"{prefix}.linear2.weight", width, stage.ffn)
            ),
        )
        if layer + 1 == stage.layers:
            x = graph.op("Add", x, ffn)
        else:
            normed, x = _add_and_norm(graph, x, ffn, _norm(graph, weights, stage, layer + 1, "norm1"))
    if stage.output_dim != width:
        x = graph.linear(
            x,
            f"{stage.prefix}.output_proj",
            weights.linear(f"{stage.prefix}.output_proj.weight", stage.output_dim, width),
        )
    return x


def _norm(graph: OnnxGraph, weights: CodecWeights, stage: TransformerStage, layer: int, name: str) -> tuple[str, str]:
    """A layer norm's scale and bias, as graph weights."""
    prefix = f"{stage.prefix}.transformer.layers.{layer}.{name}"
    scale, bias = (weights.read(f"{prefix}.{part}", (stage.d_model,)) for part in ("weight", "bias"))
    return graph.weight(f"{prefix}.weight", scale), graph.weight(f"{prefix}.bias", bias)


def _add_and_norm(graph: OnnxGraph, x: str, update: str, norm: tuple[str, str]) -> tuple[str, str]:
    """The residual sum x + update and its layer norm, in one SkipLayerNormalization: (normed, sum)."""
    normed, summed = graph.name("skip_norm"), graph.name("residual")
    graph.op(
        "SkipLayerNormalization",
        x,
        update,
        *norm,
        domain=CONTRIB_DOMAIN,
        epsilon=_LAYER_NORM_EPS,
        out=[normed, "", "", summed],  # the mean and inverse deviation are not needed
    )
    return normed, summed


def _scaled(weights: CodecWeights, stage: TransformerStage, layer: int, name: str, matrix: np.ndarray) -> np.ndarray:
    """An (in, out) projection with the layer scale that multiplies its output folded into its columns."""
    if stage.layer_scale is None:
        return matrix
    prefix = f"{stage.prefix}.transformer.layers.{layer}.{name}"
    return matrix * weights.read(f"{prefix}.scale", (stage.d_model,))[None, :]


def _attention(
    graph: OnnxGraph, weights: CodecWeights, stage: TransformerStage, index: int, layer: int, clock: StageClock, x: str
) -> str:
    """Self-attention of (1, T, width) normed inputs over the ring and the call, its output projected and scaled.

    One GroupQueryAttention (as many key heads as query heads): q, k and v packed in one projection, the
    rotary turn of q and k inside (pairs of adjacent channels, ``rotary_interleaved``), the keys and
    values read from the layer's cache and the call's own written after them, in place.
    """
    prefix = f"{stage.prefix}.transformer.layers.{layer}"
    width = stage.d_model
    in_proj = weights.read(f"{prefix}.self_attn.in_projs.0.weight", (3 * width, width))  # rows: q, k, v
    qkv = graph.linear(x, f"{prefix}.self_attn.in_proj", np.ascontiguousarray(in_proj.T))
    attended = graph.op(
        "GroupQueryAttention",
        qkv,
        "",
        "",
        key_cache_name(index, layer),
        value_cache_name(index, layer),
        clock.seqlens,
        clock.total,
        clock.cos,
        clock.sin,
        "",  # position_ids: the kernel's own, the rows after the ring
        clock.bias,
        domain=CONTRIB_DOMAIN,
        num_heads=stage.heads,
        kv_num_heads=stage.heads,
        do_rotary=1,
        rotary_interleaved=1,
        out=[graph.name("attention"), present_key_name(index, layer), present_value_name(index, layer)],
    )[0]
    out_proj = weights.linear(f"{prefix}.self_attn.out_projs.0.weight", width, width)
    return graph.linear(
        attended, f"{prefix}.self_attn.out_proj", _scaled(weights, stage, layer, "layer_scale_1", out_proj)
    )
