"""``SpeechRequest``: what to say and how, the one shape every adapter builds (API, CLI, batch, node).

Like piper's ``SynthesisConfig``: a frozen value, made once where a request enters and passed as it is.
A field left ``None`` takes the config's default at the moment the synthesizer accepts the request
(``generation.*`` for the prompt fields and the voice, ``sampling.*`` for sampling). ``check_request`` is the
first check every request gets, whichever adapter made it: cheap, and before anything is cleaned or tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.config import OPTIONS, LimitsConfig, SamplingConfig, check_value
from moss_tts_node.errors import ConfigError, RequestError
from moss_tts_node.model.rates import FRAMES_PER_SECOND
from moss_tts_node.synthesis.fields import (
    COUNT,
    SAMPLING,
    SEED,
    TEXT,
    VOICE,
    VOICES,
    RosField,
    declared,
    request_fields,
)
from moss_tts_node.synthesis.voices import LibraryVoice, check_speaker_count
from moss_tts_node.text.languages import language_tag
from moss_tts_node.text.speakers import MAX_SPEAKERS, speaker_label

# A voice: a WAV/FLAC clip or a .npy of codes (a path), (T, n_vq) codes, a voice of the library
# (``synth.voices["butler"]``), "" for none, None for the configured one.
Voice = str | Path | np.ndarray | LibraryVoice | None
# A request's voices: one, or a list of the references of [S1], [S2] ... in order, up to MAX_SPEAKERS, where None
# or "" is a speaker without one.
Voices = Voice | list[Voice] | tuple[Voice, ...]


@dataclass(frozen=True, eq=False)  # eq=False: a voice may be an array, which has no truth value to compare by
class SpeechRequest:
    """One utterance to synthesize. Only ``text`` is required. Each field is declared with what it is and which
    interfaces carry it (``synthesis/fields.py``); ``REQUEST_FIELDS`` reads that back."""

    text: str = declared(kind=TEXT, help="what to say", ros=(RosField("text", unset=None),))
    language: str | None = declared(
        None,
        kind=TEXT,
        help='the language: a code or English name of docs/usage.md "Languages", e.g. en, zh, French',
        prompt=True,
        config_default="generation.language",
        ros=(RosField("language"),),
        cli=True,
        batch=True,
        http=True,
    )
    instruction: str | None = declared(
        None,
        kind=TEXT,
        help='a style instruction, e.g. "calm, slow"',
        prompt=True,
        config_default="generation.instruction",
        ros=(RosField("instruction"),),
        cli=True,
        batch=True,
    )
    quality: str | None = declared(
        None,
        kind=TEXT,
        help="the prompt's quality field",
        prompt=True,
        config_default="generation.quality",
        ros=(RosField("quality"),),
        cli=True,
        batch=True,
        http=True,
    )
    tokens: int | None = declared(
        None,
        kind=COUNT,
        help=f"how long the speech (or the sound) should be, in frames ({FRAMES_PER_SECOND:g} per second): the "
        "prompt's tokens field",
        prompt=True,
        ros=(RosField("tokens", "uint32", unset=0),),
        cli=True,
        batch=True,
        http=True,
    )
    voice: Voices = declared(
        None,
        kind=VOICES,
        help=f"the voice, or one per speaker ([S1] first, up to {MAX_SPEAKERS}; None or '' a speaker without one): "
        "a clip, codes or a voice of the library; '' for none, None for the configured one",
        ros=(RosField("reference_audio"), RosField("voice"), RosField("voices", "string[]")),
        ros_by_name=True,
    )
    seed: int | None = declared(
        None,
        kind=SEED,
        help="random seed; the same seed gives the same audio (None or -1: sampling.seed, where -1 draws one)",
        ros=(RosField("seed", "int64", "-1", unset=-1),),
        cli=True,
        batch=True,
        http=True,
    )
    max_new_tokens: int | None = declared(
        None, kind=COUNT, help="generation steps per piece, at most what the context leaves", http=True
    )
    sampling: SamplingConfig | None = declared(
        None, kind=SAMPLING, help="a sampling section: the keys it sets (not -1) override the config's"
    )
    prefix: Voice = declared(
        None,
        kind=VOICE,
        help="a recording the speech continues (continuation cloning, docs/continuation.md); None or '': none",
        ros=(RosField("prefix_voice"),),
        ros_by_name=True,
    )
    prefix_text: str | None = declared(
        None,
        kind=TEXT,
        help="what the prefix says, put before the text (default: a named voice's transcript, or the text begins "
        "with it)",
        ros=(RosField("prefix_text"),),
        cli=True,
        batch=True,
        http=True,
    )
    sound_event: str | None = declared(
        None,
        kind=TEXT,
        help='the prompt\'s sound event field, e.g. "door knock"',
        prompt=True,
        ros=(RosField("sound_event"),),
        cli=True,
        batch=True,
        http=True,
    )
    ambient_sound: str | None = declared(
        None,
        kind=TEXT,
        help='the prompt\'s ambient sound field, e.g. "rain on a window"',
        prompt=True,
        ros=(RosField("ambient_sound"),),
        cli=True,
        batch=True,
        http=True,
    )
    scene: str | None = declared(
        None,
        kind=TEXT,
        help="the prompt's scene field (MOSS-TTSD's; docs/family.md, \"Dialogues\")",
        prompt=True,
        ros=(RosField("scene"),),
        cli=True,
        batch=True,
        http=True,
    )


REQUEST_FIELDS = request_fields(SpeechRequest)
_TEXT_FIELDS = tuple(field.name for field in REQUEST_FIELDS if field.kind == TEXT)
_COUNT_FIELDS = tuple(field.name for field in REQUEST_FIELDS if field.kind == COUNT)
_TEXT_FIELD_LIST = f"{', '.join(_TEXT_FIELDS[:-1])} and {_TEXT_FIELDS[-1]}"


def check_request(request: SpeechRequest, limits: LimitsConfig) -> None:
    """Refuse (RequestError) what no synthesis can be made of, before any heavy work: fields of the wrong
    type or out of range, a language that is none (``request_language``), and more characters than
    ``limits.max_text_chars`` (counted before the text is cleaned or tokenized, so an oversized request costs
    nothing). What needs the model (a text with nothing
    to say once cleaned, a prompt too long for the context, a voice) is checked by ``Synthesizer.stream``.
    """
    texts = {name: getattr(request, name) for name in _TEXT_FIELDS}
    for name, value in texts.items():
        if not isinstance(value, str) and (value is not None or name == "text"):
            raise RequestError(f"the request's {name} must be a string, got {type(value).__name__}")
    chars = sum(len(value) for value in texts.values() if value is not None)
    if chars > limits.max_text_chars:
        raise RequestError(
            f"the request has {chars} characters ({_TEXT_FIELD_LIST} together), more than the "
            f"{limits.max_text_chars} of 'limits.max_text_chars': split the text into several requests"
        )
    for name, value in texts.items():
        if value is not None and not value.isascii() and _has_lone_surrogate(value):
            raise RequestError(f"the request's {name} is not valid Unicode (a lone surrogate): send it as UTF-8 text")
    if request.language:  # bounded above before it is looked up and quoted
        request_language(request.language)
    seed = request.seed
    if seed is not None and (not _is_int(seed) or not -1 <= seed <= _SEED_MAX):
        raise RequestError(f"the seed must be -1 (use sampling.seed) or a number from 0 to {_SEED_MAX}, got {seed!r}")
    for name in _COUNT_FIELDS:
        value = getattr(request, name)
        if value is not None and (not _is_int(value) or not 1 <= value <= _COUNT_MAX):
            raise RequestError(f"the request's {name} must be a whole number from 1 to {_COUNT_MAX}, got {value!r}")
    _check_voices(request.voice)
    _check_voice(request.prefix, "prefix")
    if request.prefix_text is not None and no_voice(request.prefix):
        raise RequestError(
            "the request gives prefix_text but no prefix (prefix_voice over ROS, --prefix on the command line): give "
            "the recording it transcribes"
        )
    if request.sampling is not None:
        _check_sampling(request.sampling)


def request_language(value: str) -> str:
    """The spelling the prompt gets for a request's language, a code or an English name (``language_tag``);
    RequestError, saying what to give instead, for one that is none. The one check of a request's language,
    whichever adapter asks."""
    try:
        return language_tag(value)
    except ValueError as error:
        raise RequestError(str(error)) from None


def request_of(request: SpeechRequest | str, fields: dict[str, Any]) -> SpeechRequest:
    """``request`` itself, or a SpeechRequest of that text and the keyword ``fields``."""
    if isinstance(request, SpeechRequest):
        return replace(request, **fields) if fields else request
    return SpeechRequest(request, **fields)


def _check_voices(voices: Voices) -> None:
    if not isinstance(voices, list | tuple):
        _check_voice(voices, "voice")
        return
    check_speaker_count(len(voices))
    for index, voice in enumerate(voices):
        _check_voice(voice, f"voice of {speaker_label(index)}")
    if all(no_voice(voice) for voice in voices):
        raise RequestError("the request's list of voices holds no voice: give at least one, or '' alone for none")


def no_voice(voice: Voice) -> bool:
    """Whether ``voice`` names none: None (for a speaker of a list, or the configured voice alone) or ""."""
    return voice is None or (isinstance(voice, str | Path) and str(voice) == "")


def _check_voice(voice: Voice, what: str) -> None:
    if not isinstance(voice, str | Path | np.ndarray | LibraryVoice | None):
        raise RequestError(
            f"the request's {what} must be a path, an array of codes, a voice of the library, '' or None, "
            f"got {type(voice).__name__}"
        )


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
