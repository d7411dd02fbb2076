"""``python -m moss_tts_node bench``: where a step's time goes, on models of the real shape.

Run by hand, not in CI. For each model (random weights of the real shape, built once and cached by
``bench_models``; or your own weights with ``--config``) and each heads backend, a fresh worker process
loads the Synthesizer, warms up, synthesizes a fixed text with a fixed seed for ``--steps`` steps and
reports:

- prefill ms (the loop's own), and the same prompt prefilled by a separate llama.cpp process (best of 3
  each): outputs for the last row only (what the bridge does) and for every row (the text head at every
  position, what llama.cpp does by default with embeddings on): the difference is what is saved;
- steps/s and ms per step split into llama.cpp decode / heads / sampling and delay logic / codec / other;
- the backbone-only limit: llama.cpp decoding the same rows in a tight loop (text head on, as llama.cpp
  runs by default, and off, as the audio phase runs here; alternated in blocks of 10 steps);
- overhead = (step - decode) / decode, time to first audio against the bound prefill + the first frame's steps
  (``ModelSpec.first_frame_budget``) + one chunk decode, real-time factor, and peak RSS against GGUF + fp16
  embeddings and heads + KV + the resident decode graph (its weights, and a stream decoder's attention caches)
  + 500 MiB;
- prompt-prefix reuse: the same voice (``--voice-seconds`` of random reference codes) then speaks another
  text; its prefilled rows, prefill ms and time to first audio against the bound prefill(its new rows) +
  the first frame's steps + one chunk decode, next to the first request's (which prefills its whole prompt).

``--dialogue-piece`` adds what a dialogue's next piece costs to prefill (docs/family.md, "Dialogues"): it carries the
piece before it, its text as the transcript and its frames (as many as that piece is planned to make) as the prefix,
after the rows it shares with that piece's prompt (fields, voices); its rows and prefill ms, against the same piece
not carried (which prefills its text and what follows).

``--clone`` says how the voice enters each request: as the ``[S1]`` reference, as the prefix the speech continues
(docs/continuation.md), or both; given several times, the runs alternate between them, ``--rounds`` times over
(A, B, C, A, B, C...), so that a shared machine's drift falls on each alike, and a summary gives each one's mean
time to first audio and steps/s against the first's.

The codec is the tiny demo codec for bench models; the real codec costs more: measure it with
``--set model.codec_dir=/path/to/MOSS-Audio-Tokenizer-ONNX`` (random codes decode at the real cost), a stream
decoder alone with ``--set audio.stream_decoder=/path/to/decoder_stream.onnx``, or the whole real model with
``--config``. The workers run one at a time; the machine should be otherwise quiet:
the load average around each worker and the share of the CPU other processes took during it (from
/proc/stat) are recorded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moss_tts_node.choices import HEADS_BACKENDS
from moss_tts_node.model.layout import EMBEDDINGS_DIR, HEADS_DIR, audio_head_file
from moss_tts_node.model.rates import FRAMES_PER_SECOND
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.timing import StageClock, TimingReport
from moss_tts_node.tools.dev.bench_worker import machine_info, random_voice, run_worker, threads_in_use
from moss_tts_node.tools.dev.nano_bench import NANO_BENCH, bench_nano, ensure_nano_bench_model, format_nano_runs
from moss_tts_node.tools.dev.resources import peak_rss_mib

if TYPE_CHECKING:
    import numpy as np

    from moss_tts_node.synthesizer import Synthesizer

BENCH_TEXT = "Hello! I am a robot, and this is my voice. It is a fine day to test speech synthesis on a small computer."
REPEAT_TEXT = "The kitchen is on the left, past the blue door."  # the repeat request's: another text, same voice
BUDGET_SLACK = 500 * 1024 * 1024
FRAME_MS = 1000 / FRAMES_PER_SECOND  # the audio one step makes
CODEC_KEYS = {"model.codec_dir", "audio.stream_decoder"}  # overrides that put a codec other than the demo's in the loop
# How the voice enters a request (--clone): as the [S1] reference, as a prefix the speech continues, or both.
REFERENCE, CONTINUATION, BOTH = "reference", "continuation", "both"
CLONE_MODES = (REFERENCE, CONTINUATION, BOTH)
PREFIX_TEXT = "This is how I sound when I speak."  # the bench voice's transcript (its codes are random)
DIALOGUE_TURNS = (  # a dialogue's piece and the next (--dialogue-piece): each fits half the default codec window
    "[S1]Hello, robot. The quick brown fox jumps over the lazy dog. Speech synthesis on a small computer.",
    "[S2]Hello, robot. Speech synthesis on a small computer. The quick brown fox jumps over the lazy dog.",
)
DIALOGUE_EARLIER = "The quick brown fox jumps over the lazy dog."  # what the piece before carried itself


def register(commands: Any) -> None:
    bench = commands.add_parser("bench", help="measure speed and memory on real-shape random models (by hand)")
    bench.add_argument(
        "--model",
        action="append",
        help="bench model (repeatable; default: 1.7b and 8b; voice-generator-1.7b: 1.7B with 16 codebooks; "
        f"{NANO_BENCH}: MOSS-TTS-Nano with its codec, both at the real size; bench_models.BENCH_MODELS lists the "
        "Delay ones); built and cached on first use",
    )
    bench.add_argument("--config", type=Path, help="your own params file instead of a bench model")
    bench.add_argument(
        "--heads",
        default="auto",
        help=f"heads backends to compare, comma-separated, from {', '.join(HEADS_BACKENDS)} (default auto)",
    )
    bench.add_argument("--steps", type=int, default=160, help="generation steps per run (default 160)")
    bench.add_argument(
        "--threads",
        type=int,
        default=0,
        help="llama.cpp threads (and the heads' and the codec's); default 0: the cores shared out as a config with "
        "its thread counts at 0 shares them (audio.decode_ahead)",
    )
    bench.add_argument("--seed", type=int, default=1, help="seed of every run (and of the random voice)")
    bench.add_argument("--text", default=BENCH_TEXT, help="what every run says")
    bench.add_argument(
        "--voice-seconds",
        type=float,
        default=0.0,
        help="a reference voice of this many seconds of random codes in every request (default 0: none)",
    )
    bench.add_argument(
        "--clone",
        action="append",
        choices=CLONE_MODES,
        help="how the voice (--voice-seconds) enters each request: the [S1] reference (default), the prefix the "
        "speech continues, or both; repeat to alternate runs between them",
    )
    bench.add_argument("--rounds", type=int, default=1, help="run every --clone this many times, alternating")
    bench.add_argument(
        "--dialogue-piece",
        action="store_true",
        help="also measure the prefill of a dialogue's next piece, which carries the piece before it",
    )
    bench.add_argument("--no-prefill-compare", action="store_true", help="skip the every-position prefill run")
    bench.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    bench.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every run")
    bench.set_defaults(run=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    from moss_tts_node.errors import RequestError
    from moss_tts_node.tools.dev.bench_models import bench_model_dir, ensure_bench_model, ensure_heads_gguf
    from moss_tts_node.tools.overrides import parse_overrides

    models = args.model or ["1.7b", "8b"]
    overrides = parse_overrides(args.set)
    if NANO_BENCH in models:
        config = args.config or ensure_nano_bench_model(log=log)
        threads = args.threads or "shared-out"
        log(f"running MOSS-TTS-Nano ({config}), {args.steps} frames x {args.rounds}, {threads} threads ...")
        figures = bench_nano(
            config, args.steps, args.threads, args.rounds, args.seed, args.text, overrides, args.voice_seconds
        )
        print(format_nano_runs(figures))
        models = [model for model in models if model != NANO_BENCH]
        if not models:
            return 0
    heads = [h.strip() for h in args.heads.split(",") if h.strip()]
    for h in heads:
        if h not in HEADS_BACKENDS:
            raise RequestError(f"--heads {h!r}: choose from {', '.join(HEADS_BACKENDS)}")
    targets: list[tuple[str, Path]] = []
    if args.config:
        targets.append((args.config.parent.name or str(args.config), args.config))
    else:
        for name in models:
            log(f"bench model {name}: {bench_model_dir(name)}")
            targets.append((name, ensure_bench_model(name, threads=args.threads, log=log)))
    if args.clone and not args.voice_seconds:
        raise RequestError("--clone needs a voice: give --voice-seconds, e.g. 10")
    modes = args.clone or [REFERENCE]
    runs = [(round_, mode) for round_ in range(1, args.rounds + 1) for mode in modes]
    results = []
    for name, config in targets:
        for backend in heads:
            run_overrides = {**overrides, "audio.heads_backend": backend}
            if backend == "gguf" and not args.config:
                run_overrides["model.backbone_gguf"] = ensure_heads_gguf(name, log=log).name
            for round_, mode in runs:
                label = f"{name} / {backend}" + (f" / {mode}" if args.clone else "")
                label += f" #{round_}" if args.rounds > 1 else ""
                log(f"running {label}, {args.steps} steps, {args.threads or 'shared-out'} threads ...")
                result = run_worker(
                    {
                        "label": label,
                        "clone": mode,
                        "model": name,
                        "config": str(config),
                        "overrides": run_overrides,
                        "steps": args.steps,
                        "threads": args.threads,
                        "seed": args.seed,
                        "text": args.text,
                        "voice_seconds": args.voice_seconds,
                        "demo_codec": not args.config and not CODEC_KEYS & set(overrides),
                        "prefill_compare": not args.no_prefill_compare,
                        "dialogue_piece": args.dialogue_piece,
                    },
                    WORKER_COMMAND,
                    _compare_prefill,
                )
                results.append({**result, "clone": mode})
                print(format_result_line(result), flush=True)
    print()
    print(format_table(results))
    if len(modes) > 1:
        print()
        print(format_clone_summary(results))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine_info(), "runs": results}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- one run, in its own process (clean peak RSS, nothing left over from the last model) -------------

WORKER_COMMAND = [sys.executable, "-m", "moss_tts_node.tools.dev.bench", "worker"]


def _compare_prefill(job: dict[str, Any], result: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """The every-position prefill of the worker's prompt, where the job asked for it."""
    return prefill_compare(job, workdir / "prompt.npy", result) if job["prefill_compare"] else {}


