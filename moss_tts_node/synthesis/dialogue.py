"""A dialogue spoken piece after piece, each continuing the audio of the one before (docs/family.md, "Dialogues").

A dialogue model (MOSS-TTSD) keeps its speakers' voices by continuing audio. A dialogue longer than one generation
is planned as pieces cut between speaker turns (``text/pieces.py``); the first continues the request's own prefix
(the speakers' clips one after the other), if it has one, and each next piece is made, once the piece before it has
been generated, to continue that piece's audio: its frames as the prefix, its text as their transcript
(``PiecePlanner.continued``). Only the piece before is carried: a piece's text and audio are known to say the same
thing only as a whole (where its turns begin in its audio is not known), and two pieces must fit the context.

Where the carried audio would leave a piece less room than it expects to need (a piece that spoke much slower than
planned), or the piece before did not end by itself (cut by ``max_new_tokens``, so that its text is not all in its
audio), the piece is spoken as planned: continuing the request's prefix, or nothing. The stream decoder takes the
carried frames in as left context (``synthesis/pipeline.py``), so each piece's audio is what the codec gives for the
audio it continues.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from moss_tts_node.synthesis.pipeline import Generated, PlanSource
from moss_tts_node.text.pieces import Pause, Piece
from moss_tts_node.timing import StopReason

# How a piece continues the one before: (piece as planned, the piece before, its new frames) -> the piece made to
# continue it, or None where it cannot.
Follow = Callable[[Piece, Piece, np.ndarray], "Piece | None"]


class DialoguePieces(PlanSource):
    """``source``'s items, each piece after the first made by ``follow`` to continue the piece spoken before it."""

    def __init__(self, source: PlanSource, follow: Follow) -> None:
        self._source = source
        self._follow = follow
        self._last: tuple[Piece, np.ndarray] | None = None  # the piece spoken last and its new frames, to carry

    def next_item(self) -> Piece | Pause | None:
        item = self._source.next_item()
        if isinstance(item, Piece) and self._last is not None:
            return self._follow(item, *self._last) or item
        return item

    def more(self) -> bool | None:
        return self._source.more()

    def close(self) -> None:
        self._source.close()

    def spoken(self, piece: Piece, generated: Generated) -> None:
        ended = generated.stop is StopReason.END and generated.frames.shape[0] > 0
        self._last = (piece, generated.frames) if ended else None
        self._source.spoken(piece, generated)
