"""ros/requests.py, ros/goals.py and ros/loaded_model.py without a middleware, on the demo model: a request from
its arrival to its answer, refused with its reason and counted once, a text stream's end, the Speak goals' states,
and the model loaded and freed. The node over DDS: test_ros_node.py, test_ros_lifecycle.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ros_helpers import parameter_values, require_ros

from moss_tts_node.audio_output import AudioFormat
from moss_tts_node.synthesis.results import AudioChunk

require_ros()

from moss_tts_msgs.action import Speak  # noqa: E402
from moss_tts_msgs.msg import TextChunk  # noqa: E402
from moss_tts_msgs.srv import Synthesize  # noqa: E402
from rclpy.action import CancelResponse  # noqa: E402

from moss_tts_node.errors import ConfigError  # noqa: E402
from moss_tts_node.ros import requests as requests_module  # noqa: E402
from moss_tts_node.ros.audio import encode  # noqa: E402
from moss_tts_node.ros.goals import SpeakGoals  # noqa: E402
from moss_tts_node.ros.lifecycle import DEACTIVATING, SHUTTING_DOWN, Loan, Phase  # noqa: E402
from moss_tts_node.ros.loaded_model import LoadedModel  # noqa: E402
from moss_tts_node.ros.parameters import Settings, checked_settings  # noqa: E402
from moss_tts_node.ros.requests import (  # noqa: E402
    CLIENT_CANCEL,
    EMPTIED,
    SPEAK,
    STOPPED,
    SYNTHESIZE,
    TEXT,
    Requests,
)
from moss_tts_node.ros.text_stream import StreamLimits, TextStreams  # noqa: E402
from moss_tts_node.serving.intake import BUSY, Intake  # noqa: E402
from moss_tts_node.serving.queue import FULL, Outcome, Refused, State  # noqa: E402
from moss_tts_node.synthesizer import Synthesizer  # noqa: E402

NODE = "/moss_tts_node"
INACTIVE = f"the node is inactive: it serves once activated (ros2 lifecycle set {NODE} activate)"
# A few frames: each request is over in a moment; two languages, so that another is refused.
SHORT = {"generation__max_new_tokens": 40, "languages": ["en", "zh"]}
LONG = {"sampling__text_temperature": 0.0, "generation__max_new_tokens": 8000}  # the demo model speaks on
WAIT_S = 120  # a wait longer than this has deadlocked: the test fails instead of hanging
SUCCEEDED, CANCELED, ABORTED = "succeeded", "canceled", "aborted"


class Lines:
    """A logger that keeps its lines."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def warning(self, message: str) -> None:
        self.lines.append(("warning", message))

    def error(self, message: str) -> None:
        self.lines.append(("error", message))

    def warnings(self) -> list[str]:
        return [message for level, message in self.lines if level == "warning"]


class Published:
    """The audio out: every chunk published, by request id, and each one's end reason ("" but on a final one)."""

    def __init__(self) -> None:
        self.chunks: dict[str, list[AudioChunk]] = {}
        self.end_reasons: dict[str, list[str]] = {}

    def __call__(self, request_id: str, chunk: AudioChunk, encoding: str, end_reason: str) -> None:
        assert encoding == "pcm_s16le"
        self.chunks.setdefault(request_id, []).append(chunk)
        self.end_reasons.setdefault(request_id, []).append(end_reason)

    def ended(self, request_id: str) -> str:
        """How the request's audio ended: its one final chunk, the last, says so."""
        reasons = self.end_reasons[request_id]
        assert [bool(reason) for reason in reasons] == [False] * (len(reasons) - 1) + [True], reasons
        return reasons[-1]


class Node:
    """What the node gives its requests: a phase, the loaned model, the audio out and its log."""

    def __init__(self, synth: Synthesizer, settings: Settings, queue_size: int = 2) -> None:
        self.phase = Phase.ACTIVE
        self.loan: Loan[Synthesizer] = Loan()
        self.loan.give(synth)
        self.log = Lines()
        self.published = Published()
        self.requests = Requests(self.loan, lambda: self.phase, NODE, self.published, self.log)
        self.requests.apply(settings)
        self.requests.open(queue_size)

    def synthesize(self, **fields: Any) -> Synthesize.Response:
        """A ``~/synthesize`` call's answer, the node at the demo's sample rate and the default encoding."""
        answer = Synthesize.Response()
        return self.requests.synthesize(Synthesize.Request(**fields), answer, AudioFormat(24000, 1), "pcm_s16le")

    def close(self) -> None:
        self.requests.end("the test is over")
        self.requests.close("the test is over")


