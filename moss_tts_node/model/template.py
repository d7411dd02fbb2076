"""The user turn's template: the fields a model's prompt prints, in order, and how it prints what is absent.

The family's checkpoints each ship their own processing code, and their templates differ (docs/family.md,
"Prompt templates"): MOSS-TTS prints the fields of docs/model.md ("Prompt format") and leaves an absent speaker
out; MOSS-TTSD's adds a ``- Scene:`` field before ``- Text:`` and prints an absent speaker as ``[S2]: None``.
``convert`` reads the checkpoint's template from its ``processing_*.py`` without running it
(``tools/prepare/prompt_template.py``) and keeps it, as data, in the weights' ``config.json``
(``model/identity.py``); ``PromptTemplate.user_content`` renders it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moss_tts_node.errors import WeightsError

REFERENCE = "reference"  # the field the speakers' reference clips fill
TEXT = "text"  # the field spoken; always the last one (the prompt before it is a voice's reusable prefix)
SCENE = "scene"  # MOSS-TTSD's
SPEAKER_NUMBER = "{n}"  # in ``speaker`` and ``absent_speaker``: the speaker's number, from 1


@dataclass(frozen=True)
class PromptTemplate:
    """A model's user-turn template, as data.

    ``fields`` are (label, name) pairs in print order: ``- {label}:`` on one line, the value on the next.
    ``speaker`` is how a speaker with a reference clip prints (``audio_placeholder`` stands for the clip's
    audio block); ``absent_speaker`` how one without a clip prints, or None when it is left out.
    ``source`` says where the template was read.
    """

    fields: tuple[tuple[str, str], ...]
    opening: str = "<user_inst>"
    closing: str = "</user_inst>"
    absent: str = "None"
    speaker: str = "[S{n}]:\n<|audio|>"
    absent_speaker: str | None = None
    audio_placeholder: str = "<|audio|>"
    source: str = 'MOSS-TTS (docs/model.md, "Prompt format"): the checkpoint ships no processing code'

    def __post_init__(self) -> None:
        names = self.names
        if len(set(names)) != len(names) or REFERENCE not in names or not names or names[-1] != TEXT:
            raise ValueError(
                f"a template's fields must be distinct, hold {REFERENCE!r} and end with {TEXT!r}: got {names}"
            )
        if self.audio_placeholder not in self.speaker or SPEAKER_NUMBER not in self.speaker:
            raise ValueError(f"a speaker prints as {self.speaker!r}, which lacks its number or its audio")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.fields)

    @property
    def has_scene(self) -> bool:
        return SCENE in self.names

    def user_content(
        self, values: Mapping[str, Any], speakers: Sequence[bool] = (), *, stop_before: str | None = None
    ) -> str:
        """The user turn's content.

        ``values``: each field's value by name, printed with ``str``; a field missing from it, or None, prints
        ``absent``. ``speakers``: one flag per speaker S1, S2, ... saying whether it has a reference clip (each
        clip prints as ``speaker``, with ``audio_placeholder`` for its audio); none at all prints the reference
        field as absent. ``stop_before``: end right after that field's label (the prompt before its value).
        A name this template lacks is a ValueError: ask ``names`` first.
        """
        before, rest = self.split_content(values, speakers, stop_before or TEXT)
        return before if stop_before is not None else before + rest

    def split_content(
        self, values: Mapping[str, Any], speakers: Sequence[bool] = (), at: str = TEXT
    ) -> tuple[str, str]:
        """``user_content`` rendered once, in two: up to and with the label of field ``at`` (with ``TEXT``, what every
        text of these other fields shares), then the rest, from that field's value on."""
        unknown = sorted(set(values) - set(self.names) | ({REFERENCE} & set(values)))
        if unknown or at not in self.names:
            raise ValueError(f"this template has no field {(unknown or [at])[0]!r} to fill")
        lines = [self.opening]
        split = 0
        for label, name in self.fields:
            lines.append(f"- {label}:")
            if name == at:
                split = len(lines)
            value = self._references(speakers) if name == REFERENCE else values.get(name)
            lines.append(self.absent if value is None else str(value))
        lines.append(self.closing)
        return "\n".join(lines[:split]) + "\n", "\n".join(lines[split:])

    def _references(self, speakers: Sequence[bool]) -> str | None:
        if not speakers:
            return None
        shown = [
            (self.speaker if present else self.absent_speaker or "").replace(SPEAKER_NUMBER, str(number))
            for number, present in enumerate(speakers, start=1)
            if present or self.absent_speaker is not None
        ]
        return "\n".join(shown)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "opening": self.opening,
            "closing": self.closing,
            "fields": [list(pair) for pair in self.fields],
            "absent": self.absent,
            "speaker": self.speaker,
            "absent_speaker": self.absent_speaker,
            "audio_placeholder": self.audio_placeholder,
        }

    @classmethod
    def from_json(cls, record: Any, where: str) -> PromptTemplate:
        """The template ``to_json`` wrote; WeightsError naming ``where`` (the file and key) when it is not one."""
        try:
            if not isinstance(record, dict) or set(record) != set(_TEXTS) | {"fields", "absent_speaker"}:
                raise ValueError(f"expected the keys {sorted(MOSS_TTS_TEMPLATE.to_json())}")
            fields, absent_speaker = record["fields"], record["absent_speaker"]
            if not all(isinstance(record[key], str) for key in _TEXTS) or not isinstance(absent_speaker, str | None):
                raise ValueError("its texts must be strings")
            if not isinstance(fields, list) or not all(
                isinstance(pair, list) and len(pair) == 2 and all(isinstance(part, str) for part in pair)
                for pair in fields
            ):
                raise ValueError("'fields' must be a list of [label, name] pairs")
            texts = {key: record[key] for key in _TEXTS}
            return cls(fields=tuple((label, name) for label, name in fields), absent_speaker=absent_speaker, **texts)
        except ValueError as error:
            raise WeightsError(
                f"{where} is not a prompt template that convert wrote ({error}); convert the checkpoint again"
            ) from None


_TEXTS = ("source", "opening", "closing", "absent", "speaker", "audio_placeholder")  # the record's plain strings

# MOSS-TTS's template (docs/model.md, "Prompt format"): what a checkpoint that ships no processing code gets.
MOSS_TTS_TEMPLATE = PromptTemplate(
    fields=(
        ("Reference(s)", REFERENCE),
        ("Instruction", "instruction"),
        ("Tokens", "tokens"),
        ("Quality", "quality"),
        ("Sound Event", "sound_event"),
        ("Ambient Sound", "ambient_sound"),
        ("Language", "language"),
        ("Text", TEXT),
    )
)
