"""``python -m moss_tts_node bench-text-stream``: an LLM's reply spoken while it is written (docs/usage.md,
"Streamed text").

Run by hand, not in CI. One process loads the model (the 1.7B bench model of ``bench`` by default), prepares a
voice of ``--voice-seconds`` of random codes as the node does at start-up, then for each ``--rates`` value
feeds a reply of several sentences to ``Synthesizer.stream_text`` at that many fragments per second from a
producer thread, and reports:

- the time from the first fragment to the first audio;
- for each piece (a sentence, or sentences packed to ``--pack`` tokens): from its last fragment to its first
  audio, split into the wait before its synthesis began (the next word, which settles the cut, and the
  pieces before it still being synthesized) and its synthesis up to its first audio, against the bound
  prefill(its rows) + the first frame's steps (``ModelSpec.first_frame_budget``) + one chunk decode;
- the time a player that starts on the first chunk would run dry (synthesis slower than speech);

next to waiting for the whole reply: the time the last fragment arrives plus ``stream()``'s time to first
audio for the whole text (measured in the same process, after the streamed runs).

A fragment is a word with the spaces before it, or a mark: about one of Qwen's tokens in English text. The
bench models carry the demo's small tokenizer, which splits English text about three times finer than
Qwen's: their prompts have that many more rows to prefill (so the prefill figures are pessimistic), and the
cuts and packs count fragments instead, as Qwen's tokens would be counted. Random weights never end a
sentence, so each piece is given the steps its text would take: the first frame's (as many as the model has
codebooks), then three a fragment.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

REPLY = (
    "Sure, I can help with that. The kitchen is past the blue door. The coffee machine is by the sink. "
    "Please be careful, the floor is wet. Let me know if you need anything!"
)
FRAMES_PER_TOKEN = 3  # about three 80 ms frames per text token at a normal pace (text/pieces.py)
_FRAGMENT = re.compile(r"\s*\w+|\s*[^\w\s]")  # a word with the spaces before it, or a mark


def register(commands: Any) -> None:
    bench = commands.add_parser("bench-text-stream", help="measure speaking an LLM's reply as it is written (by hand)")
    bench.add_argument("--config", type=Path, help="params file (default: the 1.7B bench model, built if need be)")
    bench.add_argument("--rates", default="15,30", help="fragments (tokens) per second, comma-separated")
    bench.add_argument("--voice-seconds", type=float, default=10.0, help="reference voice of random codes (s)")
    bench.add_argument(
        "--pack", default="0,-1", help="pack_tokens values to compare, comma-separated (-1: the default)"
    )
    bench.add_argument("--threads", type=int, default=2, help="llama.cpp threads, default 2")
    bench.add_argument("--seed", type=int, default=1, help="seed of every run and of the random voice")
    bench.add_argument("--text", default=REPLY, help="the reply fed in as fragments")
    bench.set_defaults(run=run_text_stream_bench)


def run_text_stream_bench(args: argparse.Namespace) -> int:
    from moss_tts_node.config import load_config
    from moss_tts_node.model.rates import frames_for_seconds
    from moss_tts_node.synthesis.feed import TextFeed
    from moss_tts_node.synthesis.text_stream import PACK_TOKENS, RUN_TOKENS
    from moss_tts_node.synthesizer import Synthesizer
    from moss_tts_node.text.cutter import TextCutter
    from moss_tts_node.text.normalize import normalize_text
    from moss_tts_node.text.prompt import PromptFields
    from moss_tts_node.tools.dev.bench_models import ensure_bench_model

    config_path = args.config or ensure_bench_model("1.7b", threads=args.threads)
    config = load_config(config_path, {"llama.n_threads": args.threads, "audio.codec_threads": args.threads})
    with Synthesizer(config) as synth:
        frames = frames_for_seconds(args.voice_seconds)
        voice = np.random.default_rng(args.seed).integers(0, synth.spec.audio_vocab_size, (frames, synth.spec.n_vq))
        fields = {"language": "en", "voice": voice, "seed": args.seed}
        fragments = _FRAGMENT.findall(args.text)
        if "".join(fragments) != args.text:
            raise SystemExit("--text must not end in spaces")
        _as_with_real_weights(synth)
        prefix = synth.prompts.voice_prefix(PromptFields(text="", language="en"), [voice]).shape[0]
        # every codebook's head once (the delay pattern brings one more in each step): the weights paged in
        list(synth.stream("Warm up.", max_new_tokens=48, **fields))
        for rate, pack in ((float(rate), int(pack)) for rate in args.rates.split(",") for pack in args.pack.split(",")):
            pack = min(pack, RUN_TOKENS) if pack >= 0 else PACK_TOKENS
            cutter = TextCutter(normalize_text, RUN_TOKENS, synth.planner.count_tokens, pack)
            cutter.push(args.text)
            sentences = cutter.cut(ended=True)
            rows = [
                synth.prompts.build(PromptFields(text=s, language="en"), [voice]).shape[0] - prefix for s in sentences
            ]
            print(f"\n{rate:g} fragments/s, pack_tokens {pack}: {len(fragments)} fragments in {len(sentences)} pieces")
            synth.prepare_voice(language="en", voice=voice)  # as the node does: each piece prefills its text
            feed = TextFeed()
            put_at: list[float] = []

            def produce(rate: float = rate, feed: TextFeed = feed, put_at: list[float] = put_at) -> None:
                start = time.perf_counter()
                for number, fragment in enumerate(fragments):
                    time.sleep(max(0.0, start + number / rate - time.perf_counter()))
                    put_at.append(time.perf_counter())
                    feed.put(fragment)
                feed.close()

            stream = synth.stream_text(feed, pack_tokens=pack, **fields)
            chunks: list[tuple[float, float]] = []  # (arrival, seconds of audio)
            producer = threading.Thread(target=produce)
            producer.start()
            for chunk in stream:
                chunks.append((time.perf_counter(), chunk.samples.shape[0] / chunk.sample_rate))
            producer.join()
            _report_stream(
                args.text, fragments, sentences, rows, put_at, chunks, stream.clock, synth.spec.first_frame_budget
            )
        synth.prepare_voice(language="en", voice=voice)
        whole = synth.stream(args.text, **fields)  # the whole reply as one piece, after the whole of it came
        arrivals = [(time.perf_counter(), chunk.samples.shape[0] / chunk.sample_rate) for chunk in whole]
        assert whole.report is not None and whole.report.time_to_first_audio_s is not None
        print(f"\nthe whole reply as one piece: {_dry_spells(arrivals)}")
        for rate in sorted({float(value) for value in args.rates.split(",")}):
            written = (len(fragments) - 1) / rate
            print(
                f"waiting for the whole reply at {rate:g} tokens/s: its last fragment after {written:.2f} s, then "
                f"stream()'s first audio {whole.report.time_to_first_audio_s:.2f} s later (prefill of "
                f"{whole.report.prefilled_rows} rows {whole.report.prefill_ms / 1000:.2f} s): first audio at "
                f"{written + whole.report.time_to_first_audio_s:.2f} s"
            )
    return 0


def _as_with_real_weights(synth: Any) -> None:
    """This instance's planner counts a text's tokens as Qwen's tokenizer about would (its fragments), for the
    cuts and packs, and gives each piece the steps its text would take, the first frame's and FRAMES_PER_TOKEN a
    fragment: random weights never end a sentence of their own."""
    plan = synth.planner.plan

    def planned(fields: Any, voice: Any, max_new_tokens: int, *rest: Any) -> Any:
        steps = synth.spec.first_frame_steps + FRAMES_PER_TOKEN * len(_FRAGMENT.findall(fields.text))
        return plan(fields, voice, min(steps, max_new_tokens), *rest)

    synth.planner.plan = planned
    synth.planner.count_tokens = lambda text: len(_FRAGMENT.findall(text))


def _report_stream(
    text: str,
    fragments: list[str],
    sentences: list[str],
    rows: list[int],
    put_at: list[float],
    chunks: list[tuple[float, float]],
    clock: Any,
    bound_steps: int,
) -> None:
    """Print one streamed run's figures (see the module docstring); ``bound_steps``: the steps the bound on a
    piece's first audio counts for its first frame (``ModelSpec.first_frame_budget``)."""
    t0 = put_at[0]
    prefills = clock.calls["prefill"]
    step_starts = [start for start, _ in clock.calls["heads"]]
    step_s = float(np.median(np.diff(step_starts)[40:])) if len(step_starts) > 50 else float("nan")
    chunk_s = float(np.median([seconds for _, seconds in clock.calls["codec"]]))
    print(f"first audio {chunks[0][0] - t0:.2f} s after the first fragment")
    print(f"  step {step_s * 1000:.1f} ms (median), chunk decode {chunk_s * 1000:.1f} ms (median)")
    ends = _last_fragments(text, fragments, sentences)
    for number, (sentence, (prefill_start, prefill_s)) in enumerate(zip(sentences, prefills, strict=False)):
        first = next(arrival for arrival, _ in chunks if arrival > prefill_start + prefill_s)
        written = put_at[ends[number]]
        bound = prefill_s + bound_steps * step_s + chunk_s  # the delay pattern's steps up to frame 0
        print(
            f"  piece {number + 1} ({rows[number]} rows to prefill): last fragment at {written - t0:5.2f} s, "
            f"first audio {first - written:5.2f} s later = wait {prefill_start - written:5.2f} s + synthesis "
            f"{first - prefill_start:4.2f} s (bound {bound:4.2f} s: prefill {prefill_s:4.2f} s + {bound_steps} steps "
            "+ a chunk)"
            f"  {sentence[:40]!r}"
        )
    print(f"  {_dry_spells(chunks)}")


def _dry_spells(chunks: list[tuple[float, float]]) -> str:
    """The audio of ``chunks`` ((arrival, seconds) each), and how long a player starting on the first runs dry."""
    dry, spells, playing_until = 0.0, 0, chunks[0][0]
    for arrival, seconds in chunks:
        if arrival > playing_until + 0.01:
            dry += arrival - playing_until
            spells += 1
        playing_until = max(playing_until, arrival) + seconds
    audio = sum(seconds for _, seconds in chunks)
    return f"audio {audio:.2f} s; a player starting on the first chunk runs dry {dry:.2f} s in {spells} spells"


def _last_fragments(text: str, fragments: list[str], sentences: list[str]) -> list[int]:
    """For each sentence, the index of the fragment that holds its last character in the raw ``text``."""
    ends, position = [], 0
    starts = np.cumsum([0, *map(len, fragments)])
    for sentence in sentences:
        position = text.index(sentence[-1], position + len(sentence) - 1) + 1  # the sentence's final mark
        ends.append(int(np.searchsorted(starts, position, side="left")) - 1)
    return ends
