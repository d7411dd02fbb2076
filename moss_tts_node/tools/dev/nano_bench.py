"""``bench --model nano``: MOSS-TTS-Nano at the real size, streaming with a codec of the real size (docs/nano.md,
"Speed").

Run by hand, not in CI. The model is ``nano_demo``'s release at upstream's size (12 + 1 layers of width 768, the
16384-row text table, 16 audio tables), converted by ``convert`` (Q8_0, its default), with a random
MOSS-Audio-Tokenizer-Nano of the real size in its published ONNX layout (``nano_codec``): upstream's init, so the
costs are the real model's (llama.cpp's and ONNX Runtime's time depends on shapes and types, not on values). Built
once under the bench cache (``bench_models.bench_cache_dir``).

A fresh worker process loads the Synthesizer, warms up, then streams the same text ``--rounds`` times for
``--steps`` frames each (the choice of going on is greedy, so every run speaks its whole budget; the codes are
sampled as upstream samples them), in the voice of ``--voice-seconds`` of random codes if given, each after a
one-frame request of another text in that voice (a robot's usual next request: the voice prefix is in the KV cache,
the text is not), and reports per run:

- frames/s, and ms per frame split into the global transformer, the local pass (local transformer and heads),
  sampling and the codec;
- real-time factor of the whole request (wall time from the call to the last chunk over the audio's length) and of
  the steady state (after the first chunk), time to first audio and the prompt rows prefilled, peak RSS;
- once, time to first audio from an empty KV cache (the first request after start-up, its whole prompt prefilled);
- the roofline: bytes read per frame (the global GGUF once, the local GGUF once per position, the audio heads as
  held, ``audio.heads_backend``, the codec's step weights per call) against the machine's memory bandwidth (a NumPy
  streaming sum over an array far larger than the caches), as the time a frame cannot go below.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from moss_tts_node.config import write_params_file
from moss_tts_node.model.layout import nano_local_gguf_name
from moss_tts_node.tools.dev.bench_models import bench_model_dir
from moss_tts_node.tools.dev.bench_worker import machine_info, random_voice, run_worker, threads_in_use

NANO_BENCH = "nano"
CODEC_DIR = "codec"
CONFIG_NAME = "config.yaml"
STAMP_FILE = "built.json"
STAMP = {"format": 1, "size": "real", "seed": 0}
WORKER_COMMAND = [sys.executable, "-m", "moss_tts_node.tools.dev.nano_bench", "worker"]
BENCH_TEXT = "The robot reads a red book by the river, and the river sings back to it all day long."
OTHER_TEXT = "Good morning."  # the request before each measured one


def ensure_nano_bench_model(log: Any = print) -> Path:
    """The config.yaml of the cached real-size Nano bench model, built if missing or stale."""
    from moss_tts_node.tools.dev.nano_codec import write_random_nano_codec
    from moss_tts_node.tools.dev.nano_demo import write_nano_release
    from moss_tts_node.tools.prepare.convert import convert_checkpoint

    directory = bench_model_dir(NANO_BENCH)
    stamp = directory / STAMP_FILE
    if stamp.is_file() and json.loads(stamp.read_text()) == STAMP:
        return directory / CONFIG_NAME
    log(f"building the real-size Nano bench model in {directory} (a few seconds, about 0.3 GB)")
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="nano-release-") as scratch:
        release = write_nano_release(Path(scratch), "real", STAMP["seed"])
        gguf = convert_checkpoint(release, directory, force=True)
    write_random_nano_codec(directory / CODEC_DIR, "real", STAMP["seed"])
    params = {
        "model.weights_dir": ".",
        "model.backbone_gguf": gguf.name,
        "model.codec_dir": CODEC_DIR,
        "llama.n_gpu_layers": 0,
        "audio.onnx_provider": "cpu",
    }
    write_params_file(directory / CONFIG_NAME, params, "Real-size random MOSS-TTS-Nano for `bench --model nano`.")
    stamp.write_text(json.dumps(STAMP))
    return directory / CONFIG_NAME


def bench_nano(
    config: Path,
    steps: int,
    threads: int,
    rounds: int,
    seed: int,
    text: str,
    overrides: dict[str, Any] | None = None,
    voice_seconds: float = 0.0,
) -> dict[str, Any]:
    """Run the worker (in a fresh process) for ``rounds`` runs, with the config's ``overrides`` (``--set``), and
    return its figures: ``runs``, one each, and ``cold``, the request from an empty cache."""
    job = {"config": str(config), "steps": steps, "threads": threads, "seed": seed, "text": text, "rounds": rounds}
    job |= {"overrides": overrides or {}, "voice_seconds": voice_seconds}
    return run_worker(job, WORKER_COMMAND)


def memory_bandwidth_gbs(megabytes: int = 512) -> float:
    """Best of 5 streaming reads (a float32 sum) over an array far larger than the caches, in GB/s."""
    import numpy as np

    data = np.ones(megabytes * 2**20 // 4, dtype=np.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.nbytes / best / 1e9


def worker(job: dict[str, Any]) -> dict[str, Any]:
    """Measure (in the worker process): load, warm up, stream ``rounds`` times, then the roofline."""

    from moss_tts_node.config import load_config
    from moss_tts_node.synthesis.request import SpeechRequest
    from moss_tts_node.synthesizer import Synthesizer
    from moss_tts_node.tools.dev.resources import peak_rss_mib

    overrides = {"llama.n_threads": job["threads"], "sampling.text_temperature": 0.0, **job["overrides"]}
    config = load_config(Path(job["config"]), overrides)
    synth = Synthesizer(config)
    spec = synth.spec
    codes = random_voice(spec, job["voice_seconds"], job["seed"])
    voice_frames = codes.shape[0]
    voice = codes if voice_frames else None  # Nano takes no voice of zero frames

    def timed(text: str, steps: int) -> tuple[Any, list[tuple[float, int]]]:
        """A request's stream, consumed, and when each chunk came (seconds since the call) with its samples."""
        started = time.perf_counter()
        stream = synth.stream(SpeechRequest(text=text, voice=voice, seed=job["seed"], max_new_tokens=steps))
        stamps = [(time.perf_counter() - started, chunk.samples.shape[0]) for chunk in stream]
        return stream, stamps

    timed(job["text"], 8)  # warm-up: every graph and cache touched
    with synth.stages.generation() as stage:
        stage.backbone.clear()
    stream, stamps = timed(job["text"], 4)
    cold = {"first_audio_ms": 1000 * stamps[0][0], "prefilled_rows": stream.report.prefilled_rows}
    runs = []
    for _ in range(job["rounds"]):
        timed(OTHER_TEXT, 1)
        stream, stamps = timed(job["text"], job["steps"])
        wall = stamps[-1][0]
        samples = sum(n for _, n in stamps)
        frames = len(stream.codes)
        seconds = stream.clock.seconds
        first_s, first_samples = stamps[0]
        runs.append(
            {
                "frames": frames,
                "frames_per_s": frames / wall,
                "ms_per_frame": {stage: 1000 * s / frames for stage, s in seconds.items()},
                "rtf_whole": wall / (samples / spec.sampling_rate),
                "rtf_steady": (wall - first_s) / ((samples - first_samples) / spec.sampling_rate),
                "first_audio_ms": 1000 * first_s,
                "prefilled_rows": stream.report.prefilled_rows,
                "prompt_rows": stream.prompt.shape[0],
                "codec_calls_per_frame": len(stream.clock.calls.get("codec", [])) / frames,
            }
        )
    weights = Path(config.model.weights_dir)
    gguf = weights / config.model.backbone_gguf
    codec = Path(config.model.codec_dir)
    step_bytes = sum(p.stat().st_size for p in codec.glob("*decode_step*")) + sum(
        p.stat().st_size for p in codec.glob("*shared*")
    )
    peak_rss = peak_rss_mib()  # before the bandwidth measurement's own array
    with synth.stages.generation() as stage:
        heads = stage.heads
        heads_bytes, heads_name = heads.weight_bytes, heads.name
    synth.close()
    bandwidth = memory_bandwidth_gbs()
    local = gguf.with_name(nano_local_gguf_name(gguf.name))
    per_frame = {
        "global": gguf.stat().st_size,
        "local": (1 + spec.n_vq) * local.stat().st_size,
        "heads": heads_bytes,
        "codec": step_bytes * min(run["codec_calls_per_frame"] for run in runs),
    }
    for run in runs:
        run["peak_rss_mib"] = peak_rss
        run["bytes_per_frame"] = per_frame
        run["bandwidth_gbs"] = bandwidth
        run["roofline_ms_per_frame"] = 1000 * sum(per_frame.values()) / (bandwidth * 1e9)
        run["threads"] = threads_in_use(config)
        run["heads_backend"] = heads_name
    return {"runs": runs, "cold": {**cold, "voice_frames": voice_frames}}


