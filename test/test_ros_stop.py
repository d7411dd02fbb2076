"""``~/stop`` over real DDS, on the demo model (docs/ros.md, "Stopping speech"): the service and the topic stop a
goal, a topic text or a text stream being spoken, with others waiting, emptying the line behind it or not; a stop
with nothing to stop; a storm of stops; the final chunk's end reason in each case; and the player silent after a
stop. The node and its clients run in a loopback-only network namespace (ros_helpers/netns.py).

The request being stopped is accepted under greedy text and 8000 steps, so it speaks until it is stopped; those
behind it under 30 steps, so those that go on end by themselves.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from ros_helpers import played_span, require_ros
from ros_helpers.netns import LoopbackNamespace, NodeProcess, playing, serving, wait_for_line

from moss_tts_node.model.rates import SAMPLE_RATE

if TYPE_CHECKING:
    from conftest import NullSink

require_ros()

from moss_tts_node.ros.requests import EMPTIED, STOPPED  # noqa: E402

SUCCEEDED, ABORTED = 4, 6  # action_msgs/GoalStatus
LONG = {"sampling.text_temperature": 0.0, "generation.max_new_tokens": 8000}
SHORT = {"sampling.text_temperature": 0.0, "generation.max_new_tokens": 30}
SPOKEN_TO_ITS_END = ("end", "max_new_tokens")
# The interface a stop's answer names, by the kind of request it stops.
INTERFACES = {"goal": "~/speak", "text": "~/text", "stream": "~/text_stream"}


def current(kind: str, stream_id: str) -> dict[str, Any]:
    """The step that starts the request to be stopped."""
    if kind == "goal":
        return {"goal": "current", "request": {"text": "Hello there."}}
    if kind == "text":
        return {"text": "Hello there."}
    return {"chunk": {"stream_id": stream_id, "text": "Hello there."}}


def queued(stream_id: str) -> list[dict[str, Any]]:
    """The steps that put behind it, in this order, a goal, a topic text and a text stream still open."""
    return [
        {"goal": "queued", "request": {"text": "A queued goal."}},
        {"wait_depth": 1},
        {"text": "A queued text."},
        {"wait_depth": 2},
        {"chunk": {"stream_id": stream_id, "text": "A queued stream."}},
        {"wait_depth": 3},
    ]


@pytest.fixture(scope="module")
def node(netns: LoopbackNamespace, params_file: Path) -> Iterator[NodeProcess]:
    with serving(netns, ["--params-file", str(params_file), "-p", "queue_size:=3"]) as up:
        yield up


def final_reasons(answer: dict[str, Any]) -> dict[str, list[str]]:
    """Each request's end reasons, by request id, in order of its audio; checks there is one final chunk, its last."""
    reasons: dict[str, list[str]] = {}
    for request_id in answer["spoken"]:
        chunks = [c for c in answer["chunks"] if c["request_id"] == request_id]
        assert [c["index"] for c in chunks] == list(range(len(chunks))), request_id
        assert [c["is_final"] for c in chunks] == [False] * (len(chunks) - 1) + [True], request_id
        reasons[request_id] = [c["end_reason"] for c in chunks if c["end_reason"]]
    return reasons


@pytest.mark.parametrize("empties", [True, False], ids=["emptying", "keeping-the-line"])
@pytest.mark.parametrize(("kind", "via"), [("goal", "service"), ("text", "topic"), ("stream", "service")])
def test_a_stop_ends_what_is_spoken_and_as_asked_the_line_behind_it(
    netns: LoopbackNamespace, node: NodeProcess, kind: str, via: str, empties: bool
) -> None:
    # Stream ids of this case's own: an id that has ended stays ended (its later chunks are dropped).
    speaking, waiting = f"speaking-{kind}-{empties}", f"waiting-{kind}-{empties}"
    steps = [
        {"params": LONG},
        current(kind, speaking),
        {"wait_audio": [0, 2]},
        {"params": SHORT},
        *queued(waiting),
        {"stop": via},
        # Once the stop has ended the streams it ends (a stop on the topic travels apart from the chunks, and a
        # stream being spoken ends a step after the service's answer): the queued stream's end, dropped if it has
        # ended, and a late chunk of the stream being stopped, dropped too.
        {"wait_open": 0 if empties else 1},
        {"chunk": {"stream_id": waiting, "final": True}},
        *([{"chunk": {"stream_id": speaking, "text": " More.", "final": True}}] if kind == "stream" else []),
        {"wait_open": 0},
    ]
    answer = netns.client(
        "stop", steps=steps, params={"stop_empties_queue": empties}, spoken=1 if empties else 4, timeout=60
    )
    reasons = final_reasons(answer)
    stopped = answer["spoken"][0]
    assert reasons[stopped] == ["stop"]
    goals = answer["goals"]
    if kind == "goal":
        assert (goals["current"]["status"], goals["current"]["message"]) == (ABORTED, STOPPED)
    if empties:
        assert answer["spoken"] == [stopped]  # nothing behind it was spoken
        assert (goals["queued"]["status"], goals["queued"]["message"]) == (ABORTED, EMPTIED)
        said = f"stopped the {INTERFACES[kind]} request {stopped[:8]}; dropped the 3 waiting"
    else:  # the line went on, in its order, each to its end
        assert answer["spoken"][1:] == [goals["queued"]["id"], answer["spoken"][2], waiting]
        assert all(reasons[request_id][0] in SPOKEN_TO_ITS_END for request_id in answer["spoken"][1:]), reasons
        assert goals["queued"]["status"] == SUCCEEDED
        said = f"stopped the {INTERFACES[kind]} request {stopped[:8]}; the 3 waiting go on (stop_empties_queue false)"
    assert answer["answers"] == ([said] if via == "service" else [])
    log = node.output()
    assert f"~/stop: {said}" in log
    if kind == "stream":
        assert f"text stream {speaking!r} has ended: its later chunks are dropped" in log
    if empties:
        assert f"text stream {waiting!r} has ended: its later chunks are dropped" in log
    assert answer["diagnostics"]["queue_depth"] == "0"


