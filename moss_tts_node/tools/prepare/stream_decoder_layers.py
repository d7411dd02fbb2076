"""The stream decoder graph's building blocks, each adding its ONNX nodes to an ``OnnxGraph``.

``OnnxGraph`` holds the nodes and initializers being written (big weights stream to a side file). The
decode path's pieces: the quantizer's codebook lookup (``quantizer_decode``), the patch reshape
(``unpatch``), a stage's clock (positions, visibility, rotary tables, ring slots: ``stage_clock``) and a
causal Transformer stage with its layers (``transformer_stage``). ``stream_decoder_build`` puts them in
order; docs/stream-decoder.md describes the state they keep.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from moss_tts_node.codec.base import CODEBOOK_SIZE, AudioCodec
from moss_tts_node.codec.stream_decoder import (
    CODES_INPUT,
    FRAMES_INPUT,
    key_cache_name,
    new_keys_name,
    new_values_name,
    value_cache_name,
    write_slots_name,
)
from moss_tts_node.model.q8_blocks import quantize_q8_blocks
from moss_tts_node.tools.prepare.stream_decoder_checkpoint import CodecSpec, CodecWeights, TransformerStage

_EXTERNAL_ALIGN = 4096  # lets ONNX Runtime map the side file instead of reading it
_LAYER_NORM_EPS = 1e-5  # the codec's nn.LayerNorm default
_INT64_MAX = np.iinfo(np.int64).max
CONTRIB_DOMAIN = "com.microsoft"  # ONNX Runtime's own operators (MatMulNBits)


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
        self.contrib_ops = False  # whether a node of ONNX Runtime's com.microsoft domain was added

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
        self.contrib_ops = True
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

    def op(self, op_type: str, *inputs: str, outputs: int = 1, out: str | None = None, **attributes: Any) -> Any:
        """Add a node; return its output name (``out`` if given), or a list of ``outputs`` names.

        The node is named after its first output, so that profiles and the quantizer can refer to it.
        """
        from onnx import helper

        names = [out] if out is not None else [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=names[0], **attributes))
        return names[0] if len(names) == 1 else names


def quantizer_decode(graph: OnnxGraph, weights: CodecWeights, spec: CodecSpec) -> str:
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
        # One batched (32, 8, 512) MatMul, always float32: its 0.5 M weights are not worth a precision loss.
        x = graph.op("Add", graph.op("MatMul", x, matrices), biases)
    x = graph.op("ReduceSum", x, graph.constant("axis", [0]), keepdims=0)
    if rvq != spec.quantizer_output_dim:
        matrix, bias = weights.weight_normed("quantizer.output_proj", spec.quantizer_output_dim, rvq)
        x = graph.op(
            "Add", graph.linear(x, "quantizer.output_proj", matrix), graph.weight("quantizer.output_proj.bias", bias)
        )
    return x


def unpatch(graph: OnnxGraph, x: str, channels: int, size: int) -> str:
    """(T, channels * size) -> (T * size, channels): channel c * size + j at t moves to position t * size + j."""
    split = graph.op("Reshape", x, graph.constant("patch_shape", [-1, channels, size]))
    return graph.op(
        "Reshape", graph.op("Transpose", split, perm=[0, 2, 1]), graph.constant("unpatch_shape", [-1, channels])
    )


@dataclass(frozen=True)
class StageClock:
    """What every layer of a stage shares in one call: rotary tables and which keys each query sees."""

    cos: str  # (T, head_dim / 2, 1)
    sin: str
    visible: str  # (T, span + T) bool: the cached keys, then the new ones


def stage_clock(
    graph: OnnxGraph, stage: TransformerStage, index: int, frames: str, per_frame: int, attention: str
) -> StageClock:
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
    return StageClock(
        cos=graph.op("Unsqueeze", graph.op("Cos", angle), last_axis),
        sin=graph.op("Unsqueeze", graph.op("Sin", angle), last_axis),
        visible=visible,
    )


def transformer_stage(
    graph: OnnxGraph, weights: CodecWeights, stage: TransformerStage, index: int, clock: StageClock, x: str
) -> str:
    """One decoder Transformer stage on (T, input_dim); outputs its cache rows by the contract's names."""
    width = stage.d_model
    if stage.input_dim != width:  # the codec has no projection where the widths agree
        x = graph.linear(
            x,
            f"{stage.prefix}.input_proj",
            weights.linear(f"{stage.prefix}.input_proj.weight", width, stage.input_dim),
        )
    key_rows, value_rows = [], []
    for layer in range(stage.layers):
        x, key_row, value_row = _layer(graph, weights, stage, index, layer, clock, x)
        key_rows.append(key_row)
        value_rows.append(value_row)
    graph.op("Concat", *key_rows, axis=0, out=new_keys_name(index))
    graph.op("Concat", *value_rows, axis=0, out=new_values_name(index))
    if stage.output_dim != width:
        x = graph.linear(
            x,
            f"{stage.prefix}.output_proj",
            weights.linear(f"{stage.prefix}.output_proj.weight", stage.output_dim, width),
        )
    return x


def _layer(
    graph: OnnxGraph, weights: CodecWeights, stage: TransformerStage, index: int, layer: int, clock: StageClock, x: str
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
        if stage.layer_scale is not None:
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
            graph.linear(
                normed, f"{prefix}.self_attn.{part}", np.ascontiguousarray(in_proj[i * width : (i + 1) * width].T)
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
    x = residual("layer_scale_1", graph.linear(merged, f"{prefix}.self_attn.out_proj", out_proj))
    hidden = graph.linear(
        norm("norm2", x), f"{prefix}.linear1", weights.linear(f"{prefix}.linear1.weight", stage.ffn, width)
    )
    ffn = graph.linear(
        graph.op("Gelu", hidden), f"{prefix}.linear2", weights.linear(f"{prefix}.linear2.weight", width, stage.ffn)
    )
    x = residual("layer_scale_2", ffn)
    # Keep only the newest `span` positions: the rows the ring will hold.
    newest = graph.constant("newest", [-span])
    end = graph.constant("end", [_INT64_MAX])
    first = graph.constant("axis", [0])
    key_row = graph.op("Unsqueeze", graph.op("Slice", key_t, newest, end, graph.constant("axis", [2])), first)
    value_row = graph.op("Unsqueeze", graph.op("Slice", value, newest, end, graph.constant("axis", [1])), first)
    return x, key_row, value_row
