"""Write one of MOSS-TTS-Nano's transformers as a GGUF that llama.cpp runs under its ``codeshell`` architecture.

Nano's global transformer and its local one are the same GPT-2-style block (docs/nano.md, "The transformers"):
pre-LayerNorm with bias, one fused biased ``c_attn``, rotary positions, a biased GELU (tanh) MLP, a final
LayerNorm with bias, no learned positions. llama.cpp's CodeShell computes exactly that block, with one difference
of layout: Nano rotates interleaved pairs of each head, (x[2i], x[2i+1]), where CodeShell's (NEOX) rope rotates
halves, (x[i], x[i + d/2]). Permuting the query and key rows of each head (even dimensions first, then odd)
makes the two the same function: the pair Nano rotates by frequency i lands at i and i + d/2, and the attention
scores, q . k over the same permutation of both, do not change. Values and everything else keep their layout.

Nano feeds llama.cpp embeddings and reads the final-normed hidden state (the bridge turns its text head off), so
the file carries no tokenizer and a placeholder vocabulary of ``PLACEHOLDER_VOCAB`` zero rows: the
architecture requires an output matrix, which is never computed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.tools.prepare.gguf_writing import PlannedTensor, layered_tensor_name, write_planned_gguf

_DTYPES = {"f32": np.float32, "f16": np.float16}

# Rows of the placeholder token embedding and output matrices (never read: see the module's docstring).
PLACEHOLDER_VOCAB = 16

# Per-layer upstream suffix -> GGUF suffix.
_LAYER_NAMES = {
    "ln_1.weight": "attn_norm.weight",
    "ln_1.bias": "attn_norm.bias",
    "attn.c_attn.weight": "attn_qkv.weight",
    "attn.c_attn.bias": "attn_qkv.bias",
    "attn.c_proj.weight": "attn_output.weight",
    "attn.c_proj.bias": "attn_output.bias",
    "ln_2.weight": "ffn_norm.weight",
    "ln_2.bias": "ffn_norm.bias",
    "mlp.fc_in.weight": "ffn_up.weight",
    "mlp.fc_in.bias": "ffn_up.bias",
    "mlp.fc_out.weight": "ffn_down.weight",
    "mlp.fc_out.bias": "ffn_down.bias",
}
_FINAL_NAMES = {"ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"}


@dataclass(frozen=True)
class NanoTransformerShape:
    """Hyper-parameters of one of Nano's transformers (upstream's GPT-2 config names in comments)."""

    hidden: int  # n_embd
    layers: int  # n_layer
    heads: int  # n_head
    ffn: int  # n_inner
    layer_norm_eps: float = 1e-5  # layer_norm_epsilon
    rope_base: float = 10000.0  # rope_base
    context_length: int = 4096

    def __post_init__(self) -> None:
        for field in ("hidden", "layers", "heads", "ffn", "context_length"):
            if getattr(self, field) <= 0:
                raise ValueError(f"NanoTransformerShape.{field} must be positive, got {getattr(self, field)}")
        if self.hidden % self.heads or (self.hidden // self.heads) % 2:
            raise ValueError(
                f"NanoTransformerShape: hidden {self.hidden} must split into {self.heads} heads of an even size"
            )
        if self.layer_norm_eps <= 0 or self.rope_base <= 0:
            raise ValueError("NanoTransformerShape.layer_norm_eps and rope_base must be positive")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def nano_tensor_shapes(shape: NanoTransformerShape) -> dict[str, tuple[int, ...]]:
    """Every upstream tensor name of the transformer (relative to its module: ``h.0.ln_1.weight``...) with its
    shape ([out, in] for matrices), in the order the GGUF stores them."""
    h, f = shape.hidden, shape.ffn
    per_layer = {
        "ln_1.weight": (h,),
        "ln_1.bias": (h,),
        "attn.c_attn.weight": (3 * h, h),
        "attn.c_attn.bias": (3 * h,),
        "attn.c_proj.weight": (h, h),
        "attn.c_proj.bias": (h,),
        "ln_2.weight": (h,),
        "ln_2.bias": (h,),
        "mlp.fc_in.weight": (f, h),
        "mlp.fc_in.bias": (f,),
        "mlp.fc_out.weight": (h, f),
        "mlp.fc_out.bias": (h,),
    }
    shapes = {f"h.{i}.{suffix}": dims for i in range(shape.layers) for suffix, dims in per_layer.items()}
    shapes.update({"ln_f.weight": (h,), "ln_f.bias": (h,)})
    return shapes


def gguf_tensor_name(name: str) -> str:
    """Map an upstream tensor name (``h.3.attn.c_attn.weight``, ``ln_f.bias``) to GGUF's."""
    return layered_tensor_name(name, "h", _LAYER_NAMES, _FINAL_NAMES, "Nano transformer")


