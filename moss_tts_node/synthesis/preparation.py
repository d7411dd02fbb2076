"""A request made ready to plan: checked, its text cleaned, its prompt fields, voices and continuation read.

``RequestPreparation.prepare`` is what ``Synthesizer.stream`` and ``stream_text`` both do before they plan: the
cheap checks first (``check_request``), then a text with nothing to say once cleaned, the fields the model's
template has no place for, the voices (each length read before it is decoded), what the request continues. What
comes out, ``Prepared``, holds everything the planner and the pipeline read of the request and its settings.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.config import Config, GenerationConfig, resolved_sampling
from moss_tts_node.errors import ConfigError, RequestError
from moss_tts_node.model.sampling import SamplingParams
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.synthesis.fields import RequestField
from moss_tts_node.synthesis.request import (
    REQUEST_FIELDS,
    SpeechRequest,
    Voice,
    Voices,
    check_request,
    no_voice,
    request_language,
)
from moss_tts_node.synthesis.voices import LibraryVoice, VoiceLibrary, VoiceLimit, load_voice, voice_frames
from moss_tts_node.text.nano_prompt import NanoPromptBuilder
from moss_tts_node.text.normalize import has_something_to_say, normalize_text
from moss_tts_node.text.pauses import resolve_pause_mode
from moss_tts_node.text.pieces import Continuation
from moss_tts_node.text.prompt import PromptBuilder, PromptFields
from moss_tts_node.text.speakers import in_turn

# The request's fields that are the prompt's (``PromptFields``), but its text, which is cleaned first.
_PROMPT_FIELDS = tuple(field for field in REQUEST_FIELDS if field.prompt and field.name != "text")


@dataclass(frozen=True)
class Prepared:
    """A request as the planner and the pipeline take it, with the settings it runs under (``config``)."""

    request: SpeechRequest  # as given, or with the speakers' clips as its prefix (``_speakers_prefix``)
    config: Config
    fields: PromptFields
    references: list[np.ndarray | None]  # the codes of [S1], [S2] ...; None for a speaker without a clip
    continuation: Continuation | None  # what it continues; None: no recording
    sampling: SamplingParams  # its seed drawn where neither the request nor the config fixes one
    pause_markers: str  # what a pause marker means for these weights (``text/pauses.py``)

    @property
    def max_new_tokens(self) -> int:
        return self.request.max_new_tokens or self.config.generation.max_new_tokens


class RequestPreparation:
    """Prepares the requests of one loaded model, with its prompt builder, its voice encoder and its context of
    ``n_ctx`` rows; ``library`` holds the owner's named voices and the default one, encoded here from ``config``
    (``VoiceLibrary``)."""

    def __init__(
        self,
        config: Config,
        spec: ModelSpec,
        prompts: PromptBuilder | NanoPromptBuilder,
        encoder: Callable[[], AbstractContextManager[AudioCodec]],
        n_ctx: int,
    ) -> None:
        self.spec = spec
        self.prompts = prompts
        self.encoder = encoder
        self.n_ctx = n_ctx
        self._check_defaults(config)
        self.library = VoiceLibrary.build(config, spec, encoder, self.voice_limit(config))

    def _check_defaults(self, config: Config) -> None:
        """ConfigError, at load rather than on every request, for a default (``generation.*``) that fills a prompt
        field this model's template has no place for."""
        for field in _PROMPT_FIELDS:
            value = self._config_default(config, field)
            if value is None:
                continue
            try:
                self.prompts.check_fields(PromptFields(text=None, **{field.name: value}))
            except RequestError as error:
                raise ConfigError(
                    f"'{field.config_default}' is {value!r}, which these weights cannot take ({error}): "
                    f"leave {field.config_default} empty for them"
                ) from None

    @staticmethod
    def _config_default(config: Config, field: RequestField) -> Any:
        """The value of the config key a request's ``field`` defaults to (None: no key, or left empty)."""
        if field.config_default is None:
            return None
        group, key = field.config_default.split(".")
        return getattr(getattr(config, group), key) or None

    def voice_limit(self, config: Config) -> VoiceLimit:
        return VoiceLimit(config.limits.max_reference_seconds, self.n_ctx, self.spec)

    def prepare(self, request: SpeechRequest, config: Config, text_follows: bool = False) -> Prepared:
        """``request`` checked and read under ``config``; ``text_follows``: its text arrives later, in fragments
        (the request's own is empty), so there is none to clean yet."""
        check_request(request, config.limits)
        request = self._speakers_prefix(request, config)
        gen = config.generation
        text = "" if text_follows else self._text(request, gen)
        fields = self.fields(config, request, text)
        references, prefix = self.voices(request, config)
        continuation = _continuation(request, prefix, gen.normalize_text, self.spec.identity.dialogue)
        pause_markers = resolve_pause_mode(gen.pause_markers, self.spec.identity.trained_on_pause_markers)
        sampling = _sampling_params(request, config, self.spec)
        return Prepared(request, config, fields, references, continuation, sampling, pause_markers)

    def fields(self, config: Config, request: SpeechRequest, text: str | None) -> PromptFields:
        """A request's prompt fields (``text`` None: a sound without text), those left ``None`` taken from the
        config's defaults (``generation.*``); the language spelled as upstream's table does (``text/languages.py``), or
        refused; refused where this model's template has no place for one."""
        values: dict[str, Any] = {}
        for field in _PROMPT_FIELDS:
            value = getattr(request, field.name)
            values[field.name] = self._config_default(config, field) if value is None else value
        if values["language"]:
            values["language"] = request_language(values["language"])
        fields = PromptFields(text=text, **values)
        self.prompts.check_fields(fields)
        return fields

    def voices(self, request: SpeechRequest, config: Config) -> tuple[list[np.ndarray | None], np.ndarray | None]:
        """The codes of a request's references (None for a speaker without one) and of its prefix (None: it
        continues no recording). Each is refused before it is decoded when too long (``VoiceLimit``), and
        all of them when together they leave no room in the context; a file given twice (the same clip as a
        reference and as the prefix) is read once."""
        limit = self.voice_limit(config)
        references = self._references(request.voice)
        prefix = None if no_voice(request.prefix) else request.prefix
        voices = [voice for voice in (*references, prefix) if voice is not None]
        if len(voices) > 1:
            frames = [_frames(voice) for voice in references if voice is not None]
            limit.check_together(frames, 0 if prefix is None else _frames(prefix))
        read: dict[str, np.ndarray] = {}

        def codes(voice: Voice, role: str) -> np.ndarray:
            if isinstance(voice, LibraryVoice):
                return voice.codes
            assert voice is not None  # the speakers without a voice are left out
            if not isinstance(voice, str | Path):
                return load_voice(voice, self.spec, self.encoder, limit, role)
            if str(voice) not in read:
                read[str(voice)] = load_voice(voice, self.spec, self.encoder, limit, role)
            return read[str(voice)]

        return (
            [None if voice is None else codes(voice, "reference") for voice in references],
            None if prefix is None else codes(prefix, "prefix"),
        )

    def _references(self, voices: Voices) -> list[Voice]:
        """The reference of each of a request's speakers ([S1] first; None for a speaker without one), before
        anything is read: ``None`` is the configured voice, ``""`` none."""
        if voices is None:
            return [] if self.library.default is None else [self.library.default]
        if isinstance(voices, list | tuple):
            return [None if no_voice(voice) else voice for voice in voices]
        return [] if no_voice(voices) else [voices]

    def _text(self, request: SpeechRequest, gen: GenerationConfig) -> str | None:
        """The text to speak: None for a sound without text (docs/family.md, "Sound effects"), else the request's
        words after its prefix's transcript, cleaned (``_clean_text``)."""
        if _is_sound(request):
            if not no_voice(request.prefix):
                raise RequestError(
                    "a sound without text cannot continue a recording: leave the prefix out, or give the text the "
                    "recording's speech goes on with"
                )
            return None
        return _clean_text(_new_text(request.text, _transcript(request)), gen.normalize_text)

    def _speakers_prefix(self, request: SpeechRequest, config: Config) -> SpeechRequest:
        """A dialogue model's request that gives no prefix, whose speakers are all voices of the library with their
        transcripts: with the speakers' clips one after the other as its prefix, and their transcripts, each opened
        with its speaker's tag, as the prefix's, as upstream's MOSS-TTSD card builds it (docs/family.md,
        "Dialogues"). Any other request as it is."""
        given = not no_voice(request.prefix) or request.prefix_text is not None
        if not self.spec.identity.dialogue or given or _is_sound(request):
            return request
        speakers = [(i, voice) for i, voice in enumerate(self._references(request.voice)) if voice is not None]
        voices = [voice for _, voice in speakers if isinstance(voice, LibraryVoice) and voice.transcript]
        if not speakers or len(voices) < len(speakers):
            return request
        codes = np.concatenate([voice.codes for voice in voices])
        self.voice_limit(config).check(codes.shape[0], "the prefix made of the speakers' clips")
        numbers = [number for number, _ in speakers]
        transcript = " ".join(in_turn(n, voice.transcript or "") for n, voice in zip(numbers, voices, strict=True))
        return replace(request, prefix=codes, prefix_text=transcript)


