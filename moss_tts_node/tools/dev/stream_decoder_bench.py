"""Time the stream decoder at the codec's full size against an earlier revision's graph, by hand.

Run as ``python -m moss_tts_node.tools.dev.stream_decoder_bench CONFIG WORK_DIR``.

Writes a random checkpoint of CONFIG's shape into WORK_DIR (``random_codec``: initialized as the codec's
library initializes a new model, docs/stream-decoder.md "Test weights"; its audio means nothing, its
activations have a realistic scale), takes the package as it was at ``--baseline`` (by default the last
revision with the unfused graph) out of git beside it, and builds the stream decoder in each precision with
both revisions' builders. Each revision's graphs run in a process of its own, on its own runtime
(``stream_decoder_worker``), and the two are asked in turn, so that the load of a shared machine hits both
alike: for every precision, thread count and chunk size, one measurement of the baseline and one of this
revision, the first of the two alternating from round to round. Prints:

- the memory's speed (the best of NumPy sums over 2 GiB, split over 1 and 2 threads) and the arithmetic's
  (ONNX Runtime's float32 MatMul on a weight that stays in cache), and the operations a frame costs;
- per precision and revision: the graph's nodes and the weight bytes a call reads; the largest difference
  between the two revisions' decodes of the same random frames;
- per precision, thread count and chunk: ms per call and per frame of each revision, per round, and CPU ms
  per call (which another process's load changes less than wall time); each against the memory floor
  (the weight bytes read at the measured speed) and, in float32, the roofline (per stage, its weights'
  bytes at the memory's speed or its operations at the arithmetic's, whichever is slower); the ratio of
  the two revisions; the load average; each worker's peak RSS.

``--end-to-end 1.7b`` then runs ``python -m moss_tts_node bench --model 1.7b`` (the bench model of that shape,
built and cached on first use) with each revision's graph as its stream decoder, on that revision's package,
alternately: steps/s, codec ms a frame, real-time factors, time to first audio, peak RSS.

It needs git and about 20 GB in WORK_DIR (the checkpoint and two graphs per precision); the baseline's
graphs are kept for the next run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from operator import itemgetter
from pathlib import Path
from typing import IO, Any

import numpy as np

import moss_tts_node
from moss_tts_node.codec import quantizer
from moss_tts_node.codec.layout import DECODER_FILE, ENCODER_FILE, STREAM_DECODER_FILE
from moss_tts_node.model.rates import FRAMES_PER_SECOND
from moss_tts_node.tools.dev import resources, stream_decoder_worker
from moss_tts_node.tools.dev.codec_fidelity import snr_db
from moss_tts_node.tools.dev.random_codec import write_random_codec
from moss_tts_node.tools.prepare.stream_decoder_build import PRECISIONS
from moss_tts_node.tools.prepare.stream_decoder_checkpoint import Patch, read_codec_config

# The last revision whose stream decoder is the unfused graph (format 1, 4,017 nodes at full size).
UNFUSED_REVISION = "3492feade43fa15ff7778c77099a5bd5f04b1813"
CHUNKS = (1, 2, 5, 10)
DIFFERENCE_FRAMES, DIFFERENCE_CHUNK = 60, 5  # the decode both revisions make for the difference
_BANDWIDTH_BYTES = 2**31
# A third side with --spinning: ONNX Runtime's idle workers spin-wait for the next node while a call runs, and
# stop when it returns (so not between calls, while llama.cpp runs); the runtime lets them sleep.
SPINNING = "this, spinning"
SPINNING_CONFIG = {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "1"}


def memory_bandwidth(threads: int, array: np.ndarray, repeats: int = 5) -> float:
    """Bytes per second that ``threads`` threads read summing ``array`` (NumPy releases the GIL), best of
    ``repeats``: what reading weights from memory can reach."""
    parts = np.array_split(array, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            began = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - began)
    return array.nbytes / best


def matmul_speed(threads: int, repeats: int = 20) -> float:
    """Float32 operations per second (a multiply-add is 2) of ONNX Runtime's MatMul on ``threads`` threads, at
    a shape whose weight stays in cache (a last-stage feed-forward matrix, 64 rows): what the arithmetic can
    reach, best of ``repeats``."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rows, inputs, outputs = 64, 768, 3072
    weight = np.random.default_rng(0).standard_normal((inputs, outputs), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (rows, inputs))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (rows, outputs))],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"x": np.ones((rows, inputs), dtype=np.float32)}
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        session.run(None, feed)
        best = min(best, time.perf_counter() - began)
    return 2 * rows * inputs * outputs / best


