"""Split text that is too long for one generation into pieces at natural boundaries.

A long request would overflow the backbone's context (prompt plus one generated row per 80 ms
of speech) or one codec call, so the synthesizer speaks it piece by piece. Pieces end where a
speaker pauses anyway: at sentence ends (CJK ``。！？`` anywhere, Latin ``.!?`` only before a
space or the end, so ``3.14`` and ``v2.3.1`` stay whole), else at clause marks (``，、；：`` and
``,;:`` before a space), else between words, and only as a last resort inside a word (a long run
of CJK text without punctuation). Closing quotes and brackets stay with the sentence they close.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from itertools import pairwise

_CLOSERS = "\"'”’)）」』】》〉"
# Each pattern matches the end of a unit (the text after a match starts a new unit).
_SENTENCE_END = re.compile(rf"(?:[。！？]+|[.!?…]+(?=[\s{_CLOSERS}]|$))[{_CLOSERS}]*\s*")
_CLAUSE_END = re.compile(r"(?:[，、；：]|[,;:](?=\s|$))\s*")
_WORD_END = re.compile(r"\s+")
_LEVELS = (_SENTENCE_END, _CLAUSE_END, _WORD_END)
# Boundary levels, coarsest first (indices of _LEVELS): what ``unit_ends`` takes, as the streaming cutter
# (text/cutter.py) does.
SENTENCE = 0
CLAUSE = 1
WORD = 2


def split_text(text: str, limit: int, measure: Callable[[str], int] = len) -> list[str]:
    """Pieces of ``text``, in order, each measuring at most ``limit`` by ``measure``.

    ``measure`` is the cost of a piece (characters by default; the synthesizer counts
    tokens). Consecutive sentences are packed into one piece while they fit; a sentence
    that alone exceeds the limit is cut at clauses, then words, then characters. Joining
    the pieces with spaces gives the text back up to whitespace at the cuts.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    text = text.strip()
    return _split(text, limit, measure, 0) if text else []


def _split(text: str, limit: int, measure: Callable[[str], int], level: int) -> list[str]:
    """Split stripped ``text`` using the boundaries of ``_LEVELS[level]`` and finer."""
    if measure(text) <= limit:
        return [text]
    if level == len(_LEVELS):
        return _cut_anywhere(text, limit, measure)
    units = _units(text, level)
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


def unit_ends(text: str, level: int) -> list[int]:
    """The offsets inside ``text`` (neither 0 nor its length) where a unit of ``level`` (``SENTENCE``,
    ``CLAUSE`` or ``WORD``) ends, after the boundary's trailing whitespace, in order. Each is decided by
    the text up to one character beyond it, so text appended later never moves one."""
    return [match.end() for match in _LEVELS[level].finditer(text) if 0 < match.end() < len(text)]


def _units(text: str, level: int) -> list[str]:
    """``text`` cut at its ``unit_ends``; the units concatenate back to ``text``."""
    bounds = [0, *unit_ends(text, level), len(text)]
    return [text[start:end] for start, end in pairwise(bounds) if start < end]


def _cut_anywhere(text: str, limit: int, measure: Callable[[str], int]) -> list[str]:
    """Cut a text with no usable boundary into the longest prefixes that fit (binary search)."""
    pieces = []
    while text:
        low, high = 1, len(text)  # the longest fitting prefix length lies in [low, high]
        while low < high:
            middle = (low + high + 1) // 2
            if measure(text[:middle]) <= limit:
                low = middle
            else:
                high = middle - 1
        pieces.append(text[:low].strip())
        text = text[low:].strip()
    return [piece for piece in pieces if piece]
