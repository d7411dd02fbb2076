"""``bench-http``: time to first audio and real-time factor through the speech server against the CLI's own stream,
on the same model, text and seed (by hand, not in CI; docs/http.md, "Speed").

    unshare -n sh -c 'ip link set lo up && python -m moss_tts_node bench-http --config C'

The CLI's figure is ``Synthesizer.stream`` in this process, as ``synth --play`` streams; the server's is a
``serve`` process on loopback, read as a client reads it: from the request sent to the first byte of audio (TTFB),
and the whole body's time over its audio's. Each side speaks once to warm up, then ``--rounds`` times; one side at
a time, so the two never share the CPU.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_TEXT = "Hello! I am a robot, and this is my voice, streamed to you as it is made."
PORT = 8765
_READ_BYTES = 4096


def register(commands: Any) -> None:
    parser = commands.add_parser("bench-http", help="TTFB and RTF through the speech server vs the CLI (by hand)")
    parser.add_argument("--config", required=True, type=Path, help="params file, for the CLI and the server")
    parser.add_argument("--text", default=DEFAULT_TEXT, help="what every run says")
    parser.add_argument("--seed", type=int, default=1, help="seed of every run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each, after one to warm up")
    parser.set_defaults(run=run_bench_http)


def run_bench_http(args: argparse.Namespace) -> int:
    cli = _local(args.config, args.text, args.seed, args.rounds)
    server = _served(args.config, args.text, args.seed, args.rounds)
    for name, runs in (("cli (Synthesizer.stream)", cli), ("server (POST pcm, streamed)", server)):
        first = statistics.median(run["first_s"] for run in runs)
        rtf = statistics.median(run["wall_s"] / run["audio_s"] for run in runs)
        audio = runs[0]["audio_s"]
        print(
            f"{name:30s} first audio {first * 1000:7.0f} ms   RTF {rtf:5.2f}   ({audio:.2f} s of audio, "
            f"median of {len(runs)})"
        )
    print(json.dumps({"cli": cli, "server": server}))
    return 0


def _local(config: Path, text: str, seed: int, rounds: int) -> list[dict[str, float]]:
    from moss_tts_node.synthesizer import Synthesizer

    runs = []
    with Synthesizer.from_config_file(config) as synth:
        synth.prepare_voice()
        for round_ in range(rounds + 1):
            started = time.perf_counter()
            first, samples = None, 0
            for chunk in synth.stream(text, seed=seed):
                first = first if first is not None else time.perf_counter() - started
                samples += chunk.samples.shape[0]
            wall = time.perf_counter() - started
            if round_:  # the first warms up
                runs.append({"first_s": first or wall, "wall_s": wall, "audio_s": samples / synth.sampling_rate})
    return runs


def _served(config: Path, text: str, seed: int, rounds: int) -> list[dict[str, float]]:
    from moss_tts_node.http.server import LISTENING_LINE

    # The log is read as it grows: a pipe left unread would stop the server.
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "moss_tts_node", "serve", "--config", str(config), "--port", str(PORT)],
            stdout=subprocess.DEVNULL,  # uvicorn's access log
            stderr=log,
            text=True,
        )
        try:
            while True:
                log.seek(0)
                if LISTENING_LINE in log.read():
                    break
                if server.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"the server ended before it listened:\n{log.read()[-2000:]}")
                time.sleep(0.2)
            models = _get("/v1/models")
            body = {"model": models["data"][0]["id"], "input": text, "response_format": "pcm", "seed": seed}
            return [run for round_ in range(rounds + 1) if (run := _post(body)) and round_]
        finally:
            server.terminate()
            server.wait(60)


def _get(path: str) -> Any:
    connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    connection.request("GET", path)
    return json.loads(connection.getresponse().read())


def _post(body: dict[str, Any]) -> dict[str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=600)
    started = time.perf_counter()
    connection.request("POST", "/v1/audio/speech", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    first, size = None, 0
    while data := response.read1(_READ_BYTES):
        first = first if first is not None else time.perf_counter() - started
        size += len(data)
    wall = time.perf_counter() - started
    connection.close()
    return {"first_s": first or wall, "wall_s": wall, "audio_s": size / 2 / int(response.headers["X-Sample-Rate"])}