def graph_facts(path: Path) -> tuple[int, dict[str, int]]:
    """A graph's nodes, and the bytes of weights a call reads per stage (``decoder.<i>.``; "" for the rest:
    the quantizer's), its weights left on disk."""
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    weight_bytes: dict[str, int] = {}
    for tensor in model.graph.initializer:
        stage = re.match(r"decoder\.\d+\.", tensor.name)
        size = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize * int(np.prod(tensor.dims))
        key = stage[0] if stage else ""
        weight_bytes[key] = weight_bytes.get(key, 0) + size
    return len(model.graph.node), weight_bytes


def stage_operations(config: Path) -> dict[str, float]:
    """Float operations per frame of each decoder Transformer stage (``decoder.<i>.``): its weight MatMuls
    (2 per weight and position) and its attention (4 x span x width per layer and position)."""
    operations, positions = {}, 1
    for module in read_codec_config(config).decoder:
        if isinstance(module, Patch):
            positions *= module.size
            continue
        width = module.d_model
        weights = module.layers * (4 * width * width + 2 * width * module.ffn)
        weights += width * (module.input_dim if module.input_dim != width else 0)
        weights += width * (module.output_dim if module.output_dim != width else 0)
        attention = module.layers * 4 * module.context * width
        operations[f"{module.prefix}."] = positions * (2 * weights + attention)
    return operations


def roofline_ms(
    weight_bytes: dict[str, int], operations: dict[str, float], frames: int, bandwidth: float, speed: float
) -> float:
    """The least a call of ``frames`` frames can take: each stage reads its weights at the memory's speed or
    computes at the arithmetic's, whichever takes longer (the stages run one after the other)."""
    seconds = sum(
        max(size / bandwidth, frames * operations.get(stage, 0.0) / speed) for stage, size in weight_bytes.items()
    )
    return 1000 * seconds


def baseline_tree(revision: str, work_dir: Path) -> Path:
    """The package at ``revision`` (and the bridge's C sources, which it builds on first use), from this
    checkout's git, with this revision's worker and the modules it brings along (``resources.py``,
    ``codec/quantizer.py``) copied in."""
    tree = work_dir / f"baseline-{revision[:12]}"
    if not (tree / "moss_tts_node").is_dir():
        tree.mkdir(parents=True, exist_ok=True)
        repository = Path(moss_tts_node.__file__).resolve().parents[1]
        archive = subprocess.run(
            ["git", "-C", str(repository), "archive", revision, "moss_tts_node", "bridge"],
            check=True,
            capture_output=True,
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    package = Path(moss_tts_node.__file__).resolve().parent
    for module in (stream_decoder_worker, resources, quantizer):
        source = Path(module.__file__).resolve()
        shutil.copy(source, tree / "moss_tts_node" / source.relative_to(package))
    return tree


def _running_on(tree: Path | None) -> dict[str, Any]:
    """``subprocess`` arguments that make ``python -m moss_tts_node`` import the package in ``tree`` (None:
    this one): first on the path, and the working directory too, which ``-m`` puts before it."""
    return {} if tree is None else {"env": dict(os.environ, PYTHONPATH=str(tree)), "cwd": tree}


class Worker:
    """A ``stream_decoder_worker`` process on the package tree ``tree`` (None: this one)."""

    def __init__(self, tree: Path | None) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moss_tts_node.tools.dev.stream_decoder_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            **_running_on(tree),
        )
        self.peak_rss_mib = 0.0

    def ask(self, **request: Any) -> dict[str, Any]:
        stdin, stdout = self._streams()
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"the worker ended (exit status {self._process.wait()}) on {request}")
        reply = json.loads(line)
        self.peak_rss_mib = reply["peak_rss_mib"]
        return reply

    def close(self) -> None:
        stdin, _ = self._streams()
        stdin.close()
        self._process.wait()

    def _streams(self) -> tuple[IO[str], IO[str]]:
        assert self._process.stdin is not None and self._process.stdout is not None
        return self._process.stdin, self._process.stdout


