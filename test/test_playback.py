"""The player's jitter buffer against a fake output stream that records what it is given.

The stream's writes can be held (``hold``/``release``), so what plays while a chunk arrives or a
cancel comes is decided by the test, not by timing. One test plays into a PulseAudio null sink.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from moss_tts_node.errors import PlaybackError
from moss_tts_node.playback import BLOCK_S, OpenStream, OutputStream, Speaker, sound_output

if TYPE_CHECKING:
    from conftest import NullSink

RATE = 24000


class FakeOutput:
    """Records opens, writes, aborts and stops in order; each write waits for a permit while held."""

    latency = 0.05

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.written = threading.Condition()
        self._permits: threading.Semaphore | None = None

    def open(self, sample_rate: int, channels: int) -> FakeOutput:
        self.events.append(("open", (sample_rate, channels)))
        return self

    def hold(self) -> None:
        self._permits = threading.Semaphore(0)

    def release(self, writes: int | None = None) -> None:
        """Let ``writes`` more writes through, or all of them from now on."""
        permits = self._permits
        assert permits is not None
        if writes is None:
            self._permits = None
            permits.release(1_000_000)
        else:
            permits.release(writes)

    def write(self, data: np.ndarray) -> None:
        if self._permits is not None:
            self._permits.acquire()
        with self.written:
            self.events.append(("write", data.copy()))
            self.written.notify_all()

    def wait_writes(self, count: int) -> None:
        with self.written:
            assert self.written.wait_for(lambda: len(self.writes()) >= count, timeout=10)

    def writes(self) -> list[np.ndarray]:
        """What was written, less the silence the player pads with before each stop."""
        events = [*self.events, ("", None)]  # a copy: the player thread may be appending
        return [
            data  # type: ignore[misc]
            for (kind, data), (after, _) in itertools.pairwise(events)
            if kind == "write" and after != "stop"
        ]

    def played(self) -> np.ndarray:
        return np.concatenate(self.writes())

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    def start(self) -> None:
        self.events.append(("start", None))

    def stop(self) -> None:
        self.events.append(("stop", None))

    def abort(self) -> None:
        self.events.append(("abort", None))

    def close(self) -> None:
        self.events.append(("close", None))


def tone(seconds: float, frequency: float = 440.0, rate: int = RATE) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)


def chunks(samples: np.ndarray, count: int) -> list[np.ndarray]:
    return np.array_split(samples, count)


def test_a_burst_plays_whole_in_blocks_without_gaps() -> None:
    out = FakeOutput()
    speech = tone(0.7)
    with Speaker(out.open, prebuffer_s=0.3) as speaker:
        parts = chunks(speech, 5)
        for number, part in enumerate(parts):
            speaker.feed("a", part, RATE, final=number == len(parts) - 1)
        assert speaker.wait(timeout=10)
    np.testing.assert_array_equal(out.played(), speech)
    assert {w.shape[0] for w in out.writes()[:-1]} == {round(BLOCK_S * RATE)}
    assert speaker.underruns == 0
    assert out.kinds()[0] == "open" and out.kinds()[-2:] == ["stop", "close"] and "abort" not in out.kinds()


def test_it_waits_for_the_prebuffer_then_counts_a_dry_spell() -> None:
    out = FakeOutput()
    with Speaker(out.open, prebuffer_s=0.3) as speaker:
        speaker.feed("a", tone(0.1), RATE, final=False)
        assert speaker.wait_idle(timeout=10)  # it has seen the 0.1 s, and did not start
        assert out.kinds() == []
        speaker.feed("a", tone(0.25), RATE, final=False)  # 0.35 s queued: it starts
        assert speaker.wait_idle(timeout=10)  # every queued block written: the utterance ran dry
        assert len(out.writes()) == round(0.35 / BLOCK_S) and speaker.underruns == 1
        speaker.feed("a", tone(0.5), RATE, final=True)
        assert speaker.wait(timeout=10)
    assert out.played().shape[0] == round(0.85 * RATE)
    assert speaker.underruns == 1


def test_a_new_utterance_cuts_an_unfinished_one_and_plays_whole() -> None:
    out = FakeOutput()
    first, second = tone(1.0, 440.0), tone(0.3, 660.0)
    out.hold()
    with Speaker(out.open, prebuffer_s=0.1) as speaker:
        speaker.feed("a", first, RATE, final=False)
        out.release(3)
        out.wait_writes(3)
        speaker.feed("b", second, RATE, final=True)  # "a" never got its final chunk: it was cancelled
        out.release()
        assert speaker.wait(timeout=10)
    block = round(BLOCK_S * RATE)
    before, after = writes_around_abort(out)
    # At most the block already taken when "b" came follows the three; then the device is flushed.
    assert len(before) <= 4
    np.testing.assert_array_equal(np.concatenate(before), first[: len(before) * block])
    np.testing.assert_array_equal(np.concatenate(after), second)


def writes_around_abort(out: FakeOutput) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The writes before the (one) abort, and those after it."""
    assert out.kinds().count("abort") == 1
    cut = out.kinds().index("abort")
    played = {id(data) for data in out.writes()}
    writes = [(number, data) for number, (kind, data) in enumerate(out.events) if id(data) in played]
    return [d for n, d in writes if n < cut], [d for n, d in writes if n > cut]  # type: ignore[misc]


