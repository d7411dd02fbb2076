"""The NumPy side of the model: the 33 input embedding tables and the 32 audio heads.

File layout (as published in MOSS-TTS-GGUF): ``embeddings/embed_tokens.npy`` (vocab, H),
``embeddings/emb_ext_KK.npy`` and ``lm_heads/lm_head_audio_KK.npy`` (1025, H), all float16.
The embedding tables stay memory-mapped float16: a step reads 33 rows of them. The audio heads
are widened to one float32 block at load time, because BLAS has no float16 GEMV and the heads
are read in full at every step.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import WeightsError
from .model_spec import ModelSpec


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
    """Input embedding of a row: ``embed_tokens[text] + sum_k emb_ext[k][code_k]``."""

    def __init__(self, embeddings_dir: Path, spec: ModelSpec, hidden: int, text_vocab: int) -> None:
        embeddings_dir = Path(embeddings_dir)
        self.spec = spec
        self.text = load_matrix(embeddings_dir / "embed_tokens.npy", None, hidden)
        if self.text.shape[0] < text_vocab:
            raise WeightsError(
                f"{embeddings_dir / 'embed_tokens.npy'}: {self.text.shape[0]} rows, but the backbone's "
                f"vocabulary has {text_vocab}: the embeddings and the GGUF come from different models"
            )
        self.audio = [
            load_matrix(embeddings_dir / f"emb_ext_{k:02d}.npy", spec.audio_rows, hidden) for k in range(spec.n_vq)
        ]
        self.hidden = hidden

    def embed(self, rows: np.ndarray) -> np.ndarray:
        """(S, 1 + n_vq) int64 rows -> (S, H) float32 embeddings."""
        out = self.text[rows[:, 0]].astype(np.float32)
        for k, table in enumerate(self.audio):
            out += table[rows[:, k + 1]]
        return out


class AudioHeads:
    """The 32 audio LM heads as one (n_vq, 1025, H) float32 block; the pad column is left to the sampler."""

    def __init__(self, heads_dir: Path, spec: ModelSpec, hidden: int) -> None:
        heads_dir = Path(heads_dir)
        self.weights = np.empty((spec.n_vq, spec.audio_rows, hidden), dtype=np.float32)
        for k in range(spec.n_vq):
            self.weights[k] = load_matrix(heads_dir / f"lm_head_audio_{k:02d}.npy", spec.audio_rows, hidden)
        self._flat = self.weights.reshape(-1, hidden)
        self._logits = np.zeros((spec.n_vq, spec.audio_rows), dtype=np.float32)

    def logits(self, hidden: np.ndarray, channels: np.ndarray) -> np.ndarray:
        """(n_vq, 1025) logits; rows of channels not in ``channels`` are stale and must not be read.

        One GEMV over all heads when every channel is sampled (the steady state); one per
        channel during the ramp-up and the flush, when only some are.
        """
        if channels.all():
            np.matmul(self._flat, hidden, out=self._logits.reshape(-1))
        else:
            for k in np.flatnonzero(channels):
                np.matmul(self.weights[k], hidden, out=self._logits[k])
        return self._logits
