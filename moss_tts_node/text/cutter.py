"""Cutting text that arrives in fragments (an LLM's tokens) into the pieces to speak one after another.

The long-text splitter (``split.py``) sees a whole text; here the text grows while earlier pieces are
already being spoken, so a cut is never taken back. The cutter cleans the text it holds as one text (with
the request's clean-up, so line breaks join lines with a stop as in a whole request) and gives out a
prefix of the cleaned text once later text cannot change it. A piece ends at the first sentence end of
the splitter's rules (``cut_positions(..., SENTENCE)``, and line breaks where the clean-up keeps them; never
inside a pause marker) once it is *settled*:

- the next unit's first word has arrived whole (the marks before it, the word, the marks after it, then
  one more character; an East Asian wide character is a word by itself), so neither a run of marks that
  the clean-up merges (``...``, ``!!``) nor a number that may yet turn out to be a list marker can change
  the sentence before it;
- no span that the clean-up treats as one (``[..]``, ``{..}``, a markdown link's target, ``【..】``,
  ``「..」``, ``『..』``, ``〖..〗``, ``《..》``) is open before it on its line, since once closed it may be
  cleaned otherwise (kept verbatim, unwrapped). A line break releases the cut: a span the clean-up would
  close on a later line (it joins the lines first) is the one case where the pieces are cleaned apart.

The first piece is the first sentence, so speech starts as soon as it can; after it, a piece packs whole
sentences until it measures ``min_piece`` (never past ``max_run``): each piece costs the model a ramp of as many
steps as it has codebooks before its first frame is complete, which short sentences each on their own would pay
again and again.

A run longer than ``max_run`` (by ``measure``) without a sentence end is cut at its last clause end that
keeps the piece within ``max_run``, else its last word end, else between two wide characters; and
``cut(paused=True)`` (the input has paused) closes the piece at its last word end, leaving the word that
may still be being written.

After each cut the cutter forgets the raw text it has given out, where the rest cleans alone as it does
after it, so it cleans one sentence or so per fragment. The pieces' texts concatenate to the cleaned text
of the whole input, up to whitespace at the cuts, and which cuts are made depends on the text alone, never
on how it was fragmented, except for the cuts ``paused`` asks for (``test_text_cutter.py`` checks both).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from itertools import accumulate

from moss_tts_node.text.pauses import PAUSE_MARKER, find_markers, unfinished_marker_start
from moss_tts_node.text.split import CLAUSE, SENTENCE, WORD, cut_positions

# Spans the clean-up (normalize.py) treats as one, open on the last line: an opener with no closer after it.
# An unfinished pause marker ("[pau", text/pauses.py) is such an open "[" too.
_OPEN_SPAN = re.compile(
    r"!?\[[^\[\]]*$|!?\[[^\[\]]*\]\([^()]*$|\{[^{}]*$|【[^【】]*$|〖[^〖〗]*$|『[^『』]*$|「[^「」]*$|《[^《》]*$"
)  # a link or image (![alt](src)) spans from its "!" on
_LINE_BREAK = re.compile(r"\n")
_SPACE = re.compile(r"\s+")
_SLICE = 256  # characters of pushed text looked at a time
# What may join a line to the next in the cleaned text beyond whitespace (normalize.py's line separator).
_JOINTS = ("", "。")


class TextCutter:
    """Holds the text received and not yet given out, and cuts settled pieces off its front.

    ``clean`` is the request's text clean-up (``normalize_text``, or none), ``measure`` the cost of a piece
    (characters by default; the synthesizer counts tokens) that ``max_run`` and ``min_piece`` bound.
    """

    def __init__(
        self, clean: Callable[[str], str], max_run: int, measure: Callable[[str], int] = len, min_piece: int = 0
    ) -> None:
        if max_run < 1 or not 0 <= min_piece <= max_run:
            raise ValueError(f"need 1 <= max_run and 0 <= min_piece <= max_run, got {max_run} and {min_piece}")
        self._clean = clean
        self._measure = measure
        self.max_run = max_run
        self.min_piece = min_piece
        self._pieces = 0  # given out so far
        self._raw = ""  # the text held: it starts where the cleaned text given out ends, or at a line start
        self._said = ""  # squeeze(clean(self._raw))'s part already given out (empty after a restart)
        self._pushed = ""  # text pushed and not yet looked at

    def push(self, text: str) -> None:
        self._pushed += text

    def cut(self, *, ended: bool = False, paused: bool = False) -> list[str]:
        """The pieces settled now, in order, cleaned and stripped; each is given out once.

        ``ended``: no more text comes, so every end is settled and the rest is the last piece. ``paused``:
        the input has paused, so the rest is cut at its last word end too. Marks with no word among them
        (pause markers included) are no piece: they stay with the piece before them when that is cut at the
        end, otherwise for the next piece, and a text of marks alone is not spoken.
        """
        pieces = []
        while True:
            # A long text is looked at a slice at a time: the cuts do not depend on how it arrives, and
            # what is cleaned stays about one sentence long.
            self._raw, self._pushed = self._raw + self._pushed[:_SLICE], self._pushed[_SLICE:]
            last = not self._pushed
            pieces += self._cut_held(ended=ended and last, paused=paused and last)
            if last:
                return pieces

    def _cut_held(self, *, ended: bool, paused: bool) -> list[str]:
        pieces = []
        while True:
            rest = _after_squeezed(self._clean(self._raw), len(self._said))
            end = self._next_end(rest, paused, ended)
            if end is None or not _has_word(rest[:end]):
                break
            pieces.append(rest[:end].strip())
            self._pieces += 1
            self._said += _squeeze(rest[:end])
            self._restart(rest[end:])
        if ended:
            if _has_word(rest):
                pieces.append(rest.strip())
            self._raw, self._said = "", ""
        return pieces

    def _next_end(self, rest: str, paused: bool, ended: bool) -> int | None:
        """Where the next piece of the cleaned ``rest`` ends, if that is settled (everything is once the
        text has ended)."""
        limit = None if ended else self._span_limit()
        squeezed = list(accumulate((not char.isspace() for char in rest), initial=0))  # before each index

        def allowed(end: int) -> bool:
            return limit is None or squeezed[end] < limit  # not up to the opener: "!「" may merge with it

        def ready(end: int) -> bool:
            return (_has_word(rest[end:]) if ended else _settled(rest, end)) and allowed(end)

        sentences = _sentence_ends(rest)
        if self._measure(rest[: min([len(rest), *sentences])].strip()) > self.max_run:
            # Whether the run is too long is decided on the part of it that later text cannot change (the
            # cleaned text of an open link, say, shrinks once it closes), so every fragmentation decides alike.
            stable = len(rest) if ended else max([0, *(end for end in _forced_ends(rest) if ready(end))])
            if self._measure(rest[: min([stable, *sentences])].strip()) > self.max_run:
                run_end = self._run_end(rest[:stable])
                if run_end is not None and ready(run_end):
                    return run_end
                if run_end is not None and not ended:
                    return None  # the cut is known, the text after it not yet
        packed = self._packed_end(rest, sentences, ready, ended)
        if packed is not None and ready(packed):
            return packed
        if paused:
            ends = [end for end in _forced_ends(rest) if allowed(end)]
            last = rest.rstrip()[-1:]
            if last and (not _in_word(last) or _is_wide(last)) and limit is None:
                ends.append(len(rest))  # a mark or a wide character ends the text: its last word is complete
            return ends[-1] if ends else None
        return None

    def _packed_end(self, rest: str, sentences: list[int], ready: Callable[[int], bool], ended: bool) -> int | None:
        """The sentence end the next piece ends at: the first one, for the first piece; after it, the first that
        makes the piece measure ``min_piece`` or more, or the one before a sentence that would take it past
        ``max_run`` (None while neither is known yet)."""
        if not sentences or not self._pieces or not self.min_piece:
            return sentences[0] if sentences else None
        for number, end in enumerate(sentences):
            size = self._measure(rest[:end].strip())
            if size > self.max_run and number > 0:
                return sentences[number - 1]
            if size >= self.min_piece:
                return end
        if ended:
            return None  # the rest is the last piece
        stable = max([0, *(end for end in _forced_ends(rest) if ready(end))])
        return sentences[-1] if self._measure(rest[:stable].strip()) > self.max_run else None

    def _run_end(self, run: str) -> int | None:
        """Where an over-long ``run`` is cut: its last clause end within ``max_run``, else its last word end,
        else its last place between two wide characters; None where none fits."""
        fitting = [end for end in _forced_ends(run) if self._measure(run[:end].strip()) <= self.max_run]
        for level in (CLAUSE, WORD):
            ends = [end for end in fitting if end in cut_positions(run, level)]
            if ends:
                return ends[-1]
        return fitting[-1] if fitting else None

    def _span_limit(self) -> int | None:
        """Squeezed characters of the rest before the first span open on the last line; None if none is."""
        match = _OPEN_SPAN.search(self._raw, self._raw.rfind("\n") + 1)
        if match is None:
            return None
        return len(_squeeze(self._clean(self._raw[: match.start()]))) - len(self._said)

    def _restart(self, remaining: str) -> None:
        """Forget the raw text given out, where the raw text after it cleans alone to ``remaining`` (the
        cleaned text not given out yet) and the raw text before it to what was given out, up to a joint.

        The cleaned length of a raw prefix grows with it (nearly: a mark may vanish into the next one), so
        the cut is looked for from the first raw cut whose prefix cleans to nearly what was given out.
        """
        cuts = sorted(_raw_cuts(self._raw))
        said = len(self._said)

        def cleaned_before(index: int) -> str:
            return _squeeze(self._clean(self._raw[: cuts[index]]))

        low, high = 0, len(cuts)  # the first cut whose prefix cleans to said - (the longest joint) or more
        while low < high:
            middle = (low + high) // 2
            if len(cleaned_before(middle)) < said - max(map(len, _JOINTS)):
                low = middle + 1
            else:
                high = middle
        remaining = _squeeze(remaining)
        for index in range(max(low - 1, 0), len(cuts)):
            head = cleaned_before(index)
            if len(head) > said:
                return
            joins = self._said.startswith(head) and self._said[len(head) :] in _JOINTS
            if joins and _squeeze(self._clean(self._raw[cuts[index] :])) == remaining:
                self._raw, self._said = self._raw[cuts[index] :], ""
                return


def _squeeze(text: str) -> str:
    return _SPACE.sub("", text)


def _after_squeezed(text: str, count: int) -> str:
    """``text`` after its first ``count`` non-space characters."""
    seen = 0
    for index, char in enumerate(text):
        if seen == count:
            return text[index:]
        if not char.isspace():
            seen += 1
    return ""


def _sentence_ends(text: str) -> list[int]:
    """The splitter's sentence ends, and line breaks (left by a clean-up that keeps them)."""
    breaks = [match.end() for match in _LINE_BREAK.finditer(text) if match.end() < len(text)]
    return sorted({*cut_positions(text, SENTENCE), *breaks})


