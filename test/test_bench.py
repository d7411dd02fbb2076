"""The bench command's cheap parts (the measurements themselves are run by hand, not in CI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.text.prompt import PromptBuilder, PromptFields
from moss_tts_node.tools.cli.main import build_parser
from moss_tts_node.tools.dev.bench import format_table, kv_cache_bytes, run_bench
from moss_tts_node.tools.dev.bench_models import BENCH_MODELS, TEXT_VOCAB, write_padded_tokenizer
from moss_tts_node.tools.prepare.qwen3_gguf import Qwen3Shape, random_qwen3_tensors, write_qwen3_gguf


def test_bench_is_a_command() -> None:
    args = build_parser().parse_args(["bench", "--model", "1.7b", "--heads", "auto,onnx", "--steps", "20"])
    assert args.run is run_bench and args.model == ["1.7b"] and args.steps == 20


def test_bench_shapes_are_the_real_ones() -> None:
    big, small = BENCH_MODELS["8b"].shape, BENCH_MODELS["1.7b"].shape
    assert (big.hidden, big.layers, big.ffn, big.vocab) == (4096, 36, 12288, TEXT_VOCAB)
    assert (small.hidden, small.layers, small.ffn, small.vocab) == (2048, 28, 6144, TEXT_VOCAB)
    assert [model.n_vq for model in BENCH_MODELS.values()] == [32, 32, 16]
    assert BENCH_MODELS["voice-generator-1.7b"].shape == small  # MOSS-VoiceGenerator: Qwen3-1.7B, 16 codebooks
    # the stamp of MOSS-TTS's bench models is the one they were cached under before the family
    assert BENCH_MODELS["8b"].stamp() == {"format": 1, "shape": big.__dict__}


def test_padded_tokenizer_has_the_real_special_ids(tmp_path: Path) -> None:
    spec = ModelSpec()  # the published ids, 151643..151662
    write_padded_tokenizer(tmp_path, spec)
    prompt = PromptBuilder(tmp_path, spec).build(PromptFields(text="Hello, robot.", language="en"))
    assert prompt[0, 0] == spec.im_start_token_id and prompt[-1, 0] == spec.audio_start_token_id
    assert spec.im_end_token_id in prompt[:, 0]
    assert prompt[:, 0].max() < TEXT_VOCAB


def test_kv_cache_bytes_follow_the_gguf(tmp_path: Path) -> None:
    shape = Qwen3Shape(hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, ffn=64, vocab=50)
    path = tmp_path / "m.gguf"
    write_qwen3_gguf(path, shape, random_qwen3_tensors(shape, seed=0).items())
    assert kv_cache_bytes(path, 256, "f16", "f16") == 256 * 3 * (2 * 16) * 2 * 2
    # q8_0 packs 32 values into 34 bytes
    assert kv_cache_bytes(path, 256, "q8_0", "bf16") == 256 * 3 * (2 * 16) * (34 / 32 + 2)


def test_table_has_a_column_per_run() -> None:
    run = {
        "label": "8b / onnx",
        "gguf": "x.gguf",
        "gguf_bytes": 5e9,
        "prompt_rows": 141,
        "steps": 100,
        "frames": 69,
        "prefill_ms": 9000.0,
        "prefill_last_row_ms": 9000.0,
        "prefill_every_row_ms": 12000.0,
        "steps_per_s": 6.0,
        "step_ms": 166.0,
        "decode_ms": 158.0,
        "heads_ms": 6.0,
        "sampling_ms": 1.0,
        "codec_ms": 0.1,
        "other_ms": 0.9,
        "limit_ms": 220.0,
        "limit_no_text_head_ms": 157.0,
        "limit_median_ms": 219.0,
        "limit_no_text_head_median_ms": 156.0,
        "overhead": 0.05,
        "vs_limit": -0.25,
        "step_median_ms": 165.0,
        "decode_median_ms": 157.0,
        "overhead_median": 0.05,
        "decode_max_ms": 200.0,
        "ttfa_ms": 14000.0,
        "ttfa_bound_ms": 14500.0,
        "rtf": 3.0,
        "rtf_steady": 2.1,
        "peak_rss_mib": 5722.0,
        "rss_budget_bytes": 7e9,
        "load_before": [0.1, 0.2, 0.3],
        "load_after": [2.0, 1.0, 0.5],
        "foreign_cpu": 0.01,
        "threads": "llama.cpp 2 + codec 2 (inline)",
        "codec": "demo codec",
    }
    table = format_table([run, {**run, "label": "8b / gguf"}]).splitlines()
    assert table[0].count("|") == 4 and "8b / gguf" in table[0]
    assert any(line.startswith("| overhead (step - decode) / decode | 5.0% | 5.0% |") for line in table)


def test_clone_puts_the_voice_as_the_reference_the_prefix_or_both() -> None:
    import numpy as np

    from moss_tts_node.tools.dev.bench import PREFIX_TEXT, clone_fields

    voice = np.zeros((125, 32), dtype=np.int64)
    assert clone_fields("reference", voice)["voice"] is voice and "prefix" not in clone_fields("reference", voice)
    assert clone_fields("continuation", voice) == {"voice": "", "prefix": voice, "prefix_text": PREFIX_TEXT}
    assert clone_fields("both", voice)["voice"] is voice and clone_fields("both", voice)["prefix"] is voice
    assert clone_fields("both", voice[:0]) == {"voice": ""}


def test_clone_runs_alternate_and_the_summary_compares_them(
    demo_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from moss_tts_node.tools.dev import bench

    jobs: list[dict[str, Any]] = []
    figures = {"reference": (1000.0, 10.0, 300), "continuation": (1500.0, 9.0, 250)}

    def worker(job: dict[str, Any], *_: object) -> dict[str, Any]:  # a worker's figures, not the job's keys
        jobs.append(job)
        ttfa, steps, rows = figures[job["clone"]]
        figures[job["clone"]] = ttfa + 200, steps + 2, rows
        return {"label": job["label"], "ttfa_ms": ttfa, "steps_per_s": steps, "prompt_rows": rows}

    monkeypatch.setattr(bench, "run_worker", worker)
    monkeypatch.setattr(bench, "format_result_line", lambda result: result["label"])
    monkeypatch.setattr(bench, "format_table", lambda results: "")
    flags = ["--clone", "reference", "--clone", "continuation", "--rounds", "2", "--voice-seconds", "10"]
    args = build_parser().parse_args(["bench", "--config", str(demo_config), *flags])
    assert run_bench(args) == 0
    assert [job["clone"] for job in jobs] == ["reference", "continuation", "reference", "continuation"]
    summary = capsys.readouterr().out.splitlines()
    assert "| reference | 2 | 300 | 1100 (1.00) | 11.00 (1.00) |" in summary
    assert "| continuation | 2 | 250 | 1600 (1.45) | 10.00 (0.91) |" in summary


def test_the_dialogue_piece_prefills_what_it_carries_after_what_it_shares(
    synth: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    import numpy as np

    from moss_tts_node.tools.dev import bench

    # bench's clock, read at the start and the end of each timed prefill: three carried runs, then three alone, of
    # the seconds below. A figure is the best of its three, and only the piece's own prefill is timed.
    runs_s = (0.003, 0.001, 0.002, 0.005, 0.004, 0.006)
    ticks = iter([tick for start, run_s in enumerate(runs_s) for tick in (float(start), start + run_s)])
    monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))
    figures = bench.dialogue_piece_figures(synth, np.zeros((10, 32), dtype=np.int64), seed=1)
    carried, alone = figures["dialogue_carried_rows"], figures["dialogue_alone_rows"]
    # The rows before the text are kept in the KV cache either way; the carried piece prefills its transcript (the
    # piece before's text) and its frames more.
    shared = figures["dialogue_alone_prompt_rows"] - alone
    assert shared > 2 * (10 + 31) and figures["dialogue_carried_prompt_rows"] - carried == shared
    assert carried > figures["dialogue_carried_frames"] > 0
    assert figures["dialogue_carried_ms"] == pytest.approx(1.0) and figures["dialogue_alone_ms"] == pytest.approx(4.0)
    assert next(ticks, None) is None  # every run was timed, and nothing else


def test_the_nano_bench_runs_a_nano_model_to_its_budget(tmp_path: Path) -> None:
    """``bench --model nano`` on the tiny Nano demo: every run speaks its whole budget (the choice to go on is
    greedy), and the figures it reports are there (their values are the machine's: run by hand)."""
    from moss_tts_node.tools.dev.demo_weights import write_demo_weights
    from moss_tts_node.tools.dev.nano_bench import bench_nano, format_nano_runs

    config = write_demo_weights(tmp_path / "nano", model="nano")
    figures = bench_nano(config, steps=6, threads=2, rounds=2, seed=1, text="Hello, robot.", voice_seconds=2.0)
    runs, cold = figures["runs"], figures["cold"]
    assert [run["frames"] for run in runs] == [6, 6]
    for run in runs:
        assert run["rtf_whole"] > 0 and run["first_audio_ms"] > 0 and run["roofline_ms_per_frame"] > 0
        assert set(run["ms_per_frame"]) >= {"backbone", "heads", "sampling", "codec"}
        # after another text in the voice: the voice prefix (its 25 frames among it) is reused, the text is not
        assert 0 < run["prefilled_rows"] < run["prompt_rows"] - 25
    assert cold["voice_frames"] == 25 and cold["prefilled_rows"] == runs[0]["prompt_rows"]  # from empty: all of it
    printed = format_nano_runs(figures)
    assert "roofline:" in printed and "empty KV cache (a voice of 25 frames)" in printed
