"""moss_tts_node as a lifecycle node over real DDS (docs/ros.md, "Lifecycle"), on the demo model: every transition
with the real ``ros2 lifecycle`` command line, requests in each state, a deactivate while speaking with requests
waiting, cleanup and configure again, a failed configure recovered, the memory a cleanup gives back over 20 cycles,
and the player across a deactivate. The node, its clients and the ``ros2`` commands run in a loopback-only network
namespace (ros_helpers/netns.py); each test starts a node of its own.
"""

from __future__ import annotations

import importlib.util
import shlex
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from ros_helpers import played_span, require_ros, wait_played
from ros_helpers.netns import SECURITY_CLIENT, LoopbackNamespace, NodeProcess, playing, retry_until, wait_for_line

from moss_tts_node.model.rates import SAMPLE_RATE

if TYPE_CHECKING:
    from conftest import NullSink

require_ros()

SUCCEEDED, CANCELED, ABORTED = 4, 5, 6  # action_msgs/GoalStatus
QUEUED, GENERATING, DONE = 0, 1, 2  # Speak feedback states
DEACTIVATING = "the node is deactivating"
INACTIVE = "the node is inactive: it serves once activated (ros2 lifecycle set /moss_tts_node activate)"
UNCONFIGURED = (
    "the node is unconfigured: it serves once configured and activated "
    "(ros2 lifecycle set /moss_tts_node configure, then activate)"
)
# Greedy text: the demo model speaks until max_new_tokens, long enough for a line to form behind it.
LONG = {"sampling.text_temperature": 0.0, "generation.max_new_tokens": 8000}
UNMANAGED = ["-p", "autostart:=false"]

# What docs/ros.md, "Lifecycle", tells a user to type, as the tests run it.
GET = "ros2 lifecycle get /moss_tts_node"
LIST = "ros2 lifecycle list /moss_tts_node"
SET = "ros2 lifecycle set /moss_tts_node {}"
NODES = "ros2 lifecycle nodes"
PARAM_SET_WEIGHTS = "ros2 param set /moss_tts_node model.weights_dir /path/to/MOSS-TTS-GGUF"
SERVICE_CALL = "ros2 service call /moss_tts_node/synthesize moss_tts_msgs/srv/Synthesize \"{text: 'Hello'}\""
ROS_PAGE = (Path(__file__).resolve().parent.parent / "docs" / "ros.md").read_text()

# After its last cleanup the node may hold this much more than before its first configure: the code that
# configure loads once and a process cannot unload (ONNX Runtime, onnx and llama.cpp's libraries and Python
# modules, 67 MiB measured), and no more; a model left loaded would hold its KV cache and buffers on top. (The
# first cleanup can leave up to 20 MiB more, which the second takes back: docs/ros.md, "Lifecycle".)
LOADED_CODE_MARGIN_KIB = 80 * 1024
# Over the cycles, the median after cleanup in the last quarter may exceed the second quarter's by this much at
# most (the first quarter settles): a leak of 0.5 MiB a cycle fails it; one sample taken while a cleanup's memory
# was not yet given back (seen: 8-18 MiB above its neighbours, twice in five) does not. docs/ros.md, "Lifecycle",
# has the curve.
CLEANUP_GROWTH_KIB = 4 * 1024
CYCLES = 20


def start(netns: LoopbackNamespace, params_file: Path, *ros_args: str) -> NodeProcess:
    """A node of the test's own started with ``ros_args``, once it is up (it serves, or waits unconfigured)."""
    node = NodeProcess(netns, ["--params-file", str(params_file), *ros_args])
    node.wait_ready()
    return node


def require_ros2_cli() -> None:
    if importlib.util.find_spec("ros2lifecycle") is None:
        pytest.skip("the ros2 CLI with ros2lifecycle is not installed: `make msgs` installs it from ../shared/ros2cli/")


def ros2(netns: LoopbackNamespace, command: str, expected: str) -> str:
    """Run a ``ros2`` command in the namespace until its output has ``expected``; what it printed."""
    return retry_until(lambda: netns.ros2(*shlex.split(command)[1:]).stdout, expected, command)


