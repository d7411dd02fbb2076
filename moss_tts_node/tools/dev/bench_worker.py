"""What every bench shares: a measurement in a fresh worker process (clean peak RSS, nothing left from the last
model), the load around it, and the machine it ran on."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.config import Config
from moss_tts_node.errors import MossTTSError
from moss_tts_node.model.rates import frames_for_seconds
from moss_tts_node.model.spec import ModelSpec


def random_voice(spec: ModelSpec, seconds: float, seed: int) -> np.ndarray:
    """A bench's reference voice: ``seconds`` of random codes in the model's codebooks (none for 0)."""
    return np.random.default_rng(seed).integers(0, spec.audio_vocab_size, (frames_for_seconds(seconds), spec.n_vq))


def threads_in_use(config: Config) -> str:
    """The threads a Synthesizer loaded from ``config`` runs on, as the stages share the cores out, in words."""
    from moss_tts_node.synthesis.stages import decodes_ahead, with_allotted_threads

    allotted = with_allotted_threads(config, len(os.sched_getaffinity(0)))
    llama, codec = allotted.llama.n_threads or "all", allotted.audio.codec_threads or "auto"
    how = "decoding ahead" if decodes_ahead(allotted) else "inline"
    return f"llama.cpp {llama} (prefill {allotted.llama.n_threads_batch or llama}) + codec {codec} ({how})"


def run_worker(
    job: dict[str, Any],
    command: list[str],
    finish: Callable[[dict[str, Any], dict[str, Any], Path], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run ``command`` (an entry that takes the job as JSON and prints its result as JSON) in a fresh process,
    with the load and the CPU other processes took around it; ``finish(job, result, workdir)`` adds figures made from
    what the worker left in its work directory (``job["workdir"]``) before it is removed."""
    load_before = os.getloadavg()
    busy_before, ours_before, wall_before = _cpu_busy_s(), _own_cpu_s(), time.monotonic()
    with tempfile.TemporaryDirectory(prefix="moss_bench_") as tmp:
        job["workdir"] = tmp
        proc = subprocess.run(
            [*command, json.dumps(job)],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise MossTTSError(f"bench worker failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        if finish is not None:
            result.update(finish(job, result, Path(tmp)))
    result["load_before"] = [round(x, 2) for x in load_before]
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    wall = time.monotonic() - wall_before
    if busy_before is not None:
        busy = (_cpu_busy_s() or 0.0) - busy_before
        result["foreign_cpu"] = max(0.0, busy - (_own_cpu_s() - ours_before)) / (wall * (os.cpu_count() or 1))
    return result


def _cpu_busy_s() -> float | None:
    """CPU seconds the whole machine has been busy (all processes, /proc/stat), or None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process and its finished children (the workers)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def machine_info() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            mem = int(next(line.split()[1] for line in info if line.startswith("MemTotal"))) * 1024
    except (OSError, StopIteration):
        mem = 0
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(mem / 2**30, 1),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
