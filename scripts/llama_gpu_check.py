"""Check the backbone on a GPU build of llama.cpp: hidden states with n_gpu_layers -1 vs 0 vs a float64
NumPy reference, per-step decode timings, and one whole synthesis with every layer offloaded.

Run by scripts/llama_gpu_check.sh on a machine with an NVIDIA GPU, with MOSS_TTS_BRIDGE_LIB pointing at
a bridge linked against a CUDA build of llama.cpp. Prints a report; exits non-zero if the GPU result
disagrees with the reference beyond what the weight type explains.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "test")]

from qwen3_reference import qwen3_forward  # noqa: E402

from moss_tts_node.config import LlamaConfig  # noqa: E402
from moss_tts_node.llama.backbone import Backbone, BackboneParams, set_llama_verbose  # noqa: E402
from moss_tts_node.model.rates import SAMPLES_PER_FRAME  # noqa: E402
from moss_tts_node.synthesizer import Synthesizer  # noqa: E402
from moss_tts_node.tools.dev.demo_weights import write_demo_weights  # noqa: E402
from moss_tts_node.tools.prepare.attach_heads import attach_heads  # noqa: E402
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape, random_qwen3_tensors, write_qwen3_gguf  # noqa: E402


def hidden_states(gguf: Path, n_gpu_layers: int, rows: np.ndarray, kv: str, flash: str) -> np.ndarray:
    """Prefill all rows but the last 8, then decode those one by one; the hidden state after each step."""
    llama = LlamaConfig(
        n_ctx=512, n_batch=64, n_gpu_layers=n_gpu_layers, kv_cache_type_k=kv, kv_cache_type_v=kv, flash_attn=flash
    )
    params = BackboneParams(gguf_path=gguf, **asdict(llama))
    with Backbone(params) as backbone:
        backbone.prefill(rows[:-8])
        out = [backbone.hidden().copy()]
        for row in rows[-8:]:
            backbone.decode(row)
            out.append(backbone.hidden().copy())
    return np.stack(out)


def step_timing(gguf: Path, n_gpu_layers: int, hidden: int, steps: int = 64) -> dict[str, float]:
    params = BackboneParams(gguf_path=gguf, **asdict(LlamaConfig(n_ctx=1024, n_batch=512, n_gpu_layers=n_gpu_layers)))
    rng = np.random.default_rng(0)
    with Backbone(params) as backbone:
        prompt = rng.standard_normal((200, hidden)).astype(np.float32)
        start = time.perf_counter()
        backbone.prefill(prompt)
        prefill = time.perf_counter() - start
        row = rng.standard_normal(hidden).astype(np.float32)
        backbone.decode(row)  # warm-up
        start = time.perf_counter()
        for _ in range(steps):
            backbone.decode(row)
            backbone.hidden()
            backbone.text_logits()
        per_step = (time.perf_counter() - start) / steps
    return {"prefill_200_rows_ms": prefill * 1000, "ms_per_step": per_step * 1000, "steps_per_s": 1 / per_step}


def main() -> int:
    set_llama_verbose(bool(os.environ.get("LLAMA_VERBOSE")))
    work = Path(tempfile.mkdtemp())
    report: dict[str, object] = {}
    ok = True

    # 1. Exactness: a small F32 model, F32 KV cache, flash attention off (as in test/test_backbone.py).
    shape = Qwen3Shape(hidden=256, layers=4, heads=8, kv_heads=4, head_dim=32, ffn=512, vocab=1000)
    tensors = random_qwen3_tensors(shape, seed=1)
    f32 = work / "tiny_f32.gguf"
    write_qwen3_gguf(f32, shape, tensors.items(), dtype="f32")
    rows = np.random.default_rng(2).standard_normal((40, shape.hidden)).astype(np.float32)
    reference, _ = qwen3_forward(tensors, shape, rows.astype(np.float64))
    want = reference[-9:]
    for layers in (-1, 0):
        got = hidden_states(f32, layers, rows, "f32", "off")
        diff = float(np.abs(got - want).max())
        report[f"f32_max_abs_diff_vs_reference_ngl{layers}"] = diff
        ok &= diff <= 1e-3
    gpu = hidden_states(f32, -1, rows, "f16", "on")
    report["f16kv_flash_on_gpu_max_abs_diff_vs_reference"] = float(np.abs(gpu - want).max())

    # 2. Whole syntheses on the demo model with every layer offloaded: the plain GGUF (auto: onnx heads, the
    # text head skipped by the bridge's graph callback under CUDA), then one carrying the heads (auto: gguf).
    demo = write_demo_weights(work / "demo")
    gpu = {"llama.n_gpu_layers": -1, "llama.flash_attn": "auto"}
    carrying = attach_heads(demo.parent).name
    for label, overrides in (("plain_gguf", gpu), ("heads_in_gguf", {**gpu, "model.backbone_gguf": carrying})):
        with Synthesizer.from_config_file(demo, overrides) as synth:
            result = synth.synthesize("Hello from the GPU.", seed=1)
            with synth.stages.generation() as stage:
                heads = stage.heads.name
            report[f"demo_synthesis_ngl-1_{label}"] = {"heads": heads, **result.report.to_dict()}
        ok &= result.codes.shape[0] > 0 and result.audio.shape[0] == SAMPLES_PER_FRAME * result.codes.shape[0]

    if os.environ.get("SKIP_SPEED"):
        print(json.dumps(report, indent=2))
        return 0 if ok else 1

    # 3. Speed: a Qwen3-1.7B-shaped random model in F16 (quantizing needs the converter's bridge call).
    big = Qwen3Shape(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=151_936)
    big_path = work / "qwen3_1p7b_shape_f16.gguf"
    start = time.perf_counter()
    write_qwen3_gguf(big_path, big, random_qwen3_tensors(big, seed=3).items(), dtype="f16")
    report["write_1p7b_f16_gguf_s"] = time.perf_counter() - start
    for layers in (-1, 0):
        report[f"1p7b_f16_ngl{layers}"] = step_timing(big_path, layers, big.hidden)

    print(json.dumps(report, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
