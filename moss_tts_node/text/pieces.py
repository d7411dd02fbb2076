"""How a request's text is cut into pieces that each fit the context and one codec window.

A piece of t text tokens takes t prompt rows and about t * FRAMES_PER_TEXT_TOKEN generated frames
(or its share of a requested token count) plus the 32-step ramp-up, all inside n_ctx; its audio should
also fit one codec window (``audio.max_codec_seconds``), so that a piece decodes without windowing. A
text that fits is one piece; a longer one is split at sentence boundaries (``text/split.py``), each piece
with the same instruction and voice. The synthesizer speaks the pieces one after the other as one stream.

Pause markers (``text/pauses.py``) change the plan by what they mean: rendered as silence, each becomes a
``Pause`` of exactly its length between the speech pieces around it; passed to the model, each counts as the
frames the model will spend on it (a ``[pause 3.2s]`` is 40 frames in a few tokens); as text, as its tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from moss_tts_node.choices import PAUSE_MODEL, PAUSE_SILENCE, PAUSE_TEXT
from moss_tts_node.errors import RequestError
from moss_tts_node.model.rates import FRAMES_PER_SECOND, frames_for_seconds
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.text.pauses import check_pause_lengths, find_markers, split_at_markers
from moss_tts_node.text.prompt import PromptBuilder, PromptFields
from moss_tts_node.text.split import split_text

# Speech frames (80 ms) per text token, to plan how much of the context a text will need:
# about 3 in English and Chinese at a normal pace; 4 leaves room for slow speech.
FRAMES_PER_TEXT_TOKEN = 4


@dataclass(frozen=True)
class Piece:
    """One part of a request's text: its prompt and step budget."""

    prompt: np.ndarray
    max_steps: int


@dataclass(frozen=True)
class Pause:
    """Silence between the pieces around it, exactly ``samples`` long: a pause marker the project renders."""

    samples: int


class PiecePlanner:
    """Plans the pieces of requests for one model's context size and codec window."""

    def __init__(self, prompts: PromptBuilder, spec: ModelSpec, n_ctx: int, max_codec_seconds: float) -> None:
        self.prompts = prompts
        self.spec = spec
        self.n_ctx = n_ctx
        self.codec_frames = frames_for_seconds(max_codec_seconds)

    def plan(
        self, fields: PromptFields, voice: list[np.ndarray], max_new_tokens: int, pause_markers: str = PAUSE_TEXT
    ) -> list[Piece | Pause]:
        """The request as one piece, or split at sentence boundaries when its speech would not fit, with its pause
        markers taken as ``pause_markers`` (a resolved mode of ``text/pauses.py``) says.

        ``max_new_tokens`` applies to each piece and is clamped to what n_ctx leaves after its prompt; a prompt that
        leaves no room for one frame is refused (RequestError), and so are a marker longer than the pauses allow and
        a text that is only markers to be rendered as silence.
        """
        if pause_markers in (PAUSE_MODEL, PAUSE_SILENCE):
            try:
                check_pause_lengths(fields.text)
            except ValueError as error:
                raise RequestError(str(error)) from None
        parts = split_at_markers(fields.text) if pause_markers == PAUSE_SILENCE else [fields.text]
        speech = [part for part in parts if isinstance(part, str)]
        if not speech:
            raise RequestError("the text is only pause markers: give at least one word to speak with them")
        prompt = self.prompts.build(fields, voice)
        speech_tokens = sum(self.count_tokens(text) for text in speech)
        per_token = fields.tokens / speech_tokens if fields.tokens else FRAMES_PER_TEXT_TOKEN
        other_rows = prompt.shape[0] - self.count_tokens(fields.text)
        limit = int(min((self.n_ctx - other_rows - self.spec.n_vq) / (1 + per_token), self.codec_frames / per_token))
        measure = self._with_pause_frames(per_token) if pause_markers == PAUSE_MODEL else self.count_tokens
        pieces: list[Piece | Pause] = []
        for part in parts:
            if not isinstance(part, str):
                samples = round(part * self.spec.sampling_rate)
                if samples:
                    pieces.append(Pause(samples))
                continue
            # fits, or cannot fit even split (step_budget says why): one piece
            texts = [part] if measure(part) <= limit or limit < 1 else split_text(part, limit, measure)
            for text in texts:
                share = (
                    max(1, round(fields.tokens * self.count_tokens(text) / speech_tokens)) if fields.tokens else None
                )
                piece_fields = replace(fields, text=text, tokens=share)
                piece_prompt = prompt if piece_fields == fields else self.prompts.build(piece_fields, voice)
                pieces.append(Piece(piece_prompt, self.step_budget(piece_prompt, max_new_tokens)))
        return pieces

    def _with_pause_frames(self, per_token: float) -> Callable[[str], int]:
        """A text's cost in tokens when the model makes its pauses: its tokens, plus its pauses' frames as tokens."""

        def measure(text: str) -> int:
            frames = sum(marker.seconds for marker in find_markers(text)) * FRAMES_PER_SECOND
            return self.count_tokens(text) + math.ceil(frames / per_token)

        return measure

    def count_tokens(self, text: str) -> int:
        return len(self.prompts.tokenizer.encode(text, add_special_tokens=False).ids)

    def step_budget(self, prompt: np.ndarray, requested: int) -> int:
        room = self.n_ctx - prompt.shape[0]
        needed = self.spec.n_vq + 1  # the ramp-up plus one complete frame
        if room < needed:
            raise RequestError(
                f"the prompt takes {prompt.shape[0]} rows of the {self.n_ctx}-row context and leaves "
                f"{max(room, 0)} steps, fewer than the {needed} needed for one frame: shorten the text or "
                f"the reference clip, or raise llama.n_ctx"
            )
        return min(requested, room)
