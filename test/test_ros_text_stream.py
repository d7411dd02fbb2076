"""~/text_stream: ros/text_stream.py's rules without a middleware (the node over DDS: test_ros_node.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from ros_helpers import require_ros

from moss_tts_node.serving.queue import Refused

require_ros()

from moss_tts_msgs.msg import TextChunk  # noqa: E402

from moss_tts_node.ros.text_stream import (  # noqa: E402
    MAX_ID_CHARS,
    ChunkDropped,
    NewStream,
    StreamLimits,
    TextStreams,
)

LIMITS = StreamLimits(max_open=2, max_chars=40, idle_timeout_s=5.0, max_duration_s=60.0)


class Line:
    """What the node would put in line: the streams that ``receive`` opened, by id."""

    def __init__(self, streams: TextStreams) -> None:
        self.streams = streams
        self.started: dict[str, NewStream] = {}

    def receive(self, chunk: TextChunk, limits: StreamLimits = LIMITS, now: float = 0.0) -> None:
        new = self.streams.receive(chunk, limits, now)
        if new is not None:
            assert new.stream_id == chunk.stream_id and new.stream_id not in self.started
            self.started[new.stream_id] = new

    def text(self, stream_id: str) -> tuple[str, bool]:
        """What the stream's feed holds, and whether it was closed."""
        return self.started[stream_id].feed.take(timeout=0)


def chunk(stream_id: str, text: str = "", final: bool = False, **fields: Any) -> TextChunk:
    return TextChunk(stream_id=stream_id, text=text, final=final, **fields)


def test_a_stream_is_one_request_whose_fields_come_with_its_first_chunk() -> None:
    line = Line(streams := TextStreams())
    line.receive(chunk("a", "Hello", language="en", instruction="calm", seed=4), now=0.0)
    line.receive(chunk("b", "你好", reference_audio="/voices/b.npy"), now=0.1)
    line.receive(chunk("a", " there.", language="zh", seed=9), now=0.2)  # later fields are ignored
    line.receive(chunk("b", "。", final=True), now=0.3)
    first = line.started["a"].first
    assert (first.text, first.language, first.instruction, first.seed) == ("Hello", "en", "calm", 4)
    assert line.started["b"].first.reference_audio == "/voices/b.npy" and line.started["b"].first.seed == -1
    assert line.text("a") == ("Hello there.", False) and line.text("b") == ("你好。", True)
    assert streams.open_count == 1
    with pytest.raises(ChunkDropped, match="'b' has ended"):
        line.receive(chunk("b", " more"), now=0.4)
    line.receive(chunk("b", " more"), now=0.5)  # said once per stream: a flood is not logged whole


def test_a_stream_whose_first_chunk_is_final_is_one_request_of_that_chunk() -> None:
    line = Line(streams := TextStreams())
    line.receive(chunk("whole", "All at once.", final=True))
    assert line.text("whole") == ("All at once.", True) and streams.open_count == 0


def test_an_idle_stream_is_closed_and_spoken_and_an_ended_request_drops_its_later_chunks() -> None:
    line = Line(streams := TextStreams())
    line.receive(chunk("quiet", "Half a sen"), now=0.0)
    line.receive(chunk("busy", "Still"), now=0.0)
    line.receive(chunk("busy", " going"), now=4.0)
    assert streams.expire(LIMITS, now=5.0) == [
        "text stream 'quiet' got no chunk for 5 s (text_stream_idle_timeout): speaking what it received, then ending it"
    ]
    assert line.text("quiet") == ("Half a sen", True)  # what it received is spoken
    with pytest.raises(ChunkDropped, match="'quiet' has ended"):
        line.receive(chunk("quiet", "tence."), now=5.1)
    streams.ended("busy")  # its request was interrupted, say
    with pytest.raises(ChunkDropped, match="'busy' has ended"):
        line.receive(chunk("busy", " on"), now=5.2)
    assert streams.open_count == 0 and line.text("busy") == ("Still going", False)


def test_empty_chunks_do_not_keep_a_stream_open() -> None:
    """A client that sends only empty chunks adds nothing to the stream's characters: were they signs of life, it
    could hold its stream, and the line behind it, open for ever."""
    line = Line(streams := TextStreams())
    line.receive(chunk("held", "Hello"), now=0.0)
    for second in range(1, 5):
        line.receive(chunk("held"), now=float(second))
    assert len(streams.expire(LIMITS, now=5.0)) == 1
    assert line.text("held") == ("Hello", True)


def test_a_stream_lives_at_most_max_duration_however_often_it_is_fed() -> None:
    """One character every few seconds, each within the idle timeout: the stream, and its place in line, end once
    it has been open for max_duration_s (at the defaults, 20,000 characters at 9.9 s each would hold it 55 hours)."""
    line = Line(streams := TextStreams())
    line.receive(chunk("slow", "a"), now=0.0)
    for second in range(4, 60, 4):
        line.receive(chunk("slow", "b"), now=float(second))
        assert streams.expire(LIMITS, now=second + 3.9) == []
    assert streams.expire(LIMITS, now=60.0) == [
        "text stream 'slow' has been open for 60 s, as long as a stream may be (text_stream_max_duration): speaking "
        "what it received, then ending it; send a longer reply as several streams, or raise text_stream_max_duration "
        "in the node's parameter file"
    ]
    assert line.text("slow") == ("a" + "b" * 14, True)  # what it received is spoken
    with pytest.raises(ChunkDropped, match="'slow' has ended"):
        line.receive(chunk("slow", "c"), now=60.5)


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
    line = Line(streams := TextStreams())
    with pytest.raises(Refused, match=reason):
        line.receive(chunk(stream_id, text))
    assert not line.started and streams.open_count == 0


def test_streams_are_bounded_in_number_and_size() -> None:
    line = Line(TextStreams())
    line.receive(chunk("one", "a" * 30))
    line.receive(chunk("two", "b"))
    with pytest.raises(Refused, match=r"as many streams as text_stream_max_open \(2\) are open"):
        line.receive(chunk("three", "c"))
    with pytest.raises(ChunkDropped, match=r"would pass 40 characters.*closed with the 30 it had"):
        line.receive(chunk("one", "a" * 11))
    assert line.text("one") == ("a" * 30, True)  # closed: what it had is spoken
    line.receive(chunk("three", "c"))  # a place is free again
    line.receive(chunk("two", "", final=True))
    assert list(line.started) == ["one", "two", "three"]


def test_a_stream_whose_request_ended_before_its_next_chunk_drops_that_chunk() -> None:
    """Its request ended (refused by the line, or ended by a request that came in between on another thread:
    test_ros_requests.py has both) before its next chunk: it is no longer open, and that chunk is dropped."""
    line = Line(streams := TextStreams())
    line.receive(chunk("ended", "Hello"))
    streams.ended("ended")
    assert streams.open_count == 0
    with pytest.raises(ChunkDropped, match="'ended' has ended"):
        line.receive(chunk("ended", " there"))


def test_streams_from_several_threads_each_get_their_text_in_order() -> None:
    line = Line(TextStreams())
    limits = StreamLimits(max_open=8, max_chars=10_000, idle_timeout_s=5.0, max_duration_s=60.0)
    words = [f" w{number}" for number in range(200)]
    barrier = threading.Barrier(8)

    def send(name: str) -> None:
        barrier.wait()
        for word in words:
            line.receive(chunk(name, word), limits)
        line.receive(chunk(name, ".", final=True), limits)

    threads = [threading.Thread(target=send, args=(f"s{number}",)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(line.text(f"s{number}") == ("".join(words) + ".", True) for number in range(8))