def format_nano_runs(figures: dict[str, Any]) -> str:
    """The figures as lines a person reads (one run per line), then the empty-cache request, the roofline and the
    machine."""
    runs, cold = figures["runs"], figures["cold"]
    lines = []
    for number, run in enumerate(runs, 1):
        stages = ", ".join(f"{stage} {ms:.1f}" for stage, ms in run["ms_per_frame"].items())
        lines.append(
            f"run {number}: {run['frames']} frames, {run['frames_per_s']:.1f} frames/s; RTF whole "
            f"{run['rtf_whole']:.3f}, steady {run['rtf_steady']:.3f}; first audio {run['first_audio_ms']:.0f} ms "
            f"(prefilled {run['prefilled_rows']} of {run['prompt_rows']} prompt rows); "
            f"peak RSS {run['peak_rss_mib']:.0f} MiB; ms/frame: {stages}"
        )
    voice = f"a voice of {cold['voice_frames']} frames" if cold["voice_frames"] else "no voice"
    lines.append(
        f"empty KV cache ({voice}): first audio {cold['first_audio_ms']:.0f} ms, {cold['prefilled_rows']} rows "
        "prefilled"
    )
    run = runs[0]
    sizes = ", ".join(f"{part} {nbytes / 1e6:.1f} MB" for part, nbytes in run["bytes_per_frame"].items())
    lines.append(
        f"roofline: {sizes} read per frame at {run['bandwidth_gbs']:.1f} GB/s: {run['roofline_ms_per_frame']:.1f} ms "
        f"a frame at least (a frame is 80 ms of audio: RTF {run['roofline_ms_per_frame'] / 80:.3f})"
    )
    info = machine_info()
    lines.append(
        f"{info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB; threads {run['threads']}; "
        f"heads {run['heads_backend']}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))), flush=True)
    else:
        sys.exit("usage: python -m moss_tts_node bench --model nano (the worker entry is internal)")
