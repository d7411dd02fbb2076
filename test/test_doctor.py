"""``doctor``: reports what is installed and usable, and fails on what a config needs but lacks."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
from conftest import linked_copy, run_cli

from moss_tts_node.codec.layout import STREAM_DECODER_FILE
from moss_tts_node.config import load_config, read_params_file, write_params_file
from moss_tts_node.model.layout import nano_local_gguf_name
from moss_tts_node.tools.cli.doctor import diagnose


def doctor(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_cli("doctor", *args)


def by_name(config: Path | None = None) -> dict[str, tuple[str, str]]:
    return {check.what: (check.status, check.detail) for check in diagnose(config)}


def test_reports_every_component_without_a_config() -> None:
    checks = by_name()
    for what in ("python", "numpy", "llama.cpp bridge", "llama.cpp GPU offload", "onnxruntime", "tensorrt"):
        assert what in checks, what
    assert checks["llama.cpp bridge"][0] == "ok"
    assert checks["onnxruntime"][0] == "ok" and "CPUExecutionProvider" in checks["onnxruntime"][1]
    assert checks["llama.cpp GPU offload"][1].startswith(("yes", "no"))
    status, layouts = checks["llama.cpp CPU weights"]  # what the CPU offers, and what a model uses of it
    assert status == "ok" and layouts.startswith("offered ") and "layout" in layouts
    assert "cuda device" in checks  # a device, or the reason there is none


def test_a_working_demo_config_passes(demo_config: Path) -> None:
    done = doctor("--config", demo_config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[  ok] config" in done.stdout
    assert "embeddings" in done.stdout and "33/33" in done.stdout
    assert "codec (onnx)" in done.stdout and "encoder.onnx" in done.stdout


def test_missing_weights_and_engines_fail_with_the_fix(demo_config: Path, tmp_path: Path) -> None:
    weights = linked_copy(demo_config.parent, tmp_path / "weights", skip=["embeddings/emb_ext_05.npy"])
    config = tmp_path / "trt.yaml"
    params = {
        "model.weights_dir": str(weights),
        "model.backbone_gguf": load_config(demo_config).model.backbone_gguf,
        "model.engine_dir": str(tmp_path / "engines"),
        "llama.n_gpu_layers": 0,
        "audio.backend": "tensorrt",
    }
    write_params_file(config, params)
    checks = by_name(config)
    assert checks["embeddings"] == ("FAIL", f"32/33 files in {weights}")
    assert checks["codec engines"][0] == "FAIL" and "build-engines" in checks["codec engines"][1]
    done = doctor("--config", config)
    assert done.returncode == 1 and "embeddings" in done.stderr and "codec engines" in done.stderr


def test_a_config_that_turns_repacking_off_says_so(demo_config: Path, tmp_path: Path) -> None:
    config = tmp_path / "plain.yaml"
    model = load_config(demo_config).model
    params = {
        "model.weights_dir": model.weights_dir,
        "model.backbone_gguf": model.backbone_gguf,
        "model.codec_dir": model.codec_dir,
        "llama.repack": False,
    }
    write_params_file(config, params)
    assert "llama.repack" not in by_name(demo_config)
    status, detail = by_name(config)["llama.repack"]
    assert status == "--" and "the GGUF's own layout: llama.repack is false" in detail


def test_a_broken_config_is_reported_not_raised(tmp_path: Path) -> None:
    assert by_name(tmp_path / "absent.yaml")["config"][0] == "FAIL"


def test_the_audio_heads_line_says_where_they_run_and_how_to_put_them_on_the_gpu(
    demo_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moss_tts_node.tools.cli import doctor as doctor_module
    from moss_tts_node.tools.prepare.attach_heads import attach_heads

    weights = linked_copy(demo_config.parent, tmp_path / "weights")
    plain = load_config(demo_config).model.backbone_gguf

    def heads_line(gguf: str, backend: str, gpu_layers: int) -> tuple[str, str]:
        config = tmp_path / "c.yaml"
        params = {
            "model.weights_dir": str(weights),
            "model.backbone_gguf": gguf,
            "model.codec_dir": str(weights / "codec"),
            "llama.n_gpu_layers": gpu_layers,
            "audio.heads_backend": backend,
        }
        write_params_file(config, params)
        return by_name(config)["audio heads"]

    assert heads_line(plain, "auto", 0) == ("ok", f"onnx: 32 files in {weights / 'lm_heads'}")
    status, detail = heads_line(plain, "gguf", 0)
    assert status == "FAIL" and f"attach-heads {weights} --gguf {plain}" in detail
    carrying = attach_heads(weights, plain).name
    assert heads_line(carrying, "gguf", 0) == ("ok", f"gguf: in {carrying}'s output matrix, on the CPU")

    real_environment = doctor_module._check_environment
    monkeypatch.setattr(  # a llama.cpp that can offload, as a CUDA build on a Jetson
        doctor_module,
        "_check_environment",
        lambda checks: dataclasses.replace(real_environment(checks), gpu_offload=True),
    )
    assert heads_line(carrying, "auto", -1) == ("ok", f"gguf: in {carrying}'s output matrix, on the GPU")
    status, detail = heads_line(plain, "auto", -1)
    assert status == "warn" and "on the CPU while the layers run on the GPU" in detail and "attach-heads" in detail
    (weights / "lm_heads" / "lm_head_audio_07.npy").unlink()
    assert heads_line(plain, "numpy", 0)[0] == "FAIL"


def test_the_stream_decoder_line_says_which_decode_streams_use(demo_config: Path, tmp_path: Path) -> None:
    weights = linked_copy(demo_config.parent, tmp_path / "weights")
    params = {
        "model.weights_dir": str(weights),
        "model.backbone_gguf": load_config(demo_config).model.backbone_gguf,
        "model.codec_dir": str(weights / "codec"),
    }

    def stream_line(**overrides: object) -> tuple[str, str]:
        config = tmp_path / "c.yaml"
        write_params_file(config, params | overrides)
        return by_name(config)["stream decoder"]

    status, detail = stream_line()
    assert status == "--" and "re-decode audio.left_context_frames (5)" in detail and "build-stream-decoder" in detail
    assert stream_line(**{"audio.stream_decoder": "off"})[1].startswith("audio.stream_decoder off")
    graph = weights / "codec" / STREAM_DECODER_FILE
    graph.write_bytes(b"")  # the doctor loads no model: presence is what it reports
    status, detail = stream_line()
    assert status == "ok" and detail.startswith(f"{graph}: streams decode only their new frames")
    assert "decoder.onnx is not loaded" in detail
    assert stream_line(**{"model.low_memory": True}) == ("--", "not used: model.low_memory does not stream")


def test_a_working_nano_demo_config_passes_with_nanos_own_lines(nano_demo_config: Path, tmp_path: Path) -> None:
    """Nano's weights have no heads files (its heads are its audio tables), a local transformer beside the global one,
    its own prompt and a codec that streams through its published decode-step graph: each line says so."""
    done = doctor("--config", nano_demo_config)
    assert done.returncode == 0, done.stdout + done.stderr
    checks = by_name(nano_demo_config)
    config = load_config(nano_demo_config)
    weights = Path(config.model.weights_dir)
    assert checks["local gguf"][0] == "ok" and ".local.gguf" in checks["local gguf"][1]
    assert checks["embeddings"] == ("ok", f"17/17 files in {weights}")
    assert checks["audio heads"] == (
        "ok",
        f"onnx (8-bit, ONNX Runtime): the audio tables in {weights / 'embeddings'}, tied",
    )
    assert (
        checks["model"][1].startswith("MOSS-TTS-Nano, 16 codebooks") and 'docs/nano.md, "Prompt"' in checks["model"][1]
    )
    assert checks["stream decoder"][0] == "ok" and "decode-step graph" in checks["stream decoder"][1]
    assert "MOSS-Audio-Tokenizer-Nano" in checks["codec (onnx)"][1] and "decode_step" in checks["codec (onnx)"][1]

    def lines(**overrides: object) -> dict[str, tuple[str, str]]:
        changed = tmp_path / "c.yaml"
        where = {"model.weights_dir": str(weights), "model.codec_dir": config.model.codec_dir}
        write_params_file(changed, {**read_params_file(nano_demo_config), **where, **overrides})
        return by_name(changed)

    status, detail = lines(**{"audio.heads_backend": "gguf"})["audio heads"]
    assert status == "FAIL" and "does not apply to MOSS-TTS-Nano" in detail and "auto, onnx" in detail
    assert lines(**{"audio.heads_backend": "numpy"})["audio heads"][1].startswith("numpy (exact float32")
    status, detail = lines(**{"audio.backend": "tensorrt", "model.engine_dir": str(tmp_path)})["codec (tensorrt)"]
    assert status == "FAIL" and "onnx backend only" in detail
    moved = linked_copy(weights, tmp_path / "weights", skip=[nano_local_gguf_name(config.model.backbone_gguf)])
    status, detail = lines(**{"model.weights_dir": str(moved)})["local gguf"]
    assert status == "FAIL" and detail.endswith("(missing)")
