"""Where the weights live: the file and folder names of the published MOSS-TTS-GGUF layout."""

from __future__ import annotations

from pathlib import Path

HEADS_DIR = "lm_heads"
_SUFFIX = "_audio_heads.gguf"


def heads_gguf_name(source_name: str) -> str:
    """``MOSS_TTS_Q4_K_M.gguf`` -> ``MOSS_TTS_Q4_K_M_audio_heads.gguf``."""
    return f"{Path(source_name).stem}{_SUFFIX}"


def is_heads_gguf_name(name: str) -> bool:
    """Whether ``name`` is what attach-heads calls its output by default."""
    return name.endswith(_SUFFIX) and len(name) > len(_SUFFIX)


def attach_heads_command(weights_dir: Path, gguf_name: str) -> str:
    """The command that makes the heads-carrying GGUF from the plain ``gguf_name``, or from the plain GGUF
    whose default output ``gguf_name`` is."""
    plain = gguf_name.removesuffix(_SUFFIX) + ".gguf" if is_heads_gguf_name(gguf_name) else gguf_name
    return f"python -m moss_tts_node attach-heads {weights_dir} --gguf {plain}"
