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

from collections.abc import Callable, Generator, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.audio_output import AudioFormat, converted
from moss_tts_node.config import Config, check_per_request_change, load_config
from moss_tts_node.errors import ExpectedTooLong, RequestError
from moss_tts_node.model.layout import TOKENIZER_DIR
from moss_tts_node.model.rates import frames_for_seconds
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.synthesis.cancel import CancelFlag, cancel_check
from moss_tts_node.synthesis.dialogue import DialoguePieces
from moss_tts_node.synthesis.feed import TextFeed
from moss_tts_node.synthesis.fields import with_request_keywords
from moss_tts_node.synthesis.pipeline import ListedPlan, Pipeline, PlanSource
from moss_tts_node.synthesis.preparation import Prepared, RequestPreparation
from moss_tts_node.synthesis.request import REQUEST_FIELDS, SpeechRequest, check_request, request_of
from moss_tts_node.synthesis.results import AudioChunk, AudioStream, StreamResult, Synthesis
from moss_tts_node.synthesis.stages import Stages, open_stages
from moss_tts_node.synthesis.text_stream import DEFAULT_INPUT_PAUSE_S, PACK_TOKENS, RUN_TOKENS, CutPieces
from moss_tts_node.synthesis.voices import VoiceLibrary, load_voice
from moss_tts_node.text.cutter import TextCutter
from moss_tts_node.text.nano_prompt import NanoPromptBuilder
from moss_tts_node.text.normalize import normalize_text
from moss_tts_node.text.pieces import Piece, PiecePlanner
from moss_tts_node.text.prompt import PromptBuilder

