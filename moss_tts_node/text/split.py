"""Split text that is too long for one generation into pieces at natural boundaries.

A long request would overflow the backbone's context (prompt plus one generated row per 80 ms
of speech) or one codec call, so the synthesizer speaks it piece by piece. Pieces end where a
speaker pauses anyway: at sentence ends (CJK ``。！？`` anywhere, Latin ``.!?`` only before a
space or the end, so ``3.14`` and ``v2.3.1`` stay whole), else at clause marks (``，、；：`` and
``,;:`` before a space), else between words, and only as a last resort inside a word (a long run
of CJK text without punctuation). Closing quotes and brackets stay with the sentence they close.

A pause marker (``[pause 0.8s]``, ``text/pauses.py``) is one unit: no cut falls inside one, at any level, and
below the sentence level the text is cut before and after each marker as at a clause mark, so a marker is never
glued to a word around it (``wait[pause 1s]go``). A marker alone is never cut, even where it measures more
than the limit. A speaker tag (``[S1]``, ``text/speakers.py``) opens a turn: a cut may fall before one, at every level,
never inside one nor between it and the speech that follows. A dialogue (``turns``) is cut between turns first: whole
turns are packed into a piece while they fit, and only a turn too long alone is cut at its sentences, and so on.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import pairwise

from moss_tts_node.text.pauses import Marker, find_markers, inside_marker
from moss_tts_node.text.speakers import inside_opening, turn_openings

_CLOSERS = "\"'”’)）」』】》〉"
# Each pattern matches the end of a unit (the text after a match starts a new unit).
_SENTENCE_END = re.compile(rf"(?:[。！？]+|[.!?…]+(?=[\s{_CLOSERS}]|$))[{_CLOSERS}]*\s*")
_CLAUSE_END = re.compile(r"(?:[，、；：]|[,;:](?=\s|$))\s*")
_WORD_END = re.compile(r"\s+")
# What stays with a marker when the text is cut after it: the punctuation and the whitespace that follow it.
_AFTER_MARKER = re.compile(rf"[{_CLOSERS}。！？，、；：.!?…,;:]*\s*")
_NOTHING = re.compile(r"(?!)")  # the turn level's own boundaries: none, only the speaker tags every level has
_LEVELS = (_NOTHING, _SENTENCE_END, _CLAUSE_END, _WORD_END)
# The levels of cut_positions: indices of _LEVELS.
TURN = 0
SENTENCE = 1
CLAUSE = 2
WORD = 3
_MARKER_LEVEL = CLAUSE  # from this level on, each marker is a unit of its own


def split_text(text: str, limit: int, measure: Callable[[str], int] = len, turns: bool = False) -> list[str]:
    """Pieces of ``text``, in order, each measuring at most ``limit`` by ``measure``.

    ``measure`` is the cost of a piece (characters by default; the synthesizer counts
    tokens). Consecutive sentences are packed into one piece while they fit; a sentence
    that alone exceeds the limit is cut at clauses, then words, then characters. With ``turns`` (a dialogue),
    whole speaker turns are packed first, and a turn too long alone is cut at its sentences. Joining
    the pieces with spaces gives the text back up to whitespace at the cuts.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    text = text.strip()
    return _split(text, limit, measure, TURN if turns else SENTENCE) if text else []


def _split(text: str, limit: int, measure: Callable[[str], int], level: int) -> list[str]:
    """Split stripped ``text`` using the boundaries of ``_LEVELS[level]`` and finer."""
    markers = find_markers(text)
    if measure(text) <= limit or _is_one_marker(text, markers):
        return [text]
    if level == len(_LEVELS):
        return _cut_anywhere(text, limit, measure, markers)
    units = _units(text, level, markers)
    if len(units) == 1:
        return _split(text, limit, measure, level + 1)
    pieces: list[str] = []
    current = ""
    for unit in units:
        if measure(unit.strip()) > limit:
            if current.strip():
                pieces.append(current.strip())
            pieces.extend(_split(unit.strip(), limit, measure, level + 1))
            current = ""
        elif current.strip() and measure((current + unit).strip()) > limit:
            pieces.append(current.strip())
            current = unit
        else:
            current += unit
    if current.strip():
        pieces.append(current.strip())
    return pieces


def _is_one_marker(text: str, markers: list[Marker]) -> bool:
    """Whether ``text`` is a marker and what follows it when the text is cut after it (``_units``): never cut."""
    return len(markers) == 1 and markers[0].start == 0 and _AFTER_MARKER.match(text, markers[0].end).end() == len(text)


def cut_positions(text: str, level: int, markers: list[Marker] | None = None) -> list[int]:
    """Where ``text`` may be cut at ``level`` (``TURN``, ``SENTENCE``, ``CLAUSE`` or ``WORD``): after each boundary
    of that level (``TURN`` has none of its own), before each speaker tag and, from ``CLAUSE`` on, before each pause
    marker and after it and the punctuation that follows it; never inside a marker, nor inside a speaker tag or
    between it and its speech.
    Sorted positions strictly inside the text (``markers``: its markers, when already found).

    The rule every cutter of text shares: this splitter, and one that cuts text as it arrives (which must also
    hold back an ``unfinished_marker_start``)."""
    markers = find_markers(text) if markers is None else markers
    openings = turn_openings(text)
    cuts = {match.end() for match in _LEVELS[level].finditer(text)}
    cuts.update(start for start, _ in openings)  # a turn ends where the next speaker's tag begins
    if level >= _MARKER_LEVEL:
        for marker in markers:
            cuts.update((marker.start, _AFTER_MARKER.match(text, marker.end).end()))
    return sorted(
        cut
        for cut in cuts
        if 0 < cut < len(text) and not inside_marker(markers, cut) and not inside_opening(openings, cut)
    )


def _units(text: str, level: int, markers: list[Marker]) -> list[str]:
    """``text`` cut at every ``cut_positions`` of ``level``; the units concatenate back to ``text``."""
    bounds = [0, *cut_positions(text, level, markers), len(text)]
    return [text[start:end] for start, end in pairwise(bounds) if start < end]


def _cut_anywhere(text: str, limit: int, measure: Callable[[str], int], markers: list[Marker]) -> list[str]:
    """Cut a text with no usable boundary into the longest prefixes that fit (binary search), never inside one of
    its ``markers`` (positions in ``text``) nor between a speaker tag and its first character of speech."""
    openings = turn_openings(text)
    pieces = []
    offset = 0  # where the rest of the text starts in the original
    while offset < len(text):
        if text[offset].isspace():
            offset += 1
            continue
        rest = text[offset:]
        low, high = 1, len(rest)  # the longest fitting prefix length lies in [low, high]
        while low < high:
            middle = (low + high + 1) // 2
            if measure(rest[:middle]) <= limit:
                low = middle
            else:
                high = middle - 1
        cut = offset + low
        for marker in markers:
            if marker.start < cut < marker.end:  # back to the marker's start, or past it when it leads the rest
                cut = marker.start if marker.start > offset else marker.end
        for start, end in openings:
            if start < cut <= end:  # back to the tag, or past its first character of speech when it leads the rest
                cut = start if start > offset else min(end + 1, len(text))
        pieces.append(text[offset:cut].strip())
        offset = cut
    return [piece for piece in pieces if piece]
