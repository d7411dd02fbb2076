"""Voices: a reference clip or its codes, as the (T, n_vq) codes a prompt takes (docs/model.md, "Prompt format")."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np

from moss_tts_node.codec.audio_io import load_reference_audio
from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.errors import RequestError
from moss_tts_node.model.spec import ModelSpec


def load_voice(
    reference: str | Path | np.ndarray, spec: ModelSpec, encoder: Callable[[], AbstractContextManager[AudioCodec]]
) -> np.ndarray:
    """A voice as (T, n_vq) codes: from a WAV/FLAC clip (encoded with the codec ``encoder()`` gives), a .npy
    of codes, or an array of codes."""
    if isinstance(reference, np.ndarray):
        return checked_codes(reference, spec, "reference codes")
    path = Path(reference)
    if not path.is_file():
        raise RequestError(f"reference audio not found: {path}")
    if path.suffix.lower() == ".npy":
        try:
            codes = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise RequestError(f"{path}: not a readable .npy of voice codes ({exc})") from exc
        return checked_codes(codes, spec, str(path))
    samples = load_reference_audio(path)
    with encoder() as codec:
        return codec.encode(samples)


def checked_codes(codes: np.ndarray, spec: ModelSpec, what: str) -> np.ndarray:
    """``codes`` as int64 if they are (T, n_vq) codes of this model; RequestError naming ``what`` otherwise."""
    if codes.ndim != 2 or codes.shape[1] != spec.n_vq or codes.shape[0] == 0:
        raise RequestError(f"{what}: shape {codes.shape}, expected (frames, {spec.n_vq}); make it with encode-voice")
    if not np.issubdtype(codes.dtype, np.integer) or codes.min() < 0 or codes.max() >= spec.audio_vocab_size:
        raise RequestError(f"{what}: codes must be integers in 0..{spec.audio_vocab_size - 1}")
    return codes.astype(np.int64)