def settings_of(demo_config: Path, **changes: Any) -> Settings:
    return checked_settings(parameter_values(demo_config, **changes), "moss_tts_node parameters", Path.cwd())


@pytest.fixture
def node(synth: Synthesizer, demo_config: Path) -> Iterator[Node]:
    served = Node(synth, settings_of(demo_config, **SHORT))
    yield served
    served.close()


def test_a_request_is_refused_unless_the_node_serves_each_refusal_counted_and_logged_once(node: Node) -> None:
    node.phase = Phase.INACTIVE
    node.requests.text("Hello.")
    response = node.synthesize(text="Hello.")
    goal = node.requests.speak(Speak.Goal(text="Hello."), "goal", lambda ticket: None)
    assert (response.success, response.message, len(response.audio)) == (False, INACTIVE, 0)
    assert str(goal.exception(WAIT_S)) == INACTIVE
    counts = node.requests.counts(serving=False)
    assert (counts.refused, counts.completed, counts.queue_depth, counts.busy) == (3, 0, 0, False)
    assert sorted(node.log.warnings()) == [
        f"~/speak request refused: {INACTIVE}",
        f"~/synthesize request refused: {INACTIVE}",
        f"~/text request refused: {INACTIVE}",
    ]


def test_a_bad_request_is_refused_with_its_reason_and_the_line_serves_on(node: Node) -> None:
    refused = node.synthesize(text="🤖🤖🤖")
    spoken = node.synthesize(text="Hello.", seed=1)
    assert not refused.success and refused.message.startswith("nothing to say: ")
    assert spoken.success and spoken.timing.seed == 1
    assert node.log.warnings() == [f"~/synthesize request refused: {refused.message}"]