def test_every_command_run_here_is_in_the_docs() -> None:
    commands = [GET, LIST, NODES, PARAM_SET_WEIGHTS, SERVICE_CALL]
    commands += [SET.format(t) for t in ("configure", "activate", "deactivate", "cleanup", "shutdown")]
    missing = [command for command in commands if command not in ROS_PAGE]
    assert not missing, f"docs/ros.md does not give these commands as the tests run them: {missing}"


def test_every_transition_with_the_ros2_lifecycle_command_line(own_netns: LoopbackNamespace, params_file: Path) -> None:
    require_ros2_cli()
    node = start(own_netns, params_file, *UNMANAGED)
    try:
        assert "/moss_tts_node" in ros2(own_netns, NODES, "/moss_tts_node")
        ros2(own_netns, GET, "unconfigured [1]")
        available = ros2(own_netns, LIST, "configure [1]")
        assert "shutdown [5]" in available and "activate" not in available
        for transition, state, offered in (
            ("configure", "inactive [2]", ("activate [3]", "cleanup [2]", "shutdown [6]")),
            ("activate", "active [3]", ("deactivate [4]", "shutdown [7]")),
            ("deactivate", "inactive [2]", ("activate [3]", "cleanup [2]", "shutdown [6]")),
            ("cleanup", "unconfigured [1]", ("configure [1]", "shutdown [5]")),
            ("configure", "inactive [2]", ("activate [3]",)),
            ("activate", "active [3]", ("deactivate [4]",)),
        ):
            ros2(own_netns, SET.format(transition), "Transitioning successful")
            ros2(own_netns, GET, state)
            available = ros2(own_netns, LIST, offered[0])
            assert all(label in available for label in offered), (transition, available)
        ros2(own_netns, SET.format("shutdown"), "Transitioning successful")
        assert node.wait() == 0, node.output()
    finally:
        node.stop()
    log = node.output()
    for line in ("configured: model loaded", "ready: model loaded", "inactive: the requests in line ended"):
        assert line in log
    assert log.count("unconfigured: model freed") == 2  # by the cleanup, then by the shutdown from active


@pytest.mark.parametrize(("transitions", "state"), [([], "unconfigured [1]"), (["configure"], "inactive [2]")])
def test_shutdown_from_an_idle_state_ends_the_process(
    own_netns: LoopbackNamespace, params_file: Path, transitions: list[str], state: str
) -> None:
    require_ros2_cli()
    node = start(own_netns, params_file, *UNMANAGED)
    try:
        assert all(step["success"] for step in own_netns.client("transitions", transitions=transitions)["steps"])
        ros2(own_netns, GET, state)
        ros2(own_netns, SET.format("shutdown"), "Transitioning successful")
        assert node.wait() == 0, node.output()
    finally:
        node.stop()
    assert ("unconfigured: model freed" in node.output()) is bool(transitions)


