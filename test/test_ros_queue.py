"""The node's request line (serving/queue.py): order, bounds, interrupt policy, cancel, shutdown.

No ROS here: the jobs are stand-ins that run until released or cancelled. Hand-picked cases
first, then the rules as properties over random interleavings (hypothesis).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from moss_tts_node.serving.queue import (
    DROPPED,
    FULL,
    INTERRUPTED,
    POLICIES,
    Outcome,
    Refused,
    RequestQueue,
    State,
    Ticket,
)

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
    with pytest.raises(Refused, match=r"queue is full: 2 requests are waiting.*queue_size 2"):
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


@pytest.mark.parametrize("empty", ["dropped by the stop", None], ids=["emptying", "keeping-the-line"])
def test_stop_cancels_the_current_request_once_and_as_asked_ends_the_waiting(
    line: RequestQueue[FakeJob], empty: str | None
) -> None:
    current, first, second = ticket("a"), ticket("b"), ticket("c")
    line.submit(current)
    assert current.job.started.wait(WAIT)
    line.submit(first)
    line.submit(second)
    stopped, dropped = line.stop("stopped", empty)
    assert stopped is current and dropped == ([first, second] if empty else [])
    assert line.stop("stopped again", empty) == (None, [])  # it is stopping already: nothing more to stop
    assert current.wait(WAIT) == Outcome(False, "stopped")
    if empty:
        assert first.wait(0) == second.wait(0) == Outcome(False, empty)
        assert not first.job.started.is_set() and not second.job.started.is_set()
    else:
        assert first.job.started.wait(WAIT)  # the next one is spoken at once
        for waiting in (first, second):
            waiting.job.release.set()
        assert [first.wait(WAIT), second.wait(WAIT)] == [Outcome(True, "b spoken"), Outcome(True, "c spoken")]


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
    with pytest.raises(Refused, match="shutting down"):
        line.submit(ticket("c"))


def test_unknown_policy_and_negative_size_are_refused() -> None:
    with pytest.raises(ValueError, match="queue, interrupt"):
        RequestQueue(run, size=1, policy="lifo")
    with pytest.raises(ValueError, match="0 or more, got -1"):
        RequestQueue(run, size=-1)


def test_back_to_back_requests_on_an_idle_line_both_fit() -> None:
    """The first request is the one being spoken at once, even before the worker has taken it."""
    line: RequestQueue[FakeJob] = RequestQueue(run, size=1)
    first, second = ticket("a"), ticket("b")
    try:
        line.submit(first)
        line.submit(second)
        assert (first.state, second.state, second.ahead) == (State.GENERATING, State.QUEUED, 1)
        with pytest.raises(Refused, match=r"queue is full: 1 requests are waiting.*queue_size 1"):
            line.submit(ticket("c"))
        first.job.release.set()
        second.job.release.set()
        assert first.wait(WAIT) == Outcome(True, "a spoken") and second.wait(WAIT) == Outcome(True, "b spoken")
    finally:
        line.close("test over")


def test_queue_size_0_speaks_when_idle_and_refuses_while_speaking() -> None:
    line: RequestQueue[FakeJob] = RequestQueue(run, size=0)
    first, second = ticket("a"), ticket("b")
    try:
        line.submit(first)
        with pytest.raises(Refused, match=r"queue is full: 0 requests are waiting.*queue_size 0"):
            line.submit(ticket("refused"))
        first.job.release.set()
        assert first.wait(WAIT) == Outcome(True, "a spoken")
        line.submit(second)  # idle again
        second.job.release.set()
        assert second.wait(WAIT) == Outcome(True, "b spoken")
    finally:
        line.close("test over")


def test_submits_from_many_threads_are_spoken_in_the_order_accepted() -> None:
    """Real contention: threads submit at once while the worker ends jobs as fast as it can."""
    accepted: list[str] = []  # appended under the line's lock, at acceptance: its true order
    worked: list[str] = []
    done: dict[str, int] = {}

    def quick(t: Ticket[FakeJob]) -> Outcome:
        worked.append(t.job.name)
        return Outcome(True, f"{t.job.name} spoken")

    def on_update(t: Ticket[FakeJob]) -> None:
        if t.job.name not in done:
            accepted.append(t.job.name)
            done[t.job.name] = 0
        done[t.job.name] += t.state == State.DONE

    line: RequestQueue[FakeJob] = RequestQueue(quick, size=2)
    refusals: list[str] = []
    tickets = [[Ticket(FakeJob(f"{thread}-{n}"), threading.Event(), on_update) for n in range(50)] for thread in "abcd"]
    start = threading.Barrier(len(tickets))

    def submit_all(mine: list[Ticket[FakeJob]]) -> None:
        start.wait()
        for t in mine:
            try:
                line.submit(t)
            except Refused as err:
                refusals.append(str(err))

    threads = [threading.Thread(target=submit_all, args=(mine,)) for mine in tickets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    for t in (t for mine in tickets for t in mine if t.job.name in done):
        assert t.wait(WAIT) == Outcome(True, f"{t.job.name} spoken")
    line.close("test over")
    assert worked == accepted
    assert all(count == 1 for count in done.values())
    assert len(accepted) + len(refusals) == 200
    assert set(refusals) <= {FULL.format(waiting=2, size=2)}
    for mine in tickets:  # each thread's own requests keep their order
        names = [t.job.name for t in mine]
        assert [name for name in accepted if name in names] == [name for name in names if name in done]


# -- the line's rules as properties -------------------------------------------------------------
#
# A state machine drives a real RequestQueue (and its real worker thread) with random sequences of
# submits, cancels, policy changes and worker steps, and checks each answer against a model of the
# rules written independently of the implementation. The stand-in job blocks until the machine
# lets it end, so the worker's progress is one of the random steps; whether the worker thread has
# already *started* a job is left to the scheduler, and the answers must not depend on it.

SIZES = st.integers(min_value=0, max_value=3)
ENDINGS = st.sampled_from(["spoken", "boom"])
CLOSED = "the line is closed"


@dataclass
class GatedJob:
    name: str
    gate: threading.Event = field(default_factory=threading.Event)  # set: the work may end
    fails: bool = False
    done_updates: int = 0


class LineRules(RuleBasedStateMachine):
    """The model: ``current`` and ``waiting`` as the rules say they must be, and each ticket's due outcome."""

    def __init__(self) -> None:
        super().__init__()
        self.line: RequestQueue[GatedJob] | None = None
        self.current: Ticket[GatedJob] | None = None
        self.waiting: list[Ticket[GatedJob]] = []
        self.expected: dict[str, Outcome] = {}  # by ticket name, once its ending is decided
        self.cancel_reasons: dict[str, str] = {}  # the first cancel of a ticket that was current
        self.made_current: list[str] = []  # the order the rules hand tickets to the worker
        self.worked: list[str] = []  # the order the worker started them
        self.accepted: list[Ticket[GatedJob]] = []
        self.count = 0

    def work(self, ticket: Ticket[GatedJob]) -> Outcome:
        self.worked.append(ticket.job.name)
        assert ticket.job.gate.wait(WAIT), "the machine never let this job end"
        if ticket.job.fails:
            raise RuntimeError("the codec fell over")
        if ticket.cancel_flag.is_set():
            return Outcome(False, ticket.cancel_reason)
        return Outcome(True, f"{ticket.job.name} spoken")

    @initialize(size=SIZES, policy=st.sampled_from(POLICIES))
    def start(self, size: int, policy: str) -> None:
        self.line = RequestQueue(self.work, size, policy)

    @property
    def live(self) -> RequestQueue[GatedJob]:
        assert self.line is not None
        return self.line

    def _make_current(self, ticket: Ticket[GatedJob]) -> None:
        self.current = ticket
        self.made_current.append(ticket.job.name)

    @rule()
    def submit(self) -> None:
        self.count += 1
        job = GatedJob(f"r{self.count}")

        def on_update(t: Ticket[GatedJob]) -> None:
            job.done_updates += t.state == State.DONE

        new = Ticket(job, threading.Event(), on_update)
        line = self.live
        if line.policy == "queue" and self.current is not None and len(self.waiting) >= line.size:
            with pytest.raises(Refused) as refused:
                line.submit(new)
            # More than size wait only after a spell of the interrupt policy.
            assert str(refused.value) == FULL.format(waiting=len(self.waiting), size=line.size)
            return
        if line.policy == "interrupt":
            if self.current is not None:
                self.cancel_reasons.setdefault(self.current.job.name, INTERRUPTED)
            for dropped in self.waiting:
                self.expected[dropped.job.name] = Outcome(False, DROPPED)
            self.waiting.clear()
        line.submit(new)
        self.accepted.append(new)
        if self.current is None:
            self._make_current(new)
        else:
            self.waiting.append(new)

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        if not self.accepted:
            return
        target = data.draw(st.sampled_from(self.accepted))
        reason = f"cancel of {target.job.name}"
        self.live.cancel(target, reason)
        if target in self.waiting:
            self.waiting.remove(target)
            self.expected[target.job.name] = Outcome(False, reason)
        elif target is self.current:
            self.cancel_reasons.setdefault(target.job.name, reason)

    @rule(policy=st.sampled_from(POLICIES))
    def change_policy(self, policy: str) -> None:
        self.live.policy = policy  # what the node does on `ros2 param set queue_policy`

    @rule(ending=ENDINGS)
    def worker_step(self, ending: str) -> None:
        """The current job ends (spoken, cancelled or failed); the next waiting one becomes current."""
        ticket = self.current
        if ticket is None:
            return
        name = ticket.job.name
        ticket.job.fails = ending == "boom"
        if ticket.job.fails:
            self.expected[name] = Outcome(False, "synthesis failed: the codec fell over")
        elif name in self.cancel_reasons:
            self.expected[name] = Outcome(False, self.cancel_reasons[name])
        else:
            self.expected[name] = Outcome(True, f"{name} spoken")
        ticket.job.gate.set()
        assert ticket.wait(WAIT) is not None
        self.current = None
        if self.waiting:
            self._make_current(self.waiting.pop(0))

    @invariant()
    def the_line_is_as_the_rules_say(self) -> None:
        if self.line is None:
            return
        line = self.line
        assert line.busy == (self.current is not None)
        assert line.depth == len(self.waiting)
        if self.current is not None:
            assert (self.current.state, self.current.ahead, self.current.outcome) == (State.GENERATING, 0, None)
        for position, waiting in enumerate(self.waiting, start=1):
            assert (waiting.state, waiting.ahead, waiting.outcome) == (State.QUEUED, position, None)
        for ticket in self.accepted:
            assert ticket.outcome == self.expected.get(ticket.job.name)  # ended only when, and as, due
            assert ticket.job.done_updates == (ticket.outcome is not None)  # and only once

    def teardown(self) -> None:
        if self.line is None:
            return
        if self.current is not None:  # then the current one is fresh: close's cancel is what it sees
            self.worker_step("spoken")
        closing = threading.Thread(target=self.live.close, args=(CLOSED,))
        closing.start()
        for ticket in self.waiting:
            self.expected[ticket.job.name] = Outcome(False, CLOSED)
        if self.current is not None:
            assert self.current.cancel_flag.wait(WAIT)
            self.expected[self.current.job.name] = Outcome(False, CLOSED)
            self.current.job.gate.set()
        closing.join(WAIT)
        assert not closing.is_alive()
        self.current, self.waiting = None, []
        for ticket in self.accepted:
            assert ticket.outcome == self.expected[ticket.job.name]
            assert ticket.job.done_updates == 1
        assert self.worked == self.made_current  # spoken in the order accepted, none skipped, none twice
        accepted_order = [t.job.name for t in self.accepted]
        assert self.made_current == [name for name in accepted_order if name in self.made_current]


LineRules.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_the_line_keeps_its_rules_under_any_interleaving = LineRules.TestCase
