"""Where llama.cpp keeps the weights on the CPU (llama/placement.py): the choice for CPUs with and without AMX, the
bridge's skip of a buffer type, and quantized models of a real layer width decoding in processes of their own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from qwen3_reference import qwen3_forward

from moss_tts_node.errors import BridgeError
from moss_tts_node.llama.bindings import cpu_extra_buffer_types, llama_system_info, skip_cpu_extra_buffer_type
from moss_tts_node.llama.placement import UNSAFE_BUFFER_TYPES, WeightPlacement, cpu_weight_placement
from moss_tts_node.tools.prepare.conversion import quantize_gguf
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape, random_qwen3_tensors, write_qwen3_gguf

# What llama.cpp's CPU backend offers on an Intel Xeon with AMX (a library built with GGML_NATIVE there) and on
# the other x86-64 and Arm CPUs (llama_system_info: "AMX_INT8 = 1" and "REPACK = 1" where each is built in).
ON_AMX_XEON = ("AMX", "CPU_REPACK")
ELSEWHERE = ("CPU_REPACK",)

# Qwen3-1.7B's layer (MOSS-VoiceGenerator's backbone) with one layer and a small vocabulary: the matrices are
# as wide as the real ones, so llama.cpp picks the kernels and repacked layouts it picks for the real model.
REAL_WIDTH = Qwen3Shape(hidden=2048, layers=1, heads=16, kv_heads=8, head_dim=128, ffn=6144, vocab=512)
WORKER = Path(__file__).with_name("backbone_worker.py")


def test_on_a_cpu_with_amx_the_amx_layout_is_skipped_and_repacking_kept() -> None:
    placement = WeightPlacement(ON_AMX_XEON, repack=True)
    assert placement.skipped == ("AMX",)
    assert placement.used == ("CPU_REPACK",)
    assert "AMX skipped" in placement.reason() and "llama.cpp issue 20824" in placement.reason()


def test_without_amx_llama_cpp_keeps_its_own_choice() -> None:
    placement = WeightPlacement(ELSEWHERE, repack=True)
    assert placement.skipped == ()
    assert placement.used == ("CPU_REPACK",)
    assert "skipped" not in placement.reason()


@pytest.mark.parametrize("offered", [ON_AMX_XEON, ELSEWHERE])
def test_repack_off_keeps_the_gguf_layout_and_still_skips_amx(offered: tuple[str, ...]) -> None:
    placement = WeightPlacement(offered, repack=False)
    assert placement.used == ()
    assert placement.skipped == tuple(name for name in offered if name in UNSAFE_BUFFER_TYPES)
    assert "llama.repack is false" in placement.reason()


def test_a_llama_cpp_without_extra_buffer_types_says_so() -> None:
    assert "offers no other" in WeightPlacement((), repack=True).reason()


def test_this_machine_is_offered_no_unsafe_buffer_type_once_the_choice_is_made() -> None:
    placement = cpu_weight_placement(repack=True)
    assert set(cpu_extra_buffer_types()) == set(placement.used)  # what the loader reads now
    assert not set(placement.skipped) & set(cpu_extra_buffer_types())


def test_skipping_a_buffer_type_that_is_not_offered_is_refused() -> None:
    with pytest.raises(BridgeError, match="no CPU buffer type 'TILES'"):
        skip_cpu_extra_buffer_type("TILES")


@pytest.fixture(scope="module")
def real_width(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray], np.ndarray]:
    """An F16 GGUF of ``REAL_WIDTH``, its float32 tensors, and 12 input rows."""
    tensors = random_qwen3_tensors(REAL_WIDTH, seed=3)
    path = tmp_path_factory.mktemp("real_width") / "F16.gguf"
    write_qwen3_gguf(path, REAL_WIDTH, tensors.items(), dtype="f16")
    rows = np.random.default_rng(4).standard_normal((12, REAL_WIDTH.hidden)).astype(np.float32)
    return path, tensors, rows


def run_worker(model: Path, rows: np.ndarray, workdir: Path, *skip: str) -> tuple[dict[str, object], np.ndarray]:
    """The worker's report and the last row's hidden state; a worker killed by a signal fails the test."""
    np.save(workdir / "rows.npy", rows)
    out = workdir / "hidden.npy"
    command = [sys.executable, str(WORKER), str(model), str(workdir / "rows.npy"), str(out)]
    for name in skip:
        command += ["--skip", name]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"{model.name}: worker exited {result.returncode}\n{result.stderr[-3000:]}"
    return json.loads(result.stdout.splitlines()[-1]), np.load(out)


# Random weights are quantization's worst case; measured here (2026-12-03, x86-64): Q8_0 0.99997, Q4_K_M 0.9986 against
# the float64 reference. Q4_K is repacked wherever llama.cpp offers CPU_REPACK (x86-64 with AVX2, Arm with dotprod
# or i8mm), Q8_0 only on Arm.
@pytest.mark.parametrize(
    ("gguf_type", "min_correlation", "always_repacked"), [("Q8_0", 0.9995, False), ("Q4_K_M", 0.995, True)]
)
def test_a_quantized_model_of_a_real_layer_width_decodes_and_tracks_the_reference(
    real_width: tuple[Path, dict[str, np.ndarray], np.ndarray],
    tmp_path: Path,
    gguf_type: str,
    min_correlation: float,
    always_repacked: bool,
) -> None:
    f16, tensors, rows = real_width
    model = tmp_path / f"{gguf_type}.gguf"
    quantize_gguf(f16, model, gguf_type, n_threads=2)
    report, hidden = run_worker(model, rows, tmp_path)
    expected, _ = qwen3_forward(tensors, REAL_WIDTH, rows)
    assert np.corrcoef(hidden, expected[-1])[0, 1] > min_correlation
    if always_repacked and "CPU_REPACK" in report["offered"]:  # type: ignore[operator]
        assert "CPU_REPACK" in str(report["weight_layout"]).split(" (")[0], report  # the fast layout is kept


def test_a_skipped_buffer_type_holds_no_weights(
    real_width: tuple[Path, dict[str, np.ndarray], np.ndarray], tmp_path: Path
) -> None:
    if "CPU_REPACK" not in cpu_extra_buffer_types():
        pytest.skip("this llama.cpp offers no CPU_REPACK here (llama_system_info has no REPACK = 1)")
    f16, _, rows = real_width
    model = tmp_path / "Q4_K_M.gguf"
    quantize_gguf(f16, model, "Q4_K_M", n_threads=2)
    repacked, hidden_repacked = run_worker(model, rows, tmp_path)
    plain, hidden_plain = run_worker(model, rows, tmp_path, "CPU_REPACK")
    assert "CPU_REPACK" in str(repacked["weight_layout"])
    buffers = str(plain["weight_layout"]).split(" (")[0]
    assert "CPU_REPACK" not in buffers and buffers.startswith("CPU "), plain
    # The two layouts hold the same weights: only the kernels' rounding differs.
    assert np.corrcoef(hidden_repacked, hidden_plain)[0, 1] > 0.9999


def test_the_llama_cpp_that_make_builds_has_no_amx_kernel() -> None:
    # scripts/install_llama.sh builds with -mno-amx-*; a llama.cpp built elsewhere with AMX is still safe here
    # (the skip above), but then this venv is not what `make` gives a user.
    assert "AMX_INT8 = 1" not in llama_system_info(), (
        "this llama-cpp-python was built with AMX: reinstall it with `make venv` (scripts/install_llama.sh)"
    )