def test_a_check_that_fails_refuses_its_request_saying_so_and_the_node_serves_on(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault in a request's check, whatever the backend (the remote one's synthesizer once lacked an attribute
    the check read), is that request's refusal, with the reason, counted and its traceback logged: never an
    exception out of the service callback or the goal's execute, which would end the executor's spin."""
    asked = requests_module._asked

    def failing(msg: Any, name: str, synth: Synthesizer) -> Any:
        if msg.text == "fail":
            raise AttributeError("'RemoteSynthesizer' object has no attribute 'spec'")
        return asked(msg, name, synth)

    monkeypatch.setattr(requests_module, "_asked", failing)
    refused = node.synthesize(text="fail")
    goal = node.requests.speak(Speak.Goal(text="fail"), "goal", lambda ticket: None)
    reason = (
        "the node failed to check the request (AttributeError: 'RemoteSynthesizer' object has no attribute 'spec'); "
        "its log has the traceback"
    )
    assert (refused.success, refused.message, refused.sample_rate, refused.encoding) == (
        False,
        reason,
        24000,
        "pcm_s16le",
    )
    assert str(goal.exception(WAIT_S)) == reason
    assert node.synthesize(text="Hello.", seed=1).success  # the next request is served
    assert node.requests.counts(serving=True).refused == 2
    errors = [line for level, line in node.log.lines if level == "error"]
    assert len(errors) == 2 and all("Traceback" in line and "AttributeError" in line for line in errors)


def test_a_request_is_published_as_it_is_spoken_and_a_call_answered_with_the_whole_utterance(
    node: Node, synth: Synthesizer
) -> None:
    goal = node.requests.speak(Speak.Goal(text="Hello there.", seed=4), "goal", lambda ticket: None)
    ticket = goal.result(WAIT_S)
    assert ticket.wait(WAIT_S) is not None and ticket.outcome is not None and ticket.outcome.success
    published = np.concatenate([chunk.samples for chunk in node.published.chunks["goal"]])
    response = node.synthesize(text="Hello there.", seed=4)
    assert response.success and response.encoding == "pcm_s16le" and response.channels == 1
    answered = np.frombuffer(bytes(response.audio), "<i2").astype(np.int32)
    expected = np.frombuffer(encode(published, "pcm_s16le"), "<i2").astype(np.int32)  # the same seed, same audio
    assert answered.size == expected.size == round(response.duration * 24000)
    assert np.abs(answered - expected).max() <= 1  # one step of 16-bit rounding at most
    counts = node.requests.counts(serving=True)
    assert (counts.completed, counts.refused) == (2, 0) and counts.last is not None
    assert any(line.startswith("request goal: ") for _, line in node.log.lines)


def test_a_response_longer_than_max_response_seconds_is_refused_before_its_turn(
    synth: Synthesizer, demo_config: Path
) -> None:
    node = Node(synth, settings_of(demo_config, max_response_seconds=2.0, **SHORT))
    try:
        response = node.synthesize(text="Hello there, robot. " * 12)
    finally:
        node.close()
    assert not response.success
    assert "more than a ~/synthesize response holds (parameter 'max_response_seconds' (2 s))" in response.message


def test_a_text_stream_ends_its_stream_when_its_request_ends_or_is_refused(node: Node) -> None:
    streams = TextStreams()
    limits = StreamLimits(max_open=4, max_chars=1000, idle_timeout_s=5.0, max_duration_s=60.0)
    ended: dict[str, threading.Event] = {name: threading.Event() for name in ("spoken", "french")}

    def on_end(stream_id: str) -> None:
        streams.ended(stream_id)
        ended[stream_id].set()

    for first in (TextChunk(stream_id="spoken", text="Hello there."), TextChunk(stream_id="french", language="fr")):
        new = streams.receive(first, limits, now=0.0)
        assert new is not None
        node.requests.text_stream(new, on_end)
    assert ended["french"].wait(WAIT_S)  # refused: the language is no language of this node (languages)
    assert not ended["spoken"].is_set() and streams.open_count == 1  # waits for the rest of its text
    assert streams.receive(TextChunk(stream_id="spoken", text=" Bye.", final=True), limits, now=1.0) is None
    assert ended["spoken"].wait(WAIT_S) and streams.open_count == 0
    assert node.published.ended("spoken") in ("end", "max_new_tokens")  # spoken to its end
    assert node.log.warnings() == [
        "~/text_stream request refused: text stream 'french' refused: unknown language 'fr': this node accepts "
        "en, zh (parameter 'languages')"
    ]


def test_a_full_line_refuses_with_the_true_count(synth: Synthesizer, demo_config: Path) -> None:
    node = Node(synth, settings_of(demo_config, **LONG), queue_size=0)
    try:
        speaking = node.requests.speak(Speak.Goal(text="Hello."), "speaking", lambda ticket: None).result(WAIT_S)
        full = node.requests.speak(Speak.Goal(text="Hello."), "full", lambda ticket: None)
        assert str(full.exception(WAIT_S)) == FULL.format(waiting=0, size=0)
        node.requests.cancel(speaking, "stopped by the test")
        outcome = speaking.wait(WAIT_S)
    finally:
        node.close()
    assert outcome is not None and (outcome.success, outcome.message) == (False, "stopped by the test")
    assert node.requests.counts(serving=False).refused == 1
    assert node.published.ended("speaking") == "error"  # a reason the node never gives: not one of the others


def test_once_closed_every_request_is_refused_at_once_with_the_reason(node: Node) -> None:
    node.phase = Phase.SHUTTING_DOWN
    node.requests.end(SHUTTING_DOWN)
    node.requests.close(SHUTTING_DOWN)
    node.requests.text("Hello.")
    goal = node.requests.speak(Speak.Goal(text="Hello."), "goal", lambda ticket: None)
    response = node.synthesize(text="Hello.")
    assert goal.done() and str(goal.exception(0)) == response.message == SHUTTING_DOWN
    assert node.requests.counts(serving=False).refused == 3
    assert set(node.log.warnings()) == {
        f"{name} request refused: {SHUTTING_DOWN}" for name in (TEXT, SPEAK, SYNTHESIZE)
    }


def test_the_intake_checks_in_order_and_refuses_beyond_its_capacity() -> None:
    intake = Intake(capacity=3)
    release, order = threading.Event(), []
    held = intake.submit(release.wait)  # holds the intake's thread
    checks = [intake.submit(lambda number=number: order.append(number)) for number in range(2)]
    with pytest.raises(Refused) as busy:
        intake.submit(lambda: order.append(99))
    assert str(busy.value) == BUSY.format(pending=3, capacity=3)
    release.set()
    assert held.result(WAIT_S) and [check.result(WAIT_S) for check in checks] == [None, None]
    assert order == [0, 1]
    intake.submit(lambda: order.append(2)).result(WAIT_S)  # room again
    intake.close(SHUTTING_DOWN)
    with pytest.raises(Refused, match=SHUTTING_DOWN):
        intake.submit(lambda: order.append(3))
    assert order == [0, 1, 2]


def test_end_answers_every_request_in_line_with_its_reason(synth: Synthesizer, demo_config: Path) -> None:
    node = Node(synth, settings_of(demo_config, **LONG))
    speaking = node.requests.speak(Speak.Goal(text="one"), "one", lambda ticket: None).result(WAIT_S)
    waiting = node.requests.speak(Speak.Goal(text="two"), "two", lambda ticket: None).result(WAIT_S)
    node.phase = Phase.DEACTIVATING
    node.requests.end(DEACTIVATING)
    for ticket in (speaking, waiting):
        assert ticket.outcome is not None and (ticket.outcome.success, ticket.outcome.message) == (False, DEACTIVATING)
    assert speaking.job.stream.cancelled and waiting.state is State.DONE and waiting.job.started is None
    assert node.published.ended("one") == "deactivation" and "two" not in node.published.chunks  # it never spoke
    node.close()


@pytest.mark.parametrize("empties", [True, False], ids=["emptying", "keeping-the-line"])
def test_a_stop_ends_the_request_being_spoken_and_as_asked_those_behind_it(
    synth: Synthesizer, demo_config: Path, empties: bool
) -> None:
    """What ``~/stop`` does, without waiting: the request being spoken ends within a step with a final chunk
    saying "stop"; with stop_empties_queue those waiting end too, never spoken, and without it the next one
    is spoken."""
    node = Node(synth, settings_of(demo_config, stop_empties_queue=empties, **LONG))
    try:
        speaking = node.requests.speak(Speak.Goal(text="one"), "one", lambda ticket: None).result(WAIT_S)
        waiting = node.requests.speak(Speak.Goal(text="two"), "two", lambda ticket: None).result(WAIT_S)
        said = node.requests.stop()
        outcome = speaking.wait(WAIT_S)
        assert outcome is not None and (outcome.success, outcome.message) == (False, STOPPED)
        assert node.published.ended("one") == "stop"
        if empties:
            assert said == "stopped the ~/speak request one; dropped the 1 waiting"
            assert waiting.outcome == Outcome(False, EMPTIED) and "two" not in node.published.chunks
        else:
            assert said == "stopped the ~/speak request one; the 1 waiting go on (stop_empties_queue false)"
            node.requests.stop()  # the one that went on
            assert waiting.wait(WAIT_S) == Outcome(False, STOPPED) and node.published.ended("two") == "stop"
        assert node.requests.stop() == ("nothing to stop; none were waiting" if empties else "nothing to stop")
    finally:
        node.close()
    assert node.requests.counts(serving=False).refused == 0
    assert ("info", f"~/stop: {said}") in node.log.lines


def test_a_stop_that_empties_the_line_ends_the_requests_still_being_checked(
    synth: Synthesizer, demo_config: Path
) -> None:
    """A request that arrived before the stop but was still waiting for its check ends as those in line did; one
    that arrives after the stop is served."""
    node = Node(synth, settings_of(demo_config, **LONG))
    release = threading.Event()
    try:
        speaking = node.requests.speak(Speak.Goal(text="one"), "one", lambda ticket: None).result(WAIT_S)
        node.requests._intake.submit(release.wait)  # holds the intake's thread: the next request waits for its check
        checking = node.requests.speak(Speak.Goal(text="two"), "two", lambda ticket: None)
        said = node.requests.stop()
        after = node.requests.speak(Speak.Goal(text="three"), "three", lambda ticket: None)
        release.set()
        with pytest.raises(Refused) as emptied:
            checking.result(WAIT_S)
        assert str(emptied.value) == EMPTIED
        assert after.result(WAIT_S).state is not State.DONE  # in line: it came after the stop
    finally:
        node.close()
    assert said == "stopped the ~/speak request one; none were waiting"
    assert speaking.outcome == Outcome(False, STOPPED) and "two" not in node.published.chunks
    assert node.requests.counts(serving=False).refused == 0  # ended, not refused


# -- the Speak goals --------------------------------------------------------------------------------------------


class GoalId:
    def __init__(self, number: int) -> None:
        self.uuid = bytes([number] * 16)


class GoalHandle:
    """What ros/goals.py uses of rclpy's ServerGoalHandle; ``cancel`` marks it canceling as rclpy does."""

    def __init__(self, number: int, goal: Speak.Goal) -> None:
        self.goal_id = GoalId(number)
        self.request = goal
        self.feedback: list[Speak.Feedback] = []
        self.status = ""
        self.is_cancel_requested = False
        self.executed = threading.Event()

    def execute(self) -> None:
        self.executed.set()

    def publish_feedback(self, feedback: Speak.Feedback) -> None:
        self.feedback.append(feedback)

    def succeed(self) -> None:
        self.status = SUCCEEDED

    def canceled(self) -> None:
        self.status = CANCELED

    def abort(self) -> None:
        self.status = ABORTED