# The keyword fields of stream, stream_text, synthesize and prepare_voice, shown by help() as the parameters they
# are: every field of SpeechRequest but its text (synthesis/fields.py).
request_keywords = with_request_keywords(REQUEST_FIELDS)


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

    Its audio leaves at ``sampling_rate`` and ``channels``: the model's, unless ``audio.output_sample_rate`` or
    ``audio.output_channels`` ask for others, to which every stream is converted as it goes (``audio_output.py``).
    """

    def __init__(self, config: Config) -> None:
        self._config = config
        weights = Path(config.model.weights_dir)
        self.spec = ModelSpec.load(weights)
        self.model_format = AudioFormat(self.spec.sampling_rate, self.spec.audio_channels)
        self.output_format = self.model_format.given_out(config.audio)
        prompts = NanoPromptBuilder if self.spec.is_nano else PromptBuilder
        self.prompts = prompts(weights / TOKENIZER_DIR, self.spec)
        self.stages: Stages = open_stages(config, self.spec)
        try:
            self.n_ctx = self.stages.n_ctx  # what llama.cpp made of llama.n_ctx (it rounds up)
            self.planner = PiecePlanner(self.prompts, self.spec, self.n_ctx, config.audio.max_codec_seconds)
            self.pipeline = Pipeline(self.spec, self.stages)
            self.preparation = self._preparation(config)
        except BaseException:
            self.stages.close()
            raise

    @classmethod
    def from_config_file(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> Synthesizer:
        return cls(load_config(path, overrides))

    def close(self) -> None:
        self.stages.close()

    @property
    def config(self) -> Config:
        """The settings a request runs with when it gives none; ``reconfigure`` changes them."""
        return self._config

    def reconfigure(self, config: Config) -> None:
        """Run the requests made from now on with ``config``, which may differ from the current settings only in
        the keys the schema marks per-request (``check_per_request_change``): the others made the model and its
        planner. The voices are read again when the limits they were read under changed (a voice the new ones
        refuse is a ConfigError, and the settings stay as they were); a request reads the rest from its config."""
        check_per_request_change(self._config, config)
        if config.limits != self._config.limits:
            self.preparation = self._preparation(config)
        self._config = config

    def _preparation(self, config: Config) -> RequestPreparation:
        """What prepares requests, with the voices of ``config`` encoded."""
        return RequestPreparation(config, self.spec, self.prompts, self.stages.encoder, self.n_ctx)

    @property
    def voices(self) -> VoiceLibrary:
        """The owner's voices, encoded (``VoiceLibrary``); a request may give one as its voice."""
        return self.preparation.library

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
        """The rate of the audio given out (``output_format``)."""
        return self.output_format.sample_rate

    @property
    def channels(self) -> int:
        """The channels of the audio given out: samples are (n,) for one, else (n, channels)."""
        return self.output_format.channels

    def __enter__(self) -> Synthesizer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def encode_reference(self, reference: str | Path | np.ndarray, config: Config | None = None) -> np.ndarray:
        """A voice as (T, n_vq) codes: from a WAV/FLAC clip (encoded), a .npy of codes, or an array; refused
        (RequestError) before it is decoded when longer than ``limits.max_reference_seconds`` of ``config``
        (default ``self.config``) or than the context leaves room for."""
        limit = self.preparation.voice_limit(config if config is not None else self.config)
        return load_voice(reference, self.spec, self.stages.encoder, limit)

    # -- synthesis ------------------------------------------------------------------------

    @request_keywords
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
        here once, so a ``reconfigure`` later does not change a stream already made (the node queues streams).

        The checks come cheapest first (``RequestPreparation.prepare``): the fields and ``limits.max_text_chars``
        (``check_request``), then a text with nothing to say once cleaned, the voice (its length read before it is
        decoded), the prompt.
        ``max_audio_s`` bounds the audio of the whole request: generation stops there (stop reason
        max_new_tokens); ``AudioStream.estimated_seconds`` says beforehand what the text is expected to take, and a
        request expected to take more than ``max_expected_s`` is refused then, before its pieces are planned.
        """
        prepared = self.preparation.prepare(request_of(request, fields), config if config is not None else self.config)
        measured = self.planner.measure(
            prepared.fields, prepared.references, prepared.pause_markers, prepared.continuation
        )
        expected_s = measured.expected_seconds
        if max_expected_s is not None and expected_s is not None and expected_s > max_expected_s:
            raise ExpectedTooLong(expected_s, max_expected_s)
        plan = self.planner.pieces(measured, prepared.max_new_tokens)
        max_frames = None if max_audio_s is None else frames_for_seconds(max_audio_s)
        chunks = self._run(prepared, ListedPlan(plan), cancel_check(cancel), streaming, max_frames)
        prompt = next(item.prompt for item in plan if isinstance(item, Piece))
        return AudioStream(prompt, chunks, expected_s)

    @request_keywords
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
        request = request_of(request if request is not None else "", fields)
        if request.text:
            raise RequestError("stream_text takes its text from the fragments: leave the request's text empty")
        if request.tokens is not None:
            raise RequestError("a duration (tokens) cannot be asked of text that arrives in fragments: leave it out")
        if input_pause_s <= 0:
            raise RequestError(f"input_pause_s must be above 0 seconds, got {input_pause_s}")
        if not 0 <= pack_tokens <= RUN_TOKENS:
            raise RequestError(f"pack_tokens must be 0 to {RUN_TOKENS}, got {pack_tokens}")
        prepared = self.preparation.prepare(request, config if config is not None else self.config, text_follows=True)
        prompt_fields, references, continuation = prepared.fields, prepared.references, prepared.continuation
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
        flag = cancel_check(cancel)
        normalize, max_new_tokens = prepared.config.generation.normalize_text, prepared.max_new_tokens
        source = CutPieces(
            fragments if isinstance(fragments, TextFeed) else TextFeed.reading(fragments),
            TextCutter(normalize_text if normalize else str, RUN_TOKENS, self.planner.count_tokens, pack_tokens),
            lambda text: self.planner.plan(
                replace(prompt_fields, text=text), references, max_new_tokens, prepared.pause_markers, continuation
            ),
            flag,
            input_pause_s,
        )
        return AudioStream(None, self._run(prepared, source, flag, streaming))

    @request_keywords
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
        return stream.whole(self.sampling_rate)

    @request_keywords
    def prepare_voice(self, request: SpeechRequest | None = None, **fields: Any) -> int:
        """Prefill now the prompt prefix that requests with these fields will share, so that the first of
        them prefills only its text; returns the rows prefilled (0 if they already were in the KV cache).

        Fields as for ``stream`` (the text is ignored; ``None``: the config's generation defaults, the
        configured voice), so a bare call prepares what a request that gives only its text will use; a prefix is
        left out, as its rows follow the text (docs/continuation.md, "What is reused"). Waits
        for a generation under way to end first. In low_memory mode, whose backbone is reloaded per request,
        it only encodes the voice (kept for the requests that use it) and prefills nothing.
        """
        request = request_of(request if request is not None else "", fields)
        check_request(request, self.config.limits)
        prompt_fields = self.preparation.fields(self.config, request, "")
        references, _ = self.preparation.voices(replace(request, prefix=None), self.config)
        prefix = self.prompts.voice_prefix(prompt_fields, references)
        return self.stages.prepare_prefix(prefix)

    def _run(
        self,
        prepared: Prepared,
        source: PlanSource,
        cancel: Callable[[], bool],
        streaming: bool,
        max_frames: int | None = None,
    ) -> Generator[AudioChunk, None, StreamResult]:
        """The chunks of the pieces ``source`` plans, a dialogue model's each continuing the one before
        (``synthesis/dialogue.py``)."""
        if self.spec.identity.dialogue:
            planner, references = self.planner, prepared.references
            normalize = prepared.config.generation.normalize_text
            source = DialoguePieces(
                source,
                lambda piece, previous, frames: planner.continued(piece, previous, frames, references, normalize),
            )
        chunks = self.pipeline.run(source, prepared.sampling, prepared.config.audio, cancel, streaming, max_frames)
        return converted(chunks, self.model_format, self.output_format)