def worker(job: dict[str, Any]) -> dict[str, Any]:
    """Measure one configuration (runs in the worker process): load, warm up, then each figure in turn."""
    from moss_tts_node.config import load_config
    from moss_tts_node.synthesizer import Synthesizer

    overrides = {"llama.n_threads": job["threads"], "audio.codec_threads": job["threads"], **job["overrides"]}
    config = load_config(job["config"], overrides)
    started = time.perf_counter()
    synth = Synthesizer(config)
    load_s = time.perf_counter() - started
    spec = synth.spec
    voice = random_voice(spec, job["voice_seconds"], job["seed"])
    request = {"language": "en", "seed": job["seed"], **clone_fields(job.get("clone", REFERENCE), voice)}
    list(synth.stream(job["text"], max_new_tokens=8, **request))  # warm-up: page in the weights
    with synth.stages.generation() as stage:
        stage.backbone.clear()  # the measured request is a first one: nothing of its prompt is in the KV cache
        heads_backend, n_embd = stage.heads.name, stage.backbone.n_embd

    stream = synth.stream(job["text"], max_new_tokens=job["steps"], **request)
    list(stream)
    assert stream.report is not None and stream.clock is not None and stream.generated is not None
    peak_rss = peak_rss_mib()  # the first request's peak, before the replays below load anything more
    steps = step_figures(stream.report, stream.clock, spec)
    # its first frame, and a few more
    repeat = synth.stream(REPEAT_TEXT, max_new_tokens=spec.first_frame_steps + 8, **request)
    list(repeat)
    assert repeat.report is not None
    limit = backbone_limit(synth, stream.generated, stream.prompt, Path(job["workdir"]) / "prompt.npy")
    chunk_ms = first_chunk_decode_ms(synth, stream.codes)
    result = {
        "label": job["label"],
        "model": job["model"],
        "heads_backend": heads_backend,
        "n_embd": n_embd,
        "threads": threads_in_use(config),
        "codec": "demo codec (tiny; the real codec costs more)" if job["demo_codec"] else "configured codec",
        "load_s": load_s,
        "voice_frames": voice.shape[0],
        **steps,
        **limit,
        "vs_limit": steps["step_ms"] / limit["limit_ms"] - 1,
        **first_audio_figures(stream.report, repeat.report, steps["step_ms"], chunk_ms, spec),
        **memory_figures(synth, peak_rss),
    }
    if job.get("dialogue_piece"):
        result.update(dialogue_piece_figures(synth, voice, job["seed"]))
    synth.close()
    return result


