"""The facade: ``Synthesizer`` loads a voice model once and turns requests into streamed audio.

    synth = Synthesizer.from_config_file("config/cpu_only.yaml")
    stream = synth.stream("Hello there.", language="en")   # or synth.stream(SpeechRequest(...))
    for chunk in stream:          # AudioChunk objects, as they are produced
        play(chunk.samples)
    print(stream.report.format())

It knows nothing of ROS or of command lines: the node and the CLI are thin layers over it. What it is
made of lives in ``synthesis/``: the request and result types, the stages (what is loaded, and when),
voices, and the pipeline that turns a request's pieces into chunks.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.config import Config, GenerationConfig, load_config, resolved_sampling
from moss_tts_node.errors import Cancelled, ExpectedTooLong, RequestError
from moss_tts_node.model.layout import TOKENIZER_DIR
from moss_tts_node.model.rates import frames_for_seconds
from moss_tts_node.model.sampling import SamplingParams
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.synthesis.cancel import CancelFlag, cancel_check
from moss_tts_node.synthesis.dialogue import DialoguePieces
from moss_tts_node.synthesis.feed import TextFeed
from moss_tts_node.synthesis.pipeline import ListedPlan, Pipeline, PlanSource
from moss_tts_node.synthesis.request import SpeechRequest, Voice, Voices, check_request, no_voice, request_language
from moss_tts_node.synthesis.results import AudioStream, Synthesis
from moss_tts_node.synthesis.stages import Stages, open_stages
from moss_tts_node.synthesis.text_stream import DEFAULT_INPUT_PAUSE_S, PACK_TOKENS, RUN_TOKENS, CutPieces
from moss_tts_node.synthesis.voices import LibraryVoice, VoiceLibrary, VoiceLimit, load_voice, voice_frames
from moss_tts_node.text.cutter import TextCutter
from moss_tts_node.text.normalize import has_something_to_say, normalize_text
from moss_tts_node.text.pauses import resolve_pause_mode
from moss_tts_node.text.pieces import Continuation, Piece, PiecePlanner
from moss_tts_node.text.prompt import PromptBuilder, PromptFields
from moss_tts_node.text.speakers import in_turn


class Synthesizer:
    """One loaded model; one synthesis at a time (the backbone's KV cache is shared).

    The backbone keeps the last prompt in its KV cache, and a request whose prompt begins the same way
    (same voice, instruction and language: everything before the text) prefills only the rest;
    ``prepare_voice`` puts such a prefix there ahead of the first request.

    With ``model.low_memory`` (8 GB boards) the stages take turns in memory (``synthesis/stages.py``):
    nothing streams, each request reloads them, and no prompt prefix is reused.

    Streams decode with the stream decoder graph that ``audio.stream_decoder`` selects, which the stages
    load once (its state is one utterance's, reset between requests), or else with the windowed scheme.

    ``voices`` holds the owner's named voices (``voices.*``) and the default one (``generation.reference_audio``),
    all encoded here, once: a request may give one of them as its voice (``synth.voices["butler"].codes``).

    ``spec.identity`` is which model of the family the weights are (``model/identity.py``): its name, its
    MOSS-TTS release where known (with ``generation.pause_markers: auto`` it decides what a ``[pause X.Ys]``
    means: ``text/pauses.py``), its prompt template and its recommended sampling.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        weights = Path(config.model.weights_dir)
        self.spec = ModelSpec.load(weights)
        self.prompts = PromptBuilder(weights / TOKENIZER_DIR, self.spec)
        self.stages: Stages = open_stages(config, self.spec)
        try:
            self.n_ctx = self.stages.n_ctx  # what llama.cpp made of llama.n_ctx (it rounds up)
            self.planner = PiecePlanner(self.prompts, self.spec, self.n_ctx, config.audio.max_codec_seconds)
            self.pipeline = Pipeline(self.spec, self.stages)
            self.voices = VoiceLibrary.build(config, self.spec, self.stages.encoder, self._voice_limit(config))
        except BaseException:
            self.stages.close()
            raise

    @classmethod
    def from_config_file(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> Synthesizer:
        return cls(load_config(path, overrides))

    def close(self) -> None:
        self.stages.close()

    # What the node's diagnostics and the CLI read of any synthesizer, the remote backend's too (backends.py).

    @property
    def name(self) -> str:
        """Which model of the family the weights are (``ModelIdentity.name``: "MOSS-VoiceGenerator")."""
        return self.spec.identity.name

    @property
    def weight_layout(self) -> str:
        """Where llama.cpp keeps the backbone's weights, and why (``Backbone.weight_layout``)."""
        return self.stages.weight_layout

    @property
    def sampling_rate(self) -> int:
        return self.spec.sampling_rate

    def __enter__(self) -> Synthesizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- voices ---------------------------------------------------------------------------

    def encode_reference(self, reference: str | Path | np.ndarray, config: Config | None = None) -> np.ndarray:
        """A voice as (T, n_vq) codes: from a WAV/FLAC clip (encoded), a .npy of codes, or an array; refused
        (RequestError) before it is decoded when longer than ``limits.max_reference_seconds`` of ``config``
        (default ``self.config``) or than the context leaves room for."""
        limit = self._voice_limit(config if config is not None else self.config)
        return load_voice(reference, self.spec, self.stages.encoder, limit)

    def _voice_limit(self, config: Config) -> VoiceLimit:
        return VoiceLimit(config.limits.max_reference_seconds, self.n_ctx, self.spec)

    def _references(self, voices: Voices) -> list[Voice]:
        """The reference of each of a request's speakers ([S1] first; None for a speaker without one), before
        anything is read: ``None`` is the configured voice, ``""`` none."""
        if voices is None:
            return [] if self.voices.default is None else [self.voices.default]
        if isinstance(voices, list | tuple):
            return [None if no_voice(voice) else voice for voice in voices]
        return [] if no_voice(voices) else [voices]

    def _checked_fields(self, gen: GenerationConfig, request: SpeechRequest, text: str | None) -> PromptFields:
        """The request's prompt fields, refused where this model's template has no place for one."""
        fields = _prompt_fields(gen, request, text)
        self.prompts.check_fields(fields)
        return fields

    def _prepared(
        self, request: SpeechRequest, config: Config, text: str | None
    ) -> tuple[PromptFields, list[np.ndarray | None], Continuation | None]:
        """A checked request's prompt fields (its text ``text``), its references' codes and what it continues."""
        fields = self._checked_fields(config.generation, request, text)
        references, prefix = self._voices(request, config)
        dialogue = self.spec.identity.dialogue
        return fields, references, _continuation(request, prefix, config.generation.normalize_text, dialogue)

    def _voices(self, request: SpeechRequest, config: Config) -> tuple[list[np.ndarray | None], np.ndarray | None]:
        """The codes of a request's references (None for a speaker without one) and of its prefix (None: it
        continues no recording). Each is refused before it is decoded when too long (``VoiceLimit``), and
        all of them when together they leave no room in the context; a file given twice (the same clip as a
        reference and as the prefix) is read once."""
        limit = self._voice_limit(config)
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
                return load_voice(voice, self.spec, self.stages.encoder, limit, role)
            if str(voice) not in read:
                read[str(voice)] = load_voice(voice, self.spec, self.stages.encoder, limit, role)
            return read[str(voice)]

        return (
            [None if voice is None else codes(voice, "reference") for voice in references],
            None if prefix is None else codes(prefix, "prefix"),
        )

    # -- synthesis ------------------------------------------------------------------------

    def stream(
        self,
        request: SpeechRequest | str,
        *,
        cancel: CancelFlag = None,
        streaming: bool = True,
        config: Config | None = None,
        max_audio_s: float | None = None,
        max_expected_s: float | None = None,
        **fields: Any,
    ) -> AudioStream:
        """Validate the request now (errors raise here, not mid-stream), then stream its audio.

        ``request`` is a ``SpeechRequest``, or its text with the other fields as keywords
        (``synth.stream("Hi", language="en", seed=1)``). ``streaming=False`` (for whole-utterance outputs)
        yields the codec's offline decode of each piece once it is generated, instead of chunks
        decoded as they are generated (by the stream decoder when one is loaded, which gives the same
        audio, else each with ``audio.left_context_frames`` of context). A text whose
        speech would not fit the context (or one codec window) is split at sentence boundaries and
        spoken piece by piece in the same stream. ``max_new_tokens`` applies to each piece and is
        clamped to what n_ctx leaves after its prompt; a prompt that leaves no room for one frame is
        refused. A ``[pause X.Ys]`` in the text means what ``generation.pause_markers`` says (docs/usage.md,
        "Pause markers"); rendered as silence, it arrives in the stream in chunks like speech.

        ``voice`` is one voice or a list of up to five, the references of the speakers [S1], [S2] ...; ``prefix`` a
        recording the speech continues after its transcript ``prefix_text`` (docs/continuation.md): the stream is
        then the new speech only, decoded after the prefix.

        ``config`` holds the settings the request runs with (the keys the schema marks per-request:
        generation defaults, sampling, audio chunking, limits), by default ``self.config`` now: they are read
        here once, so replacing ``self.config`` later does not change a stream already made (the node queues
        streams).

        The checks come cheapest first: the fields and ``limits.max_text_chars`` (``check_request``), then a
        text with nothing to say once cleaned, the voice (its length read before it is decoded), the prompt.
        ``max_audio_s`` bounds the audio of the whole request: generation stops there (stop reason
        max_new_tokens); ``AudioStream.estimated_seconds`` says beforehand what the text is expected to take, and a
        request expected to take more than ``max_expected_s`` is refused then, before its pieces are planned.
        """
        request = _request(request, fields)
        config = config if config is not None else self.config
        check_request(request, config.limits)
        request = self._speakers_prefix(request, config)
        gen = config.generation
        if _is_sound(request):  # no text, a sound described: a sound effect (docs/family.md, "Sound effects")
            text = None
            if not no_voice(request.prefix):
                raise RequestError(
                    "a sound without text cannot continue a recording: leave the prefix out, or give the text the "
                    "recording's speech goes on with"
                )
        else:
            text = self._clean_text(_new_text(request.text, _transcript(request)), gen.normalize_text)
        prompt_fields, references, continuation = self._prepared(request, config, text)
        measured = self.planner.measure(prompt_fields, references, self._pause_mode(gen), continuation)
        expected_s = measured.expected_seconds
        if max_expected_s is not None and expected_s is not None and expected_s > max_expected_s:
            raise ExpectedTooLong(expected_s, max_expected_s)
        plan = self.planner.pieces(measured, request.max_new_tokens or gen.max_new_tokens)
        max_frames = None if max_audio_s is None else frames_for_seconds(max_audio_s)
        source = self._in_turns(ListedPlan(plan), references, gen.normalize_text)
        chunks = self.pipeline.run(
            source,
            _sampling_params(request, config, self.spec),
            config.audio,
            cancel_check(cancel),
            streaming,
            max_frames,
        )
        prompt = next(item.prompt for item in plan if isinstance(item, Piece))
        return AudioStream(prompt, chunks, expected_s)

    def stream_text(
        self,
        fragments: Iterable[str] | TextFeed,
        request: SpeechRequest | None = None,
        *,
        cancel: CancelFlag = None,
        streaming: bool = True,
        config: Config | None = None,
        input_pause_s: float = DEFAULT_INPUT_PAUSE_S,
        pack_tokens: int = PACK_TOKENS,
        **fields: Any,
    ) -> AudioStream:
        """Speak text that arrives in fragments (an LLM's tokens), sentence by sentence, as one stream.

        ``fragments`` is a ``TextFeed`` that another thread puts fragments into and closes, or any iterable
        of strings, which a reader thread drains (so a slow one never holds the synthesis up). The text is
        cleaned and cut at sentence ends as it arrives (``text/cutter.py``): the first sentence alone, then
        pieces of whole sentences of ``pack_tokens`` tokens or more (at most ``RUN_TOKENS``; 0: each sentence
        alone, which pays the model's ramp of n_vq steps once a sentence). Each is generated as soon as it is
        settled, while the next fragments arrive, its prompt prefilling only its own text after the voice's
        rows kept in the KV cache. A run of more than ``RUN_TOKENS`` tokens without a sentence end is cut at
        a clause, else a word; input silent for ``input_pause_s`` seconds, while the
        synthesis waits for text, closes the piece at its last word.

        The other fields are a request's (as ``stream``), checked now; the request's text must be empty,
        and ``tokens`` (a duration) cannot be given, as the text's length is not known. The same text and
        seed give the same audio however the text was fragmented and whenever it arrived, as long as no
        pause cut it (the pieces, and each piece's seed, depend on the text alone). A cancel ends the stream
        within one step, or while it waits for text within ``_CANCEL_POLL_S``. Once the stream is over the
        feed is abandoned: fragments put after that are ignored. The stream's report times the whole
        stream, waiting for text included.
        """
        request = _request(request if request is not None else "", fields)
        if request.text:
            raise RequestError("stream_text takes its text from the fragments: leave the request's text empty")
        if request.tokens is not None:
            raise RequestError("a duration (tokens) cannot be asked of text that arrives in fragments: leave it out")
        if input_pause_s <= 0:
            raise RequestError(f"input_pause_s must be above 0 seconds, got {input_pause_s}")
        if not 0 <= pack_tokens <= RUN_TOKENS:
            raise RequestError(f"pack_tokens must be 0 to {RUN_TOKENS}, got {pack_tokens}")
        config = config if config is not None else self.config
        check_request(request, config.limits)
        request = self._speakers_prefix(request, config)
        gen = config.generation
        prompt_fields, references, continuation = self._prepared(request, config, "")
        if continuation is not None and continuation.transcript is None:
            raise RequestError(
                "text that arrives in fragments is spoken in pieces, each continuing the prefix after its transcript: "
                "give the transcript (prefix_text), or a voice of the library that has one"
            )
        # the voices and fields leave room
        empty = self.prompts.build(
            replace(prompt_fields, text=continuation.text("") if continuation else ""),
            references,
            None if continuation is None else continuation.codes,
        )
        self.planner.step_budget(empty, 1)
        max_new_tokens = request.max_new_tokens or gen.max_new_tokens
        flag = cancel_check(cancel)
        pause_markers = self._pause_mode(gen)
        source: PlanSource = CutPieces(
            fragments if isinstance(fragments, TextFeed) else TextFeed.reading(fragments),
            TextCutter(
                normalize_text if gen.normalize_text else str, RUN_TOKENS, self.planner.count_tokens, pack_tokens
            ),
            lambda text: self.planner.plan(
                replace(prompt_fields, text=text), references, max_new_tokens, pause_markers, continuation
            ),
            flag,
            input_pause_s,
        )
        source = self._in_turns(source, references, gen.normalize_text)
        chunks = self.pipeline.run(source, _sampling_params(request, config, self.spec), config.audio, flag, streaming)
        return AudioStream(None, chunks)

    def synthesize(
        self,
        request: SpeechRequest | str,
        *,
        cancel: CancelFlag = None,
        config: Config | None = None,
        max_audio_s: float | None = None,
        **fields: Any,
    ) -> Synthesis:
        """The whole utterance at once, as the codec decodes it; raises ``Cancelled`` if the cancel flag was set."""
        stream = self.stream(request, cancel=cancel, streaming=False, config=config, max_audio_s=max_audio_s, **fields)
        chunks = [chunk.samples for chunk in stream]
        result = stream.result
        if result is None or stream.cancelled:  # None: never, the stream was read to its end
            raise Cancelled("synthesis cancelled")
        audio = np.concatenate(chunks) if chunks else np.empty(0, dtype=np.float32)
        return Synthesis(
            audio,
            self.spec.sampling_rate,
            result.report,
            prompt=stream.prompt,
            generated=result.generated,
            codes=result.codes,
        )

    def prepare_voice(self, request: SpeechRequest | None = None, **fields: Any) -> int:
        """Prefill now the prompt prefix that requests with these fields will share, so that the first of
        them prefills only its text; returns the rows prefilled (0 if they already were in the KV cache).

        Fields as for ``stream`` (the text is ignored; ``None``: the config's generation defaults, the
        configured voice), so a bare call prepares what a request that gives only its text will use; a prefix is
        left out, as its rows follow the text (docs/continuation.md, "What is reused"). Waits
        for a generation under way to end first. In low_memory mode, whose backbone is reloaded per request,
        it only encodes the voice (kept for the requests that use it) and prefills nothing.
        """
        request = _request(request if request is not None else "", fields)
        check_request(request, self.config.limits)
        prompt_fields = self._checked_fields(self.config.generation, request, "")
        references, _ = self._voices(replace(request, prefix=None), self.config)
        prefix = self.prompts.voice_prefix(prompt_fields, references)
        return self.stages.prepare_prefix(prefix)

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
        self._voice_limit(config).check(codes.shape[0], "the prefix made of the speakers' clips")
        numbers = [number for number, _ in speakers]
        transcript = " ".join(in_turn(n, voice.transcript or "") for n, voice in zip(numbers, voices, strict=True))
        return replace(request, prefix=codes, prefix_text=transcript)

    def _in_turns(self, source: PlanSource, references: list[np.ndarray | None], normalize: bool) -> PlanSource:
        """``source`` as a dialogue model speaks it, each piece continuing the one before (``synthesis/dialogue.py``);
        as it is for the other models."""
        if not self.spec.identity.dialogue:
            return source
        planner = self.planner
        return DialoguePieces(
            source, lambda piece, previous, frames: planner.continued(piece, previous, frames, references, normalize)
        )

    def _pause_mode(self, gen: GenerationConfig) -> str:
        """What a pause marker means for these weights under ``generation.pause_markers`` (``text/pauses.py``)."""
        return resolve_pause_mode(gen.pause_markers, self.spec.identity.trained_on_pause_markers)

    @staticmethod
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


def _request(request: SpeechRequest | str, fields: dict[str, Any]) -> SpeechRequest:
    """``request`` itself, or a SpeechRequest of that text and the keyword ``fields``."""
    if isinstance(request, SpeechRequest):
        return replace(request, **fields) if fields else request
    return SpeechRequest(request, **fields)


def _sampling_params(request: SpeechRequest, config: Config, spec: ModelSpec) -> SamplingParams:
    """The request's sampling over the config's, the model's recommendation where neither sets a key
    (``resolved_sampling``), its seed drawn now where neither the request nor the config fixes one."""
    layers = [layer for layer in (request.sampling, config.sampling) if layer is not None]
    sampling = resolved_sampling(spec.identity.sampling, *layers)
    seed = request.seed if request.seed is not None and request.seed >= 0 else sampling.seed
    return SamplingParams(**{**asdict(sampling), "seed": seed if seed >= 0 else secrets.randbits(63)})


def _prompt_fields(gen: GenerationConfig, request: SpeechRequest, text: str | None) -> PromptFields:
    """A request's prompt fields (``text`` None: a sound without text), those left ``None`` taken from the generation
    defaults ``gen``; the language spelled as upstream's table does (``text/languages.py``), or refused."""
    language = request.language if request.language is not None else gen.language or None
    if language:
        language = request_language(language)
    return PromptFields(
        text=text,
        language=language,
        instruction=request.instruction if request.instruction is not None else gen.instruction or None,
        quality=request.quality if request.quality is not None else gen.quality or None,
        tokens=request.tokens,
        sound_event=request.sound_event,
        ambient_sound=request.ambient_sound,
        scene=request.scene,
    )
