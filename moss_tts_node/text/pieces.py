"""How a request's text is cut into pieces that each fit the context and one codec window.

A piece of t text tokens takes t prompt rows and about t * FRAMES_PER_TEXT_TOKEN generated frames
(or its share of a requested token count) plus the 32-step ramp-up, all inside n_ctx; its audio should
also fit one codec window (``audio.max_codec_seconds``), so that a piece decodes without windowing. A
text that fits is one piece; a longer one is split at sentence boundaries (``text/split.py``), each piece
with the same instruction and voice. The synthesizer speaks the pieces one after the other as one stream.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from moss_tts_node.errors import RequestError
from moss_tts_node.model.rates import frames_for_seconds
from moss_tts_node.model.spec import ModelSpec
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


class PiecePlanner:
    """Plans the pieces of requests for one model's context size and codec window."""

    def __init__(self, prompts: PromptBuilder, spec: ModelSpec, n_ctx: int, max_codec_seconds: float) -> None:
        self.prompts = prompts
        self.spec = spec
        self.n_ctx = n_ctx
        self.codec_frames = frames_for_seconds(max_codec_seconds)

    def plan(self, fields: PromptFields, voice: list[np.ndarray], max_new_tokens: int) -> list[Piece]:
        """The request as one piece, or split at sentence boundaries when its speech would not fit.

        ``max_new_tokens`` applies to each piece and is clamped to what n_ctx leaves after its prompt;
        a prompt that leaves no room for one frame is refused (RequestError).
        """
        prompt = self.prompts.build(fields, voice)
        text_tokens = self.count_tokens(fields.text)
        per_token = fields.tokens / text_tokens if fields.tokens else FRAMES_PER_TEXT_TOKEN
        other_rows = prompt.shape[0] - text_tokens
        limit = int(min((self.n_ctx - other_rows - self.spec.n_vq) / (1 + per_token), self.codec_frames / per_token))
        if text_tokens <= limit or limit < 1:  # fits, or cannot fit even split: step_budget says why
            return [Piece(prompt, self.step_budget(prompt, max_new_tokens))]
        pieces = []
        for text in split_text(fields.text, limit, self.count_tokens):
            share = max(1, round(fields.tokens * self.count_tokens(text) / text_tokens)) if fields.tokens else None
            piece_prompt = self.prompts.build(replace(fields, text=text, tokens=share), voice)
            pieces.append(Piece(piece_prompt, self.step_budget(piece_prompt, max_new_tokens)))
        return pieces

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
