"""The values a setting may take, for the config schema and the modules that act on them.

Plain tuples with no imports, so that ``config.py`` (read by the CLI's ``--help`` and the ROS node
before any model loads) and the heavy modules can share them.
"""

from __future__ import annotations

KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # llama.cpp's names
UNQUANTIZED_KV_CACHE_TYPES = ("f32", "f16", "bf16")  # a V cache of any other type needs flash attention
FLASH_ATTN_MODES = ("auto", "on", "off")
HEADS_BACKENDS = ("auto", "gguf", "onnx", "numpy")
CODEC_BACKENDS = ("onnx", "tensorrt")
ONNX_PROVIDERS = ("auto", "cpu", "cuda")
# audio.stream_decoder: the words it takes besides a path to a stream decoder graph
STREAM_DECODER_MODES = ("auto", "off")
# generation.pause_markers: what a "[pause 3.2s]" in the text means (text/pauses.py)
PAUSE_AUTO = "auto"
PAUSE_MODEL = "model"
PAUSE_SILENCE = "silence"
PAUSE_TEXT = "text"
PAUSE_MARKER_MODES = (PAUSE_AUTO, PAUSE_MODEL, PAUSE_SILENCE, PAUSE_TEXT)
# model.backend: where the speech comes from (the local model, or an OpenAI-compatible server: http/remote.py)
BACKEND_LOCAL = "local"
BACKEND_REMOTE = "remote"
BACKENDS = (BACKEND_LOCAL, BACKEND_REMOTE)
# audio.output_channels: the channels of the audio the package gives out (audio_output.py); "model" keeps the model's
OUTPUT_CHANNELS_MODEL = "model"
OUTPUT_CHANNEL_COUNTS = {"mono": 1, "stereo": 2}
OUTPUT_CHANNELS = (OUTPUT_CHANNELS_MODEL, *OUTPUT_CHANNEL_COUNTS)
