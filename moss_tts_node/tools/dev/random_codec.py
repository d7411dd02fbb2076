"""A random codec checkpoint of the real architecture, in the published layout, initialized as a new model.

``write_random_codec(config, out_dir)`` writes ``config.json`` (a copy of ``config``) and ``model.safetensors``
with the decode path's tensors (the quantizer and the decoder), shaped as the config says and made as the
codec's library makes a new model's (docs/stream-decoder.md, "Test weights"): no trained weights are at
hand, and a figure measured on weights of another scale would mean nothing (it sets the size of every
activation, and with it what 8-bit rounding costs). Its audio means nothing. The stream decoder builder
reads it as it reads the published checkpoint: the benches use the real codec's config
(``codec-tiny/real-config.json``), the demo weights ``tiny_codec_config``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.codec.quantizer import CODEBOOK_SIZE, CODEC_QUANTIZERS
from moss_tts_node.model.rates import SAMPLE_RATE, SAMPLES_PER_FRAME
from moss_tts_node.tools.prepare.safetensors_io import write_safetensors
from moss_tts_node.tools.prepare.stream_decoder_checkpoint import Patch, read_codec_config

# The codec's library initializes its weights this way (docs/stream-decoder.md, "Test weights"): every
# nn.Linear and nn.Embedding weight normal with std 0.02, norms 1 and 0, each layer scale at the value
# config.json gives; the weight-normed 1x1 convolutions keep torch's own init (v uniform within
# 1/sqrt(fan in), g = |v| per output channel), their biases zeroed.
WEIGHT_STD = 0.02


@dataclass(frozen=True)
class RandomTensor:
    """A tensor made only when written, so a 3.5 GB checkpoint never sits in memory whole.

    ``kind``: "normal" (std WEIGHT_STD times ``scale``), "fill" (every element ``value``), "conv_v" (a weight-normed
    convolution's direction: uniform within 1/sqrt(fan in)) or "conv_g" (its magnitude: the norm of each
    output channel of the "conv_v" tensor made from the same seed, shape ``v_shape``).
    """

    shape: tuple[int, ...]
    kind: str
    seed: int
    value: float = 0.0
    v_shape: tuple[int, ...] = ()
    scale: float = 1.0

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __array__(self, dtype: np.dtype | None = None, copy: bool | None = None) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        if self.kind == "normal":
            values = rng.standard_normal(self.shape, dtype=np.float32) * np.float32(WEIGHT_STD * self.scale)
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


class RandomTensors:
    """A random checkpoint being put together, tensor by tensor, in the library's initialization; each tensor's
    values come from its name and ``seed`` alone (seed 0: the values the codec benches have always used)."""

    def __init__(self, seed: int = 0) -> None:
        self.tensors: dict[str, RandomTensor] = {}
        self._seed = seed

    def _seed_of(self, name: str) -> int:
        return zlib.crc32(name.encode()) + (self._seed << 32)

    def add(
        self, name: str, shape: tuple[int, ...], kind: str = "normal", value: float = 0.0, scale: float = 1.0
    ) -> None:
        self.tensors[name] = RandomTensor(shape, kind, self._seed_of(name), value, scale=scale)

    def add_weight_normed(self, prefix: str, out_dim: int, in_dim: int) -> None:
        """A weight-normed 1x1 convolution: torch's own init of the direction, its norm, a zero bias."""
        direction = f"{prefix}.parametrizations.weight.original1"
        self.add(f"{prefix}.bias", (out_dim,), "fill", 0.0)
        self.add(direction, (out_dim, in_dim, 1), "conv_v")
        self.tensors[f"{prefix}.parametrizations.weight.original0"] = RandomTensor(
            (out_dim, 1, 1), "conv_g", self.tensors[direction].seed, v_shape=(out_dim, in_dim, 1)
        )

    def add_layer_norms(self, prefix: str, width: int) -> None:
        for norm in ("norm1", "norm2"):
            self.add(f"{prefix}.{norm}.weight", (width,), "fill", 1.0)
            self.add(f"{prefix}.{norm}.bias", (width,), "fill", 0.0)

    def add_layer_scales(self, prefix: str, width: int, value: float) -> None:
        for scale in ("layer_scale_1", "layer_scale_2"):
            self.add(f"{prefix}.{scale}.scale", (width,), "fill", value)

    def write(self, path: Path) -> None:
        write_safetensors(path, self.tensors, "F32")  # array-likes, made as they are written


