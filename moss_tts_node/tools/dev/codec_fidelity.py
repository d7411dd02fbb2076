"""``codec-fidelity``: how far windowed and streamed decodes are from one offline decode, and what streaming costs.

Run by hand (not in CI) on a codec directory, e.g. ``../shared/codec-tiny`` (the real architecture,
tiny): random codes are decoded in one call, then in windows overlapping by a number of attention
spans, then as the synthesizer streams them (``WindowedStreamDecoding``) for each left context and
chunk size; each is compared with the one-call decode. Left contexts are given in attention spans,
so a setting measured on a codec with a short span stands for the same setting of the full-size one
(span 125 frames). The streaming cost is not measured here: it comes from the full-size decoder's
per-call times (``FULL_SIZE_CALL_MS``), as the codec's real-time factor at each full-size setting.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

# Full-size decoder (random weights, ONNX Runtime, 2 threads, a 2-core CPU): frames per call -> ms
# per call. docs/stream-decoder.md, "The windowed scheme", gives the machine and date.
FULL_SIZE_CALL_MS = ((1, 137.0), (6, 237.0), (26, 698.0), (30, 783.0), (100, 2750.0))
OVERLAP_SPANS = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)
LEFT_CONTEXT_SPANS = (0.0, 0.2, 0.4, 1.0, 2.0, 4.0)
CHUNK_FRAMES = (1, 2, 5, 10, 25)


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``codec-fidelity`` to the CLI (cli.main.EXTRA_COMMAND_MODULES)."""
    parser = commands.add_parser(
        "codec-fidelity",
        help="measure windowed and streamed decodes against one offline decode (by hand, not in CI)",
        description="Print SNR tables of windowed and streamed decodes vs one call, and streaming's real-time factor.",
    )
    parser.add_argument("--codec-dir", required=True, type=Path, help="directory with decoder.onnx (and config.json)")
    parser.add_argument("--frames", type=int, default=240, help="random code frames to decode")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the codes")
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime threads")
    parser.set_defaults(run=run)


def snr_db(signal: np.ndarray, reference: np.ndarray) -> float:
    """10 log10(reference energy / error energy); inf when equal."""
    error = np.sum(np.square(signal - reference, dtype=np.float64))
    energy = np.sum(np.square(reference, dtype=np.float64))
    return float("inf") if error == 0 else float(10 * np.log10(energy / error))


def full_size_call_ms(frames: int) -> float:
    """A full-size decoder call's time, interpolated (extrapolated past the last point along its slope)."""
    sizes, ms = zip(*FULL_SIZE_CALL_MS, strict=True)
    if frames <= sizes[-1]:
        return float(np.interp(frames, sizes, ms))
    slope = (ms[-1] - ms[-2]) / (sizes[-1] - sizes[-2])
    return ms[-1] + slope * (frames - sizes[-1])


def stream_rtf(left_context: int, chunk_frames: int, frame_seconds: float) -> float:
    """Steady-state codec time per audio time when every call decodes context + chunk frames."""
    return full_size_call_ms(left_context + chunk_frames) / 1000.0 / (chunk_frames * frame_seconds)


def run(args: argparse.Namespace) -> int:
    from moss_tts_node.codec.base import PUBLISHED_ATTENTION_SPAN_FRAMES, run_windowed
    from moss_tts_node.codec.onnx import OnnxCodec
    from moss_tts_node.codec.quantizer import CODEBOOK_SIZE
    from moss_tts_node.codec.streaming import SegmentDecoder, WindowedStreamDecoding
    from moss_tts_node.model.rates import FRAMES_PER_SECOND

    codec = OnnxCodec(args.codec_dir / "decoder.onnx", provider="cpu", threads=args.threads)
    span = codec.attention_span_frames
    codes = np.random.default_rng(args.seed).integers(0, CODEBOOK_SIZE, size=(args.frames, codec.n_quantizers))
    offline = codec.decode(codes)
    peak = float(np.abs(offline).max())
    print(f"{args.codec_dir}: attention span {span} frames; {args.frames} random frames; offline peak {peak:.3g}")

    def decode_window(window: np.ndarray) -> np.ndarray:
        return codec.decode(window).reshape(-1, codec.samples_per_frame)

    print("\nwindows of (overlap + 4 spans) frames vs one call")
    print("| overlap (spans) | overlap (frames) | SNR dB | max abs error |")
    print("|---|---|---|---|")
    for spans in OVERLAP_SPANS:
        overlap = round(spans * span)
        windowed = run_windowed(codes, overlap + 4 * span, decode_window, overlap).reshape(-1)
        print(f"| {spans:g} | {overlap} | {snr_db(windowed, offline):.1f} | {np.abs(windowed - offline).max():.2g} |")

    frame_seconds = 1.0 / FRAMES_PER_SECOND
    print(
        "\nstream vs offline decode: SNR dB here | full-size codec real-time factor "
        f"(span {PUBLISHED_ATTENTION_SPAN_FRAMES})"
    )
    print(
        "| left context (spans) | frames here | frames full size | "
        + " | ".join(f"chunk {c}" for c in CHUNK_FRAMES)
        + " |"
    )
    print("|---" * (3 + len(CHUNK_FRAMES)) + "|")
    for spans in LEFT_CONTEXT_SPANS:
        here, full = round(spans * span), round(spans * PUBLISHED_ATTENTION_SPAN_FRAMES)
        cells = []
        for chunk_frames in CHUNK_FRAMES:
            decoder = SegmentDecoder(WindowedStreamDecoding(codec, here), chunk_frames)
            pieces = [decoder.push(frame) for frame in codes]
            pieces.append(decoder.end_segment())
            streamed = np.concatenate([piece for piece in pieces if piece is not None])
            cells.append(f"{snr_db(streamed, offline):.1f} dB, {stream_rtf(full, chunk_frames, frame_seconds):.2f}x")
        print(f"| {spans:g} | {here} | {full} | " + " | ".join(cells) + " |")
    print(
        f"\none offline call of 100 frames at full size: {stream_rtf(0, 100, frame_seconds):.2f}x real time "
        "(the whole-utterance decode)"
    )
    return 0