def test_requests_and_parameter_changes_in_each_state(own_netns: LoopbackNamespace, params_file: Path) -> None:
    """Refused with the state and the way out while unconfigured or inactive, served while active; a load-time
    parameter changes only while unconfigured; every interface is there in every state."""
    node = start(own_netns, params_file, *UNMANAGED)
    try:
        for refusal, before in ((UNCONFIGURED, []), (INACTIVE, ["configure"])):
            assert all(step["success"] for step in own_netns.client("transitions", transitions=before)["steps"])
            call = own_netns.client("synthesize", requests=[{"text": "Hello."}])["responses"][0]
            assert (call["success"], call["message"], call["bytes"]) == (False, refusal, 0)
            goal = own_netns.client("speak", goals=[{"text": "Hello."}])["goals"][0]
            assert (goal["status"], goal["message"]) == (ABORTED, refusal)
            own_netns.client("text", texts=["Hello."], finals=0)
            wait_for_log(node, f"~/text request refused: {refusal}")
            stream = f"stream-{len(before)}"
            # A stream is checked on the intake's thread: its second chunk is sent once the first was refused.
            own_netns.client("text_stream", steps=[{"chunk": {"stream_id": stream, "text": "Hello"}}])
            wait_for_log(node, f"~/text_stream request refused: text stream {stream!r} refused: {refusal}")
            own_netns.client("text_stream", steps=[{"chunk": {"stream_id": stream, "text": " there."}}])
            wait_for_log(node, f"text stream {stream!r} has ended: its later chunks are dropped")
            voices = own_netns.client("voices", script=SECURITY_CLIENT)  # known from configure on
            assert (voices["success"], voices["message"]) == (
                (True, "")
                if before
                else (
                    False,
                    "the node is unconfigured: its voices are encoded when it is configured "
                    "(ros2 lifecycle set /moss_tts_node configure)",
                )
            )
        changes = own_netns.client("params", set=[["llama.n_ctx", 4096], ["sampling.seed", 3], ["queue_size", 3]])[
            "set"
        ]
        assert [verdict["successful"] for verdict in changes] == [False, True, False]
        assert (
            changes[0]["reason"].startswith("'llama.n_ctx' is read when the model loads")
            and "inactive" in (changes[0]["reason"])
        )
        assert own_netns.client("transitions", transitions=["activate"])["steps"][0]["success"]
        assert own_netns.client("synthesize", requests=[{"text": "Hello."}])["responses"][0]["success"]
        assert own_netns.client("speak", goals=[{"text": "Hello."}])["goals"][0]["status"] == SUCCEEDED
        assert len(own_netns.client("text", texts=["Hello."])["chunks"]) > 0
        values = own_netns.client("diagnostics", where={"lifecycle_state": "active"})["values"]
        assert (values["requests_refused"], values["requests_completed"]) == ("8", "3")
        steps = own_netns.client("transitions", transitions=["deactivate", "cleanup"])["steps"]
        assert [step["state"] for step in steps] == ["inactive", "unconfigured"]
        changes = own_netns.client("params", set=[["llama.n_ctx", 4096]])["set"]
        assert changes[0]["successful"], changes  # takes effect at the next configure
    finally:
        node.stop()


def wait_for_log(node: NodeProcess, line: str, timeout: float = 30.0) -> None:
    wait_for_line(node.output, line, lambda: node.process.poll() is None, "the node", timeout)


def test_deactivate_while_speaking_ends_each_request_once_with_its_reason(
    own_netns: LoopbackNamespace, params_file: Path
) -> None:
    """A goal speaking, a service call and a goal waiting: the deactivate ends all three as aborted with the
    reason, each once (one result, one "done" feedback); requests then are refused as inactive; activated again,
    the node speaks."""
    node = start(own_netns, params_file, "-p", "queue_size:=2")
    try:
        answer = own_netns.client("deactivate", params=LONG)
    finally:
        node.stop()
    assert (answer["deactivated"], answer["state"], answer["activated"]) == (True, "inactive", True)
    speaking, waiting = answer["goals"]
    for goal in (speaking, waiting):
        assert (goal["status"], goal["message"]) == (ABORTED, DEACTIVATING), goal
        assert [f["state"] for f in goal["feedback"]].count(DONE) == 1
    assert speaking["timing"]["stop_reason"] == "cancelled"
    assert GENERATING in {f["state"] for f in speaking["feedback"]}
    assert GENERATING not in {f["state"] for f in waiting["feedback"]}
    assert (answer["call"]["success"], answer["call"]["message"]) == (False, DEACTIVATING)
    assert answer["call"]["timing"]["queue_wait"] is None  # it never left the line
    assert answer["inactive"]["goal"] == {"status": ABORTED, "message": INACTIVE}
    assert answer["inactive"]["call"] == {"success": False, "message": INACTIVE}
    assert answer["again"]["status"] == CANCELED and answer["again"]["chunks"] > 0
    assert node.output().count(f"request {speaking['id'][:8]}: {DEACTIVATING}") == 1
    spoken = [c for c in answer["chunks"] if c["request_id"] == speaking["id"]]
    assert [c["end_reason"] for c in spoken if c["is_final"]] == ["deactivation"] and spoken[-1]["is_final"]
    assert not any(c["request_id"] == waiting["id"] for c in answer["chunks"])  # it never spoke