def tiny_codec_config() -> dict[str, Any]:
    """The published codec's config.json (OpenMOSS-Team/MOSS-Audio-Tokenizer) with tiny Transformers: the
    same stages, patch sizes, quantizer and 10 s attention window, each Transformer 2 layers of width 64 (4
    heads of 16) with a feed-forward of 128, where the published ones have 12 or 32 layers of 768 or 1280."""
    tiny = {"d_model": 64, "num_heads": 4, "num_layers": 2, "dim_feedforward": 128}

    def stages(dims: tuple[tuple[int, int], ...]) -> list[dict[str, Any]]:  # (input, output) channels each
        entries: list[dict[str, Any]] = []
        for input_dimension, output_dimension in dims:
            if entries:
                entries.append({"module_type": "PatchedPretransform", "patch_size": 2})
            entries.append(
                {
                    "module_type": "Transformer",
                    "causal": True,
                    "conv_layout": True,
                    "gating": "none",
                    "input_dimension": input_dimension,
                    "output_dimension": output_dimension,
                    "layer_scale": 0.01,
                    "max_period": 10000,
                    "norm": "layer_norm",
                    "positional_embedding": "rope",
                    **tiny,
                }
            )
        return entries

    samples = {"module_type": "PatchedPretransform", "patch_size": 240}  # a position's samples, the codec's ends
    return {
        "architectures": ["MossAudioTokenizerModel"],
        "model_type": "speech_tokenizer",
        "sampling_rate": SAMPLE_RATE,
        "downsample_rate": SAMPLES_PER_FRAME,
        "causal_transformer_context_duration": 10,
        "code_dim": 768,
        "encoder_kwargs": [samples, *stages(((240, 384), (768, 384), (768, 640), (1280, 768)))],
        "decoder_kwargs": [*stages(((768, 1280), (640, 768), (384, 768), (384, 240))), samples],
        "quantizer_type": "rlfq",
        "quantizer_kwargs": {
            "quantizer_type": "rlfq",
            "num_quantizers": CODEC_QUANTIZERS,
            "codebook_size": CODEBOOK_SIZE,
            "codebook_dim": 8,
            "rvq_dim": 512,
            "input_dim": 768,
            "output_dim": 768,
        },
    }


def write_random_codec(config: Path | Mapping[str, Any], out_dir: Path) -> Path:
    """A checkpoint directory with a codec config (a config.json's path, or its content) and random decode-path
    weights in the published layout, initialized as the codec's library initializes a new model."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / "config.json"
    text = json.dumps(config, indent=2) + "\n" if isinstance(config, Mapping) else config.read_text(encoding="utf-8")
    config_path.write_text(text, encoding="utf-8")
    spec = read_codec_config(config_path)
    tensors = RandomTensors()
    for i in range(CODEC_QUANTIZERS):  # read_codec_config refuses any other count
        tensors.add(f"quantizer.quantizers.{i}.codebook.weight", (CODEBOOK_SIZE, spec.codebook_dim))
        tensors.add_weight_normed(f"quantizer.quantizers.{i}.out_proj", spec.rvq_dim, spec.codebook_dim)
    tensors.add_weight_normed("quantizer.output_proj", spec.quantizer_output_dim, spec.rvq_dim)
    for stage in spec.decoder:
        if isinstance(stage, Patch):
            continue
        width = stage.d_model
        if stage.input_dim != width:
            tensors.add(f"{stage.prefix}.input_proj.weight", (width, stage.input_dim))
        if stage.output_dim != width:
            tensors.add(f"{stage.prefix}.output_proj.weight", (stage.output_dim, width))
        for layer in range(stage.layers):
            prefix = f"{stage.prefix}.transformer.layers.{layer}"
            tensors.add(f"{prefix}.self_attn.in_projs.0.weight", (3 * width, width))
            tensors.add(f"{prefix}.self_attn.out_projs.0.weight", (width, width))
            tensors.add(f"{prefix}.linear1.weight", (stage.ffn, width))
            tensors.add(f"{prefix}.linear2.weight", (width, stage.ffn))
            tensors.add_layer_norms(prefix, width)
            if stage.layer_scale is not None:
                tensors.add_layer_scales(prefix, width, stage.layer_scale)
    tensors.write(out_dir / "model.safetensors")
    return out_dir
