"""The one place a codec backend is chosen, from the codec's own parameters."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moss_tts_node.codec.base import AudioCodec, read_attention_span
from moss_tts_node.codec.layout import DECODER_FILE, ENCODER_FILE
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.codec.quantizer import CODEC_QUANTIZERS
from moss_tts_node.errors import CodecError


@dataclass(frozen=True)
class CodecParams:
    """How to open the codec. The values, and their defaults, are the config's (``model.*`` and ``audio.*`` keys),
    checked once there."""

    backend: str  # a name of choices.CODEC_BACKENDS
    codec_dir: Path | None  # the ONNX graphs (and the codec's config.json, which TensorRT engines lack)
    engine_dir: Path | None  # TensorRT engines, for the tensorrt backend
    onnx_provider: str  # a name of choices.ONNX_PROVIDERS
    threads: int  # ONNX Runtime intra-op threads; 0 lets it choose
    max_frames: int  # the most frames one codec call takes (audio.max_codec_seconds); longer audio is windowed
    n_quantizers: int = CODEC_QUANTIZERS  # the model's codebooks (its n_vq), which the codec decodes and encodes


def open_codec(
    params: CodecParams, *, encoder: bool = True, decoder: bool = True, encoder_optional: bool = False
) -> AudioCodec:
    """The codec backend ``params.backend`` names, holding the graphs asked for.

    ``encoder``/``decoder`` let ``low_memory`` hold one stage at a time. With both, a missing
    encoder (never downloaded or built) only fails when something is encoded, since most
    robots use voices pre-encoded with encode-voice; opened to encode only, it fails at once,
    unless ``encoder_optional`` (the encoder beside a stream decoder, which decodes instead).
    """
    optional = encoder_optional or decoder
    if params.backend == "tensorrt":
        from moss_tts_node.codec.tensorrt import TensorRTCodec  # needs TensorRT: import only when chosen

        if params.engine_dir is None:
            raise CodecError("the tensorrt codec backend needs the engines' directory (model.engine_dir)")
        # The engines carry no settings of their own: the ONNX directory they were built from may.
        return TensorRTCodec(
            params.engine_dir,
            encoder=encoder,
            decoder=decoder,
            encoder_optional=optional,
            max_frames=params.max_frames,
            attention_span_frames=read_attention_span(params.codec_dir),
            n_quantizers=params.n_quantizers,
        )
    if params.codec_dir is None:
        raise CodecError("the onnx codec backend needs the codec's directory (model.codec_dir)")
    encoder_path = params.codec_dir / ENCODER_FILE
    return OnnxCodec(
        params.codec_dir / DECODER_FILE if decoder else None,
        encoder_path if encoder and (encoder_path.is_file() or not optional) else None,
        provider=params.onnx_provider,
        threads=params.threads,
        max_frames=params.max_frames,
        n_quantizers=params.n_quantizers,
    )