def step_figures(report: TimingReport, clock: StageClock, spec: ModelSpec) -> dict[str, Any]:
    """Where a step's time goes: the report's means per step, and medians over the steady state from the
    stream's own clock (a shared machine can take a core from one step for a few hundred ms)."""
    import numpy as np

    steps = report.steps
    step_ms = (report.wall_s * 1000 - report.prefill_ms) / steps
    decode_ms, heads_ms, sampling_ms = (
        report.backbone_ms_per_step,
        report.heads_ms_per_step,
        report.sampling_ms_per_step,
    )
    codec_ms = report.codec_ms / steps
    decode_s = [seconds for _, seconds in clock.calls["backbone"]]
    step_s = np.diff([start for start, _ in clock.calls["heads"]]).tolist()
    steady_from = spec.first_frame_steps + 8  # past the ramp-up, in which fewer codebooks are sampled

    def steady_median_ms(seconds: list[float]) -> float | None:
        return 1000 * float(np.median(seconds[steady_from:])) if len(seconds) >= steady_from + 10 else None

    step_median, decode_median = steady_median_ms(step_s), steady_median_ms(decode_s)
    return {
        "prompt_rows": report.prompt_rows,
        "prefilled_rows": report.prefilled_rows,
        "steps": steps,
        "frames": report.frames,
        "stop_reason": report.stop_reason,
        "prefill_ms": report.prefill_ms,
        "steps_per_s": 1000 / step_ms,
        "step_ms": step_ms,
        "decode_ms": decode_ms,
        "heads_ms": heads_ms,
        "sampling_ms": sampling_ms,
        "codec_ms": codec_ms,
        "other_ms": step_ms - decode_ms - heads_ms - sampling_ms - codec_ms,
        "overhead": (step_ms - decode_ms) / decode_ms,
        "step_median_ms": step_median,
        "decode_median_ms": decode_median,
        "overhead_median": None
        if step_median is None or decode_median is None
        else (step_median - decode_median) / decode_median,
        "decode_max_ms": 1000 * max(decode_s) if decode_s else None,
        "rtf": report.real_time_factor,
        "rtf_steady": step_ms / FRAME_MS,
        "audio_s": report.audio_seconds,
    }


