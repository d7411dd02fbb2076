"""Read a MOSS-Audio-Tokenizer checkpoint for the stream decoder builder (``stream_decoder_build``).

``read_codec_config``: the decode path's shapes from ``config.json`` (``CodecSpec``), refusing any setting
the graph does not implement. ``CodecWeights``: the safetensors tensors as float32, each checked against
the shape the config implies. No PyTorch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.codec.quantizer import CODEBOOK_SIZE, CODEC_QUANTIZERS
from moss_tts_node.errors import WeightsError
from moss_tts_node.model.rates import FRAMES_PER_SECOND
from moss_tts_node.tools.prepare.config_reader import ConfigReader, read_json_object
from moss_tts_node.tools.prepare.safetensors_io import SafetensorsCheckpoint

_QUANTIZER_TYPES = ("rlfq", "random_prefix_rlfq")  # both decode codes the same way
# The codec's defaults for keys a decoder Transformer entry may leave out; None: the key is required.
TRANSFORMER_KEYS: dict[str, Any] = {
    "module_type": None,
    "input_dimension": None,
    "output_dimension": None,
    "d_model": None,
    "num_heads": None,
    "num_layers": None,
    "dim_feedforward": 2048,
    "causal": False,
    "positional_embedding": "sin",
    "max_period": 10000,
    "norm": "layer_norm",
    "layer_scale": None,
    "gating": "none",
    "conv_layout": False,  # a layout flag the codec ignores at inference
}
# Values the graph implements; anything else would decode wrongly, so it is refused.
TRANSFORMER_SUPPORTED = {
    "causal": (True,),
    "positional_embedding": ("rope",),
    "norm": ("layer_norm",),
    "gating": ("none",),
}


@dataclass(frozen=True)
class TransformerStage:
    """One decoder Transformer stage as the config describes it, plus its attention span in positions."""

    prefix: str  # tensor name prefix, "decoder.<index>"
    input_dim: int
    output_dim: int
    d_model: int
    heads: int
    layers: int
    ffn: int
    layer_scale: float | None  # the layer scales' initial value in config.json; None: the stage has none
    max_period: float
    context: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


@dataclass(frozen=True)
class Patch:
    """A PatchedPretransform: splits each position's channels into ``size`` consecutive positions."""

    size: int


@dataclass(frozen=True)
class CodecSpec:
    """The decode path's shapes: the quantizer's widths, then the decoder modules in order."""

    codebook_dim: int
    rvq_dim: int
    quantizer_output_dim: int
    decoder: tuple[TransformerStage | Patch, ...]


def read_codec_config(path: Path) -> CodecSpec:
    """The decode path's shapes from the codec's config.json; WeightsError names any key it cannot use."""
    config = read_json_object(
        path, WeightsError, "point at the codec checkpoint directory (config.json + model.safetensors)"
    )
    reader = _ConfigReader(path, WeightsError)
    sampling_rate = reader.number(config, "sampling_rate", "")
    downsample_rate = reader.number(config, "downsample_rate", "")
    if downsample_rate != AudioCodec.samples_per_frame or sampling_rate / downsample_rate != FRAMES_PER_SECOND:
        raise WeightsError(
            f"{path}: sampling_rate {sampling_rate} / downsample_rate {downsample_rate} is not the "
            f"{FRAMES_PER_SECOND} frames/s of {AudioCodec.samples_per_frame} samples this package decodes"
        )
    duration = reader.number(config, "causal_transformer_context_duration", "")
    quantizer = reader.mapping(config, "quantizer_kwargs", "")
    quantizer_type = quantizer.get("quantizer_type", config.get("quantizer_type", "rvq"))
    reader.check_supported("quantizer_kwargs.quantizer_type", quantizer_type, _QUANTIZER_TYPES)
    where = "quantizer_kwargs"
    reader.check_supported(f"{where}.num_quantizers", quantizer.get("num_quantizers"), (CODEC_QUANTIZERS,))
    reader.check_supported(f"{where}.codebook_size", quantizer.get("codebook_size"), (CODEBOOK_SIZE,))
    input_dim = reader.integer(quantizer, "input_dim", where)
    rvq_dim = int(quantizer.get("rvq_dim") or input_dim)
    output_dim = int(quantizer.get("output_dim") or input_dim)

    # The codec sizes each stage's attention span as int(stage rate x duration), the rate reached by
    # walking the encoder down from the sampling rate and the decoder back up; the same float steps
    # here give the same spans.
    rate = float(sampling_rate)
    for index, entry in enumerate(reader.entries(config, "encoder_kwargs")):
        if entry.get("module_type") == "PatchedPretransform":
            rate /= reader.integer(entry, "patch_size", f"encoder_kwargs[{index}]")
    modules: list[TransformerStage | Patch] = []
    channels, positions = output_dim, 1
    for index, entry in enumerate(reader.entries(config, "decoder_kwargs")):
        where = f"decoder_kwargs[{index}]"
        module_type = entry.get("module_type")
        if module_type == "PatchedPretransform":
            size = reader.integer(entry, "patch_size", where)
            if channels % size:
                raise WeightsError(
                    f"{path}: {where}.patch_size {size} does not divide the {channels} channels before it"
                )
            modules.append(Patch(size))
            channels, positions, rate = channels // size, positions * size, rate * size
        elif module_type == "Transformer":
            stage = reader.transformer(entry, where, f"decoder.{index}", int(rate * duration))
            if stage.input_dim != channels:
                raise WeightsError(
                    f"{path}: {where}.input_dimension is {stage.input_dim}, but {channels} channels reach it"
                )
            modules.append(stage)
            channels = stage.output_dim
        else:
            reader.check_supported(f"{where}.module_type", module_type, ("Transformer", "PatchedPretransform"))
    if channels != 1 or positions != downsample_rate:
        raise WeightsError(
            f"{path}: decoder_kwargs turn a frame into {positions} positions of {channels} channels; "
            f"expected {downsample_rate} samples of 1 channel"
        )
    codebook_dim = reader.integer(quantizer, "codebook_dim", "quantizer_kwargs")
    return CodecSpec(codebook_dim, rvq_dim, output_dim, tuple(modules))


