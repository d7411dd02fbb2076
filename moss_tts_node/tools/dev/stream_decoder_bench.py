"""Time the stream decoder at the codec's full size, by hand.

Run as ``python -m moss_tts_node.tools.dev.stream_decoder_bench CONFIG WORK_DIR``.

Writes a random checkpoint of the published shape (decode path only; initialized as the codec's library
initializes a new model, docs/stream-decoder.md "Test weights": its audio means nothing, its activations
have a realistic scale), builds the stream decoder graph in each precision, and prints the codec's cost
per frame of audio (and the real-time factor) streaming in chunks of 1 to 25 frames, with 1 and 2
threads, next to the stateless scheme that re-decodes 25 frames of left context with every 5 new ones.
Rounds over every graph and thread count are interleaved so that the load of a shared machine hits all
alike; the 1-minute load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moss_tts_node.codec.base import CODEBOOK_SIZE, AudioCodec
from moss_tts_node.codec.stream_decoder import StreamDecoder
from moss_tts_node.model.rates import FRAMES_PER_SECOND
from moss_tts_node.tools.prepare.safetensors_io import write_safetensors
from moss_tts_node.tools.prepare.stream_decoder_build import PRECISIONS, build_stream_decoder
from moss_tts_node.tools.prepare.stream_decoder_checkpoint import Patch, read_codec_config

CHUNKS = (1, 2, 5, 10, 25)
STATELESS_NEW, STATELESS_CONTEXT = 5, 25  # the scheme the stream decoder replaces
# The codec's library initializes its weights this way (docs/stream-decoder.md, "Test weights"): every
# nn.Linear and nn.Embedding weight normal with std 0.02, norms 1 and 0, each layer scale at the value
# config.json gives; the weight-normed 1x1 convolutions keep torch's own init (v uniform within
# 1/sqrt(fan in), g = |v| per output channel), their biases zeroed.
WEIGHT_STD = 0.02


@dataclass(frozen=True)
class _RandomTensor:
    """A tensor made only when written, so a 3.5 GB checkpoint never sits in memory whole.

    ``kind``: "normal" (std WEIGHT_STD), "fill" (every element ``value``), "conv_v" (a weight-normed
    convolution's direction: uniform within 1/sqrt(fan in)) or "conv_g" (its magnitude: the norm of each
    output channel of the "conv_v" tensor made from the same seed, shape ``v_shape``).
    """

    shape: tuple[int, ...]
    kind: str
    seed: int
    value: float = 0.0
    v_shape: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        if self.kind == "normal":
            values = rng.standard_normal(self.shape, dtype=np.float32) * np.float32(WEIGHT_STD)
        elif self.kind == "conv_v":
            values = _conv_direction(rng, self.shape)
        elif self.kind == "conv_g":
            direction = _conv_direction(rng, self.v_shape)
            values = np.sqrt(np.sum(np.square(direction, dtype=np.float64), axis=(1, 2), keepdims=True))
            values = values.astype(np.float32)
        else:
            values = np.full(self.shape, self.value, dtype=np.float32)
        return values if dtype is None else values.astype(dtype)


def _conv_direction(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """torch's nn.Conv1d weight init (kaiming uniform with a = sqrt(5)): uniform within 1/sqrt(fan in)."""
    bound = 1 / np.sqrt(np.prod(shape[1:]))
    return rng.uniform(-bound, bound, shape).astype(np.float32)


def write_random_codec(config_path: Path, out_dir: Path) -> Path:
    """A checkpoint directory with ``config_path``'s config and random decode-path weights in the published
    layout, initialized as the codec's library initializes a new model."""
    spec = read_codec_config(config_path)
    tensors: dict[str, _RandomTensor] = {}

    def add(name: str, shape: tuple[int, ...], kind: str = "normal", value: float = 0.0) -> None:
        tensors[name] = _RandomTensor(shape, kind, zlib.crc32(name.encode()), value)

    def add_weight_normed(prefix: str, out_dim: int, in_dim: int) -> None:
        direction = f"{prefix}.parametrizations.weight.original1"
        add(f"{prefix}.bias", (out_dim,), "fill", 0.0)
        add(direction, (out_dim, in_dim, 1), "conv_v")
        seed = tensors[direction].seed
        tensors[f"{prefix}.parametrizations.weight.original0"] = _RandomTensor(
            (out_dim, 1, 1), "conv_g", seed, v_shape=(out_dim, in_dim, 1)
        )

    for i in range(AudioCodec.n_quantizers):  # read_codec_config refuses any other count
        add(f"quantizer.quantizers.{i}.codebook.weight", (CODEBOOK_SIZE, spec.codebook_dim))
        add_weight_normed(f"quantizer.quantizers.{i}.out_proj", spec.rvq_dim, spec.codebook_dim)
    add_weight_normed("quantizer.output_proj", spec.quantizer_output_dim, spec.rvq_dim)
    for stage in spec.decoder:
        if isinstance(stage, Patch):
            continue
        width = stage.d_model
        if stage.input_dim != width:
            add(f"{stage.prefix}.input_proj.weight", (width, stage.input_dim))
        if stage.output_dim != width:
            add(f"{stage.prefix}.output_proj.weight", (stage.output_dim, width))
        for layer in range(stage.layers):
            prefix = f"{stage.prefix}.transformer.layers.{layer}"
            add(f"{prefix}.self_attn.in_projs.0.weight", (3 * width, width))
            add(f"{prefix}.self_attn.out_projs.0.weight", (width, width))
            add(f"{prefix}.linear1.weight", (stage.ffn, width))
            add(f"{prefix}.linear2.weight", (width, stage.ffn))
            for norm in ("norm1", "norm2"):
                add(f"{prefix}.{norm}.weight", (width,), "fill", 1.0)
                add(f"{prefix}.{norm}.bias", (width,), "fill", 0.0)
            if stage.layer_scale is not None:
                add(f"{prefix}.layer_scale_1.scale", (width,), "fill", stage.layer_scale)
                add(f"{prefix}.layer_scale_2.scale", (width,), "fill", stage.layer_scale)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(config_path.read_text(encoding="utf-8"), encoding="utf-8")
    write_safetensors(out_dir / "model.safetensors", tensors, "F32")  # array-likes, made as they are written
    return out_dir


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


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; peak RSS {_peak_rss_mb():.0f} MB")
    print(f"codec ms per frame (a frame is {frame_ms:.0f} ms of audio; real-time factor in brackets), per round:")
    for (precision, threads, scheme), values in results.items():
        figures = "  ".join(f"{value:6.1f} ({value / frame_ms:.2f}x)" for value in values)
        print(f"  {precision:14s} {threads} thr  {scheme:14s} {figures}")


if __name__ == "__main__":
    main()
