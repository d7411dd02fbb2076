"""``TextFeed``: the fragments of one request's text, from the thread that has them to the synthesis.

A producer (an LLM's token callback, a reader of standard input, the ROS node) puts fragments from its own
thread and is never held up: the feed only appends. Threading and the standard library only, so a producer
imports nothing heavy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from moss_tts_node.errors import RequestError


class TextFeed:
    """Fragments of one request's text, put by a producer thread and taken by the synthesis.

    ``put`` and ``close`` never wait for the synthesis. Once the stream is over (ended, cancelled or
    dropped) the feed is abandoned: later fragments are ignored, and ``abandoned`` tells a producer it
    may stop.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._parts: list[str] = []
        self._closed = False
        self._error: BaseException | None = None
        self.abandoned = False
        self._last_arrival = time.monotonic()
        self._arrivals = 0  # fragments put so far

    @classmethod
    def reading(cls, fragments: Iterable[str]) -> TextFeed:
        """A feed filled from ``fragments`` by a reader thread (iterating them may wait: an LLM's tokens),
        which stops when they end, fail (the error reaches the synthesis) or the feed is abandoned."""
        feed = cls()

        def read() -> None:
            try:
                for fragment in fragments:
                    if feed.abandoned:
                        return
                    feed.put(fragment)
            except BaseException as error:  # handed to the synthesis thread, which raises it
                feed.fail(error)
            else:
                feed.close()

        threading.Thread(target=read, name="text-feed", daemon=True).start()
        return feed

    def put(self, text: str) -> None:
        if not isinstance(text, str):
            raise RequestError(f"a text fragment must be a str, not {type(text).__name__}")
        with self._condition:
            if self.abandoned:
                return
            if self._closed:
                raise RequestError("the text feed is closed: put every fragment before close()")
            self._parts.append(text)
            self._last_arrival = time.monotonic()
            self._arrivals += 1
            self._condition.notify_all()

    def close(self) -> None:
        """No more text: what has arrived is spoken to its end."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()

    def fail(self, error: BaseException) -> None:
        """End the text with ``error``, which the synthesis raises once it has taken the text before it."""
        with self._condition:
            self._error = error
            self._closed = True
            self._condition.notify_all()

    def abandon(self) -> None:
        with self._condition:
            self.abandoned = True
            self._parts.clear()

    def take(self, timeout: float) -> tuple[str, bool]:
        """The text arrived since the last take (waiting up to ``timeout`` seconds for some), and whether
        the text has ended; raises what ``fail`` was given once the text before it is taken."""
        with self._condition:
            self._condition.wait_for(lambda: self._parts or self._closed, timeout)
            text = "".join(self._parts)
            self._parts.clear()
            if not text and self._error is not None:
                raise self._error
            return text, self._closed and self._error is None

    def silence(self) -> tuple[int, float]:
        """The fragments put so far and the seconds since the last of them (or since the feed was made), read
        together under the lock: the silence they give belongs to that count of fragments."""
        with self._condition:
            return self._arrivals, time.monotonic() - self._last_arrival