def build(tree: Path | None, checkpoint: Path, path: Path, precision: str, rebuild: bool) -> None:
    """Build a graph with the builder of ``tree`` (None: this one), in a process of its own, unless it is there
    and ``rebuild`` is False."""
    if path.is_file() and not rebuild:
        return
    began = time.perf_counter()
    command = [sys.executable, "-m", "moss_tts_node", "build-stream-decoder", str(checkpoint), "--out", str(path)]
    command += ["--precision", precision, "--force"]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, **_running_on(tree))
    print(f"built {path} in {time.perf_counter() - began:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="the codec's config.json (e.g. codec-tiny/real-config.json)")
    parser.add_argument("work_dir", type=Path, help="where the random checkpoint, the baseline and the graphs go")
    parser.add_argument("--baseline", default=UNFUSED_REVISION, help="git revision to compare with")
    parser.add_argument(
        "--precision", nargs="*", choices=PRECISIONS, default=["fp32", "w8-attention"], help="graphs to time"
    )
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2], help="ONNX Runtime intra-op threads")
    parser.add_argument("--chunks", type=int, nargs="*", default=list(CHUNKS), help="frames per call")
    parser.add_argument("--frames", type=int, default=61, help="frames streamed per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over every setting")
    parser.add_argument(
        "--spinning",
        action="store_true",
        help=f"also run this revision with ONNX Runtime's workers spinning during a call ({SPINNING!r})",
    )
    parser.add_argument(
        "--end-to-end",
        choices=("1.7b", "8b"),
        help="then run `bench` on this bench model with each revision's graph, alternately, --rounds times",
    )
    parser.add_argument("--chunk-frames", type=int, default=5, help="audio.chunk_frames of --end-to-end")
    args = parser.parse_args()
    args.work_dir = args.work_dir.resolve()  # the workers run elsewhere
    if args.frames < 2 * max(args.chunks) + 1:  # the first call of each measurement is not timed
        parser.error(f"--frames must be at least {2 * max(args.chunks) + 1} for chunks of {max(args.chunks)}")

    checkpoint = args.work_dir / "checkpoint"
    if not (checkpoint / "model.safetensors").is_file():
        write_random_codec(args.config, checkpoint)
    trees = {"baseline": baseline_tree(args.baseline, args.work_dir), "this": None}
    graphs = {
        (revision, precision): _graph(tree, checkpoint, args.work_dir, precision)
        for precision in args.precision
        for revision, tree in trees.items()
    }
    # Each side: the revision whose graph and runtime it runs, and the session settings it adds.
    sides = {revision: (revision, {}) for revision in trees}
    if args.spinning:
        sides[SPINNING] = ("this", SPINNING_CONFIG)
    # Started before the 2 GiB below: Linux counts the parent's resident memory at a fork in the child's peak.
    workers = {side: Worker(trees[revision]) for side, (revision, _) in sides.items()}
    try:
        machine = _measure_machine(args.threads)
        facts = {key: graph_facts(path) for key, path in graphs.items()}
        operations = stage_operations(checkpoint / "config.json")
        print(f"  {sum(operations.values()) / 1e9:.2f} GFLOP a frame (weight MatMuls and attention)")
        for (revision, precision), (nodes, weight_bytes) in facts.items():
            total = sum(weight_bytes.values())
            print(f"  {precision:12s} {revision:8s}: {nodes:5d} nodes, {total / 1e9:.2f} GB of weights a call reads")
        results = _decode_rounds(args, workers, sides, graphs)
    finally:
        for worker in workers.values():
            worker.close()
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("peak RSS of the worker: " + ", ".join(f"{side} {w.peak_rss_mib:.0f} MiB" for side, w in workers.items()))
    _print_decode_table(args, sides, results, facts, operations, machine)
    if args.end_to_end:
        _end_to_end(args, trees, graphs)


def _graph(tree: Path | None, checkpoint: Path, work_dir: Path, precision: str) -> Path:
    """A revision's graph as a codec directory holds it (the end-to-end runs use the directory); the baseline's
    are kept for the next run, this revision's built afresh (its code may have changed)."""
    name = tree.name if tree else "this"
    path = work_dir / f"{name}-{precision}" / STREAM_DECODER_FILE
    build(tree, checkpoint, path, precision, rebuild=tree is None)
    return path