def test_goals_are_aborted_with_the_reason_or_end_canceled_by_their_client(
    synth: Synthesizer, demo_config: Path
) -> None:
    """A bad goal is accepted, then aborted with its reason; a waiting goal canceled by its client ends canceled;
    the goal being spoken, ended by a deactivate (not its client), ends aborted with that reason."""
    node = Node(synth, settings_of(demo_config, **LONG))
    goals = SpeakGoals(node.requests)
    speaking, waiting = GoalHandle(1, Speak.Goal(text="Hello.")), GoalHandle(2, Speak.Goal(text="Hi."))
    bad = GoalHandle(3, Speak.Goal(text="Hi.", seed=-5))
    try:
        for handle in (speaking, waiting, bad):
            goals.accept(handle)
            assert handle.executed.is_set()
        bad_result = goals.execute(bad)
        waiting.is_cancel_requested = True  # rclpy marks it canceling once the cancel is accepted
        assert goals.cancel(waiting) == CancelResponse.ACCEPT
        waiting_result = goals.execute(waiting)
        node.phase = Phase.DEACTIVATING
        node.requests.end(DEACTIVATING)
        speaking_result = goals.execute(speaking)
    finally:
        node.close()
    assert (bad.status, bad_result.success) == (ABORTED, False) and bad_result.message.startswith("the seed must be")
    assert (waiting.status, waiting_result.message) == (CANCELED, CLIENT_CANCEL)
    assert (speaking.status, speaking_result.message) == (ABORTED, DEACTIVATING)
    assert node.published.ended(bytes(speaking.goal_id.uuid).hex()) == "deactivation"
    states = [feedback.state for feedback in speaking.feedback]
    assert states[0] == Speak.Feedback.STATE_GENERATING and states[-1] == Speak.Feedback.STATE_DONE
    assert waiting.feedback[0].state == Speak.Feedback.STATE_QUEUED and waiting.feedback[0].queue_position == 1
    published = node.published.chunks.get(bytes(speaking.goal_id.uuid).hex(), [])  # the goal's request id
    assert speaking_result.duration == pytest.approx(sum(chunk.samples.size for chunk in published) / 24000)
    assert speaking.feedback[-1].audio_produced == pytest.approx(speaking_result.duration)