def test_deactivate_ends_a_text_stream_that_waits_for_more_text(
    own_netns: LoopbackNamespace, params_file: Path
) -> None:
    """A stream spoken as far as its text goes, waiting for the rest: the deactivate ends it as any request, and
    its later chunks are dropped, once activated again too."""
    node = start(own_netns, params_file)
    try:
        first = {"chunk": {"stream_id": "talker", "text": "Hello there. And then"}}
        own_netns.client("text_stream", steps=[first, {"wait_chunks": ["talker", 1]}])
        assert own_netns.client("transitions", transitions=["deactivate", "activate"])["steps"][0]["success"]
        own_netns.client("text_stream", steps=[{"chunk": {"stream_id": "talker", "text": " more.", "final": True}}])
        wait_for_log(node, "text stream 'talker' has ended: its later chunks are dropped")
    finally:
        node.stop()
    assert node.output().count(f"request talker: {DEACTIVATING}") == 1


def test_cleanup_then_configure_again_speaks_the_same_audio_for_the_same_seed(
    own_netns: LoopbackNamespace, params_file: Path
) -> None:
    node = start(own_netns, params_file)  # autostart: active, as `ros2 run` has it
    try:
        before = own_netns.client("synthesize", requests=[{"text": "Hello there, robot.", "seed": 7}])["responses"][0]
        steps = own_netns.client("transitions", transitions=["deactivate", "cleanup", "configure", "activate"])["steps"]
        after = own_netns.client("synthesize", requests=[{"text": "Hello there, robot.", "seed": 7}])["responses"][0]
    finally:
        node.stop()
    assert [(s["success"], s["state"]) for s in steps] == [
        (True, "inactive"),
        (True, "unconfigured"),
        (True, "inactive"),
        (True, "active"),
    ]
    assert before["success"] and before["bytes"] > 0
    assert after["sha256"] == before["sha256"] and after["bytes"] == before["bytes"]


def test_a_failed_configure_is_recovered_after_fixing_the_parameter(
    own_netns: LoopbackNamespace, params_file: Path, demo_config: Path
) -> None:
    """The route of docs/ros.md, "Lifecycle": configure fails with the reason in the log and in diagnostics, the
    process stays up, the parameter is fixed with ros2 param set, and configure succeeds."""
    require_ros2_cli()
    node = start(own_netns, params_file, *UNMANAGED, "-p", "model.weights_dir:=/nonexistent")
    reason = "moss_tts_node parameters: 'model.weights_dir' directory not found: /nonexistent"
    try:
        ros2(own_netns, SET.format("configure"), "Transitioning failed")
        ros2(own_netns, GET, "unconfigured [1]")
        status = own_netns.client("diagnostics", where={"lifecycle_state": "unconfigured"})
        assert (status["level"], status["message"]) == (2, f"configure failed: {reason}")
        weights = str(demo_config.parent.resolve())
        ros2(own_netns, PARAM_SET_WEIGHTS.replace("/path/to/MOSS-TTS-GGUF", weights), "Set parameter successful")
        ros2(own_netns, SET.format("configure"), "Transitioning successful")
        ros2(own_netns, SET.format("activate"), "Transitioning successful")
        assert "success=True" in ros2(own_netns, SERVICE_CALL, "response:")
        status = own_netns.client("diagnostics", where={"lifecycle_state": "active"})
        assert (status["level"], status["message"]) == (0, "ready")
        assert node.process.poll() is None
    finally:
        node.stop()
    assert f"configure failed: {reason}; the node stays unconfigured" in node.output()


