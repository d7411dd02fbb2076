"""Where the node checks requests: one at a time, in the order they arrive, on a thread of its own.

A request's check (its text cleaned, tokenized and planned into pieces) takes tens of milliseconds at
``limits.max_text_chars`` (docs/security.md, "Nothing holds the executor"), and the executor's callbacks that
take requests share a callback group with the parameter services, the diagnostics timer or the goal cancels. So
those callbacks
hand the check here and return; what waits for the verdict (a service call) waits on the returned future.
One thread keeps the order of arrival, which is the order of the line (serving/queue.py). The checks waiting
here are bounded too: beyond ``capacity`` a request is refused at once, with the reason.

This module knows nothing of ROS, like the line it feeds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from moss_tts_node.serving.queue import Refused

BUSY = (
    "the node is busy: {pending} requests are waiting to be checked; retry later (at most {capacity} wait, "
    "the limit of requests arriving faster than they are checked)"
)

# Requests that may wait for their check (docs/security.md, "Request checks"): more than a burst of clients sends
# at once.
CHECKS_WAITING = 32

_Result = TypeVar("_Result")


class Intake:
    """Runs checks one after another, in the order ``submit`` was called, with at most ``capacity`` waiting."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="request-checks")
        self._lock = threading.Lock()
        self._pending = 0
        self._closed: str | None = None  # why it refuses every check, once closed

    def submit(self, check: Callable[[], _Result]) -> Future[_Result]:
        """Queue ``check``; raises Refused, with the reason, when ``capacity`` checks wait already."""
        with self._lock:
            if self._closed is not None:
                raise Refused(self._closed)
            if self._pending >= self.capacity:
                raise Refused(BUSY.format(pending=self._pending, capacity=self.capacity))
            self._pending += 1
            return self._pool.submit(self._run, check)

    def _run(self, check: Callable[[], _Result]) -> _Result:
        try:
            return check()
        finally:
            with self._lock:
                self._pending -= 1

    def close(self, reason: str) -> None:
        """Refuse new checks with ``reason`` and wait for those queued: each answers its request."""
        with self._lock:
            self._closed = reason
        self._pool.shutdown(wait=True)
