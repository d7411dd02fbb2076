"""Text that arrives in fragments as the pieces of one request (``Synthesizer.stream_text``;
docs/usage.md, "Streamed text").

A producer puts fragments into a ``TextFeed`` (``synthesis/feed.py``) from its own thread. The synthesis
thread, whenever it is ready for the next piece, takes what has arrived, cuts it into settled sentences
(``text/cutter.py``) and plans each into pieces that fit the context (``text/pieces.py``), so a piece is
generated while the next fragments arrive.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from moss_tts_node.synthesis.feed import TextFeed
from moss_tts_node.synthesis.pipeline import PlanSource
from moss_tts_node.text.cutter import TextCutter
from moss_tts_node.text.pieces import Pause, Piece

# A run without a sentence end is cut at a clause, else a word, once it passes this many text tokens
# (docs/usage.md, "Streamed text"): about 24 English words or 45 Chinese characters, longer than most spoken
# sentences, and 1 to 2 s of an LLM writing at 15 to 30 tokens per second before the run's first audio.
RUN_TOKENS = 32
# After the first sentence, a piece packs whole sentences until it has this many text tokens (at most
# RUN_TOKENS): each piece costs the model a step per codebook before its first frame is complete, and a sentence
# of a few words speaks for little more than that (measured: docs/speed.md, "Streamed text").
PACK_TOKENS = 24
# Input silent this long closes the piece at its last word: many times an LLM's gap between tokens (30 to
# 70 ms), so only a stall (a tool call, a slow server) cuts a sentence short.
DEFAULT_INPUT_PAUSE_S = 1.0
# How often a synthesis waiting for text looks at its cancel flag.
_CANCEL_POLL_S = 0.05


class CutPieces(PlanSource):
    """The plan of a text fed in fragments: cut by ``cutter``, each cut text planned by ``plan`` (into pieces,
    and pauses where its pause markers are rendered as silence).

    Waiting for the next piece, an input silent for ``input_pause_s`` makes the cutter close the piece at its
    last word; a set ``cancelled`` flag ends the pieces.
    """

    def __init__(
        self,
        feed: TextFeed,
        cutter: TextCutter,
        plan: Callable[[str], list[Piece | Pause]],
        cancelled: Callable[[], bool],
        input_pause_s: float,
    ) -> None:
        self._feed = feed
        self._cutter = cutter
        self._plan = plan
        self._cancelled = cancelled
        self._input_pause_s = input_pause_s
        self._ready: deque[Piece | Pause] = deque()
        self._ended = False
        self._paused_at = -1  # the arrival count at which a pause was last cut

    def next_item(self) -> Piece | Pause | None:
        while not self._ready and not self._ended and not self._cancelled():
            # A pause is cut once per silence: the word it leaves may still be being written. The cut is marked
            # with the count read with its silence: a fragment put after that read (even during the take) has a
            # silence of its own to come, which a count read later would mark as cut already.
            arrivals, silent_s = self._feed.silence()
            pause_due = self._paused_at != arrivals
            pause_left = self._input_pause_s - silent_s if pause_due else _CANCEL_POLL_S
            text, ended = self._feed.take(timeout=min(max(pause_left, 0.0), _CANCEL_POLL_S))
            paused = pause_due and pause_left <= 0 and not text and not ended
            if paused:
                self._paused_at = arrivals
            self._cut(text, ended, paused)
        return self._ready.popleft() if self._ready and not self._cancelled() else None

    def more(self) -> bool | None:
        if not self._ready and not self._ended:
            self._cut(*self._feed.take(timeout=0), paused=False)
        if self._ready:
            return True
        return False if self._ended else None

    def close(self) -> None:
        self._feed.abandon()

    def _cut(self, text: str, ended: bool, paused: bool) -> None:
        self._cutter.push(text)
        for piece_text in self._cutter.cut(ended=ended, paused=paused):
            self._ready.extend(self._plan(piece_text))
        self._ended = ended
