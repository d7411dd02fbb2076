"""An independent float64 NumPy MOSS-TTS-Nano transformer, the yardstick for llama.cpp's CodeShell in the tests.

Written from upstream's block (``gpt2_decoder.py``: docs/nano.md, "The transformers"), not from the GGUF writer:
pre-LayerNorm with bias, the fused ``c_attn`` split into query, key and value, rotary positions on *interleaved*
pairs (cos and sin repeated per pair, ``rotate_half`` taking (-odd, even)), causal attention scaled by
1/sqrt(head_dim), a GELU (tanh, "gelu_new") MLP, a final LayerNorm. It takes input embeddings and recomputes the
whole sequence on each call, which is all a reference needs.
"""

from __future__ import annotations

import numpy as np

from moss_tts_node.tools.prepare.codeshell_gguf import NanoTransformerShape, nano_tensor_shapes


def random_nano_tensors(shape: NanoTransformerShape, seed: int) -> dict[str, np.ndarray]:
    """Random float32 weights, upstream-named, with norms and biases off their init values, so a test notices one
    that is ignored or misplaced, and queries and keys large enough that attention is sharp, as a trained model's
    is (at upstream's init, std 0.02, every score is near 0 and the positions hardly matter)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, dims in nano_tensor_shapes(shape).items():
        if name.endswith("weight") and len(dims) == 1:
            values = 1.0 + 0.1 * rng.standard_normal(dims)
        elif len(dims) == 1:
            values = 0.05 * rng.standard_normal(dims)
        elif name.endswith("c_attn.weight"):
            values = 2.0 / np.sqrt(dims[1]) * rng.standard_normal(dims)
        else:
            values = 0.02 * rng.standard_normal(dims)
        out[name] = values.astype(np.float32)
    return out


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def _rotate_interleaved(x: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """x (S, heads, d) rotated pair by pair: (x[2i], x[2i+1]) by position * base^(-2i/d)."""
    d = x.shape[-1]
    inv_freq = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float64) / d)
    angles = positions[:, None].astype(np.float64) * inv_freq[None, :]  # (S, d/2)
    cos = np.repeat(np.cos(angles), 2, axis=-1)[:, None, :]
    sin = np.repeat(np.sin(angles), 2, axis=-1)[:, None, :]
    rotated = np.stack((-x[..., 1::2], x[..., 0::2]), axis=-1).reshape(x.shape)
    return x * cos + rotated * sin


def nano_forward(tensors: dict[str, np.ndarray], shape: NanoTransformerShape, embeddings: np.ndarray) -> np.ndarray:
    """The final-normed hidden states (S, hidden) of input embeddings (S, hidden) at positions 0..S-1."""
    t = {name: value.astype(np.float64) for name, value in tensors.items()}
    x = embeddings.astype(np.float64)
    s, h, heads, d = x.shape[0], shape.hidden, shape.heads, shape.head_dim
    positions = np.arange(s)
    causal = np.tril(np.ones((s, s), dtype=bool))
    for i in range(shape.layers):
        p = f"h.{i}."
        a = _layer_norm(x, t[p + "ln_1.weight"], t[p + "ln_1.bias"], shape.layer_norm_eps)
        qkv = a @ t[p + "attn.c_attn.weight"].T + t[p + "attn.c_attn.bias"]
        q, k, v = (qkv[:, j * h : (j + 1) * h].reshape(s, heads, d) for j in range(3))
        q = _rotate_interleaved(q, positions, shape.rope_base)
        k = _rotate_interleaved(k, positions, shape.rope_base)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
        scores = np.where(causal[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attended = np.einsum("hqk,khd->qhd", probs, v).reshape(s, h)
        x = x + attended @ t[p + "attn.c_proj.weight"].T + t[p + "attn.c_proj.bias"]
        m = _layer_norm(x, t[p + "ln_2.weight"], t[p + "ln_2.bias"], shape.layer_norm_eps)
        m = _gelu_tanh(m @ t[p + "mlp.fc_in.weight"].T + t[p + "mlp.fc_in.bias"])
        x = x + m @ t[p + "mlp.fc_out.weight"].T + t[p + "mlp.fc_out.bias"]
    return _layer_norm(x, t["ln_f.weight"], t["ln_f.bias"], shape.layer_norm_eps)
