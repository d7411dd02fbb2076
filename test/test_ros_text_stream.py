"""~/text_stream: ros/text_stream.py's rules without a middleware (the node over DDS: test_ros_node.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from ros_helpers import require_ros

from moss_tts_node.ros.queue import Rejected
from moss_tts_node.synthesis.feed import TextFeed

require_ros()

from moss_tts_msgs.msg import TextChunk  # noqa: E402

from moss_tts_node.ros.text_stream import (  # noqa: E402
    MAX_ID_CHARS,
    ChunkDropped,
    StreamLimits,
    StreamRefused,
    TextStreams,
)

LIMITS = StreamLimits(max_open=2, max_chars=40, idle_timeout_s=5.0)


class Line:
    """What the node would do with a new stream: remember its first chunk, which makes its request, and its
    feed (or refuse it)."""

    def __init__(self) -> None:
        self.started: dict[str, tuple[TextChunk, TextFeed]] = {}
        self.refuse: str | None = None

    def start(self, stream_id: str, first: TextChunk, feed: TextFeed) -> None:
        if self.refuse is not None:
            raise Rejected(self.refuse)
        self.started[stream_id] = (first, feed)

    def text(self, stream_id: str) -> tuple[str, bool]:
        """What the stream's feed holds, and whether it was closed."""
        return self.started[stream_id][1].take(timeout=0)


def chunk(stream_id: str, text: str = "", final: bool = False, **fields: Any) -> TextChunk:
    return TextChunk(stream_id=stream_id, text=text, final=final, **fields)


def test_a_stream_is_one_request_whose_fields_come_with_its_first_chunk() -> None:
    line = Line()
    streams = TextStreams(line.start)
    streams.receive(chunk("a", "Hello", language="en", instruction="calm", seed=4), LIMITS, now=0.0)
    streams.receive(chunk("b", "你好", reference_audio="/voices/b.npy"), LIMITS, now=0.1)
    streams.receive(chunk("a", " there.", language="zh", seed=9), LIMITS, now=0.2)  # later fields are ignored
    streams.receive(chunk("b", "。", final=True), LIMITS, now=0.3)
    first, _ = line.started["a"]
    assert (first.text, first.language, first.instruction, first.seed) == ("Hello", "en", "calm", 4)
    assert line.started["b"][0].reference_audio == "/voices/b.npy" and line.started["b"][0].seed == -1
    assert line.text("a") == ("Hello there.", False) and line.text("b") == ("你好。", True)
    assert streams.open_count == 1
    with pytest.raises(ChunkDropped, match="'b' has ended"):
        streams.receive(chunk("b", " more"), LIMITS, now=0.4)
    streams.receive(chunk("b", " more"), LIMITS, now=0.5)  # said once per stream: a flood is not logged whole


def test_an_idle_stream_is_closed_and_spoken_and_an_ended_request_drops_its_later_chunks() -> None:
    line = Line()
    streams = TextStreams(line.start)
    streams.receive(chunk("quiet", "Half a sen"), LIMITS, now=0.0)
    streams.receive(chunk("busy", "Still"), LIMITS, now=0.0)
    streams.receive(chunk("busy", " going"), LIMITS, now=4.0)
    assert streams.expire(LIMITS, now=5.0) == ["quiet"]
    assert line.text("quiet") == ("Half a sen", True)  # what it received is spoken
    with pytest.raises(ChunkDropped, match="'quiet' has ended"):
        streams.receive(chunk("quiet", "tence."), LIMITS, now=5.1)
    streams.ended("busy")  # its request was interrupted, say
    with pytest.raises(ChunkDropped, match="'busy' has ended"):
        streams.receive(chunk("busy", " on"), LIMITS, now=5.2)
    assert streams.open_count == 0 and line.text("busy") == ("Still going", False)


def test_empty_chunks_do_not_keep_a_stream_open() -> None:
    """A client that sends only empty chunks adds nothing to the stream's characters: were they signs of life, it
    could hold its stream, and the line behind it, open for ever."""
    line = Line()
    streams = TextStreams(line.start)
    streams.receive(chunk("held", "Hello"), LIMITS, now=0.0)
    for second in range(1, 5):
        streams.receive(chunk("held"), LIMITS, now=float(second))
    assert streams.expire(LIMITS, now=5.0) == ["held"]
    assert line.text("held") == ("Hello", True)


@pytest.mark.parametrize(
    ("stream_id", "text", "reason"),
    [
        ("", "Hi", f"1 to {MAX_ID_CHARS} printable characters"),
        ("x" * (MAX_ID_CHARS + 1), "Hi", f"1 to {MAX_ID_CHARS} printable characters"),
        ("bad\nid", "Hi", "printable"),
        ("long", "y" * 41, "41 characters, more than text_stream_max_chars 40"),
    ],
)
def test_a_bad_first_chunk_refuses_the_stream(stream_id: str, text: str, reason: str) -> None:
    line = Line()
    streams = TextStreams(line.start)
    with pytest.raises(StreamRefused, match=reason):
        streams.receive(chunk(stream_id, text), LIMITS, now=0.0)
    assert not line.started and streams.open_count == 0


def test_streams_are_bounded_in_number_and_size() -> None:
    line = Line()
    streams = TextStreams(line.start)
    streams.receive(chunk("one", "a" * 30), LIMITS, now=0.0)
    streams.receive(chunk("two", "b"), LIMITS, now=0.0)
    with pytest.raises(StreamRefused, match=r"as many streams as text_stream_max_open \(2\) are open"):
        streams.receive(chunk("three", "c"), LIMITS, now=0.0)
    with pytest.raises(ChunkDropped, match=r"would pass 40 characters.*closed with the 30 it had"):
        streams.receive(chunk("one", "a" * 11), LIMITS, now=0.0)
    assert line.text("one") == ("a" * 30, True)  # closed: what it had is spoken
    streams.receive(chunk("three", "c"), LIMITS, now=0.0)  # a place is free again
    streams.receive(chunk("two", "", final=True), LIMITS, now=0.0)
    line.refuse = "the queue is full"
    with pytest.raises(StreamRefused, match="'four' refused: the queue is full"):
        streams.receive(chunk("four", "d"), LIMITS, now=0.0)
    with pytest.raises(ChunkDropped, match="'four' has ended"):
        streams.receive(chunk("four", "e"), LIMITS, now=0.0)


def test_a_request_that_ends_while_it_is_being_put_in_line_never_opens() -> None:
    streams: TextStreams

    def start(stream_id: str, first: TextChunk, feed: TextFeed) -> None:
        streams.ended(stream_id)  # interrupted by a request that came in between, on another thread

    streams = TextStreams(start)
    streams.receive(chunk("gone", "Hello"), LIMITS, now=0.0)
    assert streams.open_count == 0
    with pytest.raises(ChunkDropped, match="'gone' has ended"):
        streams.receive(chunk("gone", " there"), LIMITS, now=0.0)


def test_streams_from_several_threads_each_get_their_text_in_order() -> None:
    line = Line()
    streams = TextStreams(line.start)
    limits = StreamLimits(max_open=8, max_chars=10_000, idle_timeout_s=5.0)
    words = [f" w{number}" for number in range(200)]
    barrier = threading.Barrier(8)

    def send(name: str) -> None:
        barrier.wait()
        for word in words:
            streams.receive(chunk(name, word), limits, now=0.0)
        streams.receive(chunk(name, ".", final=True), limits, now=0.0)

    threads = [threading.Thread(target=send, args=(f"s{number}",)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(line.text(f"s{number}") == ("".join(words) + ".", True) for number in range(8))
