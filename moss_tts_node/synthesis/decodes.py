"""Where a request's codec calls run: on the generating thread between steps, or on a thread of their own while the
next frames generate (``audio.decode_ahead``; docs/design.md, "Threads").

Both take the same calls in the same order (a ``SegmentDecoder``'s: frames pushed, context primed, segments
ended) and hand back the samples they produce in that order, so the audio is the same either way; only when it
is computed differs. Decoding ahead overlaps the codec with generation, which pays where llama.cpp's steps gain
little from a second thread (MOSS-TTS-Nano's small transformers) and where the cores are shared with other work.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np

from moss_tts_node.timing import StageClock

CodecCall = Callable[[], "np.ndarray | None"]
# Calls a request may have outstanding before the generating thread waits for the oldest, per frame of a chunk:
# the audio never falls further behind the frames than about this many chunks.
PENDING_CHUNKS = 2


class Decodes(Protocol):
    def run(self, call: CodecCall, wait: bool = False) -> list[np.ndarray]:
        """Take ``call``; return the samples of the calls finished so far, in order (with ``wait``, after every
        call taken has finished)."""
        ...

    def finish(self, call: CodecCall) -> tuple[list[np.ndarray], np.ndarray | None]:
        """Take ``call`` and wait for every call taken: the samples of the earlier ones not returned yet, in order,
        and what ``call`` returned (the caller marks it the last)."""
        ...


class InlineDecodes:
    """Each call runs at once, on the caller's thread."""

    def __init__(self, clock: StageClock) -> None:
        self._clock = clock

    def run(self, call: CodecCall, wait: bool = False) -> list[np.ndarray]:
        with self._clock.stage("codec"):
            samples = call()
        return [] if samples is None else [samples]

    def finish(self, call: CodecCall) -> tuple[list[np.ndarray], np.ndarray | None]:
        with self._clock.stage("codec"):
            return [], call()


class AheadDecodes:
    """Calls run in order on one worker thread; the caller collects their samples when it next comes by. Used as
    a context manager: leaving it drops the calls not started and waits for the running one, so nothing touches
    the codec's state after the request (the pipeline resets it next). An error of a call is raised to the
    caller when it collects that call."""

    def __init__(self, clock: StageClock, chunk_frames: int) -> None:
        self._clock = clock
        self._max_pending = PENDING_CHUNKS * chunk_frames + 1
        self._pending: deque[Future[np.ndarray | None]] = deque()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="moss-codec")

    def __enter__(self) -> AheadDecodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)

    def run(self, call: CodecCall, wait: bool = False) -> list[np.ndarray]:
        self._pending.append(self._worker.submit(self._timed, call))
        ready = []
        while self._pending and (wait or self._pending[0].done() or len(self._pending) > self._max_pending):
            samples = self._pending.popleft().result()
            if samples is not None:
                ready.append(samples)
        return ready

    def finish(self, call: CodecCall) -> tuple[list[np.ndarray], np.ndarray | None]:
        self._pending.append(self._worker.submit(self._timed, call))
        earlier = []
        while len(self._pending) > 1:
            samples = self._pending.popleft().result()
            if samples is not None:
                earlier.append(samples)
        return earlier, self._pending.popleft().result()

    def _timed(self, call: CodecCall) -> np.ndarray | None:
        with self._clock.stage("codec"):
            return call()
