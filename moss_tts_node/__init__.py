"""moss_tts_node: MOSS-TTS-Delay speech for robots, torch-free (llama.cpp + NumPy + ONNX Runtime).

The Python API is ``Synthesizer``; the ROS node and the CLI are thin layers over it.
Heavy modules load lazily, so ``import moss_tts_node`` stays cheap for tools that only read config.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from moss_tts_node.config import Config, load_config
from moss_tts_node.errors import Cancelled, CodecError, ConfigError, MossTTSError, RequestError, WeightsError

if TYPE_CHECKING:
    from moss_tts_node.backends import open_synthesizer
    from moss_tts_node.synthesis.feed import TextFeed
    from moss_tts_node.synthesis.request import SpeechRequest
    from moss_tts_node.synthesis.results import AudioChunk, AudioStream, Synthesis
    from moss_tts_node.synthesizer import Synthesizer

__all__ = [
    "AudioChunk",
    "AudioStream",
    "Cancelled",
    "CodecError",
    "Config",
    "ConfigError",
    "MossTTSError",
    "RequestError",
    "SpeechRequest",
    "Synthesis",
    "Synthesizer",
    "TextFeed",
    "WeightsError",
    "load_config",
    "open_synthesizer",
]


# Loaded on first use: the facade imports the whole synthesis stack (tokenizers, llama.cpp, ONNX Runtime).
_LAZY = {
    "AudioChunk": "moss_tts_node.synthesis.results",
    "AudioStream": "moss_tts_node.synthesis.results",
    "Synthesis": "moss_tts_node.synthesis.results",
    "SpeechRequest": "moss_tts_node.synthesis.request",
    "Synthesizer": "moss_tts_node.synthesizer",
    "TextFeed": "moss_tts_node.synthesis.feed",
    "open_synthesizer": "moss_tts_node.backends",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
