"""The one place a codec backend is chosen, from the codec's own parameters."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moss_tts_node.codec.base import ONNX_SOURCE, AudioCodec, read_attention_span
from moss_tts_node.codec.layout import DECODER_FILE, ENCODER_FILE, NANO_META_FILE
from moss_tts_node.codec.nano import NANO_ONNX_SOURCE, NanoOnnxCodec, is_nano_directory
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.codec.quantizer import CODEC_QUANTIZERS
from moss_tts_node.errors import CodecError, WeightsError


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
    sample_rate: int = AudioCodec.sample_rate  # the model's rate: its codec's (24 kHz, MOSS-TTS-Nano's 48 kHz)


def open_codec(
    params: CodecParams, *, encoder: bool = True, decoder: bool = True, encoder_optional: bool = False
) -> AudioCodec:
    """The codec backend ``params.backend`` names, holding the graphs asked for.

    ``encoder``/``decoder`` let ``low_memory`` hold one stage at a time. With both, a missing
    encoder (never downloaded or built) only fails when something is encoded, since most
    robots use voices pre-encoded with encode-voice; opened to encode only, it fails at once,
    unless ``encoder_optional`` (the encoder beside a stream decoder, which decodes instead).

    The codec directory's layout says which codec it is: MOSS-Audio-Tokenizer-Nano's published ONNX directory
    holds ``codec_browser_onnx_meta.json`` (``NanoOnnxCodec``), MOSS-Audio-Tokenizer's ``decoder.onnx`` and
    ``encoder.onnx`` (``OnnxCodec``).
    """
    optional = encoder_optional or decoder
    nano = params.codec_dir is not None and is_nano_directory(params.codec_dir)
    delay = params.backend == "tensorrt" or (  # TensorRT runs MOSS-Audio-Tokenizer, at OnnxCodec's rate
        params.codec_dir is not None
        and any((params.codec_dir / name).is_file() for name in (DECODER_FILE, ENCODER_FILE))
    )
    found = NanoOnnxCodec if nano else OnnxCodec
    if (nano or delay) and found.sample_rate != params.sample_rate:
        raise CodecError(
            f"model.codec_dir {params.codec_dir} is a {found.sample_rate} Hz codec, but these weights speak at "
            f"{params.sample_rate} Hz: use the codec they were made for (MOSS-TTS-Nano: {NANO_ONNX_SOURCE}; the "
            f"Delay models: {ONNX_SOURCE})"
        )
    if nano:
        return _open_nano(params, encoder=encoder, decoder=decoder)
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
    graphs = (params.codec_dir / name for name in (DECODER_FILE, ENCODER_FILE))
    if (decoder or not encoder_optional) and not any(path.is_file() for path in graphs):
        raise WeightsError(
            f"codec directory {params.codec_dir} holds neither {DECODER_FILE} / {ENCODER_FILE} "
            f"(MOSS-Audio-Tokenizer: {ONNX_SOURCE}) nor {NANO_META_FILE} (MOSS-Audio-Tokenizer-Nano: "
            f"{NANO_ONNX_SOURCE}); download one with hf download <repo> --local-dir <dir>"
        )
    encoder_path = params.codec_dir / ENCODER_FILE
    return OnnxCodec(
        params.codec_dir / DECODER_FILE if decoder else None,
        encoder_path if encoder and (encoder_path.is_file() or not optional) else None,
        provider=params.onnx_provider,
        threads=params.threads,
        max_frames=params.max_frames,
        n_quantizers=params.n_quantizers,
    )


def _open_nano(params: CodecParams, *, encoder: bool, decoder: bool) -> NanoOnnxCodec:
    """MOSS-Audio-Tokenizer-Nano from its published ONNX directory, for a model of its 16 codebooks."""
    if params.backend != "onnx":
        raise CodecError(
            f"{params.codec_dir} is a MOSS-Audio-Tokenizer-Nano codec, which runs on the onnx backend only "
            f"(not {params.backend})"
        )
    if params.n_quantizers != NanoOnnxCodec.codec_quantizers:
        raise CodecError(
            f"{params.codec_dir} is a MOSS-Audio-Tokenizer-Nano codec of {NanoOnnxCodec.codec_quantizers} "
            f"codebooks; the model has {params.n_quantizers}: use the codec its weights were made for"
        )
    return NanoOnnxCodec(
        params.codec_dir,
        provider=params.onnx_provider,
        threads=params.threads,
        max_frames=params.max_frames,
        encoder=encoder,
        decoder=decoder,
    )
