"""The node's request line (ros_queue.py): order, bounds, interrupt policy, cancel, shutdown.

No ROS here: the jobs are stand-ins that run until released or cancelled.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from moss_tts_node.ros.queue import Outcome, Rejected, RequestQueue, State, Ticket

WAIT = 10.0  # seconds; only reached when something is broken


@dataclass
class FakeJob:
    name: str
    release: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    updates: list[tuple[State, int]] = field(default_factory=list)


def run(ticket: Ticket[FakeJob]) -> Outcome:
    """Stand in for a synthesis: run until released, checking the cancel flag as the synthesizer does."""
    ticket.job.started.set()
    while not ticket.job.release.wait(0.005):
        if ticket.cancel_flag.is_set():
            return Outcome(False, ticket.cancel_reason)
    if ticket.job.name == "boom":
        raise RuntimeError("the codec fell over")
    return Outcome(True, f"{ticket.job.name} spoken")


def ticket(name: str) -> Ticket[FakeJob]:
    job = FakeJob(name)
    return Ticket(job, threading.Event(), on_update=lambda t: job.updates.append((t.state, t.ahead)))


@pytest.fixture
def line() -> Iterator[RequestQueue[FakeJob]]:
    queue: RequestQueue[FakeJob] = RequestQueue(run, size=2)
    yield queue
    queue.close("test over")


def test_requests_run_one_at_a_time_in_order(line: RequestQueue[FakeJob]) -> None:
    a, b, c = ticket("a"), ticket("b"), ticket("c")
    line.submit(a)
    assert a.job.started.wait(WAIT)
    line.submit(b)
    line.submit(c)
    assert (a.state, b.state, c.state) == (State.GENERATING, State.QUEUED, State.QUEUED)
    assert (b.ahead, c.ahead) == (1, 2)
    assert line.depth == 2 and line.busy
    for t in (a, b, c):
        t.job.release.set()
    assert [t.wait(WAIT) for t in (a, b, c)] == [Outcome(True, f"{n} spoken") for n in "abc"]
    assert b.job.updates[0] == (State.QUEUED, 1)
    assert c.job.updates[0] == (State.QUEUED, 2)
    assert c.job.updates[-2:] == [(State.GENERATING, 0), (State.DONE, 0)]
    positions = [ahead for state, ahead in c.job.updates if state == State.QUEUED]
    assert positions == sorted(positions, reverse=True)  # only ever moves forward


def test_a_full_queue_refuses_with_the_reason(line: RequestQueue[FakeJob]) -> None:
    running, waiting = ticket("a"), [ticket("b"), ticket("c")]
    line.submit(running)
    assert running.job.started.wait(WAIT)
    for t in waiting:
        line.submit(t)
    with pytest.raises(Rejected, match=r"queue is full: 2 requests are waiting.*queue_size 2"):
        line.submit(ticket("d"))
    for t in (running, *waiting):
        t.job.release.set()
    assert all(t.wait(WAIT) == Outcome(True, f"{t.job.name} spoken") for t in (running, *waiting))


def test_interrupt_stops_the_current_request_and_drops_the_waiting(line: RequestQueue[FakeJob]) -> None:
    current, waiting, newer = ticket("a"), ticket("b"), ticket("c")
    line.submit(current)
    assert current.job.started.wait(WAIT)
    line.submit(waiting)
    line.policy = "interrupt"
    line.submit(newer)
    outcome = current.wait(WAIT)
    assert outcome is not None and not outcome.success and "interrupted by a newer request" in outcome.message
    assert waiting.wait(0) == Outcome(False, "dropped from the queue by a newer request (queue_policy interrupt)")
    assert not waiting.job.started.is_set()
    assert newer.job.started.wait(WAIT)
    newer.job.release.set()
    assert newer.wait(WAIT) == Outcome(True, "c spoken")


def test_cancel_takes_a_waiting_request_out_and_stops_the_current_one(line: RequestQueue[FakeJob]) -> None:
    current, first, second = ticket("a"), ticket("b"), ticket("c")
    line.submit(current)
    assert current.job.started.wait(WAIT)
    line.submit(first)
    line.submit(second)
    line.cancel(first, "canceled by the client")
    assert first.wait(0) == Outcome(False, "canceled by the client")
    assert second.ahead == 1  # moved up
    line.cancel(current, "canceled by the client")
    assert current.wait(WAIT) == Outcome(False, "canceled by the client")
    assert second.job.started.wait(WAIT)
    second.job.release.set()
    assert second.wait(WAIT) == Outcome(True, "c spoken")


def test_a_failing_request_does_not_stop_the_queue(line: RequestQueue[FakeJob]) -> None:
    failing, after = ticket("boom"), ticket("b")
    failing.job.release.set()
    after.job.release.set()
    line.submit(failing)
    line.submit(after)
    assert failing.wait(WAIT) == Outcome(False, "synthesis failed: the codec fell over")
    assert after.wait(WAIT) == Outcome(True, "b spoken")


def test_close_answers_everyone_and_refuses_newcomers() -> None:
    line: RequestQueue[FakeJob] = RequestQueue(run, size=4)
    current, waiting = ticket("a"), ticket("b")
    line.submit(current)
    assert current.job.started.wait(WAIT)
    line.submit(waiting)
    line.close("the node is shutting down")
    assert current.wait(0) == Outcome(False, "the node is shutting down")
    assert waiting.wait(0) == Outcome(False, "the node is shutting down")
    with pytest.raises(Rejected, match="shutting down"):
        line.submit(ticket("c"))


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="queue, interrupt"):
        RequestQueue(run, size=1, policy="lifo")