def test_a_goal_that_succeeds_ends_succeeded_with_its_figures(node: Node) -> None:
    goals = SpeakGoals(node.requests)
    handle = GoalHandle(7, Speak.Goal(text="Hello there.", seed=2))
    goals.accept(handle)
    result = goals.execute(handle)
    assert (handle.status, result.success, result.timing.seed) == (SUCCEEDED, True, 2)
    assert node.published.ended(bytes([7] * 16).hex()) == result.timing.stop_reason  # end, or max_new_tokens
    assert result.duration > 0 and handle.feedback[-1].chunks_published == len(
        node.published.chunks[bytes([7] * 16).hex()]
    )


# -- the model ------------------------------------------------------------------------------------------------


def test_the_model_is_loaded_lent_and_freed_and_a_failed_load_says_why(demo_config: Path, tmp_path: Path) -> None:
    log = Lines()
    model = LoadedModel(log)
    model.load(settings_of(demo_config))
    assert model.audio == AudioFormat(24000, 1) and model.load_s is not None and model.failure is None
    assert model.loaded.startswith("model loaded in ") and model.loaded.endswith(f" ({model.name})")
    assert model.name == "MOSS-TTS (release unknown)"  # the demo's convert had no card to tell its release
    with model.loan.borrow() as synth:
        assert synth is not None
    model.free()
    with model.loan.borrow() as synth:
        assert synth is None
    assert log.lines[-1][1].startswith("unconfigured: model freed in ")
    (tmp_path / "bad.wav").write_text("not audio")
    with pytest.raises(ConfigError) as error:
        model.load(settings_of(demo_config, voices__files=[str(tmp_path / "bad.wav")]))
    assert model.failed(error.value) == model.failure == str(error.value)
    assert "'voices.files': voice 'bad' cannot be used" in model.failure
    with model.loan.borrow() as synth:
        assert synth is None  # nothing half-made is lent