def _clean_text(text: str, normalize: bool) -> str:
    """The text to speak (``check_request`` made sure it is a string of bounded length): cleaned when
    ``normalize``, and refused when it is empty, or has nothing to say (``has_something_to_say``)."""
    if not text.strip():
        raise RequestError("the text is empty: give at least one word to speak")
    if normalize:
        text = normalize_text(text)
    if not has_something_to_say(text):
        raise RequestError(
            "nothing to say: once cleaned, the text has no letter or digit (only emoji, symbols, punctuation "
            "or control characters)"
        )
    return text


def _is_sound(request: SpeechRequest) -> bool:
    """Whether the request asks for a sound and nothing to say: a sound event or an ambient sound, and no text."""
    return not request.text.strip() and bool(request.sound_event or request.ambient_sound)


def _frames(voice: Voice) -> int:
    """A voice's frames, read without decoding it."""
    if isinstance(voice, LibraryVoice):
        return voice.codes.shape[0]
    assert voice is not None
    return voice_frames(voice)


def _transcript(request: SpeechRequest) -> str | None:
    """What the request's prefix says, as given: its prefix_text, else a library voice's own transcript; None where
    the text begins with it (``check_request`` refused a prefix_text without a prefix)."""
    if request.prefix_text is not None:
        return request.prefix_text
    return request.prefix.transcript if isinstance(request.prefix, LibraryVoice) else None


