"""Where the weights live: the file and folder names of the published MOSS-TTS-GGUF layout.

A weights directory holds the backbone GGUF (``gguf_name``), ``EMBEDDINGS_DIR`` (the text table and one
table per codebook), ``HEADS_DIR`` (the text head, unused at run time, and one audio head per codebook),
``TOKENIZER_DIR`` and ``CONFIG_FILE`` (the special-token ids). All tables and heads are float16 ``.npy``.
"""

from __future__ import annotations

from pathlib import Path

CONFIG_FILE = "config.json"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_FILE = "tokenizer.json"
EMBEDDINGS_DIR = "embeddings"
TEXT_EMBEDDING_FILE = "embed_tokens.npy"
HEADS_DIR = "lm_heads"
TEXT_HEAD_FILE = "lm_head_text.npy"
DEFAULT_QUANTIZATION = "Q4_K_M"
_SUFFIX = "_audio_heads.gguf"


def audio_embedding_file(codebook: int) -> str:
    """``emb_ext_00.npy`` .. ``emb_ext_31.npy``, in ``EMBEDDINGS_DIR``."""
    return f"emb_ext_{codebook:02d}.npy"


def audio_head_file(codebook: int) -> str:
    """``lm_head_audio_00.npy`` .. ``lm_head_audio_31.npy``, in ``HEADS_DIR``."""
    return f"lm_head_audio_{codebook:02d}.npy"


def gguf_name(quantization: str) -> str:
    """The published naming of the backbone GGUF: ``Q4_K_M`` -> ``MOSS_TTS_Q4_K_M.gguf``."""
    return f"MOSS_TTS_{quantization}.gguf"


DEFAULT_GGUF = gguf_name(DEFAULT_QUANTIZATION)


def nano_gguf_name(quantization: str) -> str:
    """MOSS-TTS-Nano's global transformer: ``Q8_0`` -> ``MOSS_TTS_NANO_Q8_0.gguf`` (the config's backbone_gguf)."""
    return f"MOSS_TTS_NANO_{quantization}.gguf"


NANO_DEFAULT_QUANTIZATION = "Q8_0"
NANO_DEFAULT_GGUF = nano_gguf_name(NANO_DEFAULT_QUANTIZATION)


def nano_local_gguf_name(global_name: str) -> str:
    """Nano's local transformer, beside its global one: ``MOSS_TTS_NANO_Q8_0.gguf`` ->
    ``MOSS_TTS_NANO_Q8_0.local.gguf``."""
    return f"{Path(global_name).stem}.local.gguf"


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