def test_cancel_stops_at_once_and_the_next_one_plays() -> None:
    out = FakeOutput()
    second = tone(0.2, 660.0)
    out.hold()
    with Speaker(out.open, prebuffer_s=0.1) as speaker:
        speaker.feed("a", tone(2.0), RATE, final=True)
        out.release(2)
        out.wait_writes(2)
        assert speaker.cancel("a")
        out.release()
        assert speaker.wait(timeout=10)
        assert not speaker.cancel("a")
        with pytest.raises(PlaybackError, match="has ended"):
            speaker.feed("a", tone(0.1), RATE, final=True)
        speaker.feed("b", second, RATE, final=True)
        assert speaker.wait(timeout=10)
    before, after = writes_around_abort(out)
    assert len(before) <= 3  # the two let through, and at most the block taken when the cancel came
    np.testing.assert_array_equal(np.concatenate(after), second)
    cut = out.kinds().index("abort")
    assert out.kinds()[cut : cut + 3] == ["abort", "close", "open"]  # the next one gets a stream of its own


def test_after_a_cancel_the_next_utterance_plays_from_its_first_sample(
    null_sink: NullSink, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through PulseAudio: a stream aborted and started again lost up to 18 ms of the next utterance's start."""
    for name, value in null_sink.env.items():
        monkeypatch.setenv(name, value)
    # PortAudio reads the sound server's address once, when it starts: a test before this one in the same process
    # may have started it without the null sink's, and the default device would be missing. Start it again.
    sounddevice = pytest.importorskip("sounddevice")
    sounddevice._terminate()
    sounddevice._initialize()
    second = tone(0.5, 660.0)
    output = Watched(sound_output(None))
    with Speaker(output.open, prebuffer_s=0.3) as speaker:
        speaker.feed("a", tone(3.0), RATE, final=True)
        output.wait(lambda: output.blocks >= round(0.5 / BLOCK_S), "half a second of the first utterance")
        assert speaker.cancel("a")
        output.wait(lambda: output.closed, "the first utterance's stream closed")  # aborted: what it held dropped
        with null_sink.recording(tmp_path / "after.raw") as captured:
            speaker.feed("b", second, RATE, final=True)
            assert speaker.wait(timeout=10)
    loud = np.flatnonzero(np.abs(captured[0]) > 1e-4)
    assert loud.size and loud[-1] - loud[0] + 1 >= second.size - 5  # a sine's first sample is 0: below the bar
    assert null_sink.snr_db(second, captured[0]) > 40


class Watched:
    """The real output, its streams watched: the blocks written to the last one opened, and whether it closed."""

    def __init__(self, open_stream: OpenStream) -> None:
        self._open = open_stream
        self._changed = threading.Condition()
        self.blocks = 0
        self.closed = False

    def open(self, sample_rate: int, channels: int) -> OutputStream:
        stream = self._open(sample_rate, channels)
        write, close = stream.write, stream.close
        with self._changed:
            self.blocks, self.closed = 0, False

        def written(data: np.ndarray) -> None:
            write(data)
            with self._changed:
                self.blocks += 1
                self._changed.notify_all()

        def closed() -> None:
            close()
            with self._changed:
                self.closed = True
                self._changed.notify_all()

        stream.write, stream.close = written, closed  # type: ignore[method-assign]
        return stream

    def wait(self, until: Callable[[], bool], what: str) -> None:
        with self._changed:
            assert self._changed.wait_for(until, timeout=30), f"never saw {what}"


def test_each_utterance_plays_at_its_own_rate_and_channels() -> None:
    out = FakeOutput()
    stereo = np.stack([tone(0.1, rate=48000), tone(0.1, 660.0, rate=48000)], axis=1)
    with Speaker(out.open, prebuffer_s=0.1) as speaker:
        speaker.feed("a", tone(0.2), RATE, final=True)
        speaker.feed("b", tone(0.1, rate=16000), 16000, final=False)
        with pytest.raises(PlaybackError, match="24000 Hz, 1 channels after 16000 Hz, 1 channels"):
            speaker.feed("b", tone(0.1), RATE, final=False)
        speaker.feed("b", tone(0.1, rate=16000), 16000, final=True)
        speaker.feed("c", stereo, 48000, final=False)
        with pytest.raises(PlaybackError, match="48000 Hz, 1 channels after 48000 Hz, 2 channels"):
            speaker.feed("c", tone(0.1, rate=48000), 48000, final=False)
        speaker.feed("c", stereo, 48000, final=True)
        assert speaker.wait(timeout=10)
    opens = [(kind, value) for kind, value in out.events if kind in ("open", "stop")]
    layouts = [(RATE, 1), (16000, 1), (48000, 2)]
    assert opens == [event for layout in layouts for event in (("open", layout), ("stop", None))]
    writes = out.writes()
    played_stereo = np.concatenate([w for w in writes if w.ndim == 2])
    mono = np.concatenate([w for w in writes if w.ndim == 1])
    assert mono.shape[0] == round(0.2 * RATE) + round(0.2 * 16000)
    np.testing.assert_array_equal(played_stereo, np.concatenate([stereo, stereo]))  # both channels, in order


def test_a_chunk_after_the_final_one_is_refused() -> None:
    out = FakeOutput()
    out.hold()
    with Speaker(out.open) as speaker:
        speaker.feed("a", tone(0.5), RATE, final=True)
        with pytest.raises(PlaybackError, match="after its final one"):
            speaker.feed("a", tone(0.1), RATE, final=True)
        out.release()


def test_without_sounddevice_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sounddevice", None)  # import raises ImportError
    with pytest.raises(PlaybackError, match=r"moss_tts_node\[play\].*libportaudio2"):
        sound_output()
