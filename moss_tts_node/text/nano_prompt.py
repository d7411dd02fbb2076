"""MOSS-TTS-Nano's prompt: the rows upstream's ``build_inference_input_ids`` makes (docs/nano.md, "Prompt").

Nano's user turn is MOSS-TTS's ``<user_inst>`` block with every field but the reference and the text fixed to
``None``, and upstream tokenizes it in segments (the role, the template before the reference, the template after
it, the text, the closing template, each on its own), so the rows here are made segment by segment too: one
tokenization of the whole chat would cut some boundaries otherwise. There is no delay pattern: a reference clip is
one user-slot row per frame, a recording the speech continues one assistant-slot row per frame.

- With a voice (upstream's "voice_clone" mode): the clip's rows stand where the reference's ``None`` would.
- Without one ("continuation" mode, text only): the reference is ``None``.
- Continuing a recording (``prefix``, "continuation" mode with a prompt): the text is the recording's transcript
  and then the new text, and after the assistant's ``audio_start`` come the recording's rows.

The prompt builder has the interface of ``text/prompt.py``'s, so the planner and the request preparation take
either; the fields Nano's template fixes are refused here (``check_fields``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields as dataclass_fields
from dataclasses import replace
from pathlib import Path

import numpy as np

from moss_tts_node.errors import RequestError
from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.text.prompt import Prompt, PromptFields, load_tokenizer, refuse_control_tokens

# upstream's prompting.py, segment by segment.
# Where the prompt below comes from, in words (doctor's model line).
NANO_PROMPT_SOURCE = 'the prompt of upstream\'s prompting.py (docs/nano.md, "Prompt")'
USER_ROLE = "user\n"
REFERENCE_OPENING = "<user_inst>\n- Reference(s):\n"
NO_REFERENCE = "None"
AFTER_REFERENCE = (
    "\n- Instruction:\nNone\n"
    "- Tokens:\nNone\n"
    "- Quality:\nNone\n"
    "- Sound Event:\nNone\n"
    "- Ambient Sound:\nNone\n"
    "- Language:\nNone\n"
    "- Text:\n"
)
USER_CLOSING = "\n</user_inst>"
ASSISTANT_TURN_OPENING = "\n"
ASSISTANT_ROLE = "assistant\n"

# The prompt fields Nano has: upstream's template prints None for every other one.
NANO_FIELDS = ("text",)


class NanoPromptBuilder:
    def __init__(self, tokenizer_dir: Path, spec: ModelSpec) -> None:
        self.tokenizer, self._token_text = load_tokenizer(tokenizer_dir, spec)
        self.spec = spec

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def check_fields(self, fields: PromptFields) -> None:
        """RequestError for a field Nano's prompt has no place for (its template fixes them to None)."""
        for field in dataclass_fields(PromptFields):
            if field.name not in NANO_FIELDS and getattr(fields, field.name) is not None:
                raise RequestError(
                    f"MOSS-TTS-Nano's prompt has no {field.name} field (upstream's template fixes it to None; "
                    f"the model reads the language from the text): leave {field.name} out"
                )

    def _voice(self, references: Sequence[np.ndarray | None]) -> np.ndarray | None:
        clips = [codes for codes in references if codes is not None]
        if len(references) > 1:
            raise RequestError(
                f"MOSS-TTS-Nano speaks in one voice; this request gives {len(references)} speakers: give one voice"
            )
        return clips[0] if clips else None

    def _text_rows(self, ids: Sequence[int]) -> np.ndarray:
        rows = np.full((len(ids), self.spec.channels), self.spec.audio_pad_code, dtype=np.int64)
        rows[:, 0] = ids
        return rows

    def _audio_rows(self, codes: np.ndarray, slot: int) -> np.ndarray:
        rows = np.empty((codes.shape[0], self.spec.channels), dtype=np.int64)
        rows[:, 0] = slot
        rows[:, 1:] = codes
        return rows

    def _before_text(self, voice: np.ndarray | None) -> np.ndarray:
        """The rows every text with this voice (or none) shares: the user turn up to its text."""
        spec = self.spec
        opening = [spec.im_start_token_id, *self._ids(USER_ROLE), *self._ids(REFERENCE_OPENING)]
        if voice is None:
            ids = [*opening, *self._ids(NO_REFERENCE), *self._ids(AFTER_REFERENCE)]
            return self._text_rows(ids)
        return np.concatenate(
            [
                self._text_rows([*opening, spec.audio_start_token_id]),
                self._audio_rows(voice, spec.audio_user_slot_token_id),
                self._text_rows([spec.audio_end_token_id, *self._ids(AFTER_REFERENCE)]),
            ]
        )

    def encode(
        self, fields: PromptFields, references: Sequence[np.ndarray | None] = (), prefix: np.ndarray | None = None
    ) -> Prompt:
        """The (S, 1 + n_vq) prompt and the number of its text's tokens. ``references``: at most one voice's (T, n_vq)
        codes; ``prefix``: the (T, n_vq) codes of a recording the speech continues, whose transcript
        ``fields.text`` begins with."""
        self.check_fields(fields)
        refuse_control_tokens(fields, tuple(self._token_text.values()))
        spec = self.spec
        voice = self._voice(references)
        if voice is not None and prefix is not None:
            raise RequestError(
                "MOSS-TTS-Nano either clones a voice or continues a recording, not both in one request "
                "(upstream's voice_clone mode takes no transcript): give voice or prefix"
            )
        text_ids = self._ids(fields.text or "")
        closing = [
            *self._ids(USER_CLOSING),
            spec.im_end_token_id,
            *self._ids(ASSISTANT_TURN_OPENING),
            spec.im_start_token_id,
            *self._ids(ASSISTANT_ROLE),
            spec.audio_start_token_id,
        ]
        sections = [self._before_text(voice), self._text_rows([*text_ids, *closing])]
        if prefix is not None:
            sections.append(self._audio_rows(prefix, spec.audio_assistant_gen_slot_token_id))
        return Prompt(np.concatenate(sections), len(text_ids), sections[0].shape[0])

    def build(
        self, fields: PromptFields, references: Sequence[np.ndarray | None] = (), prefix: np.ndarray | None = None
    ) -> np.ndarray:
        """``encode``'s rows."""
        return self.encode(fields, references, prefix).rows

    def voice_prefix(self, fields: PromptFields, references: Sequence[np.ndarray | None] = ()) -> np.ndarray:
        """The rows ``build`` gives every text with this voice first (the text is tokenized on its own, so they
        are exactly shared); ``fields.text`` is ignored."""
        self.check_fields(replace(fields, text=None))
        return self._before_text(self._voice(references))
