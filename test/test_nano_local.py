"""Nano's local transformer in ONNX Runtime (``model/nano_local.py``), held to the float64 NumPy reference of
upstream's block (``nano_reference.py``): from a float GGUF within float32 rounding, from a Q8_0 one (the same 8-bit
weights llama.cpp would read) within 8-bit rounding, and position by position as a frame's local pass runs it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from nano_reference import nano_forward, random_nano_tensors
from qwen3_reference import exact_backbone

from moss_tts_node.errors import WeightsError
from moss_tts_node.llama.bindings import load_bridge_library
from moss_tts_node.model.nano_local import OnnxLocalTransformer
from moss_tts_node.tools.prepare.codeshell_gguf import NanoTransformerShape, write_nano_transformer_gguf

POSITIONS = 17  # a frame's: the continue-or-stop position and one a codebook
LLAMA_FTYPE_MOSTLY_Q8_0 = 7


def _written(path: Path, shape: NanoTransformerShape, seed: int) -> tuple[Path, dict[str, np.ndarray]]:
    tensors = random_nano_tensors(shape, seed)
    write_nano_transformer_gguf(path, shape, tensors.items())
    return path, tensors


def _local_pass(local: OnnxLocalTransformer, rows: np.ndarray) -> np.ndarray:
    local.clear()
    hidden = []
    for row in rows:
        local.decode(row)
        hidden.append(local.hidden().copy())
    return np.stack(hidden)


@pytest.mark.parametrize("layers", [1, 2])
def test_a_float_gguf_computes_upstreams_block(tmp_path: Path, layers: int) -> None:
    shape = NanoTransformerShape(hidden=64, layers=layers, heads=4, ffn=256, context_length=64)
    gguf, tensors = _written(tmp_path / "local.gguf", shape, seed=3)
    rows = np.random.default_rng(4).standard_normal((POSITIONS, shape.hidden)).astype(np.float32)
    expected = nano_forward(tensors, shape, rows)
    local = OnnxLocalTransformer(gguf, POSITIONS)
    assert local.n_embd == shape.hidden
    first = _local_pass(local, rows)
    np.testing.assert_allclose(first, expected, atol=1e-5, rtol=0)  # measured 6e-7 (2026-12-07)
    # A clear starts the next frame afresh: the slots the last frame filled are masked, whatever they hold.
    np.testing.assert_array_equal(_local_pass(local, rows), first)
    shorter = _local_pass(local, rows[:5])
    np.testing.assert_array_equal(shorter, first[:5])
    with pytest.raises(ValueError, match="holds 17 positions; clear it first"):
        for row in rows:
            local.decode(row)
    local.close()


def test_a_q8_0_gguf_runs_the_same_8_bit_weights_as_llama_cpp(tmp_path: Path) -> None:
    """The Q8_0 blocks go to MatMulNBits as they are: against the float64 reference both ONNX Runtime and llama.cpp
    (reading the same file) are off by the 8-bit rounding only, and by about as much."""
    shape = NanoTransformerShape(hidden=128, layers=1, heads=4, ffn=512, context_length=64)
    float_gguf, tensors = _written(tmp_path / "local-f32.gguf", shape, seed=5)
    q8 = tmp_path / "local-q8_0.gguf"
    status = load_bridge_library().moss_bridge_quantize(
        str(float_gguf).encode(), str(q8).encode(), LLAMA_FTYPE_MOSTLY_Q8_0, 1
    )
    assert status == 0
    rows = np.random.default_rng(6).standard_normal((POSITIONS, shape.hidden)).astype(np.float32)
    expected = nano_forward(tensors, shape, rows)
    ours = _local_pass(OnnxLocalTransformer(q8, POSITIONS), rows)
    with exact_backbone(q8) as backbone:
        backbone.prefill(rows[:1], text_logits=False)
        theirs = [backbone.hidden().copy()]
        for row in rows[1:]:
            backbone.decode(row, text_logits=False)
            theirs.append(backbone.hidden().copy())
    spread = np.abs(expected).max()
    ours_off, theirs_off = np.abs(ours - expected).max() / spread, np.abs(np.stack(theirs) - expected).max() / spread
    assert 0 < ours_off < 2e-2 and ours_off < 3 * theirs_off, (ours_off, theirs_off)


def test_what_is_not_a_local_transformer_is_refused(tmp_path: Path, demo_config: Path) -> None:
    from moss_tts_node.config import backbone_path, load_config

    qwen3 = backbone_path(load_config(demo_config))  # the Delay demo's backbone: a qwen3 GGUF
    with pytest.raises(WeightsError, match="architecture 'qwen3', not MOSS-TTS-Nano's local transformer"):
        OnnxLocalTransformer(qwen3, POSITIONS)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 12)
    with pytest.raises(WeightsError, match="not a readable GGUF"):
        OnnxLocalTransformer(broken, POSITIONS)