class _ConfigReader(ConfigReader):
    """The codec config's values, with what the stream decoder builder implements."""

    def entries(self, config: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
        value = self.value(config, key, "")
        if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
            raise self.fail(key, "must be a list of module objects")
        return value

    def check_supported(self, key: str, value: Any, supported: tuple[Any, ...]) -> None:
        if value not in supported:
            raise self.fail(
                key,
                f"= {value!r} is not supported by the stream decoder "
                f"(it implements {', '.join(map(repr, supported))}); "
                "use the published decoder.onnx for this codec, or extend the stream decoder builder "
                "(moss_tts_node/tools/prepare/stream_decoder_*.py)",
            )

    def transformer(self, entry: Mapping[str, Any], where: str, prefix: str, context: int) -> TransformerStage:
        unknown = sorted(set(entry) - set(TRANSFORMER_KEYS))
        if unknown:
            raise self.fail(
                f"{where}.{unknown[0]}",
                "is a setting the stream decoder does not know, so it cannot reproduce it; "
                "extend the stream decoder builder (moss_tts_node/tools/prepare/stream_decoder_*.py) "
                "or remove it if it is the default",
            )
        values = {key: entry.get(key, default) for key, default in TRANSFORMER_KEYS.items()}
        for key, supported in TRANSFORMER_SUPPORTED.items():
            self.check_supported(f"{where}.{key}", values[key], supported)
        dims = {key: self.integer(entry, key, where) for key in ("input_dimension", "output_dimension", "d_model")}
        heads, layers = self.integer(entry, "num_heads", where), self.integer(entry, "num_layers", where)
        if dims["d_model"] % heads or (dims["d_model"] // heads) % 2:
            raise self.fail(
                f"{where}.num_heads", f"= {heads} must split d_model {dims['d_model']} into even head sizes"
            )
        if context < 1:
            raise self.fail("causal_transformer_context_duration", f"gives {prefix} an attention span of {context}")
        return TransformerStage(
            prefix=prefix,
            input_dim=dims["input_dimension"],
            output_dim=dims["output_dimension"],
            d_model=dims["d_model"],
            heads=heads,
            layers=layers,
            ffn=int(values["dim_feedforward"]),
            layer_scale=None if values["layer_scale"] is None else float(values["layer_scale"]),
            max_period=float(values["max_period"]),
            context=context,
        )


class CodecWeights:
    """Checkpoint tensors as float32, each checked against the shape the config implies."""

    def __init__(self, checkpoint: SafetensorsCheckpoint) -> None:
        self.checkpoint = checkpoint

    def read(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        info = self.checkpoint.tensors.get(name)
        if info is None:
            raise WeightsError(
                f"{self.checkpoint.directory}: tensor {name} is missing; the safetensors file does not match "
                "its config.json (re-download the checkpoint)"
            )
        if info.shape != shape:
            raise WeightsError(
                f"{self.checkpoint.directory}: tensor {name} has shape {list(info.shape)}, but config.json implies "
                f"{list(shape)}; the safetensors file does not match its config.json"
            )
        return self.checkpoint.read(name)

    def linear(self, name: str, out_dim: int, in_dim: int) -> np.ndarray:
        """A bias-free nn.Linear weight, transposed to (in, out) for x @ W."""
        return np.ascontiguousarray(self.read(name, (out_dim, in_dim)).T)

    def weight_normed(self, prefix: str, out_dim: int, in_dim: int) -> tuple[np.ndarray, np.ndarray]:
        """A weight-normed 1x1 Conv1d as (in, out) matrix and bias: W = g * v / |v| per output channel."""
        g = self.read(f"{prefix}.parametrizations.weight.original0", (out_dim, 1, 1))[:, 0, 0]
        v = self.read(f"{prefix}.parametrizations.weight.original1", (out_dim, in_dim, 1))[:, :, 0]
        norm = np.sqrt(np.sum(np.square(v, dtype=np.float64), axis=1))
        matrix = (v * (g / norm)[:, None]).astype(np.float32)
        return np.ascontiguousarray(matrix.T), self.read(f"{prefix}.bias", (out_dim,))
