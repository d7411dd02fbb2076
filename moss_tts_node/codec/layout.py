"""The file names of the published codec (MOSS-Audio-Tokenizer-ONNX): one ONNX graph each way."""

from __future__ import annotations

ENCODER_FILE = "encoder.onnx"
DECODER_FILE = "decoder.onnx"