def rope_halves_order(heads: int, head_dim: int) -> np.ndarray:
    """Row order that turns interleaved rotary pairs into halves, head by head: within each head the even
    dimensions, then the odd ones."""
    within = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    return (np.arange(heads)[:, None] * head_dim + within[None, :]).reshape(-1)


def codeshell_layout(name: str, array: np.ndarray, shape: NanoTransformerShape) -> np.ndarray:
    """``array`` as CodeShell holds it: c_attn's query and key rows (weight and bias) permuted to rope halves."""
    if not name.endswith(("attn.c_attn.weight", "attn.c_attn.bias")):
        return array
    order = rope_halves_order(shape.heads, shape.head_dim)
    h = shape.hidden
    query, key, value = array[:h], array[h : 2 * h], array[2 * h :]
    return np.concatenate([query[order], key[order], value])


def write_nano_transformer_gguf(
    path: Path | str,
    shape: NanoTransformerShape,
    tensors: Iterable[tuple[str, np.ndarray]],
    dtype: str = "f32",
    name: str = "moss-tts-nano",
) -> None:
    """Write the transformer to ``path`` (atomically) from upstream-named, upstream-laid-out ``tensors``.

    ``tensors`` must yield every name of ``nano_tensor_shapes(shape)`` exactly once. ``dtype`` (``f32`` or
    ``f16``) applies to the matrices; norms and biases stay f32, as llama.cpp expects.
    """
    import gguf  # deferred: only converters and generators need the gguf package

    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    placeholder = (PLACEHOLDER_VOCAB, shape.hidden)
    layers = {
        source: PlannedTensor(
            gguf_tensor_name(source), dims, np.dtype(_DTYPES[dtype] if len(dims) == 2 else np.float32)
        )
        for source, dims in nano_tensor_shapes(shape).items()
    }
    # The placeholders go first and last, under their GGUF names (no upstream tensor has those).
    plan = {
        "token_embd.weight": PlannedTensor("token_embd.weight", placeholder, np.dtype(np.float32)),
        **layers,
        "output.weight": PlannedTensor("output.weight", placeholder, np.dtype(np.float32)),
    }

    def add_header(writer: Any) -> None:
        writer.add_name(name)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
        writer.add_block_count(shape.layers)
        writer.add_context_length(shape.context_length)
        writer.add_embedding_length(shape.hidden)
        writer.add_feed_forward_length(shape.ffn)
        writer.add_head_count(shape.heads)
        writer.add_head_count_kv(shape.heads)
        writer.add_layer_norm_eps(shape.layer_norm_eps)
        writer.add_rope_freq_base(shape.rope_base)
        writer.add_vocab_size(PLACEHOLDER_VOCAB)
        writer.add_tokenizer_model("none")

    def laid_out() -> Iterator[tuple[str, np.ndarray]]:
        zeros = np.zeros(placeholder, dtype=np.float32)
        yield "token_embd.weight", zeros
        for source, array in tensors:
            gguf_tensor_name(source)  # a name that is not Nano's at all gets its own error
            yield source, codeshell_layout(source, np.asarray(array), shape)
        yield "output.weight", zeros

    write_planned_gguf(path, "codeshell", add_header, plan, laid_out(), f"a {shape.layers}-layer Nano transformer")
