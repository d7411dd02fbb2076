"""The codec's file names: the published ONNX graphs (MOSS-Audio-Tokenizer-ONNX), the checkpoint's settings,
the stream decoder graph that ``build-stream-decoder`` writes beside them, and the meta file that marks a
MOSS-Audio-Tokenizer-Nano ONNX directory (it names that directory's graphs)."""

from __future__ import annotations

ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
CHECKPOINT_CONFIG = "config.json"  # the codec checkpoint's settings, as its save_pretrained writes them
STREAM_DECODER_FILE = "decoder_stream.onnx"  # looked for beside decoder.onnx in model.codec_dir
NANO_META_FILE = "codec_browser_onnx_meta.json"  # MOSS-Audio-Tokenizer-Nano-ONNX: the graphs, settings, stream state
