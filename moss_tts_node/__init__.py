"""moss_tts_node: MOSS-TTS-Delay speech for robots, torch-free (llama.cpp + NumPy + ONNX Runtime).

The Python API is ``Synthesizer``; the ROS node and the CLI are thin layers over it.
Heavy modules load lazily, so ``import moss_tts_node`` stays cheap for tools that only read config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from moss_tts_node.config import Config, load_config
from moss_tts_node.errors import Cancelled, CodecError, ConfigError, MossTTSError, RequestError, WeightsError

if TYPE_CHECKING:
    from moss_tts_node.synthesizer import AudioChunk, AudioStream, Synthesis, Synthesizer

__all__ = [
    "AudioChunk",
    "AudioStream",
    "Cancelled",
    "CodecError",
    "Config",
    "ConfigError",
    "MossTTSError",
    "RequestError",
    "Synthesis",
    "Synthesizer",
    "WeightsError",
    "load_config",
]


def __getattr__(name: str) -> Any:
    if name in ("AudioChunk", "AudioStream", "Synthesis", "Synthesizer"):
        from moss_tts_node import synthesizer

        return getattr(synthesizer, name)
    raise AttributeError(name)
