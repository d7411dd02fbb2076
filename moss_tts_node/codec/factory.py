"""The one place a codec backend is chosen from a config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from moss_tts_node.codec.base import AudioCodec, read_attention_span
from moss_tts_node.codec.layout import DECODER_FILE, ENCODER_FILE
from moss_tts_node.codec.onnx import OnnxCodec
from moss_tts_node.model.rates import frames_for_seconds

if TYPE_CHECKING:
    from moss_tts_node.config import Config


def open_codec(config: Config, *, encoder: bool = True, decoder: bool = True) -> AudioCodec:
    """The codec backend ``config.audio.backend`` names, holding the graphs asked for.

    The one place a backend is chosen: the synthesizer and the CLI open their codec here.
    ``encoder``/``decoder`` let ``low_memory`` hold one stage at a time. With both, a missing
    encoder (never downloaded or built) only fails when something is encoded, since most
    robots use voices pre-encoded with encode-voice; opened to encode only, it fails at once.
    """
    audio = config.audio
    max_frames = frames_for_seconds(audio.max_codec_seconds)
    if audio.backend == "tensorrt":
        from moss_tts_node.codec.tensorrt import TensorRTCodec  # needs TensorRT: import only when chosen

        # The engines carry no settings of their own: the ONNX directory they were built from may.
        span = read_attention_span(Path(config.model.codec_dir) if config.model.codec_dir else None)
        return TensorRTCodec(
            Path(config.model.engine_dir),
            encoder=encoder,
            decoder=decoder,
            max_frames=max_frames,
            attention_span_frames=span,
        )
    codec_dir = Path(config.model.codec_dir)
    encoder_path = codec_dir / ENCODER_FILE
    return OnnxCodec(
        codec_dir / DECODER_FILE if decoder else None,
        encoder_path if encoder and (encoder_path.is_file() or not decoder) else None,
        provider=audio.onnx_provider,
        threads=audio.codec_threads,
        max_frames=max_frames,
    )
