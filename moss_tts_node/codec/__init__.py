"""The audio codec (MOSS-Audio-Tokenizer): interface, ONNX Runtime and TensorRT backends, audio files, streaming."""
