"""Prompt building: text fields and reference codes into the (S, 1 + n_vq) matrix the backbone reads.

The layout follows docs/model.md ("Prompt format") exactly: a ChatML user turn holding the
``<user_inst>`` block, the assistant header, then one ``audio_start`` row; in continuation mode the assistant
turn goes on with the prefix recording's codes, cut where upstream's processor cuts them (docs/model.md,
"Continuation"). Special tokens are looked up in the tokenizer by the ids of the model config, never by name.
The ``<user_inst>`` block is the weights' own template (``ModelSpec.identity.template``, read from the checkpoint's
processing code: docs/family.md, "Prompt templates"), which says which fields the model's prompt has, in what order,
and how a speaker without a clip prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from moss_tts_node.errors import RequestError, WeightsError
from moss_tts_node.model.delay import apply_delay
from moss_tts_node.model.layout import TOKENIZER_DIR, TOKENIZER_FILE
from moss_tts_node.model.spec import ModelSpec


@dataclass(frozen=True)
class PromptFields:
    """The user-instruction fields, named as the templates name them; ``None`` prints as ``None``, as in upstream's
    processor (docs/model.md, "Upstream"). A field the model's template lacks must stay None."""

    text: str | None  # None: no text at all (a sound effect), which prints None as upstream's processor does
    language: str | None = None
    instruction: str | None = None
    tokens: int | None = None  # target duration in frames (rates.FRAMES_PER_SECOND per second)
    quality: str | None = None
    sound_event: str | None = None
    ambient_sound: str | None = None
    scene: str | None = None  # MOSS-TTSD's


_FIELD_NAMES = tuple(field.name for field in dataclasses.fields(PromptFields))
_TEXT_FIELDS = tuple(name for name in _FIELD_NAMES if name != "tokens")  # those a user's words fill


@dataclass(frozen=True)
class Prompt:
    """A prompt's (S, 1 + n_vq) int64 rows, how many of them are the tokens of its text field (those that start
    inside it: the count a planner needs, taken from the one tokenization of the prompt), and how many come before
    its text: the voice prefix that every text with the same other fields and references begins with, which the
    backbone prefills apart so that reusing it is exact (``Backbone.prefill_prompt``)."""

    rows: np.ndarray
    text_tokens: int
    shared_rows: int


