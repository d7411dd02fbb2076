"""The node's line of requests: one synthesis at a time on the model, the rest wait their turn.

The model has one KV cache, so requests run one after another on a single worker thread. The
line is bounded (a full line refuses new requests with the reason) and has a policy:

- ``queue``: first in, first out;
- ``interrupt``: a new request cancels the one being spoken and drops those waiting, so a robot
  that changes its mind stops talking about the old thing at once.

This module knows nothing of ROS, so the policy is tested without a middleware; the node
decides what a job is and what running one means.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

POLICIES = ("queue", "interrupt")
# The reasons the line gives; FULL is formatted with the number waiting and queue_size.
FULL = (
    "the queue is full: {waiting} requests are waiting behind the one being spoken (queue_size {size}); "
    "retry later, raise queue_size, or set queue_policy to interrupt"
)
INTERRUPTED = "interrupted by a newer request (queue_policy interrupt)"
DROPPED = "dropped from the queue by a newer request (queue_policy interrupt)"
SYNTHESIS_FAILED = "synthesis failed"  # begins the outcome of a request whose work raised

Job = TypeVar("Job")


class Refused(Exception):
    """A request turned away before its turn: a bad request, a full line, a busy intake, the node's state, a text
    stream's bound. ``str()`` is the reason its sender gets. Every part of the node that refuses raises this one,
    and ros/requests.py counts and logs it."""


class State(enum.IntEnum):
    """Where a ticket is; the values are those of the Speak feedback's ``STATE_*`` constants."""

    QUEUED = 0
    GENERATING = 1
    DONE = 2


@dataclass(frozen=True)
class Outcome:
    """How a request ended: ``success``, or why not (bad request, cancelled, interrupted, aborted)."""

    success: bool
    message: str