def _continuation(
    request: SpeechRequest, prefix: np.ndarray | None, normalize: bool, turns: bool
) -> Continuation | None:
    """What the request continues: the prefix's codes and its transcript, cleaned as the text is (None where the
    request's text begins with it, and where it is blank once cleaned: so every check that a continuation has no
    transcript apart holds for it); None without a prefix. ``turns``: a dialogue model's (``Continuation``)."""
    if prefix is None:
        return None
    transcript = _transcript(request)
    if transcript is not None:
        transcript = normalize_text(transcript) if normalize else transcript.strip()
    return Continuation(prefix, transcript or None, normalize, turns)


def _new_text(text: str, transcript: str | None) -> str:
    """The request's text without the prefix's transcript where it begins with it (upstream's requests do): the
    transcript goes before each piece's text anyway (``Continuation.text``)."""
    lead = (transcript or "").strip()
    if not lead or not text.lstrip().startswith(lead):
        return text
    new = text.lstrip()[len(lead) :]
    if not new.strip():
        raise RequestError("the text is only the prefix's transcript: give the words that follow it")
    return new


def _sampling_params(request: SpeechRequest, config: Config, spec: ModelSpec) -> SamplingParams:
    """The request's sampling over the config's, the model's recommendation where neither sets a key
    (``resolved_sampling``), its seed drawn now where neither the request nor the config fixes one."""
    layers = [layer for layer in (request.sampling, config.sampling) if layer is not None]
    sampling = resolved_sampling(spec.identity.sampling, *layers)
    seed = request.seed if request.seed is not None and request.seed >= 0 else sampling.seed
    return SamplingParams(**{**asdict(sampling), "seed": seed if seed >= 0 else secrets.randbits(63)})
