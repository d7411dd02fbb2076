"""Nano's transformers as CodeShell GGUFs in llama.cpp, held to a float64 NumPy reference of upstream's block
(``nano_reference.py``): the rope pairs rearranged by the writer must give upstream's function exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from nano_reference import nano_forward, random_nano_tensors
from qwen3_reference import exact_backbone

from moss_tts_node.tools.prepare.codeshell_gguf import (
    NanoTransformerShape,
    nano_tensor_shapes,
    rope_halves_order,
    write_nano_transformer_gguf,
)

SHAPE = NanoTransformerShape(hidden=64, layers=2, heads=4, ffn=256, context_length=64)


@pytest.fixture(scope="module")
def tensors() -> dict[str, np.ndarray]:
    return random_nano_tensors(SHAPE, seed=3)


def _written(path: Path, tensors: dict[str, np.ndarray], shape: NanoTransformerShape = SHAPE) -> Path:
    write_nano_transformer_gguf(path, shape, tensors.items())
    return path


def test_llama_cpp_computes_upstreams_block(tmp_path: Path, tensors: dict[str, np.ndarray]) -> None:
    rows = np.random.default_rng(4).standard_normal((12, SHAPE.hidden)).astype(np.float32)
    expected = nano_forward(tensors, SHAPE, rows)
    with exact_backbone(_written(tmp_path / "nano.gguf", tensors)) as backbone:
        backbone.prefill(rows[:9], text_logits=False)
        hidden = [backbone.hidden().copy()]
        for row in rows[9:]:  # positions carry on from the prefill, one decode each
            backbone.decode(row, text_logits=False)
            hidden.append(backbone.hidden().copy())
    # llama.cpp's GELU reads an fp16 table (GGML_GELU_FP16): measured 2e-5 here (2026-12-06), 1e-3 allowed.
    np.testing.assert_allclose(np.stack(hidden), expected[8:], atol=1e-3, rtol=0)


def test_the_rope_pairs_matter(tmp_path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The same weights without the writer's rearrangement are a different function: the reference would catch a
    writer that forgot it (the first position has no rotation, so the check looks past it)."""
    rows = np.random.default_rng(5).standard_normal((6, SHAPE.hidden)).astype(np.float32)
    undo = np.argsort(rope_halves_order(SHAPE.heads, SHAPE.head_dim))
    scrambled = dict(tensors)
    for i in range(SHAPE.layers):
        for suffix in ("weight", "bias"):
            name = f"h.{i}.attn.c_attn.{suffix}"
            q, k, v = np.split(tensors[name], 3)
            scrambled[name] = np.concatenate([q[undo], k[undo], v])
    with exact_backbone(_written(tmp_path / "scrambled.gguf", scrambled)) as backbone:
        backbone.prefill(rows, text_logits=False)
        last = backbone.hidden().copy()
    assert np.abs(last - nano_forward(tensors, SHAPE, rows)[-1]).max() > 1e-2


def test_the_writer_refuses_a_wrong_tensor_set(tmp_path: Path, tensors: dict[str, np.ndarray]) -> None:
    missing = {name: value for name, value in tensors.items() if name != "h.1.mlp.fc_out.bias"}
    with pytest.raises(ValueError, match=r"missing tensors: h\.1\.mlp\.fc_out\.bias"):
        _written(tmp_path / "a.gguf", missing)
    with pytest.raises(ValueError, match=r"unknown Nano transformer tensor name 'h\.0\.attn\.q_proj\.weight'"):
        _written(tmp_path / "b.gguf", {"h.0.attn.q_proj.weight": np.zeros(1), **tensors})
    wrong = dict(tensors, **{"h.0.ln_1.bias": np.zeros(SHAPE.hidden + 1, np.float32)})
    with pytest.raises(ValueError, match=r"'h\.0\.ln_1\.bias' has shape \(65,\), expected \(64,\)"):
        _written(tmp_path / "c.gguf", wrong)
    with pytest.raises(ValueError, match="does not belong to a 1-layer Nano transformer"):
        one = NanoTransformerShape(hidden=64, layers=1, heads=4, ffn=256)
        _written(tmp_path / "d.gguf", tensors, one)
    assert not list(tmp_path.glob(".*.partial")), "a failed write leaves no partial file"
    assert set(nano_tensor_shapes(SHAPE)) == set(tensors)
