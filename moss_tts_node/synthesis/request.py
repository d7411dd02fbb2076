"""``SpeechRequest``: what to say and how, the one shape every adapter builds (API, CLI, batch, node).

Like piper's ``SynthesisConfig``: a frozen value, made once where a request enters and passed as it is.
A field left ``None`` takes the config's default at the moment the synthesizer accepts the request
(``generation.*`` for the prompt fields and the voice, ``sampling.*`` for sampling). ``check_request`` is the
first check every request gets, whichever adapter made it: cheap, and before anything is cleaned or tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moss_tts_node.config import OPTIONS, LimitsConfig, SamplingConfig, check_value
from moss_tts_node.errors import ConfigError, RequestError

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
    sampling: SamplingConfig | None = None  # a sampling section: the keys it sets (not -1) override the config's


_TEXT_FIELDS = ("text", "language", "instruction", "quality")
_COUNT_FIELDS = ("tokens", "max_new_tokens")


def check_request(request: SpeechRequest, limits: LimitsConfig) -> None:
    """Refuse (RequestError) what no synthesis can be made of, before any heavy work: fields of the wrong
    type or out of range, and more characters than ``limits.max_text_chars`` (counted before the text is
    cleaned or tokenized, so an oversized request costs nothing). What needs the model (a text with nothing
    to say once cleaned, a prompt too long for the context, a voice) is checked by ``Synthesizer.stream``.
    """
    texts = {name: getattr(request, name) for name in _TEXT_FIELDS}
    for name, value in texts.items():
        if not isinstance(value, str) and (value is not None or name == "text"):
            raise RequestError(f"the request's {name} must be a string, got {type(value).__name__}")
    chars = sum(len(value) for value in texts.values() if value is not None)
    if chars > limits.max_text_chars:
        raise RequestError(
            f"the request has {chars} characters (text, instruction, quality and language together), more than "
            f"the {limits.max_text_chars} of 'limits.max_text_chars': split the text into several requests"
        )
    for name, value in texts.items():
        if value is not None and not value.isascii() and _has_lone_surrogate(value):
            raise RequestError(f"the request's {name} is not valid Unicode (a lone surrogate): send it as UTF-8 text")
    seed = request.seed
    if seed is not None and (not _is_int(seed) or not -1 <= seed <= _SEED_MAX):
        raise RequestError(f"the seed must be -1 (use sampling.seed) or a number from 0 to {_SEED_MAX}, got {seed!r}")
    for name in _COUNT_FIELDS:
        value = getattr(request, name)
        if value is not None and (not _is_int(value) or not 1 <= value <= _COUNT_MAX):
            raise RequestError(f"the request's {name} must be a whole number from 1 to {_COUNT_MAX}, got {value!r}")
    if not isinstance(request.voice, str | Path | np.ndarray | None):
        raise RequestError(
            f"the request's voice must be a path, an array of codes, '' or None, got {type(request.voice).__name__}"
        )
    if request.sampling is not None:
        _check_sampling(request.sampling)


def _check_sampling(sampling: SamplingConfig) -> None:
    if not isinstance(sampling, SamplingConfig):
        raise RequestError(f"the request's sampling must be a SamplingConfig, got {type(sampling).__name__}")
    for option in OPTIONS.values():
        group, name = option.key.split(".", 1)
        if group == "sampling":
            try:
                check_value(option, getattr(sampling, name), "the request's sampling")
            except ConfigError as error:
                raise RequestError(str(error)) from error


def _has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a surrogate code point alone, which no UTF-8 (nor the tokenizer) takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_SEED_MAX = int(OPTIONS["sampling.seed"].max or 0)
_COUNT_MAX = int(OPTIONS["generation.max_new_tokens"].max or 0)