def load_tokenizer(tokenizer_dir: Path, spec: ModelSpec) -> tuple[Tokenizer, dict[str, str]]:
    """The weights' tokenizer.json, and the text of each special token of ``spec`` (by its field name), looked up by
    the id the model config gives: WeightsError where the file is missing or unreadable or lacks one of them."""
    path = Path(tokenizer_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise WeightsError(f"tokenizer not found: {path} (it ships in the weights' {TOKENIZER_DIR}/ directory)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises plain Exception
        raise WeightsError(f"{path}: not a readable tokenizer.json: {exc}") from exc
    token_text = {}
    for name, token_id in spec.special_token_ids.items():
        text = tokenizer.id_to_token(token_id)
        if text is None:
            raise WeightsError(f"{path}: has no token with id {token_id} ({name} in the model config)")
        token_text[name] = text
    return tokenizer, token_text


def refuse_control_tokens(fields: PromptFields, tokens: Sequence[str]) -> None:
    """RequestError for a text field that holds one of ``tokens`` (special tokens, placeholders)."""
    for name in _TEXT_FIELDS:
        value = getattr(fields, name)
        if not value:
            continue
        for token in tokens:
            if token in value:
                raise RequestError(f"the {name} contains the control token {token!r}; remove it")


class PromptBuilder:
    def __init__(self, tokenizer_dir: Path, spec: ModelSpec) -> None:
        self.tokenizer, self._token_text = load_tokenizer(tokenizer_dir, spec)
        self.spec = spec
        self.template = spec.identity.template

    def user_content(self, fields: PromptFields, references: Sequence[np.ndarray | None]) -> str:
        """The user turn's content: the template filled in with the fields and a line per speaker."""
        return "".join(self._split_content(fields, references))

    def _split_content(self, fields: PromptFields, references: Sequence[np.ndarray | None]) -> tuple[str, str]:
        """The user turn's content, rendered once, in two: up to its text field's label (what every text of these
        other fields shares), then the text and what follows it."""
        return self.template.split_content(self._values(fields), _speakers(references))

    def check_fields(self, fields: PromptFields) -> None:
        """RequestError for a field given that this model's template has no place for (a scene to MOSS-TTS)."""
        self._values(fields)

    def _values(self, fields: PromptFields) -> dict[str, Any]:
        """The fields that are given, by name; RequestError for one this model's template has no place for."""
        values = {name: getattr(fields, name) for name in _FIELD_NAMES if getattr(fields, name) is not None}
        missing = [name for name in values if name not in self.template.names]
        if missing:
            raise RequestError(
                f"{self.spec.identity.name}'s prompt has no {missing[0]} field (its template's fields: "
                f"{', '.join(self.template.names)}): leave {missing[0]} out"
            )
        return values

    def build(
        self, fields: PromptFields, references: Sequence[np.ndarray | None] = (), prefix: np.ndarray | None = None
    ) -> np.ndarray:
        """The (S, 1 + n_vq) int64 prompt; ``references`` are the (T, n_vq) code matrices of [S1], [S2] ...,
        None for a speaker without one. ``prefix``: the (T, n_vq) codes of a recording the speech continues
        (continuation mode): the assistant turn holds them delayed, as generated audio, and the prompt ends on
        their T-th gen-slot row; ``fields.text`` must then begin with what the recording says."""
        return self.encode(fields, references, prefix).rows

    def encode(
        self, fields: PromptFields, references: Sequence[np.ndarray | None] = (), prefix: np.ndarray | None = None
    ) -> Prompt:
        """``build``'s rows, and the number of tokens of ``fields.text`` among them."""
        self._refuse_control_tokens(fields)
        spec = self.spec
        tok = self._token_text
        content_before_text, text_on = self._split_content(fields, references)
        before_text = f"{tok['im_start_token_id']}user\n{content_before_text}"
        chat = f"{before_text}{text_on}{tok['im_end_token_id']}\n{tok['im_start_token_id']}assistant\n"
        clips = [codes for codes in references if codes is not None]
        text_start = len(self._with_clip_blocks(before_text, clips))
        frames = 0 if prefix is None else prefix.shape[0]
        # The assistant turn opens its audio; a prefix's rows follow as generated ones, gen slots over its codes.
        opening = [spec.audio_start_token_id] + [spec.audio_assistant_gen_slot_token_id] * frames
        rows, offsets = self._rows(chat, clips, opening)
        if prefix is not None:
            # Upstream lays the turn out whole (T gen slots, n_vq - 1 delay slots, audio_end, im_end) and cuts all
            # after the T-th gen slot: the delayed codes of those T rows stay, the flush's rows go.
            rows[rows.shape[0] - frames :, 1:] = apply_delay(prefix, spec.audio_pad_code)[:frames]
        text_end = text_start + len(fields.text or "")  # no text (None) prints a word of the template's, not text
        text_tokens = sum(1 for start, _ in offsets if text_start <= start < text_end)
        return Prompt(rows, text_tokens, sum(1 for start, _ in offsets if start < text_start))

    def voice_prefix(self, fields: PromptFields, references: Sequence[np.ndarray | None] = ()) -> np.ndarray:
        """The rows that ``build`` gives every text with these other fields and references first: the
        prompt up to its text (reference clips, instruction, ..., language). ``fields.text`` is ignored.

        The backbone keeps such a prefix in its KV cache between requests (``Backbone.prepare_prefix``).
        """
        prompt = self.encode(replace(fields, text=""), references)
        return prompt.rows[: prompt.shared_rows]

    def _with_clip_blocks(self, chat: str, clips: Sequence[np.ndarray]) -> str:
        """``chat`` with each placeholder replaced by its clip's block of user slots."""
        spec, tok = self.spec, self._token_text
        for codes in clips:
            slots = tok["audio_user_slot_token_id"] * spec.delayed_rows(codes.shape[0])
            block = tok["audio_start_token_id"] + slots + tok["audio_end_token_id"]
            chat = chat.replace(self.template.audio_placeholder, block, 1)
        return chat

    def _rows(
        self, chat: str, clips: Sequence[np.ndarray], last_tokens: Sequence[int]
    ) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """The chat's tokens as rows (audio columns padded), then a row for each of ``last_tokens``, with each
        reference clip's codes in its slots; and each token's character span in the chat with its clip blocks."""
        spec = self.spec
        encoding = self.tokenizer.encode(self._with_clip_blocks(chat, clips), add_special_tokens=False)
        ids = [*encoding.ids, *last_tokens]
        rows = np.full((len(ids), spec.channels), spec.audio_pad_code, dtype=np.int64)
        rows[:, 0] = ids
        self._place_reference_codes(rows, clips)
        return rows, encoding.offsets

    def _place_reference_codes(self, rows: np.ndarray, references: Sequence[np.ndarray]) -> None:
        """Write each clip's delayed codes into the audio columns of its run of user slots."""
        spec = self.spec
        starts = np.flatnonzero(rows[:, 0] == spec.audio_start_token_id)[: len(references)]
        if len(starts) != len(references):
            raise WeightsError("the tokenizer did not keep audio_start as one token; check tokenizer.json")
        for start, codes in zip(starts, references, strict=False):
            delayed = apply_delay(codes, spec.audio_pad_code)
            run = rows[start + 1 : start + 1 + delayed.shape[0], 0]
            if run.shape[0] != delayed.shape[0] or np.any(run != spec.audio_user_slot_token_id):
                raise WeightsError(
                    "the tokenizer split the audio slot tokens: its tokenizer.json must list them "
                    "as added special tokens"
                )
            rows[start + 1 : start + 1 + delayed.shape[0], 1:] = delayed

    def _refuse_control_tokens(self, fields: PromptFields) -> None:
        refuse_control_tokens(fields, (*self._token_text.values(), self.template.audio_placeholder))


def _speakers(references: Sequence[np.ndarray | None]) -> list[bool]:
    """Which speakers, [S1] first, have a reference clip (None: a speaker without one)."""
    return [codes is not None for codes in references]
