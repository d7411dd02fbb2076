"""Time the stream decoder at the codec's full size, by hand.

Run as ``python -m moss_tts_node.tools.dev.stream_decoder_bench CONFIG WORK_DIR``.

Writes a random checkpoint of the published shape (``random_codec``: decode path only; initialized as the
codec's library initializes a new model, docs/stream-decoder.md "Test weights": its audio means nothing,
its activations have a realistic scale), builds the stream decoder graph in each precision, and prints the codec's cost
per frame of audio (and the real-time factor) streaming in chunks of 1 to 25 frames, with 1 and 2
threads, next to the stateless scheme that re-decodes 25 frames of left context with every 5 new ones.
Rounds over every graph and thread count are interleaved so that the load of a shared machine hits all
alike; the 1-minute load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from moss_tts_node.codec.base import CODEBOOK_SIZE, AudioCodec
from moss_tts_node.codec.stream_decoder import StreamDecoder
from moss_tts_node.model.rates import FRAMES_PER_SECOND
from moss_tts_node.tools.dev.random_codec import write_random_codec
from moss_tts_node.tools.dev.resources import peak_rss_mib
from moss_tts_node.tools.prepare.stream_decoder_build import PRECISIONS, build_stream_decoder

CHUNKS = (1, 2, 5, 10, 25)
STATELESS_NEW, STATELESS_CONTEXT = 5, 25  # the scheme the stream decoder replaces


def _seconds_per_call(decoder: StreamDecoder, pieces: list[np.ndarray], reset_each_call: bool) -> float:
    """Median wall time of one ``decode`` call over ``pieces`` fed in order (the first call is untimed)."""
    decoder.reset()
    decoder.decode(pieces[0])
    times = []
    for piece in pieces[1:]:
        if reset_each_call:
            decoder.reset()
        began = time.perf_counter()
        decoder.decode(piece)
        times.append(time.perf_counter() - began)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path, help="the codec's config.json (e.g. codec-tiny/real-config.json)")
    parser.add_argument("work_dir", type=Path, help="where the random checkpoint and the graphs go (about 10 GB)")
    parser.add_argument("--precision", nargs="*", choices=PRECISIONS, default=list(PRECISIONS), help="graphs to time")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2], help="ONNX Runtime intra-op threads")
    parser.add_argument("--chunks", type=int, nargs="*", default=list(CHUNKS), help="frames per call")
    parser.add_argument("--frames", type=int, default=61, help="frames streamed per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds over every graph")
    args = parser.parse_args()
    if args.frames < 2 * max(args.chunks) + 1:  # the first call of each measurement is not timed
        parser.error(f"--frames must be at least {2 * max(args.chunks) + 1} for chunks of {max(args.chunks)}")

    checkpoint = args.work_dir / "checkpoint"
    if not (checkpoint / "model.safetensors").is_file():
        write_random_codec(args.config, checkpoint)
    graphs = {}
    for precision in args.precision:
        path = args.work_dir / f"stream-decoder-{precision}.onnx"
        if not path.is_file():
            began = time.perf_counter()
            build_stream_decoder(checkpoint, path, precision=precision)
            print(f"built {path} in {time.perf_counter() - began:.0f} s", flush=True)
        graphs[precision] = path

    frame_ms = 1000 / FRAMES_PER_SECOND
    codes = np.random.default_rng(0).integers(0, CODEBOOK_SIZE, (args.frames, AudioCodec.n_quantizers))
    window = STATELESS_CONTEXT + STATELESS_NEW
    results: dict[tuple[str, int, str], list[float]] = {}  # (precision, threads, scheme): ms per frame, per round
    for round_index in range(args.rounds):
        for threads in args.threads:
            print(f"round {round_index + 1}, {threads} threads: load average {os.getloadavg()[0]:.2f}", flush=True)
            # One graph at a time in memory: a full-size fp32 graph holds 3.5 GB.
            for precision, path in graphs.items():
                decoder = StreamDecoder(path, threads=threads)
                for chunk in args.chunks:
                    pieces = [codes[start : start + chunk] for start in range(0, args.frames - chunk + 1, chunk)]
                    ms = 1000 * _seconds_per_call(decoder, pieces, reset_each_call=False) / chunk
                    results.setdefault((precision, threads, f"chunk {chunk}"), []).append(ms)
                # Stateless: each call decodes 25 old frames again to produce 5 new ones.
                ms = 1000 * _seconds_per_call(decoder, [codes[:window]] * 3, reset_each_call=True) / STATELESS_NEW
                results.setdefault((precision, threads, f"stateless {STATELESS_NEW}+{STATELESS_CONTEXT}"), []).append(
                    ms
                )
                del decoder
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; peak RSS {peak_rss_mib():.0f} MiB")
    print(f"codec ms per frame (a frame is {frame_ms:.0f} ms of audio; real-time factor in brackets), per round:")
    for (precision, threads, scheme), values in results.items():
        figures = "  ".join(f"{value:6.1f} ({value / frame_ms:.2f}x)" for value in values)
        print(f"  {precision:14s} {threads} thr  {scheme:14s} {figures}")


if __name__ == "__main__":
    main()
