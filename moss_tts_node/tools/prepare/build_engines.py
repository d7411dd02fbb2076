"""``python -m moss_tts_node build-engines``: TensorRT engines of the codec for this GPU."""

from __future__ import annotations

import argparse
from pathlib import Path

from moss_tts_node.codec.engines import METADATA_FILE, build_engines
from moss_tts_node.codec.quantizer import CODEC_QUANTIZERS
from moss_tts_node.model.rates import MAX_CODEC_SECONDS


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``build-engines`` to the CLI (cli.main.EXTRA_COMMAND_MODULES)."""
    parser = commands.add_parser(
        "build-engines",
        help="build TensorRT engines of the codec for this GPU (TF32)",
        description="Build TensorRT engines of the codec from its ONNX files, for this GPU and TensorRT.",
    )
    parser.add_argument("--decoder", required=True, type=Path, help="decoder.onnx of MOSS-Audio-Tokenizer-ONNX")
    parser.add_argument(
        "--encoder", type=Path, help="encoder.onnx (only needed to clone voices from audio clips on this machine)"
    )
    parser.add_argument("--out", required=True, type=Path, help="directory for the engines and engines.json")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=MAX_CODEC_SECONDS,
        help=f"longest audio one engine call takes (default {MAX_CODEC_SECONDS:g}); longer audio is windowed",
    )
    parser.add_argument(
        "--quantizers",
        type=int,
        default=CODEC_QUANTIZERS,
        help=f"the model's codebooks (its config.json's n_vq): {CODEC_QUANTIZERS} for MOSS-TTS (default), 16 for "
        "MOSS-TTSD, MOSS-VoiceGenerator and MOSS-SoundEffect (docs/family.md)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    engines = build_engines(args.decoder, args.out, args.max_seconds, args.encoder, args.quantizers)
    print(
        f"wrote {args.out / METADATA_FILE}: TensorRT {engines.tensorrt_version}, {engines.gpu.name} "
        f"(compute capability {engines.gpu.compute_capability}), up to {engines.max_seconds:g} s "
        f"({engines.max_frames} frames), {engines.n_quantizers} quantizers, {engines.precision}"
    )
    return 0
