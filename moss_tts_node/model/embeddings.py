"""The 1 + n_vq input embedding tables (text + one per codebook: 33 for MOSS-TTS), memory-mapped float16.

File layout (as published in MOSS-TTS-GGUF, ``model/layout.py``): a text table (vocab, H) and one
table per codebook (1025, H), all float16. A step reads 1 + n_vq rows, a prompt S x (1 + n_vq).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from moss_tts_node.errors import WeightsError
from moss_tts_node.model.layout import TEXT_EMBEDDING_FILE, audio_embedding_file
from moss_tts_node.model.spec import ModelSpec

if TYPE_CHECKING:
    pass


def load_matrix(path: Path, rows: int | None, hidden: int | None, mmap: bool = True) -> np.ndarray:
    """A float16 (rows, hidden) .npy; ``None`` accepts any size on that axis."""
    if not path.is_file():
        raise WeightsError(f"weight file not found: {path} (download MOSS-TTS-GGUF or run demo-weights)")
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise WeightsError(f"{path}: not a readable .npy file ({exc}); download it again") from exc
    expected = (rows if rows is not None else "any", hidden if hidden is not None else "any")
    if (
        array.ndim != 2
        or (rows is not None and array.shape[0] != rows)
        or (hidden is not None and array.shape[1] != hidden)
    ):
        raise WeightsError(f"{path}: shape {array.shape}, expected {expected}; the file belongs to another model")
    if array.dtype != np.float16:
        raise WeightsError(f"{path}: dtype {array.dtype}, expected float16")
    return array


class EmbeddingTables:
    """Input embedding of a row: ``embed_tokens[text] + sum_k emb_ext[k][code_k]``.

    The tables stay memory-mapped float16; only the rows looked up are widened.
    """

    def __init__(self, embeddings_dir: Path, spec: ModelSpec, hidden: int, text_vocab: int) -> None:
        embeddings_dir = Path(embeddings_dir)
        self.spec = spec
        self.text = load_matrix(embeddings_dir / TEXT_EMBEDDING_FILE, None, hidden)
        if self.text.shape[0] < text_vocab:
            raise WeightsError(
                f"{embeddings_dir / TEXT_EMBEDDING_FILE}: {self.text.shape[0]} rows, but the backbone's "
                f"vocabulary has {text_vocab}: the embeddings and the GGUF come from different models"
            )
        self.audio = [
            load_matrix(embeddings_dir / audio_embedding_file(k), spec.audio_rows, hidden) for k in range(spec.n_vq)
        ]
        self.hidden = hidden
        # Plain ndarray views of the maps (indexing a np.memmap costs a subclass round trip per call).
        self._text = self.text.view(np.ndarray)
        self._audio = [table.view(np.ndarray) for table in self.audio]
        self._gather = np.empty((1 + spec.n_vq, hidden), dtype=np.float16)

    def embed(self, rows: np.ndarray) -> np.ndarray:
        """(S, 1 + n_vq) int64 rows -> (S, H) float32 embeddings."""
        if rows.shape[0] == 1:  # a generation step: gather the 1 + n_vq rows, one float32 sum
            gather, row = self._gather, rows[0].tolist()
            gather[0] = self._text[row[0]]
            for k, table in enumerate(self._audio):
                gather[k + 1] = table[row[k + 1]]
            return np.sum(gather, axis=0, dtype=np.float32, keepdims=True)
        out = self._text[rows[:, 0]].astype(np.float32)
        for k, table in enumerate(self._audio):
            out += table[rows[:, k + 1]]
        return out
