"""How a request's text is cut into pieces that each fit the context and one codec window.

A piece of t text tokens takes t prompt rows and about t * FRAMES_PER_TEXT_TOKEN generated frames
(or its share of a requested token count) plus the ramp-up before its first frame (``ModelSpec.first_frame_steps``,
the model's codebook count), all inside n_ctx; its audio should also fit one codec window
(``audio.max_codec_seconds``), so that a piece decodes without windowing. A text that fits is one piece; a longer
one is split at sentence boundaries (``text/split.py``), each piece with the same instruction and voice. The
synthesizer speaks the pieces one after the other as one stream.

Pause markers (``text/pauses.py``) change the plan by what they mean: rendered as silence, each becomes a
``Pause`` of exactly its length between the speech pieces around it; passed to the model, each counts as the
frames the model will spend on it (a ``[pause 3.2s]`` is 40 frames in a few tokens); as text, as its tokens.

A request that continues a recording (a ``Continuation``, docs/continuation.md) has every piece continue it: each
piece's prompt holds the recording's codes, and its text follows the recording's transcript, so each piece is what
upstream's processor makes of a continuation request; the recording's rows and transcript count as the piece's
prompt, and its frames as the codec window's.

A dialogue model's text (MOSS-TTSD: docs/family.md, "Dialogues") is cut between speaker turns, each piece opened
with its speaker's tag, and each piece after the first continues the audio the piece before it generated, with that
piece's text as the transcript (``PiecePlanner.continued``, once that audio exists). So that the carried piece fits
beside the next, a dialogue's pieces are at most half of what the context and the codec window leave.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from moss_tts_node.choices import PAUSE_MODEL, PAUSE_SILENCE, PAUSE_TEXT
from moss_tts_node.errors import RequestError
from moss_tts_node.model.rates import FRAMES_PER_SECOND, frames_for_seconds
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.text.nano_chunks import nano_chunks, pause_after
from moss_tts_node.text.nano_prompt import NanoPromptBuilder
from moss_tts_node.text.normalize import normalize_text
from moss_tts_node.text.pauses import check_pause_lengths, find_markers, split_at_markers
from moss_tts_node.text.prompt import Prompt, PromptBuilder, PromptFields
from moss_tts_node.text.speakers import MAX_SPEAKERS, going_on, reopened, speaker_label
from moss_tts_node.text.split import split_text

# Speech frames (80 ms) per text token, to plan how much of the context a text will need:
# about 3 in English and Chinese at a normal pace; 4 leaves room for slow speech.
FRAMES_PER_TEXT_TOKEN = 4
_WIDEST_TAG = speaker_label(MAX_SPEAKERS - 1)  # what opening a dialogue's piece again with its speaker may add


@dataclass(frozen=True)
class Piece:
    """One part of a request's text: its prompt and step budget. A piece that continues a recording ends its prompt
    inside that recording's audio, on its ``prefix_frames``-th frame (docs/model.md, "Continuation").

    ``fields`` are the piece's own prompt fields (its text without a transcript before it, its share of the tokens
    field) and ``expected_frames`` what its speech is planned to take: what a piece that continues this one, or that
    this one is made to continue, is built from (``PiecePlanner.continued``)."""

    prompt: np.ndarray
    max_steps: int
    prefix_frames: int = 0
    fields: PromptFields | None = None
    expected_frames: int = 0
    shared_rows: int = 0  # the prompt's rows before its text (Prompt.shared_rows)


@dataclass(frozen=True, eq=False)  # eq=False: codes are an array, which has no truth value to compare by
class Continuation:
    """The recording a request's speech continues: its (T, n_vq) codes and its transcript (``normalize``: cleaned as
    the request's text is), which every piece's text follows; None where the request's text begins with it
    already, which is then spoken as one piece. ``turns``: a dialogue's, in which a piece that opens with the
    speaker whose turn ends the transcript goes on with that turn (``speakers.going_on``)."""

    codes: np.ndarray
    transcript: str | None
    normalize: bool
    turns: bool = False

    def text(self, piece: str) -> str:
        """A piece's text as its prompt holds it: the transcript, a space, the piece; cleaned together, as upstream
        cleans the text it is given whole (the space goes where the clean-up takes it out, between CJK)."""
        if not self.transcript:
            return piece
        joined = f"{self.transcript} {going_on(self.transcript, piece) if self.turns else piece}"
        return normalize_text(joined) if self.normalize else joined


@dataclass(frozen=True)
class Pause:
    """Silence between the pieces around it, exactly ``samples`` long: a pause marker the project renders."""

    samples: int


@dataclass(frozen=True)
class Measured:
    """A request's text measured for planning, before any piece is cut: its parts in order (speech, and the
    seconds of each pause rendered as silence), each speech part's prompt as the request's fields make it, and
    the seconds its pause markers ask for unless they are text."""

    fields: PromptFields
    references: tuple[np.ndarray | None, ...]
    continuation: Continuation | None
    pause_markers: str
    parts: list[str | float]
    prompts: list[Prompt]  # one per speech part, in order
    tokens: list[int]  # each speech part's own tokens (its prompt's text tokens but a transcript's before it)
    pause_seconds: float

    @property
    def speech_tokens(self) -> int:
        return sum(self.tokens)

    @property
    def expected_seconds(self) -> float | None:
        """What the request is expected to take: its tokens field, or FRAMES_PER_TEXT_TOKEN frames per text
        token (generous for speech at a normal pace), and its pauses; None for a sound without text nor tokens
        field, whose length the model decides (within max_new_tokens and the context)."""
        if self.fields.text is None and not self.fields.tokens:
            return None
        frames = self.fields.tokens or self.speech_tokens * FRAMES_PER_TEXT_TOKEN
        return frames / FRAMES_PER_SECOND + self.pause_seconds


class PiecePlanner:
    """Plans the pieces of requests for one model's context size and codec window.

    A text is tokenized once per piece, in that piece's prompt: the counts the plan needs come from there. Only a
    text that must be split is measured again, sentence by sentence, where the splitter looks for its cuts.
    """

    def __init__(
        self, prompts: PromptBuilder | NanoPromptBuilder, spec: ModelSpec, n_ctx: int, max_codec_seconds: float
    ) -> None:
        self.prompts = prompts
        self.spec = spec
        self.n_ctx = n_ctx
        self.codec_frames = frames_for_seconds(max_codec_seconds)

    def plan(
        self,
        fields: PromptFields,
        references: Sequence[np.ndarray | None],
        max_new_tokens: int,
        pause_markers: str = PAUSE_TEXT,
        continuation: Continuation | None = None,
    ) -> list[Piece | Pause]:
        """The request as one piece, or split at sentence boundaries when its speech would not fit, with its pause
        markers taken as ``pause_markers`` (a resolved mode of ``text/pauses.py``) says: ``pieces(measure(...))``."""
        return self.pieces(self.measure(fields, references, pause_markers, continuation), max_new_tokens)

    def measure(
        self,
        fields: PromptFields,
        references: Sequence[np.ndarray | None],
        pause_markers: str = PAUSE_TEXT,
        continuation: Continuation | None = None,
    ) -> Measured:
        """The request's text in parts, each speech part in its prompt. Refuses (RequestError) a marker longer
        than the pauses allow and a text that is only markers to be rendered as silence."""
        references = tuple(references)
        if fields.text is None:  # a sound without text: one piece, with nothing to split nor to pause
            sound = self.prompts.encode(fields, references)
            return Measured(fields, references, None, pause_markers, [], [sound], [0], 0.0)
        markers_are_pauses = pause_markers in (PAUSE_MODEL, PAUSE_SILENCE)
        if markers_are_pauses:
            try:
                check_pause_lengths(fields.text)
            except ValueError as error:
                raise RequestError(str(error)) from None
        parts = split_at_markers(fields.text) if pause_markers == PAUSE_SILENCE else [fields.text]
        speech = [part for part in parts if isinstance(part, str)]
        if not speech:
            raise RequestError("the text is only pause markers: give at least one word to speak with them")
        prompts = [self._prompt(fields, text, references, continuation) for text in speech]
        transcript = continuation.transcript if continuation is not None else None
        before = self.count_tokens(continuation.text("")) if transcript else 0  # the transcript, in every prompt
        tokens = [max(prompt.text_tokens - before, 0) for prompt in prompts]
        pause_seconds = sum(marker.seconds for marker in find_markers(fields.text)) if markers_are_pauses else 0.0
        return Measured(fields, references, continuation, pause_markers, parts, prompts, tokens, pause_seconds)

    def _prompt(
        self,
        fields: PromptFields,
        text: str,
        references: Sequence[np.ndarray | None],
        continuation: Continuation | None,
        tokens: int | None = None,
    ) -> Prompt:
        """The prompt of a piece of ``text`` (with the ``tokens`` field, if given, instead of the request's)."""
        if continuation is None:
            return self.prompts.encode(replace(fields, text=text, tokens=tokens or fields.tokens), references)
        piece_fields = replace(fields, text=continuation.text(text), tokens=tokens or fields.tokens)
        return self.prompts.encode(piece_fields, references, continuation.codes)

    def pieces(self, measured: Measured, max_new_tokens: int) -> list[Piece | Pause]:
        """The pieces and pauses of a measured request. ``max_new_tokens`` applies to each piece and is clamped
        to what n_ctx leaves after its prompt; a prompt that leaves no room for one frame is refused
        (RequestError)."""
        fields, references, continuation = measured.fields, measured.references, measured.continuation
        if fields.text is None:
            sound = measured.prompts[0]
            return [Piece(sound.rows, self.step_budget(sound.rows, max_new_tokens), shared_rows=sound.shared_rows)]
        speech_tokens = measured.speech_tokens
        per_token = fields.tokens / speech_tokens if fields.tokens else FRAMES_PER_TEXT_TOKEN
        other_rows = measured.prompts[0].rows.shape[0] - measured.tokens[0]
        prefix_frames = 0 if continuation is None else continuation.codes.shape[0]
        codec_frames = self.codec_frames - prefix_frames  # a continuation decodes with its prefix before it
        ramp = self.spec.first_frame_steps
        limit = int(min((self.n_ctx - other_rows - ramp) / (1 + per_token), codec_frames / per_token))
        model_pauses = measured.pause_markers == PAUSE_MODEL

        def pause_tokens(text: str) -> int:
            """A text's pauses, when the model makes them, as the tokens their frames are worth."""
            frames = sum(marker.seconds for marker in find_markers(text)) * FRAMES_PER_SECOND
            return math.ceil(frames / per_token) if model_pauses else 0

        def measure(text: str) -> int:
            return self.count_tokens(text) + pause_tokens(text)

        if continuation is not None:
            self._check_continuation_room(measured, limit, other_rows, per_token)
        dialogue = self.spec.identity.dialogue
        nano_voice = self.spec.is_nano and any(codes is not None for codes in references)
        if dialogue:  # each piece is cut to be carried whole beside the next: a tag more, reopened
            limit = min(limit, self._carried_limit(measured, per_token)) - self.count_tokens(_WIDEST_TAG)
        measured_parts = iter(zip(measured.prompts, measured.tokens, strict=True))
        transcript_tokens = measured.prompts[0].text_tokens - measured.tokens[0]
        pieces: list[Piece | Pause] = []
        speaker: str | None = None  # in a dialogue, whose turn is under way
        for part in measured.parts:
            if not isinstance(part, str):
                samples = round(part * self.spec.sampling_rate)
                if samples:
                    pieces.append(Pause(samples))
                continue
            part_prompt, part_tokens = next(measured_parts)
            if nano_voice:  # cut as upstream cuts a voice clone's text, whether it fits or not
                chunks = nano_chunks(part, self.count_tokens)
                texts: list[tuple[str, int | None]] = (
                    [(part, part_tokens)] if chunks == [part] else [(chunk, None) for chunk in chunks]
                )
            # fits, or cannot fit even split (step_budget says why): one piece, in the prompt it was measured in
            elif part_tokens + pause_tokens(part) <= limit or limit < 1:
                texts = [(part, part_tokens)]
            else:
                texts = [(text, None) for text in split_text(part, limit, measure, turns=dialogue)]
            for number, (text, known_tokens) in enumerate(texts):
                if dialogue:
                    text, speaker = reopened(text, speaker)
                    known_tokens = known_tokens if text == part else None
                tokens = known_tokens
                share = None
                if fields.tokens:
                    tokens = known_tokens if known_tokens is not None else self.count_tokens(text)
                    share = max(1, round(fields.tokens * tokens / speech_tokens))
                reuse = known_tokens is not None and share == fields.tokens
                prompt = part_prompt if reuse else self._prompt(fields, text, references, continuation, share)
                if tokens is None:  # its own, from its prompt's one tokenization: the transcript's are not its own
                    tokens = prompt.text_tokens - transcript_tokens
                expected = share or math.ceil((tokens + pause_tokens(text)) * per_token)
                own = replace(fields, text=text, tokens=share or fields.tokens)
                rows = prompt.rows
                budget = self.step_budget(rows, max_new_tokens)
                pieces.append(Piece(rows, budget, prefix_frames, own, expected, prompt.shared_rows))
                if nano_voice and number + 1 < len(texts):
                    pieces.append(Pause(round(pause_after(text) * self.spec.sampling_rate)))
        return pieces

    def _carried_limit(self, measured: Measured, per_token: float) -> float:
        """The most tokens a dialogue's piece may take so that, carried whole (its text as the transcript, its frames
        as the prefix, ``per_token`` frames a token), it fits beside the next piece as long: in the context, after
        the rows every piece has (fields and references), and in the codec window."""
        fixed = self.prompts.encode(replace(measured.fields, text=""), measured.references).rows.shape[0]
        ramp = self.spec.first_frame_steps
        return min((self.n_ctx - fixed - ramp) / (2 * (1 + per_token)), self.codec_frames / (2 * per_token))

    def continued(
        self,
        piece: Piece,
        previous: Piece,
        frames: np.ndarray,
        references: Sequence[np.ndarray | None],
        normalize: bool,
    ) -> Piece | None:
        """``piece`` continuing the audio ``previous`` generated (``frames``, its new ones): its prompt holds them as
        the prefix, and ``previous``'s text as their transcript (docs/family.md, "Dialogues"); None where that
        leaves less room than ``piece`` expects to need, in the context or the codec window."""
        own, said = piece.fields, previous.fields
        if own is None or said is None or own.text is None or not said.text or not frames.shape[0]:
            return None
        carried = Continuation(frames, said.text, normalize, turns=True)
        prompt = self.prompts.encode(replace(own, text=carried.text(own.text)), references, frames)
        room = self.n_ctx - prompt.rows.shape[0]
        needed = piece.expected_frames + self.spec.first_frame_steps
        if room < needed or frames.shape[0] + piece.expected_frames > self.codec_frames:
            return None
        steps = min(piece.max_steps, room)
        return Piece(prompt.rows, steps, frames.shape[0], own, piece.expected_frames, prompt.shared_rows)

    def _check_continuation_room(self, measured: Measured, limit: int, other_rows: int, per_token: float) -> None:
        """Refuse (RequestError, with the numbers) a continuation whose prefix leaves no room for its text, and one
        whose text begins with the prefix's transcript (none given) and would need more than one piece."""
        continuation = measured.continuation
        assert continuation is not None
        frames = continuation.codes.shape[0]
        if limit < 1:
            raise RequestError(
                f"the continuation's prompt takes {other_rows} rows of the {self.n_ctx}-row context before its text "
                f"(the prefix's {frames} frames among them), with a codec window of {self.codec_frames} frames, "
                f"which leaves room for no text at {per_token:g} frames a token: use a shorter prefix, or raise "
                "llama.n_ctx (and audio.max_codec_seconds)"
            )
        if continuation.transcript is None and (len(measured.tokens) > 1 or measured.tokens[0] > limit):
            raise RequestError(
                f"the text ({measured.speech_tokens} tokens, the prefix's transcript first) needs more than one piece "
                f"(at most {limit} tokens each beside this prefix), and each piece continues the prefix: give its "
                "transcript (prefix_text) apart, so that it goes before each piece, or a shorter text"
            )

    def count_tokens(self, text: str) -> int:
        return len(self.prompts.tokenizer.encode(text, add_special_tokens=False).ids)

    def step_budget(self, prompt: np.ndarray, requested: int) -> int:
        room = self.n_ctx - prompt.shape[0]
        needed = self.spec.first_frame_budget
        if room < needed:
            raise RequestError(
                f"the prompt takes {prompt.shape[0]} rows of the {self.n_ctx}-row context and leaves "
                f"{max(room, 0)} steps, fewer than the {needed} needed for one frame: shorten the text or "
                f"the reference clip, or raise llama.n_ctx"
            )
        return min(requested, room)
