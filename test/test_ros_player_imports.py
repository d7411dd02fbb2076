"""``moss_tts_player`` plays audio and nothing more: importing it loads none of the synthesis stack.

A robot may run the player on a machine without the model (or its native libraries), and a player that
pulled in tokenizers, llama.cpp and ONNX Runtime would take their memory and start-up time for nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys

from ros_helpers import require_ros

require_ros()

# Modules of this package the player may not load, by prefix; model/ and codec/ only for their file-name
# facts (config.py names the weight and graph files in its key descriptions) and the family's table of
# recommended sampling (config.py resolves the sampling keys left to the model) and its audio rates (a module of
# constants: config.py's default for audio.max_codec_seconds), text/ only for its table of languages (config.py
# checks generation.language against it).
FORBIDDEN_PACKAGE_PREFIXES = (
    "moss_tts_node.synthesizer",
    "moss_tts_node.synthesis.pipeline",
    "moss_tts_node.synthesis.stages",
    "moss_tts_node.synthesis.voices",
    "moss_tts_node.llama",
    "moss_tts_node.text",
    "moss_tts_node.tools",
    "moss_tts_node.model.",
    "moss_tts_node.codec.",
)
FACT_MODULES = {
    "moss_tts_node.model.layout",
    "moss_tts_node.model.family",
    "moss_tts_node.model.rates",
    "moss_tts_node.codec.layout",
    "moss_tts_node.text",
    "moss_tts_node.text.languages",
}
FORBIDDEN_LIBRARIES = {"onnxruntime", "tokenizers", "gguf", "llama_cpp", "soundfile", "onnx", "tensorrt"}


def test_the_player_imports_no_synthesis_code() -> None:
    loaded = json.loads(
        subprocess.run(
            [
                sys.executable,  # the venv's interpreter: ROS message imports need its library path
                "-c",
                "import json, sys, moss_tts_node.ros.player; print(json.dumps(sorted(sys.modules)))",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()[-1]
    )
    assert "moss_tts_node.ros.player" in loaded and "moss_tts_node.ros.audio" in loaded  # it did import
    ours = [m for m in loaded if m.startswith(FORBIDDEN_PACKAGE_PREFIXES) and m not in FACT_MODULES]
    assert ours == [], "the player loads synthesis code"
    libraries = sorted({m.split(".")[0] for m in loaded} & FORBIDDEN_LIBRARIES)
    assert libraries == [], "the player loads the synthesis stack's libraries"