class Ticket(Generic[Job]):
    """One request's place in line: its job, cancel flag, state and outcome.

    ``cancel_flag`` is the flag the job checks while it runs (the synthesizer checks it every
    generation step). ``on_update`` is called, from whichever thread made the change, when the
    state, the position or the job's progress changes, so an action server can publish feedback
    as it happens.
    """

    def __init__(
        self, job: Job, cancel_flag: threading.Event, on_update: Callable[[Ticket[Job]], None] | None = None
    ) -> None:
        self.job = job
        self.cancel_flag = cancel_flag
        self.cancel_reason = ""
        self.state = State.QUEUED
        self.ahead = 0  # requests before this one, the one being generated included
        self.outcome: Outcome | None = None
        self._on_update = on_update
        self._done = threading.Event()

    def cancel(self, reason: str) -> bool:
        """Set the cancel flag with ``reason``; False if it was set already (the first reason stays)."""
        if self.cancel_flag.is_set():
            return False
        self.cancel_reason = reason
        self.cancel_flag.set()
        return True

    def updated(self) -> None:
        if self._on_update is not None:
            self._on_update(self)

    def finish(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.state = State.DONE
        self.ahead = 0
        self.updated()  # before waking wait(), so a "done" feedback goes out before the result
        self._done.set()

    def wait(self, timeout: float | None = None) -> Outcome | None:
        """The outcome once the request has ended; None if ``timeout`` passed first."""
        self._done.wait(timeout)
        return self.outcome


class RequestQueue(Generic[Job]):
    """Runs ``work(ticket)`` for one ticket at a time, in a worker thread, in line order.

    The line is ``current`` (the ticket being spoken, or handed to the worker to speak next)
    and ``waiting`` (the tickets behind it). Every change to them happens under one lock, in the
    same step as the decision that makes it: ``submit`` makes a ticket current at once when the
    line is empty, and the worker makes the next waiting ticket current in the same step as it
    ends the previous one. So there is no ticket "taken by nobody yet" for ``submit`` to miscount.

    The rules (docs/ros.md, "Requests"):

    - with policy ``queue``, a ticket is refused as full only when ``size`` tickets (more, after a
      spell of ``interrupt``) are already waiting behind the current one; ``size`` 0 means "speak
      when idle, refuse while speaking";
    - tickets become current in the order ``submit`` accepted them;
    - with policy ``interrupt``, ``submit`` cancels the current ticket and drops the waiting ones;
    - every ticket accepted ends exactly once (``Ticket.finish``), with the outcome of its work or
      the reason it was cancelled, dropped or closed; a refused one raises ``Refused`` instead.

    ``work`` streams the job and returns its Outcome; it must check ``ticket.cancel_flag`` often
    (the synthesizer does, every step). An exception from it ends that ticket as failed and the
    queue keeps serving.
    """

    def __init__(self, work: Callable[[Ticket[Job]], Outcome], size: int, policy: str = "queue") -> None:
        if policy not in POLICIES:
            raise ValueError(f"queue policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if size < 0:
            raise ValueError(f"queue size must be 0 or more, got {size}")
        self.size = size
        self.policy = policy
        self._work = work
        self._waiting: deque[Ticket[Job]] = deque()
        self._current: Ticket[Job] | None = None
        self._closed: str | None = None  # the reason, once closed
        self._lock = threading.Condition()
        self._worker = threading.Thread(target=self._serve, name="synthesis", daemon=True)
        self._worker.start()

    @property
    def depth(self) -> int:
        """Requests waiting (the one being generated not included)."""
        with self._lock:
            return len(self._waiting)

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._current is not None

    def submit(self, ticket: Ticket[Job]) -> None:
        """Put a ticket in line, or raise Refused with the reason."""
        with self._lock:
            if self._closed is not None:
                raise Refused(self._closed)
            if self.policy == "interrupt":
                if self._current is not None:
                    self._current.cancel(INTERRUPTED)
                self._drop_waiting(DROPPED)
            elif self._current is not None and len(self._waiting) >= self.size:
                raise Refused(FULL.format(waiting=len(self._waiting), size=self.size))
            if self._current is None:
                self._make_current(ticket)
                self._lock.notify()
            else:
                self._waiting.append(ticket)
                ticket.ahead = len(self._waiting)
                ticket.updated()

    def cancel(self, ticket: Ticket[Job], reason: str) -> None:
        """Stop a ticket: a waiting one ends now, the current one within one step of its work."""
        with self._lock:
            if ticket in self._waiting:
                self._waiting.remove(ticket)
                ticket.finish(Outcome(False, reason))
                self._renumber()
            else:
                ticket.cancel(reason)

    def stop(self, reason: str, empty: str | None) -> tuple[Ticket[Job] | None, list[Ticket[Job]]]:
        """Cancel the current ticket with ``reason`` (it ends within one step of its work) and, when ``empty``
        gives a reason, end every waiting one with it now; the ticket this call stopped (None when there was
        none, or it was stopping already) and those it ended. Waits for nothing."""
        with self._lock:
            current = self._current if self._current is not None and self._current.cancel(reason) else None
            dropped = list(self._waiting) if empty is not None else []
            if empty is not None:
                self._drop_waiting(empty)
        return current, dropped

    def close(self, reason: str) -> None:
        """Refuse new requests, end the waiting ones with ``reason``, cancel the current one, and
        wait for the worker to stop (within one generation step)."""
        with self._lock:
            self._closed = reason
            self._drop_waiting(reason)
            if self._current is not None:
                self._current.cancel(reason)
            self._lock.notify()
        self._worker.join()

    # Tickets are updated with the lock held, so that each one's updates (and so an action's
    # feedback) come in the order they happened; ``on_update`` must not wait on another thread.

    def _make_current(self, ticket: Ticket[Job]) -> None:
        self._current = ticket
        ticket.state = State.GENERATING
        ticket.ahead = 0
        ticket.updated()

    def _drop_waiting(self, reason: str) -> None:
        while self._waiting:
            self._waiting.popleft().finish(Outcome(False, reason))

    def _renumber(self) -> None:
        for index, ticket in enumerate(self._waiting, start=1):  # the current one is ahead of all
            if ticket.ahead != index:
                ticket.ahead = index
                ticket.updated()

    def _serve(self) -> None:
        while True:
            with self._lock:
                while self._current is None and self._closed is None:
                    self._lock.wait()
                ticket = self._current
            if ticket is None:  # closed, and nothing left to end
                return
            try:
                outcome = self._work(ticket)
            except Exception as exc:  # a failed request must not stop the node from serving
                logging.getLogger(__name__).exception("synthesis failed")
                outcome = Outcome(False, f"{SYNTHESIS_FAILED}: {exc}")
            with self._lock:
                ticket.finish(outcome)
                self._current = None
                if self._waiting:
                    self._make_current(self._waiting.popleft())
                    self._renumber()
