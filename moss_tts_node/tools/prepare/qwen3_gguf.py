"""Write a Qwen3 backbone as a GGUF file that llama.cpp loads (arch ``qwen3``).

Shared by the demo-weight generator and the checkpoint converter. Tensors arrive as an iterable of
``(hf_name, array)`` pairs so that a converter can hand them over one at a time: each tensor is written
as soon as every tensor before it in ``qwen3_tensor_shapes`` order has been written, so a caller that
yields in that order never holds more than one tensor in memory (out-of-order tensors are buffered until
their turn).

The file carries no tokenizer (``tokenizer.ggml.model = "none"`` plus ``qwen3.vocab_size``): MOSS-TTS
tokenizes with the ``tokenizers`` library and feeds llama.cpp embeddings, never token ids.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.tools.prepare.gguf_writing import PlannedTensor, layered_tensor_name, write_planned_gguf

_DTYPES = {"f32": np.float32, "f16": np.float16}

# Per-layer HF suffix -> GGUF suffix (Qwen3 uses NEOX rope in llama.cpp: no q/k permutation needed).
_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


@dataclass(frozen=True)
class Qwen3Shape:
    """Hyper-parameters of a Qwen3 backbone (the names follow HF ``Qwen3Config``)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 1e6
    rms_eps: float = 1e-6
    context_length: int = 40960

    def __post_init__(self) -> None:
        for field in ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context_length"):
            if getattr(self, field) <= 0:
                raise ValueError(f"Qwen3Shape.{field} must be positive, got {getattr(self, field)}")
        if self.heads % self.kv_heads != 0:
            raise ValueError(f"Qwen3Shape.heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2 != 0:
            raise ValueError(f"Qwen3Shape.head_dim must be even for rope, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_eps <= 0:
            raise ValueError("Qwen3Shape.rope_theta and rms_eps must be positive")


def gguf_tensor_name(hf_name: str) -> str:
    """Map a Qwen3Model tensor name (``layers.3.mlp.up_proj.weight``, ``lm_head.weight``...) to GGUF's."""
    return layered_tensor_name(hf_name, "layers", _LAYER_NAMES, _GLOBAL_NAMES, "Qwen3")


def qwen3_tensor_shapes(shape: Qwen3Shape) -> dict[str, tuple[int, ...]]:
    """Every HF tensor name of the backbone with its [out, in] shape, in the order the GGUF stores them."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (shape.vocab, h)}
    for i in range(shape.layers):
        p = f"layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.q_norm.weight": (shape.head_dim,),
                p + "self_attn.k_norm.weight": (shape.head_dim,),
                p + "self_attn.o_proj.weight": (h, q),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (shape.ffn, h),
                p + "mlp.up_proj.weight": (shape.ffn, h),
                p + "mlp.down_proj.weight": (h, shape.ffn),
            }
        )
    shapes["norm.weight"] = (h,)
    shapes["lm_head.weight"] = (shape.vocab, h)
    return shapes


def write_qwen3_gguf(
    path: Path | str,
    shape: Qwen3Shape,
    tensors: Iterable[tuple[str, np.ndarray]],
    dtype: str = "f32",
    name: str = "moss-tts-backbone",
) -> None:
    """Write the backbone to ``path`` (atomically: a partial file never takes the final name).

    ``tensors`` must yield every name of ``qwen3_tensor_shapes(shape)`` exactly once, ``lm_head.weight``
    included (MOSS-TTS has its own text head, so the output is never tied to the embeddings). ``dtype``
    (``f32`` or ``f16``) applies to the 2-D matrices; norm vectors always stay f32, as llama.cpp expects.
    """
    import gguf  # deferred: only converters and generators need the gguf package

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    plan = {
        hf_name: PlannedTensor(
            gguf_tensor_name(hf_name), dims, np.dtype(_DTYPES[dtype] if len(dims) == 2 else np.float32)
        )
        for hf_name, dims in qwen3_tensor_shapes(shape).items()
    }

    def add_header(writer: Any) -> None:
        writer.add_name(name)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
        writer.add_block_count(shape.layers)
        writer.add_context_length(shape.context_length)
        writer.add_embedding_length(shape.hidden)
        writer.add_feed_forward_length(shape.ffn)
        writer.add_head_count(shape.heads)
        writer.add_head_count_kv(shape.kv_heads)
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
        writer.add_layer_norm_rms_eps(shape.rms_eps)
        writer.add_rope_freq_base(shape.rope_theta)
        writer.add_vocab_size(shape.vocab)
        writer.add_tokenizer_model("none")

    # A name that is not Qwen3's at all gets gguf_tensor_name's own error.
    write_planned_gguf(
        path, "qwen3", add_header, plan, tensors, f"a {shape.layers}-layer backbone", check_name=gguf_tensor_name
    )


def random_qwen3_tensors(shape: Qwen3Shape, seed: int) -> dict[str, np.ndarray]:
    """Random float32 backbone weights whose hidden states stay O(1) at any depth.

    Matrices are scaled by 1/sqrt(fan_in); the two that write into the residual stream (``o_proj``,
    ``down_proj``) get a further 1/sqrt(2 * layers), so the stream grows like sqrt(1 + ...) instead of
    exploding. Norm weights are near 1 but not exactly 1, so a test still notices when one is ignored.
    """
    rng = np.random.default_rng(seed)
    residual_scale = 1.0 / np.sqrt(2.0 * shape.layers)
    out: dict[str, np.ndarray] = {}
    for name, dims in qwen3_tensor_shapes(shape).items():
        if len(dims) == 1:
            values = 1.0 + 0.1 * rng.standard_normal(dims)
        elif name == "embed_tokens.weight":
            values = rng.standard_normal(dims)
        else:
            scale = 1.0 / np.sqrt(dims[1])
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                scale *= residual_scale
            values = scale * rng.standard_normal(dims)
        out[name] = values.astype(np.float32)
    return out