def _forced_ends(text: str) -> list[int]:
    """Every place a run may be cut: unit ends of every level, and between two wide characters."""
    wide = [i for i in range(1, len(text)) if _is_wide(text[i - 1]) and _is_wide(text[i])]
    return sorted({*_sentence_ends(text), *cut_positions(text, CLAUSE), *cut_positions(text, WORD), *wide})


def _raw_cuts(raw: str) -> set[int]:
    """Where the raw text may be cut to restart the cleaning: every place ``_forced_ends`` names, and its end."""
    return {*_forced_ends(raw), len(raw)}


def _settled(text: str, end: int) -> bool:
    """Whether the text after ``end`` holds the next unit's first word whole (see the module docstring); a
    pause marker is no word, and one still arriving may yet be one."""
    marker_ends = {marker.start: marker.end for marker in find_markers(text)}
    unfinished = unfinished_marker_start(text)
    index = end
    while index < len(text) and (index in marker_ends or not _in_word(text[index])):
        index = marker_ends.get(index, index + 1)  # the marks (and markers) the next unit starts with
    if index == len(text) or (unfinished is not None and index > unfinished):
        return False
    if _is_wide(text[index]):
        return True
    while index < len(text) and _in_word(text[index]) and not _is_wide(text[index]):
        index += 1  # the word
    while index < len(text) and not _in_word(text[index]) and not text[index].isspace():
        index += 1  # the marks after it: "1." may be a list marker, "1.5" a number
    return index < len(text)


def _has_word(text: str) -> bool:
    """Whether ``text`` has a word to speak: a pause marker is none (a piece is never a pause alone)."""
    return any(map(_in_word, PAUSE_MARKER.sub("", text)))


def _in_word(char: str) -> bool:
    return char.isalnum()


def _is_wide(char: str) -> bool:
    """An East Asian wide character (Han, kana, Hangul): a word by itself for cutting."""
    return char.isalnum() and unicodedata.east_asian_width(char) in "WF"