def backbone_limit(
    synth: Synthesizer, generated: np.ndarray, prompt: np.ndarray, prompt_file: Path
) -> dict[str, float]:
    """The backbone-only limit: llama.cpp decoding the request's rows again in a tight loop, its text head on
    and off in alternate blocks of 10 steps (which changes nothing in the KV cache), so that both see the same
    machine: a shared machine drifts by ~10% from minute to minute. The prompt's embeddings are saved to
    ``prompt_file`` for ``prefill_compare``."""
    import numpy as np

    with synth.stages.generation() as stage:
        backbone = stage.backbone
        embeddings = stage.embeddings.embed(generated[:-1])
        prompt_embeddings = stage.embeddings.embed(prompt)
    np.save(prompt_file, prompt_embeddings)
    backbone.clear()
    backbone.prefill(prompt_embeddings)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i, row in enumerate(embeddings):
        text_head = (i // 10) % 2 == 0
        t = time.perf_counter()
        backbone.decode(row, text_logits=text_head)
        times[text_head].append(time.perf_counter() - t)
    return {
        "limit_ms": 1000 * float(np.mean(times[True])),
        "limit_no_text_head_ms": 1000 * float(np.mean(times[False])),
        "limit_median_ms": 1000 * float(np.median(times[True])),
        "limit_no_text_head_median_ms": 1000 * float(np.median(times[False])),
    }


def first_chunk_decode_ms(synth: Synthesizer, codes: np.ndarray | None) -> float | None:
    """The codec's time for the first chunk (one frame), median of 5; None when nothing was generated."""
    import numpy as np

    if codes is None or not len(codes):
        return None
    times = []
    with synth.stages.decoder() as codec:
        for _ in range(5):
            t = time.perf_counter()
            codec.decode(codes[:1])
            times.append(time.perf_counter() - t)
    return 1000 * float(np.median(times))


def first_audio_bound_ms(prefill_ms: float, step_ms: float, chunk_ms: float | None, spec: ModelSpec) -> float:
    """What a request's first audio should take at most: its prefill, the first frame's steps (the rows up to frame
    0's last codebook, the delay pattern's, and one to spare: ``ModelSpec.first_frame_budget``) and one chunk
    decode."""
    return prefill_ms + spec.first_frame_budget * step_ms + (chunk_ms or 0.0)


def first_audio_figures(
    first: TimingReport, repeat: TimingReport, step_ms: float, chunk_ms: float | None, spec: ModelSpec
) -> dict[str, Any]:
    """Time to first audio of the first request (its whole prompt prefilled) and of the repeat request (the
    same voice, another text: only its own rows prefilled), each against its bound."""

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1000

    return {
        "ttfa_ms": ms(first.time_to_first_audio_s),
        "ttfa_bound_ms": first_audio_bound_ms(first.prefill_ms, step_ms, chunk_ms, spec),
        "repeat_prompt_rows": repeat.prompt_rows,
        "repeat_prefilled_rows": repeat.prefilled_rows,
        "repeat_prefill_ms": repeat.prefill_ms,
        "repeat_ttfa_ms": ms(repeat.time_to_first_audio_s),
        "repeat_ttfa_bound_ms": first_audio_bound_ms(repeat.prefill_ms, step_ms, chunk_ms, spec),
        "first_chunk_decode_ms": chunk_ms,
    }


def dialogue_piece_figures(synth: Synthesizer, voice: np.ndarray, seed: int) -> dict[str, Any]:
    """The prefill of a dialogue's next piece (``DIALOGUE_TURNS[1]``) after the piece before it
    (``DIALOGUE_TURNS[0]``, with ``voice`` as both speakers' reference when there is one): carried (its text and
    as many random frames as it is planned to make, as ``PiecePlanner.continued`` builds it) and not. The KV cache
    holds the piece before's prompt first, as after its generation, and as in a long dialogue that piece carries
    another itself, so that only the rows before the text are shared. Best of 3 each."""
    import numpy as np

    from moss_tts_node.text.pieces import Piece
    from moss_tts_node.text.prompt import PromptFields

    planner, spec = synth.planner, synth.spec
    references = [voice, voice] if voice.shape[0] else []
    earlier, before, piece = (
        next(p for p in planner.plan(PromptFields(text=turn, language="en"), references, 1) if isinstance(p, Piece))
        for turn in (DIALOGUE_EARLIER, *DIALOGUE_TURNS)
    )
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, spec.audio_vocab_size, (before.expected_frames, spec.n_vq))
    carried = planner.continued(piece, before, frames, references, True)
    other = rng.integers(0, spec.audio_vocab_size, (earlier.expected_frames, spec.n_vq))
    cached = planner.continued(before, earlier, other, references, True)  # the piece before, as a long dialogue's
    if carried is None or cached is None:
        return {"dialogue_error": "the piece before does not fit beside the next in this context"}
    figures: dict[str, Any] = {}
    with synth.stages.generation() as stage:
        backbone, embed = stage.backbone, stage.embeddings.embed
        for name, measured in (("dialogue_carried", carried), ("dialogue_alone", piece)):
            times = []
            for _ in range(3):
                backbone.clear()
                backbone.prefill_prompt(cached.prompt, embed, text_logits=False, shared_rows=cached.shared_rows)
                started = time.perf_counter()
                rows = backbone.prefill_prompt(measured.prompt, embed, shared_rows=measured.shared_rows)
                times.append(time.perf_counter() - started)
            prompt_rows = measured.prompt.shape[0]
            figures |= {f"{name}_rows": rows, f"{name}_prompt_rows": prompt_rows, f"{name}_ms": 1000 * min(times)}
    return {**figures, "dialogue_carried_frames": frames.shape[0]}