def test_cleanup_gives_the_memory_back_over_cycles(own_netns: LoopbackNamespace, params_file: Path) -> None:
    """20 rounds of configure, activate, a request, deactivate, cleanup: after the last cleanup the node holds no
    more than a node that never loaded plus the code the first configure loaded, after each one much less than
    while loaded, it does not grow from one round to the next, and every round speaks the same audio."""
    node = start(own_netns, params_file, *UNMANAGED)
    never_loaded = node.rss_kib()
    cleaned: list[int] = []
    loaded: list[int] = []

    def sample(line: dict[str, Any]) -> None:
        if line.get("step") == "cleanup":
            cleaned.append(node.rss_kib())
        elif line.get("step") == "speak":
            loaded.append(node.rss_kib())

    try:
        request = {"text": "Hello there, robot.", "seed": 3}
        answer = own_netns.client("cycles", timeout=600, on_line=sample, cycles=CYCLES, request=request)
    finally:
        node.stop()
    print(f"node RSS (KiB): never loaded {never_loaded}; loaded {loaded}; after each cleanup {cleaned}")
    assert len(set(answer["sha256"])) == 1  # the same audio from every load
    assert cleaned[-1] <= never_loaded + LOADED_CODE_MARGIN_KIB, (never_loaded, cleaned)
    quarter = len(cleaned) // 4
    second, last = cleaned[quarter : 2 * quarter], cleaned[-quarter:]
    assert statistics.median(last) <= statistics.median(second) + CLEANUP_GROWTH_KIB, cleaned
    assert min(load - clean for load, clean in zip(loaded, cleaned, strict=True)) > 20 * 1024, (loaded, cleaned)


def test_the_player_goes_quiet_when_the_node_deactivates_and_plays_once_it_is_active_again(
    own_netns: LoopbackNamespace, params_file: Path, null_sink: NullSink, tmp_path: Path
) -> None:
    """An utterance the node has finished speaking, still playing: the player stops it when the node leaves the
    active state (a ~/text request has no goal status to follow), then plays the next one after activate.

    Greedy text makes the demo model speak to max_new_tokens: 120 steps are several seconds of audio, made in a
    fraction of a second, so the utterance is still playing when the deactivate comes, whatever the machine.
    """
    node = start(own_netns, params_file, "-p", "sampling.text_temperature:=0.0", "-p", "generation.max_new_tokens:=120")
    log = tmp_path / "player.log"
    env = {**own_netns.env, "PULSE_SERVER": null_sink.env["PULSE_SERVER"]}
    try:
        with playing(own_netns, log, env=env) as player:
            with null_sink.recording(tmp_path / "playing.raw"):
                sent = own_netns.client(
                    "text", texts=["Hello there, robot."], save=str(tmp_path / "a.npy"), other_listeners=1
                )
                deadline = time.monotonic() + 60
                while played_span(tmp_path / "playing.raw") == 0:  # it plays
                    assert player.poll() is None and time.monotonic() < deadline, log.read_text()
                    time.sleep(0.02)
                assert own_netns.client("transitions", transitions=["deactivate"])["steps"][0]["success"]
                stopped = "the node left the active state (deactivating): its audio stopped"
                wait_for_line(log.read_text, stopped, lambda: player.poll() is None, "the player", 60.0)
            assert "(1 utterances playing or waiting)" in log.read_text()
            utterance = np.load(tmp_path / "a.npy").size
            assert utterance > 2 * SAMPLE_RATE and len(sent["chunks"]) > 1
            with null_sink.recording(tmp_path / "inactive.raw"):
                # As long as the whole utterance, in the sink's own time: what would still play, were it not stopped.
                null_sink.wait_recorded(tmp_path / "inactive.raw", utterance)
            # Stopped means cut within the device's buffer: far less than the rest of the utterance plays on.
            assert played_span(tmp_path / "inactive.raw") < SAMPLE_RATE // 4, log.read_text()
            assert own_netns.client("transitions", transitions=["activate"])["steps"][0]["success"]
            with null_sink.recording(tmp_path / "again.raw") as captured:
                own_netns.client(
                    "text",
                    texts=["Hello robot."],
                    save=str(tmp_path / "b.npy"),
                    params={"generation.max_new_tokens": 60},
                )
                again = np.load(tmp_path / "b.npy")
                wait_played(tmp_path / "again.raw", again.size, player, log)
            assert null_sink.snr_db(again, captured[0]) > 15, log.read_text()  # see test_cli's play test
    finally:
        node.stop()
