"""An independent float64 NumPy Qwen3 forward, the yardstick for llama.cpp's numbers in the tests.

Written from the Qwen3 definition (HF ``modeling_qwen3``), not from llama.cpp: RMSNorm, per-head q/k
RMSNorm, NEOX rope (rotate the two halves of each head), grouped-query causal attention, SwiGLU, final
norm. It takes input *embeddings* as MOSS-TTS does and recomputes the whole sequence on each call, which
is all a reference needs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moss_tts_node.config import LlamaConfig
from moss_tts_node.llama.backbone import Backbone, BackboneParams
from moss_tts_node.model.generation import generate_rows
from moss_tts_node.model.identity import RECORD_KEY
from moss_tts_node.model.layout import CONFIG_FILE
from moss_tts_node.synthesis import pipeline as pipeline_module
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.tools.dev.demo_weights import CHECKPOINT_DIR
from moss_tts_node.tools.prepare.convert import convert_checkpoint
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape


def exact_backbone(gguf_path: Path) -> Backbone:
    """llama.cpp set up to match this reference closely: CPU, F32 KV cache, flash attention off."""
    llama = LlamaConfig(
        n_ctx=64, n_batch=8, n_threads=2, n_gpu_layers=0, kv_cache_type_k="f32", kv_cache_type_v="f32", flash_attn="off"
    )
    return Backbone(BackboneParams(gguf_path=gguf_path, **asdict(llama)))


@contextmanager
def exact_synthesizer(demo_config: Path, workdir: Path, **overrides: Any) -> Iterator[Synthesizer]:
    """The demo model converted (into ``workdir``) from its original checkpoint to F32, with an F32 KV cache and
    greedy sampling: equal inputs give bit-equal rows, and rows this reference can be held to. ``overrides``: more
    config keys. The model is the one the demo's weights record (a 16-codebook checkpoint cannot always tell)."""
    demo = demo_config.parent
    model = json.loads((demo / CONFIG_FILE).read_text())[RECORD_KEY]["model"]
    gguf = convert_checkpoint(demo / CHECKPOINT_DIR, workdir, "F32", model=model)
    settings = {
        "model.weights_dir": str(gguf.parent),
        "model.backbone_gguf": gguf.name,
        "model.codec_dir": str(demo / "codec"),
        "llama.kv_cache_type_k": "f32",
        "llama.kv_cache_type_v": "f32",
        "sampling.text_temperature": 0.0,
        "sampling.audio_temperature": 0.0,
        **overrides,
    }
    with Synthesizer.from_config_file(demo_config, settings) as synth:
        yield synth


def recorded_rows(monkeypatch: pytest.MonkeyPatch) -> list[np.ndarray]:
    """The rows the synthesizer's pipeline generates from now on, as they come (a stream that a wrong rule breaks may
    stop at a decode before it ends; what it generated up to there is in the list anyway)."""
    rows: list[np.ndarray] = []

    def recorded(*args: Any, **kwargs: Any) -> Any:
        generation = generate_rows(*args, **kwargs)
        while True:
            try:
                row = next(generation)
            except StopIteration as end:
                return end.value
            rows.append(row)
            yield row

    monkeypatch.setattr(pipeline_module, "generate_rows", recorded)
    return rows


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _rope_neox(x: np.ndarray, theta: float) -> np.ndarray:
    """Rotate (S, heads, head_dim) by position; pairs are (i, i + head_dim/2), as NEOX/HF do."""
    seq, _, dim = x.shape
    half = dim // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / dim)
    angle = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def qwen3_forward(
    tensors: dict[str, np.ndarray], shape: Qwen3Shape, embeddings: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Run (S, hidden) input embeddings from position 0.

    Returns the hidden states after the final RMSNorm, (S, hidden), and the text logits, (S, vocab),
    both float64.
    """
    w = {name: np.asarray(t, dtype=np.float64) for name, t in tensors.items()}
    eps, hd = shape.rms_eps, shape.head_dim
    seq = embeddings.shape[0]
    group = shape.heads // shape.kv_heads
    causal = np.triu(np.full((seq, seq), -np.inf), k=1)
    x = np.asarray(embeddings, dtype=np.float64)
    for i in range(shape.layers):
        p = f"layers.{i}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(seq, shape.heads, hd)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(seq, shape.kv_heads, hd)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(seq, shape.kv_heads, hd)
        q = _rope_neox(_rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), shape.rope_theta)
        k = _rope_neox(_rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), shape.rope_theta)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head j reads kv head j // group
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + causal
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(seq, shape.heads * hd)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    hidden = _rms_norm(x, w["norm.weight"], eps)
    return hidden, hidden @ w["lm_head.weight"].T