def memory_figures(synth: Synthesizer, peak_rss: float) -> dict[str, Any]:
    """Peak RSS against its budget: the GGUF, the fp16 embedding tables and audio heads, the KV cache, the
    resident decode graph, and BUDGET_SLACK."""
    from moss_tts_node.config import backbone_path

    config = synth.config
    gguf = backbone_path(config)
    weights = Path(config.model.weights_dir)
    fp16 = sum(p.stat().st_size for p in (weights / EMBEDDINGS_DIR).glob("*.npy"))
    fp16 += sum((weights / HEADS_DIR / audio_head_file(k)).stat().st_size for k in range(synth.spec.n_vq))
    kv = kv_cache_bytes(gguf, synth.n_ctx, config.llama.kv_cache_type_k, config.llama.kv_cache_type_v)
    codec_bytes = decode_graph_bytes(synth)
    return {
        "gguf": gguf.name,
        "gguf_bytes": gguf.stat().st_size,
        "peak_rss_mib": peak_rss,
        "rss_budget_bytes": gguf.stat().st_size + fp16 + kv + codec_bytes + BUDGET_SLACK,
        "kv_cache_bytes": kv,
        "fp16_npy_bytes": fp16,
        "codec_resident_bytes": codec_bytes,
    }


def clone_fields(mode: str, voice: Any) -> dict[str, Any]:
    """A request's voice fields for ``mode`` (``CLONE_MODES``): ``voice`` (codes, maybe none) as the reference, as
    the prefix, or both."""
    if not voice.shape[0]:
        return {"voice": ""}
    fields: dict[str, Any] = {"voice": voice if mode in (REFERENCE, BOTH) else ""}
    if mode in (CONTINUATION, BOTH):
        fields.update(prefix=voice, prefix_text=PREFIX_TEXT)
    return fields