def _measure_machine(threads: list[int]) -> dict[int, tuple[float, float]]:
    """Per thread count: the memory's speed (bytes/s) and float32 arithmetic's (operations/s), printed."""
    array = np.ones(_BANDWIDTH_BYTES // 4, dtype=np.float32)
    bandwidth = {count: memory_bandwidth(count, array) for count in sorted(set(threads))}
    del array
    machine = {count: (speed, matmul_speed(count)) for count, speed in bandwidth.items()}
    print(f"load average {os.getloadavg()[0]:.2f}; memory read by NumPy sums over 2 GiB, float32 MatMul in cache:")
    for count, (speed, arithmetic) in machine.items():
        print(f"  {count} threads: {speed / 1e9:.1f} GB/s, {arithmetic / 1e9:.0f} GFLOP/s")
    return machine


Sides = dict[str, tuple[str, dict[str, str]]]  # side: (revision, session settings it adds)
Results = dict[tuple[str, int, int, str], list[tuple[float, float]]]  # (precision, threads, chunk, side): per
# round, ms per call of wall time and of CPU time


def _decode_rounds(
    args: argparse.Namespace, workers: dict[str, Worker], sides: Sides, graphs: dict[tuple[str, str], Path]
) -> Results:
    """Every precision, thread count and chunk, each side in turn, the first side alternating by round."""
    results: Results = {}
    for round_index in range(args.rounds):
        order = list(workers) if round_index % 2 == 0 else list(reversed(workers))
        for threads in args.threads:
            for precision in args.precision:
                for side in order:
                    revision, session_config = sides[side]
                    graph = str(graphs[revision, precision])
                    workers[side].ask(load=graph, threads=threads, session_config=session_config)
                if round_index == 0 and threads == args.threads[0]:
                    _print_difference(workers, args.work_dir, precision)
                print(
                    f"round {round_index + 1}, {threads} threads, {precision}: load average {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                for chunk in args.chunks:
                    for side in order:
                        reply = workers[side].ask(time=chunk, frames=args.frames)
                        results.setdefault((precision, threads, chunk, side), []).append(
                            (1000 * reply["seconds_per_call"], 1000 * reply["cpu_seconds_per_call"])
                        )
    return results


def _print_decode_table(
    args: argparse.Namespace,
    sides: Sides,
    results: Results,
    facts: dict[tuple[str, str], tuple[int, dict[str, int]]],
    operations: dict[str, float],
    machine: dict[int, tuple[float, float]],
) -> None:
    print(
        f"ms per call (ms per frame; a frame is {1000 / FRAMES_PER_SECOND:.0f} ms of audio) per round, [CPU ms per "
        "call]; x floor: the median ms per call / the memory floor (weight bytes / memory speed); x roofline: / the "
        "floor of each stage's weight bytes or float32 arithmetic, whichever is slower (fp32 graphs); x baseline: "
        "the medians against the baseline's, wall [CPU]"
    )
    for precision in args.precision:
        for threads in args.threads:
            bandwidth, arithmetic = machine[threads]
            for chunk in args.chunks:
                cells, medians = [], {}
                for side, (revision, _) in sides.items():
                    weight_bytes = facts[revision, precision][1]
                    values = results[precision, threads, chunk, side]
                    medians[side] = np.median(values, axis=0)
                    figures = " / ".join(f"{wall:.0f} ({wall / chunk:.1f})" for wall, _ in values)
                    cpu = " / ".join(f"{cpu:.0f}" for _, cpu in values)
                    floor = 1000 * sum(weight_bytes.values()) / bandwidth
                    cells.append(f"{side} {figures} [{cpu}], {medians[side][0] / floor:.2f}x floor")
                    if precision == "fp32":
                        roofline = roofline_ms(weight_bytes, operations, chunk, bandwidth, arithmetic)
                        cells[-1] += f", {medians[side][0] / roofline:.2f}x roofline ({roofline:.0f} ms)"
                    if side != "baseline":
                        wall, cpu = medians[side] / medians["baseline"]
                        cells[-1] += f", {wall:.2f} [{cpu:.2f}] x baseline"
                print(f"  {precision:12s} {threads} thr chunk {chunk:2d}: " + "; ".join(cells))


# The end-to-end figures --end-to-end prints, from `bench --json`: (label, key, scale, format).
def _peak_rss_mib(run: dict[str, Any]) -> float:
    """A bench run's peak RSS; a baseline revision's bench (3492fea and before) reported it in bytes."""
    return run["peak_rss_mib"] if "peak_rss_mib" in run else run["peak_rss_bytes"] / 2**20


_END_TO_END: tuple[tuple[str, Callable[[dict[str, Any]], float], str], ...] = (
    ("steps/s", itemgetter("steps_per_s"), ".2f"),
    ("llama.cpp decode ms a step", itemgetter("decode_ms"), ".1f"),
    ("codec ms a step", itemgetter("codec_ms"), ".1f"),
    ("real-time factor", itemgetter("rtf"), ".2f"),
    ("steady-state real-time factor", itemgetter("rtf_steady"), ".2f"),
    ("time to first audio ms", itemgetter("ttfa_ms"), ".0f"),
    ("peak RSS MiB", _peak_rss_mib, ".0f"),
    ("other processes' CPU %", lambda run: 100 * run["foreign_cpu"], ".0f"),
)


def _end_to_end(args: argparse.Namespace, trees: dict[str, Path | None], graphs: dict[tuple[str, str], Path]) -> None:
    """``bench`` on a bench model with each revision's graph as its stream decoder, on that revision's package,
    alternately; a table of the figures a listener's real time depends on."""
    from moss_tts_node.tools.dev.bench_models import ensure_bench_model

    demo_codec = ensure_bench_model(args.end_to_end).parent / "codec"  # its encoder.onnx and decoder.onnx
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for round_index in range(args.rounds):
        order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
        for precision in args.precision:
            for revision in order:
                codec_dir = graphs[revision, precision].parent
                for name in (ENCODER_FILE, DECODER_FILE):
                    if not (codec_dir / name).exists():
                        (codec_dir / name).symlink_to(demo_codec / name)
                out = args.work_dir / "end-to-end.json"
                command = [sys.executable, "-m", "moss_tts_node", "bench", "--model", args.end_to_end]
                command += ["--set", f"model.codec_dir={codec_dir}", "--set", f"audio.chunk_frames={args.chunk_frames}"]
                command += ["--no-prefill-compare", "--json", str(out)]
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL, **_running_on(trees[revision]))
                runs.setdefault((precision, revision), []).append(json.loads(out.read_text())["runs"][0])
                print(f"end to end, round {round_index + 1}, {precision}, {revision}: done", flush=True)
    print(f"end to end: `bench --model {args.end_to_end}`, audio.chunk_frames {args.chunk_frames}, per round")
    for precision in args.precision:
        for label, value, style in _END_TO_END:
            cells = [
                f"{revision} " + " / ".join(format(value(run), style) for run in runs[precision, revision])
                for revision in trees
            ]
            print(f"  {precision:12s} {label:30s} " + "; ".join(cells))
        for revision in trees:
            frames = [run["codec_ms"] * run["steps"] / run["frames"] for run in runs[precision, revision]]
            print(f"  {precision:12s} {revision} codec ms a frame: " + " / ".join(f"{ms:.1f}" for ms in frames))


def _print_difference(workers: dict[str, Worker], work_dir: Path, precision: str) -> None:
    """The largest difference between the two revisions' decodes of the same frames, and its SNR."""
    audio = {}
    for side in ("baseline", "this"):
        out = work_dir / f"difference-{side}.npy"
        workers[side].ask(decode=DIFFERENCE_CHUNK, frames=DIFFERENCE_FRAMES, out=str(out))
        audio[side] = np.load(out)
        out.unlink()
    difference = float(np.abs(audio["this"] - audio["baseline"]).max())
    print(
        f"{precision}: {DIFFERENCE_FRAMES} frames in chunks of {DIFFERENCE_CHUNK}, this revision against the "
        f"baseline: largest difference {difference:.2e} on a peak of {np.abs(audio['baseline']).max():.3g}, "
        f"{snr_db(audio['this'], audio['baseline']):.1f} dB",
        flush=True,
    )


if __name__ == "__main__":
    main()
