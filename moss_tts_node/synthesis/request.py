"""``SpeechRequest``: what to say and how, the one shape every adapter builds (API, CLI, batch, node).

Like piper's ``SynthesisConfig``: a frozen value, made once where a request enters and passed as it is.
A field left ``None`` takes the config's default at the moment the synthesizer accepts the request
(``generation.*`` for the prompt fields and the voice, ``sampling.*`` for sampling).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moss_tts_node.config import SamplingConfig

# A voice: a WAV/FLAC clip or a .npy of codes (a path), (T, n_vq) codes, "" for none, None for the configured one.
Voice = str | Path | np.ndarray | None


@dataclass(frozen=True, eq=False)  # eq=False: a voice may be an array, which has no truth value to compare by
class SpeechRequest:
    """One utterance to synthesize. Only ``text`` is required."""

    text: str
    language: str | None = None  # a language tag (en, zh, ...) for the prompt's language field
    instruction: str | None = None  # a style instruction ("calm, slow")
    quality: str | None = None  # the prompt's quality field
    tokens: int | None = None  # how many frames the speech should take (the prompt's tokens field)
    voice: Voice = None
    seed: int | None = None  # None or -1: sampling.seed (-1 there draws a fresh one); the same seed, the same audio
    max_new_tokens: int | None = None  # generation steps per piece, at most what the context leaves
    sampling: SamplingConfig | None = None  # the whole sampling section, replacing the config's
