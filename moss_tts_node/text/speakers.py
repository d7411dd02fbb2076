"""Speaker tags, ``[S1]`` to ``[S5]``: who speaks, in the prompt's references and in the text.

The prompt numbers its reference clips ``[S1]:`` to ``[S5]:``, one per speaker (docs/model.md, "Prompt format"), and
a dialogue's text marks each speaker's turn with the same tags (``[S1]Hello.[S2]Hi!``). A tag reaches the prompt
as written, as upstream's processor writes it: the normalizer keeps every ``[...]`` verbatim, and the long-text
splitter (``text/split.py``) never cuts inside a tag nor between a tag and the speech it opens; a turn ends where
the next speaker's tag begins, so the splitter may cut there, as at a sentence end. A dialogue is cut between
turns first; a piece that begins inside a turn (a turn too long for one piece) is opened again with its speaker's
tag, so that every piece says who speaks (``reopened``).
"""

from __future__ import annotations

import re

MAX_SPEAKERS = 5  # the template's [S1] .. [S5]
SPEAKER_TAG = re.compile(rf"\[S[1-{MAX_SPEAKERS}]\]")
_SPACE_AFTER = re.compile(r"\s*")


def speaker_label(index: int) -> str:
    """The tag of the ``index``-th speaker, counted from 0: ``[S1]`` for the first."""
    return f"[S{index + 1}]"


def in_turn(index: int, text: str) -> str:
    """``text`` as a turn of the ``index``-th speaker (from 0): opened with its tag, unless it opens with it already
    (as upstream's MOSS-TTSD app writes a speaker's transcript: ``[S1] In short, ...``)."""
    tag = speaker_label(index)
    return text if text.startswith(tag) else f"{tag} {text}"


def turn_openings(text: str) -> list[tuple[int, int]]:
    """Each speaker tag of ``text`` with the whitespace after it, as (start, end): no cut may fall inside one, so a
    tag stays whole and with the speech it opens."""
    return [(tag.start(), _SPACE_AFTER.match(text, tag.end()).end()) for tag in SPEAKER_TAG.finditer(text)]


def inside_opening(openings: list[tuple[int, int]], position: int) -> bool:
    """Whether cutting at ``position`` would split a tag from itself or from the speech it opens."""
    return any(start < position <= end for start, end in openings)


def reopened(text: str, speaker: str | None) -> tuple[str, str | None]:
    """``text``, a piece of a dialogue, opened with ``speaker``'s tag (the one whose turn it goes on with) when it
    does not open with a tag of its own; and the speaker whose turn is under way at its end."""
    tags = SPEAKER_TAG.findall(text)
    opens = SPEAKER_TAG.match(text) is not None
    return (text if opens or speaker is None else f"{speaker}{text}"), (tags[-1] if tags else speaker)


def going_on(said: str, text: str) -> str:
    """``text`` as it follows ``said`` in one dialogue: without its opening tag where the last turn of ``said`` is
    that speaker's already, as upstream's MOSS-TTSD app joins a speaker's consecutive turns into one."""
    tags = SPEAKER_TAG.findall(said)
    opening = SPEAKER_TAG.match(text)
    if opening is None or not tags or tags[-1] != opening.group():
        return text
    return text[opening.end() :].lstrip()