def decode_graph_bytes(synth: Any) -> int:
    """What the resident decode graph holds: its weights (the graph and its side file) and, for a stream
    decoder, its attention caches. The encoder, loaded on a first encode, is not counted: bench encodes nothing."""
    from moss_tts_node.codec.layout import DECODER_FILE

    stream = synth.stages.stream_decoding
    if stream is not None:
        graph, state = stream.decoder.path, stream.decoder.state_bytes
    else:
        graph, state = Path(synth.config.model.codec_dir) / DECODER_FILE, 0
    files = [graph, graph.with_name(f"{graph.name}.data")]
    return state + sum(path.stat().st_size for path in files if path.is_file())


def kv_cache_bytes(gguf: Path, n_ctx: int, type_k: str, type_v: str) -> int:
    from moss_tts_node.llama.gguf import scan_gguf

    fields, _, _ = scan_gguf(gguf)
    arch = fields["general.architecture"]

    def key(name: str) -> int:
        return int(fields[f"{arch}.{name}"])

    width = key("attention.head_count_kv") * key("attention.key_length")
    per_element = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32}
    per_token = key("block_count") * width * (per_element.get(type_k, 2.0) + per_element.get(type_v, 2.0))
    return int(n_ctx * per_token)


# ---- the prefill with the text head at every position (bench_prefill, in its own process) --------------


