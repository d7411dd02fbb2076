"""Inline pause markers, ``[pause 3.2s]``: what one is, where they are, and what a request means by them.

MOSS-TTS-v1.5 was trained on pauses written into the text as ``[pause X.Ys]`` (docs/model.md, "MOSS-TTS-v1.5");
1.0 was not and reads one out as text. A marker is one unit wherever text is cut: the long-text splitter
(``text/split.py``) never cuts inside one, and cuts around one as at a clause mark; the normalizer keeps every
``[...]`` verbatim. ``generation.pause_markers`` says what a marker means (``PAUSE_MARKER_MODES``):

- ``model``: it stays in the text and the model makes the pause (v1.5); its length counts as speech when the
  text is planned, because the model generates the pause frame by frame;
- ``silence``: the project takes it out and puts exactly that much silence between the speech on either side;
- ``text``: it is text like any other (the brackets are kept, nothing is checked);
- ``auto``: ``model`` for a checkpoint known to be v1.5, else ``silence`` (``resolve_pause_mode``).

The grammar is lenient where people are (``[pause 2s]``, ``[Pause 0.5 s]``); the text keeps what was written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from moss_tts_node.choices import PAUSE_AUTO, PAUSE_MODEL, PAUSE_SILENCE

# Longer pauses are refused: a request is bounded before heavy work (a robot that must wait longer sends two).
MAX_PAUSE_SECONDS = 60.0

PAUSE_MARKER = re.compile(r"\[\s*pause\s+(\d{1,6}(?:\.\d{1,6})?)\s*s\s*\]", re.IGNORECASE)
# What can still grow into a marker at the end of text that is arriving piece by piece ("... [pau").
_MARKER_PREFIX = re.compile(
    r"\[\s*(?:p(?:a(?:u(?:s(?:e(?:\s+(?:\d+(?:\.\d*)?\s*(?:s\s*)?)?)?)?)?)?)?)?\Z", re.IGNORECASE
)


@dataclass(frozen=True)
class Marker:
    """One pause marker: ``text[start:end]``, asking for ``seconds`` of pause."""

    start: int
    end: int
    seconds: float


def find_markers(text: str) -> list[Marker]:
    """Every pause marker in ``text``, in order."""
    return [Marker(m.start(), m.end(), float(m.group(1))) for m in PAUSE_MARKER.finditer(text)]


def inside_marker(markers: list[Marker], position: int) -> bool:
    """Whether cutting ``text`` at ``position`` would split one of its ``markers``."""
    return any(marker.start < position < marker.end for marker in markers)


def unfinished_marker_start(text: str) -> int | None:
    """Where a marker that is not yet complete may begin at the end of ``text``, or None: text that arrives in
    pieces must not be cut from there on until more of it has come."""
    start = text.rfind("[")
    return start if start >= 0 and _MARKER_PREFIX.match(text, start) else None


def split_at_markers(text: str) -> list[str | float]:
    """``text`` as the speech between its markers and the markers' lengths in seconds, in order; adjacent
    markers add up, and speech that is only whitespace is left out."""
    parts: list[str | float] = []
    position = 0
    for marker in find_markers(text):
        _append_speech(parts, text[position : marker.start])
        if parts and isinstance(parts[-1], float):
            parts[-1] += marker.seconds
        else:
            parts.append(marker.seconds)
        position = marker.end
    _append_speech(parts, text[position:])
    return parts


def _append_speech(parts: list[str | float], speech: str) -> None:
    if speech.strip():
        parts.append(speech.strip())


def check_pause_lengths(text: str) -> None:
    """Refuse a marker longer than ``MAX_PAUSE_SECONDS`` (ValueError naming it)."""
    for marker in find_markers(text):
        if marker.seconds > MAX_PAUSE_SECONDS:
            raise ValueError(
                f"the pause marker {text[marker.start : marker.end]!r} asks for more than {MAX_PAUSE_SECONDS:g} s: "
                "split the request in two, or shorten the pause"
            )


def resolve_pause_mode(setting: str, trained_on_markers: bool | None) -> str:
    """What ``generation.pause_markers`` means for a checkpoint: ``auto`` becomes ``model`` when the checkpoint is
    known to be trained on markers (v1.5), else ``silence``, which is exact on either checkpoint and never reads a
    marker out; the other settings stand."""
    if setting != PAUSE_AUTO:
        return setting
    return PAUSE_MODEL if trained_on_markers else PAUSE_SILENCE
