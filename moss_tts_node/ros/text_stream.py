"""``~/text_stream``: TextChunk messages assembled, by stream id, into requests whose text arrives in pieces
(docs/ros.md, "Streamed text over ROS").

Pure (no node): ``test/test_ros_text_stream.py`` checks every rule without a middleware. The node hands each
message here from its subscription; a stream's first chunk comes back as a ``NewStream``, which the node puts in
its line of requests (ros/requests.py: the first chunk's request, ``Synthesizer.stream_text`` on the stream's
``TextFeed``) and which leaves the open streams through ``ended`` when its request ends or is refused. The rest
is here:

- a stream's first chunk starts it, with the request fields it carries (later chunks' fields are ignored);
  its later chunks go into its feed, ``final`` closes it, and ``expire`` closes a stream that gets no chunk for
  ``idle_timeout_s`` or has been open for ``max_duration_s``: what it received is spoken;
- the network is untrusted, so what a stream may hold is bounded before any work: at most ``max_open``
  streams are open, a stream holds at most ``max_chars`` characters (the chunk that would pass it closes the
  stream with what it had) and lives at most ``max_duration_s`` (a chunk every few seconds would otherwise keep
  it, and its place in line, for days), and a stream id is 1 to ``MAX_ID_CHARS`` printable characters;
- once a stream has ended (final, idle, cut at its limit, refused, or its request ended: spoken,
  interrupted, cancelled) its later chunks are dropped, with one warning per stream; the last
  ``REMEMBERED_ENDED`` ended ids are remembered for that.

Every method may be called from any thread: the subscription, the timer, the intake and the worker that ends
requests (``ended`` runs under the line's lock; this module calls nothing outside it under its own).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from moss_tts_msgs.msg import TextChunk

from moss_tts_node.serving.queue import Refused
from moss_tts_node.synthesis.feed import TextFeed

MAX_ID_CHARS = 64
REMEMBERED_ENDED = 1024


class ChunkDropped(Exception):
    """A chunk was not taken (its stream has ended, or would pass its limit); ``str()`` says why."""


@dataclass(frozen=True)
class StreamLimits:
    """The node's bounds on text streams (its text_stream_* parameters)."""

    max_open: int
    max_chars: int
    idle_timeout_s: float
    max_duration_s: float


@dataclass(frozen=True)
class NewStream:
    """A stream opened by its first chunk, to be put in line as one request: the chunk's request fields are
    the request's, and its text goes into ``feed``, where the first chunk's is already."""

    stream_id: str
    first: TextChunk
    feed: TextFeed


@dataclass
class _Open:
    feed: TextFeed
    chars: int
    opened: float  # monotonic time of its first chunk
    last_chunk: float  # monotonic time of its last chunk


class TextStreams:
    """The text streams being received."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}
        self._ended: OrderedDict[str, bool] = OrderedDict()  # ended ids -> a drop was already reported

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    def receive(self, chunk: TextChunk, limits: StreamLimits, now: float) -> NewStream | None:
        """Take one chunk at monotonic time ``now``; the stream it opens, if it is a new stream's first. Raises
        Refused for a new stream refused, ChunkDropped for a chunk not taken that the sender should hear of; a
        repeated drop passes quietly."""
        stream_id = chunk.stream_id
        with self._lock:
            if stream_id in self._ended:
                if self._ended[stream_id]:
                    return None
                self._ended[stream_id] = True
                raise ChunkDropped(f"text stream {stream_id!r} has ended: its later chunks are dropped")
            stream = self._open.get(stream_id)
            if stream is None:
                self._check_new(stream_id, chunk, limits)
                stream = self._open[stream_id] = _Open(TextFeed(), 0, now, now)
                self._append(stream_id, stream, chunk, now)
                return NewStream(stream_id, chunk, stream.feed)
            if stream.chars + len(chunk.text) > limits.max_chars:
                self._end(stream_id)
                stream.feed.close()  # what it holds is spoken
                raise ChunkDropped(
                    f"text stream {stream_id!r} would pass {limits.max_chars} characters (text_stream_max_chars): "
                    f"closed with the {stream.chars} it had"
                )
            self._append(stream_id, stream, chunk, now)
            return None

    def expire(self, limits: StreamLimits, now: float) -> list[str]:
        """Close the streams that got no chunk for ``limits.idle_timeout_s`` or have been open for
        ``limits.max_duration_s`` (what they hold is spoken); why each was closed, for the log."""
        closed: dict[str, str] = {}
        with self._lock:
            for stream_id, stream in self._open.items():
                if now - stream.last_chunk >= limits.idle_timeout_s:
                    closed[stream_id] = (
                        f"text stream {stream_id!r} got no chunk for {limits.idle_timeout_s:g} s "
                        "(text_stream_idle_timeout): speaking what it received, then ending it"
                    )
                elif now - stream.opened >= limits.max_duration_s:
                    closed[stream_id] = (
                        f"text stream {stream_id!r} has been open for {limits.max_duration_s:g} s, as long as a stream "
                        "may be (text_stream_max_duration): speaking what it received, then ending it; send a longer "
                        "reply as several streams, or raise text_stream_max_duration in the node's parameter file"
                    )
            for stream_id in closed:
                self._open[stream_id].feed.close()
                self._end(stream_id)
        return list(closed.values())

    def ended(self, stream_id: str) -> None:
        """The stream's request has ended (spoken, interrupted, cancelled, failed) or was refused: drop what comes
        after."""
        with self._lock:
            if stream_id in self._open:
                self._end(stream_id)

    def _check_new(self, stream_id: str, chunk: TextChunk, limits: StreamLimits) -> None:
        if not 0 < len(stream_id) <= MAX_ID_CHARS or not stream_id.isprintable():
            raise Refused(f"a text stream's stream_id must be 1 to {MAX_ID_CHARS} printable characters")
        if len(chunk.text) > limits.max_chars:
            raise Refused(
                f"text stream {stream_id!r}: its first chunk holds {len(chunk.text)} characters, more than "
                f"text_stream_max_chars {limits.max_chars}"
            )
        if len(self._open) >= limits.max_open:
            raise Refused(
                f"text stream {stream_id!r} refused: as many streams as text_stream_max_open ({limits.max_open}) "
                "are open; end one with a final chunk first"
            )

    def _append(self, stream_id: str, stream: _Open, chunk: TextChunk, now: float) -> None:
        if not chunk.text and not chunk.final:
            return  # no text: not a sign of life, or a client could hold its stream (and the line) open for ever
        stream.feed.put(chunk.text)
        stream.chars += len(chunk.text)
        stream.last_chunk = now
        if chunk.final:
            stream.feed.close()
            self._end(stream_id)

    def _end(self, stream_id: str) -> None:
        self._open.pop(stream_id, None)
        self._ended[stream_id] = False
        self._ended.move_to_end(stream_id)
        while len(self._ended) > REMEMBERED_ENDED:
            self._ended.popitem(last=False)