def test_a_stop_with_nothing_to_stop_says_so_and_the_node_speaks_on(
    netns: LoopbackNamespace, node: NodeProcess
) -> None:
    # The messages first, acknowledged before the first call goes: the calls share their callback group and come
    # later, so the messages are handled by the time the calls are answered, and none lands on the text (once a
    # message handled after the text stopped it: the order of two topics is not kept).
    answer = netns.client(
        "stop",
        steps=[{"stop": "topic", "times": 3}, {"stop": "service", "times": 2}, {"params": SHORT}, {"text": "Hello."}],
    )
    assert answer["answers"] == ["nothing to stop; none were waiting"] * 2
    (text,) = final_reasons(answer).values()  # the text after them: spoken to its end
    assert text[0] in SPOKEN_TO_ITS_END


def test_a_storm_of_stops_stops_once_and_each_call_is_answered(netns: LoopbackNamespace, node: NodeProcess) -> None:
    """Forty stops at once on a goal with two waiting, ten of them service calls in flight together (as many as
    a service's default queue holds) and thirty messages: one stop stops it (and empties the line), the others
    find nothing; then the node speaks a goal to its end."""
    answer = netns.client(
        "stop",
        steps=[
            {"params": LONG},
            {"goal": "current"},
            {"wait_audio": [0, 2]},
            {"goal": "second"},
            {"goal": "third"},
            {"wait_depth": 2},
            {"storm": [10, 30]},
            {"params": SHORT},
            {"goal": "after"},
        ],
        timeout=60,
    )
    goals = answer["goals"]
    assert (goals["current"]["status"], goals["current"]["message"]) == (ABORTED, STOPPED)
    assert {goals[name]["message"] for name in ("second", "third")} == {EMPTIED}
    assert goals["after"]["status"] == SUCCEEDED
    assert answer["spoken"] == [goals["current"]["id"], goals["after"]["id"]]
    reasons = final_reasons(answer)
    assert reasons[goals["current"]["id"]] == ["stop"] and reasons[goals["after"]["id"]][0] in SPOKEN_TO_ITS_END
    assert len(answer["answers"]) == 10
    # One of the stops stopped it: a call, or a message (then every call found nothing).
    stopped = f"stopped the ~/speak request {goals['current']['id'][:8]}; dropped the 2 waiting"
    assert answer["answers"].count(stopped) <= 1
    assert set(answer["answers"]) - {stopped} == {"nothing to stop; none were waiting"}
    assert "Traceback" not in node.output()


def test_the_player_is_silent_after_a_stop(
    own_netns: LoopbackNamespace, params_file: Path, null_sink: NullSink, tmp_path: Path
) -> None:
    """A ~/text utterance playing, seconds of it buffered in the player: a stop on the topic silences it at once.
    A topic text has no goal status to follow: the final chunk's end reason is what stops it."""
    log = tmp_path / "player.log"
    env = {**own_netns.env, "PULSE_SERVER": null_sink.env["PULSE_SERVER"]}
    with serving(own_netns, ["--params-file", str(params_file)]) as node, playing(own_netns, log, env=env) as player:
        with null_sink.recording(tmp_path / "playing.raw"):
            own_netns.client(
                "stop",
                steps=[{"params": LONG}, {"text": "Hello there, robot."}, {"wait_audio": [0, 20]}],
                wait_finals=False,
                other_listeners=1,
            )
            deadline = time.monotonic() + 60
            while played_span(tmp_path / "playing.raw") == 0:  # it plays
                assert player.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.02)
            answer = own_netns.client("stop", steps=[{"stop": "topic"}, {"wait_final": 1}])
            wait_for_line(log.read_text, "stopped (stop)", lambda: player.poll() is None, "the player", 30.0)
        assert [c["end_reason"] for c in answer["chunks"] if c["is_final"]] == ["stop"]
        with null_sink.recording(tmp_path / "after.raw"):
            null_sink.wait_recorded(tmp_path / "after.raw", 2 * SAMPLE_RATE)  # two seconds of the sink's own time
        assert played_span(tmp_path / "after.raw") == 0, log.read_text()
        assert "~/stop: stopped the ~/text request" in node.output()
