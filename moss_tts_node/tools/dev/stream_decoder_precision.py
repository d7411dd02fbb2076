"""Which stream decoder weights can be 8-bit: each group's cost in fidelity, then a mix, by hand.

Run as ``python -m moss_tts_node.tools.dev.stream_decoder_precision CHECKPOINT WORK_DIR``.

``CHECKPOINT`` is a codec checkpoint directory (``random_codec.write_random_codec`` writes a random one of
the published shape, initialized as the codec's library initializes it). For each group of weight MatMuls
(a stage's attention projections, its output projection, each feed-forward matrix, the in/out
projections, a quarter of the first stage's layers, everything) a graph is built with that group 8-bit
(``WeightPrecision``: MatMulNBits, int8 activations per row and block) and the rest float32, and its
decode of ``--frames`` random frames in one call is compared with the float32 graph's (the offline
decode): SNR in dB. Errors this small add up as noise powers, so the table also predicts what a union
of groups gives. ``--mix REGEX`` then checks one mix as streams use it: chunks of 1, 5 and 25 frames
over ``--stream-frames`` against the float32 offline decode, and how much the output depends on the
chunking. One graph is built at a time (3.5 GB at full size) and deleted after its measurement.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import numpy as np

from moss_tts_node.codec.quantizer import CODEBOOK_SIZE, CODEC_QUANTIZERS
from moss_tts_node.codec.stream_decoder import StreamDecoder
from moss_tts_node.tools.dev.codec_fidelity import snr_db
from moss_tts_node.tools.prepare.stream_decoder_build import write_graph
from moss_tts_node.tools.prepare.stream_decoder_layers import WeightPrecision

_LAYERS = r"decoder\.{stage}\.transformer\.layers\.\d+\."
# (label, pattern over weight names); decoder.0/2/4/6 are the four Transformer stages (12.5 to 100 Hz).
GROUPS = [
    *(
        (f"stage {stage} {kind}", _LAYERS.format(stage=stage) + pattern)
        for stage in (0, 2, 4, 6)
        for kind, pattern in (
            ("q/k/v", r"self_attn\.in_proj"),
            ("attn out", r"self_attn\.out_proj"),
            ("ffn in", r"linear1"),
            ("ffn out", r"linear2"),
        )
    ),
    ("quantizer projection", r"quantizer\.output_proj"),
    ("stage input projections", r"decoder\.\d+\.input_proj"),
    ("last output projection", r"decoder\.6\.output_proj"),
    *(
        (
            f"stage 0 layers {first}-{first + 7}",
            rf"decoder\.0\.transformer\.layers\.({'|'.join(map(str, range(first, first + 8)))})\..*",
        )
        for first in (0, 8, 16, 24)
    ),
    ("all", r".*"),
]


def _decode(graph: Path, codes: np.ndarray, chunk: int, threads: int) -> np.ndarray:
    decoder = StreamDecoder(graph, threads=threads)
    return np.concatenate([decoder.decode(codes[start : start + chunk]) for start in range(0, len(codes), chunk)])


def _build(checkpoint: Path, path: Path, pattern: str | None, block: int) -> Path:
    weights = None if pattern is None else WeightPrecision(lambda name: re.fullmatch(pattern, name) is not None, block)
    write_graph(checkpoint, path, "window", weights)
    return path


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(f"{path.name}.data").unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path, help="codec checkpoint directory (config.json + model.safetensors)")
    parser.add_argument("work_dir", type=Path, help="where the graphs go (the float32 one is kept)")
    parser.add_argument("--frames", type=int, default=60, help="frames decoded per group (one call)")
    parser.add_argument("--block", type=int, default=32, help="input channels per 8-bit scale")
    parser.add_argument("--groups", nargs="*", help="labels of GROUPS to measure (default: all)")
    parser.add_argument("--mix", help="a weight-name pattern to check at chunks 1, 5, 25 instead of the groups")
    parser.add_argument("--stream-frames", type=int, default=300, help="frames streamed for --mix")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    fp32 = args.work_dir / "fp32.onnx"
    if not fp32.is_file():
        _build(args.checkpoint, fp32, None, args.block)
    variant = args.work_dir / "variant.onnx"
    frames = args.stream_frames if args.mix else args.frames
    codes = np.random.default_rng(0).integers(0, CODEBOOK_SIZE, (frames, CODEC_QUANTIZERS))
    reference = _decode(fp32, codes, frames, args.threads)
    print(f"{frames} frames, 8-bit blocks of {args.block}; float32 output peak {np.abs(reference).max():.3g}")
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    if args.mix:
        try:
            _build(args.checkpoint, variant, args.mix, args.block)
            streams = {chunk: _decode(variant, codes, chunk, args.threads) for chunk in (1, 5, 25)}
        finally:
            _remove(variant)
        for chunk, audio in streams.items():
            print(f"  chunk {chunk:2d}: {snr_db(audio, reference):6.1f} dB against the float32 offline decode")
        spread = max(float(np.abs(streams[chunk] - streams[25]).max()) for chunk in (1, 5))
        print(f"  largest difference between chunkings: {spread:.2e}")
        return
    noise = {}
    for label, pattern in GROUPS:
        if args.groups and label not in args.groups:
            continue
        began = time.perf_counter()
        try:
            audio = _decode(_build(args.checkpoint, variant, pattern, args.block), codes, frames, args.threads)
        finally:
            _remove(variant)
        noise[label] = snr_db(audio, reference)
        print(f"  {label:24s} {noise[label]:6.1f} dB   ({time.perf_counter() - began:.0f} s)", flush=True)
    parts = [label for label in noise if label != "all" and not label.startswith("stage 0 layers")]
    if parts:
        predicted = -10 * np.log10(sum(10 ** (-noise[label] / 10) for label in parts))
        print(f"  sum of the {len(parts)} disjoint groups' noise powers: {predicted:.1f} dB")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
