"""Whether decoding on a thread of its own beside generation would pay, by hand.

Run as ``python -m moss_tts_node.tools.dev.decode_overlap_bench CONFIG GRAPH``: CONFIG a params file (a bench
model's, e.g. ``~/.cache/moss_tts_node/bench/1.7b/config.yaml``), GRAPH a full-size stream decoder.

The pipeline runs the backbone's steps and the stream decoder's calls one after the other on one thread
(each using every core). Both read memory hard, so on a CPU running them side by side only pays if one
leaves the memory or the cores idle for the other. This measures it on the real parts: the backbone's
steps (rows of a real generation, replayed with llama.cpp) and stream decoder calls of ``--chunk`` frames,
one call per ``--chunk`` steps as a stream makes them, either one after the other or the calls on a thread
of their own, with each thread count. Printed: ms per frame (one step and one chunk's share of a call), per
round, the settings taken in turn within a round; and the load average.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import numpy as np

from moss_tts_node.codec.quantizer import CODEBOOK_SIZE
from moss_tts_node.codec.stream_decoder import StreamDecoder
from moss_tts_node.config import load_config
from moss_tts_node.synthesizer import Synthesizer

TEXT = "Hello! I am a robot, and this is my voice. It is a fine day to test speech synthesis on a small computer."
# (label, backbone threads, decoder threads, whether the decoder runs on a thread of its own)
SETTINGS = (
    ("one after the other, 2 + 2 threads", 2, 2, False),
    ("side by side, 2 + 2 threads", 2, 2, True),
    ("side by side, 1 + 1 threads", 1, 1, True),
    ("one after the other, 1 + 1 threads", 1, 1, False),
)


class Backbone:
    """The backbone of a loaded synthesizer with ``threads`` llama.cpp threads, and the rows of one generation."""

    def __init__(self, config: Path, threads: int, steps: int) -> None:
        # No stream decoder in this synthesizer: the one measured is loaded apart, with its own thread count.
        self.synth = Synthesizer(load_config(config, {"llama.n_threads": threads, "audio.stream_decoder": "off"}))
        stream = self.synth.stream(TEXT, max_new_tokens=steps, seed=1)
        for _ in stream:
            pass
        with self.synth.stages.generation() as stage:
            self.backbone = stage.backbone
            self.rows = stage.embeddings.embed(stream.generated[:-1])
            self.prompt = stage.embeddings.embed(stream.prompt)

    def restart(self) -> None:
        self.backbone.clear()
        self.backbone.prefill(self.prompt)

    def steps(self, first: int, count: int) -> None:
        for i in range(first, first + count):
            self.backbone.decode(self.rows[i % len(self.rows)], text_logits=False)


def ms_per_frame(backbone: Backbone, decoder: StreamDecoder, calls: int, chunk: int, beside: bool) -> float:
    """Generate ``calls`` x ``chunk`` steps and decode them in ``calls`` calls, one after the other or beside."""
    codes = np.random.default_rng(0).integers(0, CODEBOOK_SIZE, ((calls + 1) * chunk, decoder.n_quantizers))
    decoder.reset()
    decoder.decode(codes[:chunk])  # allocates
    backbone.restart()

    def decode_all() -> None:
        for i in range(1, calls + 1):
            decoder.decode(codes[i * chunk : (i + 1) * chunk])

    began = time.perf_counter()
    if beside:
        thread = threading.Thread(target=decode_all)
        thread.start()
        backbone.steps(0, calls * chunk)
        thread.join()
    else:
        for i in range(1, calls + 1):
            backbone.steps(i * chunk, chunk)
            decoder.decode(codes[i * chunk : (i + 1) * chunk])
    return 1000 * (time.perf_counter() - began) / (calls * chunk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="params file of the model whose backbone runs")
    parser.add_argument("graph", type=Path, help="a full-size stream decoder graph")
    parser.add_argument("--chunk", type=int, default=5, help="frames per decoder call (audio.chunk_frames)")
    parser.add_argument("--calls", type=int, default=6, help="decoder calls per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    steps = args.calls * args.chunk + 40
    backbones = {threads: Backbone(args.config, threads, steps) for threads in (1, 2)}
    decoders = {threads: StreamDecoder(args.graph, threads=threads) for threads in (1, 2)}
    measures: dict[str, list[float]] = {}
    for round_index in range(args.rounds):
        for label, llama_threads, decoder_threads, beside in SETTINGS:
            backbone, decoder = backbones[llama_threads], decoders[decoder_threads]
            value = ms_per_frame(backbone, decoder, args.calls, args.chunk, beside)
            measures.setdefault(label, []).append(value)
        print(f"round {round_index + 1} done, load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"ms per frame (a step and 1/{args.chunk} of a call of {args.chunk} frames), per round:")
    for label, values in measures.items():
        print(
            f"  {label:38s} " + " / ".join(f"{value:.0f}" for value in values) + f"  (median {np.median(values):.0f})"
        )


if __name__ == "__main__":
    main()