def prefill_compare(job: dict[str, Any], prompt: Path, result: dict[str, Any]) -> dict[str, Any]:
    from moss_tts_node.config import backbone_path, load_config
    from moss_tts_node.tools.dev import bench_prefill

    config = load_config(job["config"], job["overrides"])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            bench_prefill.__name__,
            str(backbone_path(config)),
            str(prompt),
            str(job["threads"]),
            str(config.llama.n_ctx),
            str(config.llama.n_batch),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        log(f"prefill comparison failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return {}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- output ---------------------------------------------------------------------------------------------


def format_result_line(r: dict[str, Any]) -> str:
    return (
        f"{r['label']}: {r['steps_per_s']:.2f} steps/s, step {r['step_ms']:.1f} ms "
        f"(decode {r['decode_ms']:.1f}, limit {r['limit_ms']:.1f}), overhead {100 * r['overhead']:.1f}%, "
        f"other processes' CPU {100 * r.get('foreign_cpu', 0):.0f}%"
    )


def format_clone_summary(results: list[dict[str, Any]]) -> str:
    """Each --clone's mean time to first audio and steps/s over its runs, and their ratios to the first's."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_mode.setdefault(result["clone"], []).append(result)
    means = {
        mode: (
            statistics.fmean(r["ttfa_ms"] for r in runs if r["ttfa_ms"] is not None),
            statistics.fmean(r["steps_per_s"] for r in runs),
            statistics.fmean(r["prompt_rows"] for r in runs),
        )
        for mode, runs in by_mode.items()
    }
    first_ttfa, first_steps, _ = next(iter(means.values()))
    lines = [
        "| clone | runs | prompt rows | time to first audio ms (ratio) | steps/s (ratio) |",
        "|---|---|---|---|---|",
    ]
    for mode, (ttfa, steps, rows) in means.items():
        lines.append(
            f"| {mode} | {len(by_mode[mode])} | {rows:.0f} | {ttfa:.0f} ({ttfa / first_ttfa:.2f}) "
            f"| {steps:.2f} ({steps / first_steps:.2f}) |"
        )
    return "\n".join(lines)


def _ms(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(results: list[dict[str, Any]]) -> str:
    """A markdown table, one column per run."""
    mib = 1024 * 1024

    def row(name: str, fn: Any) -> str:
        return f"| {name} | " + " | ".join(fn(r) for r in results) + " |"

    lines = [
        "| | " + " | ".join(r["label"] for r in results) + " |",
        "|---|" + "---|" * len(results),
        row("GGUF", lambda r: f"{r['gguf']} ({r['gguf_bytes'] / 1e9:.2f} GB)"),
        row("prompt rows / steps / frames", lambda r: f"{r['prompt_rows']} / {r['steps']} / {r['frames']}"),
        row("prefill ms (in the loop)", lambda r: _ms(r["prefill_ms"], 0)),
        row(
            "prefill ms, last row out / every row out (best of 3)",
            lambda r: f"{_ms(r.get('prefill_last_row_ms'), 0)} / {_ms(r.get('prefill_every_row_ms'), 0)}",
        ),
        row("steps/s", lambda r: f"{r['steps_per_s']:.2f}"),
        row("ms per step", lambda r: _ms(r["step_ms"], 2)),
        row("- llama.cpp decode", lambda r: _ms(r["decode_ms"], 2)),
        row("- heads", lambda r: _ms(r["heads_ms"], 2)),
        row("- sampling + delay + embedding", lambda r: _ms(r["sampling_ms"], 2)),
        row("- codec", lambda r: _ms(r["codec_ms"], 2)),
        row("- other", lambda r: _ms(r["other_ms"], 2)),
        row(
            "backbone-only limit ms, text head on: mean / median",
            lambda r: f"{_ms(r['limit_ms'], 2)} / {_ms(r.get('limit_median_ms'), 2)}",
        ),
        row(
            "backbone-only limit ms, text head off: mean / median",
            lambda r: f"{_ms(r['limit_no_text_head_ms'], 2)} / {_ms(r.get('limit_no_text_head_median_ms'), 2)}",
        ),
        row("overhead (step - decode) / decode", lambda r: f"{100 * r['overhead']:.1f}%"),
        row(
            "steady state: median step / decode ms",
            lambda r: f"{_ms(r.get('step_median_ms'), 2)} / {_ms(r.get('decode_median_ms'), 2)}",
        ),
        row(
            "steady state: median overhead",
            lambda r: "-" if r.get("overhead_median") is None else f"{100 * r['overhead_median']:.1f}%",
        ),
        row(
            "steady state: median step vs median limit (text head on)",
            lambda r: (
                "-"
                if r.get("step_median_ms") is None or r.get("limit_median_ms") is None
                else f"{100 * (r['step_median_ms'] / r['limit_median_ms'] - 1):+.1f}%"
            ),
        ),
        row("slowest decode ms", lambda r: _ms(r.get("decode_max_ms"), 0)),
        row("step vs limit (text head on)", lambda r: f"{100 * r['vs_limit']:+.1f}%"),
        row(
            "time to first audio ms (bound)",
            lambda r: f"{_ms(r['ttfa_ms'], 0)} ({_ms(r['ttfa_bound_ms'], 0)})",
        ),
        row("reference voice frames", lambda r: str(r.get("voice_frames", 0))),
        row(
            "first request: prefilled / prompt rows, prefill ms",
            lambda r: f"{r.get('prefilled_rows', '-')} / {r['prompt_rows']}, {_ms(r['prefill_ms'], 0)}",
        ),
        row(
            "repeat request (same voice, another text): prefilled / prompt rows, prefill ms",
            lambda r: (
                f"{r.get('repeat_prefilled_rows', '-')} / {r.get('repeat_prompt_rows', '-')}, "
                f"{_ms(r.get('repeat_prefill_ms'), 0)}"
            ),
        ),
        row(
            "repeat request: time to first audio ms (bound)",
            lambda r: f"{_ms(r.get('repeat_ttfa_ms'), 0)} ({_ms(r.get('repeat_ttfa_bound_ms'), 0)})",
        ),
        row("real-time factor (steady state)", lambda r: f"{_ms(r['rtf'], 2)} ({r['rtf_steady']:.2f})"),
        row(
            "peak RSS MiB (budget)",
            lambda r: f"{r['peak_rss_mib']:.0f} ({r['rss_budget_bytes'] / mib:.0f})",
        ),
        row(
            "budget: GGUF + fp16 tables + KV + decode graph and state + slack, MiB",
            lambda r: " + ".join(
                "-" if value is None else f"{value / mib:.0f}"
                for value in (
                    r.get("gguf_bytes"),
                    r.get("fp16_npy_bytes"),
                    r.get("kv_cache_bytes"),
                    r.get("codec_resident_bytes"),
                    BUDGET_SLACK,
                )
            ),
        ),
        row(
            "dialogue's next piece: prefilled / prompt rows, prefill ms (carried frames)",
            lambda r: (
                "-"
                if "dialogue_carried_ms" not in r
                else f"{r['dialogue_carried_rows']} / {r['dialogue_carried_prompt_rows']}, "
                f"{_ms(r['dialogue_carried_ms'], 0)} ({r['dialogue_carried_frames']})"
            ),
        ),
        row(
            "the same piece not carried: prefilled / prompt rows, prefill ms",
            lambda r: (
                "-"
                if "dialogue_alone_ms" not in r
                else f"{r['dialogue_alone_rows']} / {r['dialogue_alone_prompt_rows']}, {_ms(r['dialogue_alone_ms'], 0)}"
            ),
        ),
        row("load average before / after", lambda r: f"{r['load_before'][0]:.2f} / {r['load_after'][0]:.2f}"),
        row(
            "other processes' CPU during the run",
            lambda r: "-" if r.get("foreign_cpu") is None else f"{100 * r['foreign_cpu']:.0f}% of the machine",
        ),
    ]
    info = machine_info()
    threads = sorted({r["threads"] for r in results})
    lines.append("")
    lines.append(
        f"{info['cpu']}, {info['cores']} cores, {info['memory_gb']} GB; threads {', '.join(threads)}; "
        f"codec: {results[0]['codec'] if results else '-'}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))), flush=True)
    else:
        sys.exit("usage: python -m moss_tts_node bench ... (the worker entry is internal)")
