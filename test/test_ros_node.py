"""moss_tts_node over real DDS, on the demo model: the node and its clients are separate
processes in one loopback-only network namespace (ros_helpers/netns.py).

One node serves the whole module (it loads in about a second); tests that change a
parameter restore it. Long requests come from greedy text sampling
(``sampling.text_temperature`` 0), with which the demo model never ends on its own and runs
to ``generation.max_new_tokens``.
"""

from __future__ import annotations

import importlib.util
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from memory_growth import SOAK_RSS_GROWTH_KIB, late_growth_kib
from ros_helpers import PARAMS_FILE_SEED, require_ros
from ros_helpers.netns import LoopbackNamespace, NodeProcess, played_by_the_player, serving, stop_process

from moss_tts_node.codec.streaming import OfflineDecoding, WindowedStreamDecoding
from moss_tts_node.model.rates import SAMPLE_RATE, SAMPLES_PER_FRAME
from moss_tts_node.serving.queue import FULL

if TYPE_CHECKING:
    from conftest import NullSink

require_ros()

from moss_tts_node.ros.text_stream import MAX_ID_CHARS  # noqa: E402

SUCCEEDED, CANCELED, ABORTED = 4, 5, 6  # action_msgs/GoalStatus
QUEUED, GENERATING, DONE = 0, 1, 2  # Speak feedback states
# With greedy text the demo model speaks until max_new_tokens: about ten seconds of generation,
# more than a slow DDS discovery can take to deliver the first chunk. Tests cut these short.
LONG = {"sampling.text_temperature": 0.0, "generation.max_new_tokens": 8000}
LONG_ARGS = [arg for key, value in LONG.items() for arg in ("-p", f"{key}:={value}")]


@pytest.fixture(scope="module")
def node(netns: LoopbackNamespace, params_file: Path) -> Iterator[NodeProcess]:
    with serving(netns, ["--params-file", str(params_file), "-p", "queue_size:=2", "-p", "languages:=[en, zh]"]) as up:
        yield up


def chunks_of(answer: dict[str, Any], request_id: str) -> list[dict[str, Any]]:
    return [c for c in answer["chunks"] if c["request_id"] == request_id]


def assert_stream(chunks: list[dict[str, Any]], *, ended: str | None = None) -> None:
    """Chunks of one utterance: in order, no gaps, each starting where the previous one ended, and one final chunk,
    the last, saying how it ended: ``ended``, or (None) the model ended it or its steps ran out."""
    assert chunks
    assert [c["index"] for c in chunks] == list(range(len(chunks)))
    assert [c["is_final"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert [c["end_reason"] for c in chunks[:-1]] == [""] * (len(chunks) - 1)
    assert chunks[-1]["end_reason"] in ((ended,) if ended else ("end", "max_new_tokens"))
    offset = 0.0
    for chunk in chunks:
        assert (chunk["sample_rate"], chunk["channels"], chunk["encoding"]) == (SAMPLE_RATE, 1, "pcm_s16le")
        assert chunk["start_offset"] == pytest.approx(offset)
        offset += chunk["bytes"] / 2 / SAMPLE_RATE


def test_text_topic_streams_chunks_in_order(netns: LoopbackNamespace, node: NodeProcess) -> None:
    """Two texts in a row: each streamed whole, one after the other, never interleaved."""
    answer = netns.client("text", texts=["Hello there.", "And a second sentence."])
    ids = list(dict.fromkeys(c["request_id"] for c in answer["chunks"]))  # in order of arrival
    assert len(ids) == 2
    first, second = (chunks_of(answer, request_id) for request_id in ids)
    assert first[-1]["received"] <= second[0]["received"]
    assert_stream(first)
    assert_stream(second)


@pytest.mark.parametrize(("encoding", "width"), [("pcm_s16le", 2), ("float32", 4)])
def test_synthesize_returns_the_audio_of_every_frame(
    netns: LoopbackNamespace, node: NodeProcess, encoding: str, width: int
) -> None:
    answer = netns.client(
        "synthesize", requests=[{"text": "Hello there.", "seed": 1}], params={"output_encoding": encoding}
    )
    response = answer["responses"][0]
    assert response["success"], response["message"]
    timing = response["timing"]
    assert timing["frames"] > 0 and timing["stop_reason"] == "end" and timing["seed"] == 1
    assert response["bytes"] == timing["frames"] * SAMPLES_PER_FRAME * width
    assert response["duration"] == pytest.approx(timing["frames"] * SAMPLES_PER_FRAME / SAMPLE_RATE)
    assert (response["sample_rate"], response["channels"], response["encoding"]) == (SAMPLE_RATE, 1, encoding)
    assert 0 < timing["time_to_first_audio"] <= timing["wall_time"] and timing["real_time_factor"] > 0
    assert timing["codec_decode"] == OfflineDecoding.name and timing["codec_rtf"] > 0


def test_speak_gives_feedback_then_a_result(netns: LoopbackNamespace, node: NodeProcess) -> None:
    answer = netns.client("speak", goals=[{"text": "Hello there.", "seed": 2}])
    goal = answer["goals"][0]
    assert goal["status"] == SUCCEEDED and goal["success"], goal["message"]
    chunks = chunks_of(answer, goal["id"])
    assert_stream(chunks)
    feedback = goal["feedback"]
    states = [f["state"] for f in feedback]
    assert GENERATING in states and states == sorted(states) and states[-1] == DONE  # queued, generating, done
    assert [f["chunks"] for f in feedback] == sorted(f["chunks"] for f in feedback)
    assert feedback[-1]["chunks"] == len(chunks)
    assert feedback[-1]["audio_produced"] == pytest.approx(goal["duration"])
    assert goal["duration"] == pytest.approx(goal["timing"]["frames"] * SAMPLES_PER_FRAME / SAMPLE_RATE)
    assert goal["timing"]["codec_decode"] == WindowedStreamDecoding.name  # the demo codec has no stream decoder


def test_cancel_stops_the_utterance_within_a_step(netns: LoopbackNamespace, node: NodeProcess) -> None:
    answer = netns.client(
        "speak",
        goals=[{"text": "Hello there."}],
        then={"goal": 0, "chunks": 2, "do": "cancel"},
        params=LONG,
    )
    goal = answer["goals"][0]
    assert goal["status"] == CANCELED and goal["message"] == "canceled by the client"
    assert goal["timing"]["stop_reason"] == "cancelled"
    assert goal["timing"]["steps"] < 8000  # it was still speaking: the chunks came as they were made
    assert goal["result_received"] - goal["cancel_sent"] < 2.0  # a step takes milliseconds
    assert_stream(chunks_of(answer, goal["id"]), ended="cancel")


def test_queue_policy_serves_in_order_and_refuses_when_full(netns: LoopbackNamespace, node: NodeProcess) -> None:
    """queue_size is 2: one speaking, two waiting, the fourth refused with the reason."""
    answer = netns.client(
        "speak",
        goals=[{"text": text} for text in ("one", "two", "three", "four")],
        then={"goal": 0, "chunks": 1, "do": "cancel"},
        params=LONG,
    )
    first, second, third, fourth = answer["goals"]
    assert [g["accepted"] for g in answer["goals"]] == [True] * 4
    assert first["status"] == CANCELED and GENERATING in {f["state"] for f in first["feedback"]}
    for waiting, ahead in ((second, 1), (third, 2)):
        assert (QUEUED, ahead) in {(f["state"], f["ahead"]) for f in waiting["feedback"]}
        assert waiting["status"] == CANCELED and waiting["message"] == "canceled by the client"
        assert GENERATING not in {f["state"] for f in waiting["feedback"]}
    assert fourth["status"] == ABORTED and not fourth["success"]
    assert "queue is full" in fourth["message"] and "queue_size 2" in fourth["message"]


def test_a_request_runs_with_the_parameters_it_was_accepted_under(netns: LoopbackNamespace, node: NodeProcess) -> None:
    """Two goals wait behind a long one while the parameters change under them: each runs with
    those in force when it was accepted. Greedy text runs every goal to max_new_tokens, so its
    step count says which value it ran with."""
    answer = netns.client(
        "speak",
        goals=[
            {"text": "one"},
            {"text": "two", "params": {"generation.max_new_tokens": 40, "audio.chunk_frames": 5}},
            {
                "text": "three",
                "params": {"generation.max_new_tokens": 45, "audio.chunk_frames": 2, "output_encoding": "float32"},
            },
        ],
        then={"goal": 0, "chunks": 1, "do": "cancel", "cancel": [0]},
        params={**LONG, "output_encoding": "pcm_s16le"},
    )
    first, second, third = answer["goals"]
    assert first["status"] == CANCELED
    assert second["status"] == SUCCEEDED and third["status"] == SUCCEEDED, answer["goals"]
    assert (second["timing"]["steps"], second["timing"]["stop_reason"]) == (40, "max_new_tokens")
    assert (third["timing"]["steps"], third["timing"]["stop_reason"]) == (45, "max_new_tokens")
    for goal, encoding, width, chunk_frames in ((second, "pcm_s16le", 2, 5), (third, "float32", 4, 2)):
        chunks = chunks_of(answer, goal["id"])
        assert {c["encoding"] for c in chunks} == {encoding}
        assert max(c["bytes"] for c in chunks) == chunk_frames * SAMPLES_PER_FRAME * width


def test_interrupt_policy_cuts_the_current_utterance(netns: LoopbackNamespace, node: NodeProcess) -> None:
    answer = netns.client(
        "speak",
        goals=[{"text": "first"}, {"text": "second", "wait_chunks": 1}],
        then={"goal": 1, "chunks": 1, "do": "cancel"},
        params={**LONG, "queue_policy": "interrupt"},
    )
    first, second = answer["goals"]
    assert first["status"] == ABORTED and "interrupted by a newer request" in first["message"]
    assert first["timing"]["stop_reason"] == "cancelled"
    assert_stream(chunks_of(answer, first["id"]), ended="interrupt")
    assert second["status"] == CANCELED
    assert chunks_of(answer, second["id"])  # the newer request was spoken


def test_bad_requests_are_answered_and_the_node_keeps_serving(netns: LoopbackNamespace, node: NodeProcess) -> None:
    bad = [
        ({"text": "   "}, "text is empty"),
        ({"text": "Hello.", "language": "fr"}, "unknown language 'fr': this node accepts en, zh"),
        ({"text": "Hello.", "reference_audio": "/nonexistent/voice.wav"}, "not a voice of this node"),
        ({"text": "Hello.", "instruction": "calm " * 10000}, "'limits.max_text_chars'"),  # refused unread
    ]
    answer = netns.client(
        "synthesize", requests=[request for request, _ in bad] + [{"text": "Hello.", "language": "en"}]
    )
    *refused, served = answer["responses"]
    for response, (_, reason) in zip(refused, bad, strict=True):
        assert not response["success"] and reason in response["message"]
        assert response["bytes"] == 0
    assert served["success"], served["message"]
    goal = netns.client("speak", goals=[{"text": ""}])["goals"][0]
    assert goal["status"] == ABORTED and "text is empty" in goal["message"]
    assert "request refused: the text is empty" in node.output()


def test_parameters_come_from_the_file_and_the_command_line(
    netns: LoopbackNamespace, node: NodeProcess, demo_config: Path
) -> None:
    names = ["sampling.seed", "model.weights_dir", "queue_size", "languages", "queue_policy"]
    values = netns.client("params", get=names)["values"]
    assert values == {
        "sampling.seed": PARAMS_FILE_SEED,  # from the file
        "model.weights_dir": str(demo_config.parent.resolve()),
        "queue_size": 2,  # from the command line
        "languages": ["en", "zh"],
        "queue_policy": "queue",  # the default
    }


def test_bad_parameter_values_are_refused_with_the_reason(netns: LoopbackNamespace, node: NodeProcess) -> None:
    answer = netns.client(
        "params",
        set=[
            ["sampling.text_top_p", 2.0],
            ["queue_policy", "lifo"],
            ["sampling.text_temperature", "hot"],
            ["llama.n_ctx", 1024],
            ["queue_size", 3],
            ["sampling.text_temperature", 1],  # an int for a float, as in a config file
            ["sampling.text_temperature", 1.5],
        ],
    )
    verdicts = [(v["successful"], v["reason"]) for v in answer["set"]]
    assert not verdicts[0][0] and "sampling.text_top_p" in verdicts[0][1]
    assert verdicts[1] == (
        False,
        "moss_tts_node parameters: 'queue_policy' must be one of queue, interrupt, got 'lifo'",
    )
    assert verdicts[2] == (False, "moss_tts_node parameters: 'sampling.text_temperature' must be float, got str 'hot'")
    assert verdicts[3] == (
        False,
        "'llama.n_ctx' is read when the model loads, so it changes only while the node is unconfigured, and the "
        "node is active: deactivate and clean it up first (ros2 lifecycle set /moss_tts_node deactivate, then "
        "cleanup), set it, then configure and activate",
    )
    assert not verdicts[4][0] and "read-only" in verdicts[4][1]  # read when the process starts
    assert verdicts[5][0] and verdicts[6][0]


@pytest.mark.skipif(
    importlib.util.find_spec("audio_common_msgs") is None,
    reason="audio_common_msgs is not installed (it is not on PyPI): the node publishes ~/audio only",
)
def test_audio_common_topics_carry_what_audio_play_plays(netns: LoopbackNamespace, node: NodeProcess) -> None:
    """What ros-drivers' audio_play (format wave) takes: raw S16LE mono on ``audio`` at its QoS (depth 10, fewer
    chunks here than that), the same bytes as ~/audio's pcm_s16le chunks, each stamped as its chunk on
    ``audio_stamped``, and the format latched on ``audio_info`` for a subscriber that comes later."""
    answer = netns.client(
        "audio_common", texts=["Hello there."], params={"audio.chunk_frames": 20, "output_encoding": "pcm_s16le"}
    )
    chunks = answer["chunks"]
    pcm = [size for size in chunks["sizes"] if size]  # the empty final chunk is not sent there
    assert 1 < len(pcm) < 10
    assert answer["raw"]["sizes"] == pcm and answer["stamped"]["sizes"] == pcm
    assert answer["raw"]["sha256"] == chunks["sha256"] == answer["stamped"]["sha256"]
    stamps = [stamp for stamp, size in zip(chunks["stamps"], chunks["sizes"], strict=True) if size]
    assert answer["stamped"]["stamps"] == stamps and all(stamps)
    assert answer["info"] == {
        "channels": 1,
        "sample_rate": SAMPLE_RATE,
        "sample_format": "S16LE",
        "bitrate": SAMPLE_RATE * 16,
        "coding_format": "wave",
    }


def test_diagnostics_report_the_model_the_queue_and_the_last_request(
    netns: LoopbackNamespace, node: NodeProcess
) -> None:
    netns.client("synthesize", requests=[{"text": "Hello there.", "seed": 1}])
    status = netns.client("diagnostics")
    values = status["values"]
    assert status["level"] == 0 and status["message"] == "ready"
    assert values["model_loaded"] == "true"
    assert re.fullmatch(r"CPU [0-9.]+ MiB \(.+\)", values["weight_layout"]), values  # the demo's F16 backbone
    assert (values["queue_depth"], values["queue_size"], values["queue_policy"]) == ("0", "2", "queue")
    assert float(values["last_real_time_factor"]) > 0
    assert float(values["last_time_to_first_audio_s"]) > 0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_shutdown_answers_every_request_and_exits_0(
    own_netns: LoopbackNamespace, params_file: Path, signum: int
) -> None:
    with serving(own_netns, ["--params-file", str(params_file), *LONG_ARGS]) as process:
        answer = own_netns.client(
            "speak",
            goals=[{"text": "one"}, {"text": "two"}, {"text": "three"}],
            then={"goal": 0, "chunks": 1, "do": signal.Signals(signum).name, "pid": process.process.pid},
        )
        assert process.wait() == 0, process.output()
    for goal in answer["goals"]:
        assert goal["status"] == ABORTED and goal["message"] == "the node is shutting down", (goal, process.output())
    assert answer["goals"][0]["timing"]["stop_reason"] == "cancelled"
    log = process.output()
    assert "the node is shutting down" in log
    assert "Traceback" not in log and "terminate called" not in log


@pytest.mark.parametrize(
    ("ros_args", "reason"),
    [
        (["-p", "llama.n_ctx:=10"], "llama.n_ctx out of range"),
        (["-p", "model.weights_dir:=/nonexistent"], "'model.weights_dir' directory not found: /nonexistent"),
        (["-p", "output_encoding:=mp3"], "'output_encoding' must be one of pcm_s16le, float32, got 'mp3'"),
    ],
)
def test_bad_parameters_stop_the_node_at_startup(
    own_netns: LoopbackNamespace, params_file: Path, ros_args: list[str], reason: str
) -> None:
    process = NodeProcess(own_netns, ["--params-file", str(params_file), *ros_args])
    try:
        assert process.wait() == 2
    finally:
        process.stop()
    assert "cannot start" in process.output() and reason in process.output()


BURST_CLIENTS, BURST_GOALS, BURST_ROUNDS = 3, 2, 8  # six goals at once, eight times over


def wait_for(condition: Callable[[], bool], clients: list[Future[Any]], what: str, timeout: float = 60.0) -> None:
    """Poll ``condition``; fail at once with a client's error if one has ended."""
    deadline = time.monotonic() + timeout
    while not condition():
        for client in clients:
            if client.done():
                client.result()  # raises the client's failure
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("queue_size", [0, 2])
def test_a_burst_from_several_clients_is_served_first_come_first_served(
    own_netns: LoopbackNamespace, params_file: Path, tmp_path: Path, queue_size: int
) -> None:
    """Goals from three client processes at once, more than the line holds: in the order the node
    accepted them (their stamps), the first is spoken, the next ``queue_size`` wait in that order,
    the rest are refused with the true count; then the line is spoken through in that order.

    Greedy text makes every goal long, so the burst is over before anything ends on its own; each
    client cancels its goals as they start, which starts the next. Several rounds catch a race
    that a single burst would show only sometimes.
    """
    sync = tmp_path / "sync"
    sync.mkdir()
    with (
        serving(own_netns, ["--params-file", str(params_file), "-p", f"queue_size:={queue_size}", *LONG_ARGS]),
        ThreadPoolExecutor(BURST_CLIENTS) as pool,
    ):
        clients = [
            pool.submit(
                own_netns.client,
                "burst",
                timeout=120,
                sync_dir=str(sync),
                name=str(number),
                clients=BURST_CLIENTS,
                per_round=BURST_GOALS,
                rounds=BURST_ROUNDS,
            )
            for number in range(BURST_CLIENTS)
        ]
        wait_for(lambda: len(list(sync.glob("matched-*"))) == BURST_CLIENTS, clients, "the clients")
        for number in range(BURST_ROUNDS):
            (sync / f"go-{number}").touch()
            wait_for(
                lambda: len(list(sync.glob(f"done-{number}-*"))) == BURST_CLIENTS,  # noqa: B023
                clients,
                f"round {number}",
            )
        answers = [client.result() for client in clients]
    for number in range(BURST_ROUNDS):
        goals = sorted((goal for answer in answers for goal in answer["rounds"][number]), key=lambda g: g["stamp_ns"])
        assert len({goal["stamp_ns"] for goal in goals}) == len(goals)  # one order of acceptance
        served, refused = goals[: queue_size + 1], goals[queue_size + 1 :]
        for goal in refused:
            assert goal["status"] == ABORTED and not goal["feedback"], (number, goal)
            assert goal["message"] == FULL.format(waiting=queue_size, size=queue_size), (number, goal)
        first = [(g["feedback"][0]["state"], g["feedback"][0]["ahead"]) for g in served]
        assert first == [(GENERATING, 0)] + [(QUEUED, ahead) for ahead in range(1, queue_size + 1)], number
        for goal in served:
            assert goal["status"] == CANCELED and goal["message"] == "canceled by the client", (number, goal)
        started = [next(f["received"] for f in g["feedback"] if f["state"] == GENERATING) for g in served]
        assert started == sorted(started), number  # spoken in the order accepted


SOAK_CYCLES = 42  # of 18 requests each; the node's memory is sampled after each (memory_growth.py has the limit)


def test_a_soak_of_mixed_requests_is_answered_in_full_with_bounded_memory(
    own_netns: LoopbackNamespace, params_file: Path
) -> None:
    """750+ requests one after another: two texts at once on the topic, service calls, goals,
    goals cancelled while spoken and while waiting, bad input of each kind, oversized and hostile
    requests (a megabyte of text, probes of the machine's files). Every one is answered as it should
    be, the diagnostics count them, and the node's memory levels off."""
    short = ["-p", "generation.max_new_tokens:=33"]  # two frames of audio: the demo model is slow per step
    curve: list[tuple[int, int]] = []  # (requests so far, node RSS in KiB)
    ros_args = ["--params-file", str(params_file), "-p", "queue_size:=1", "-p", "languages:=[en]", *short]
    with serving(own_netns, ros_args) as process:
        curve.append((0, process.rss_kib()))

        def sample(line: dict[str, Any]) -> None:
            if "progress" in line:
                curve.append((line["progress"], process.rss_kib()))

        answer = own_netns.client("soak", timeout=600, on_line=sample, cycles=SOAK_CYCLES, long=LONG)
        counts = answer["counts"]
        # The node counts what the client counted, once the last topic refusals are in (a topic's message may reach
        # it after a later service call's): a count that never gets there fails this wait. Its 50 s are for a loaded
        # machine, where 10 once fell two refusals short.
        counted = {"requests_completed": str(counts["succeeded"]), "requests_refused": str(counts["refused"])}
        own_netns.client("diagnostics", where=counted, wait_s=50)
    print("soak RSS (requests, KiB):", curve)
    assert answer["unexpected"] == []
    assert counts["requests"] >= 750
    assert counts["succeeded"] + counts["cancelled"] + counts["refused"] == counts["requests"]
    assert process.output().count("~/text request refused: the text is empty") == SOAK_CYCLES
    assert process.output().count("~/text request refused: the request has 5000 characters") == SOAK_CYCLES
    assert late_growth_kib([kib for _, kib in curve]) <= SOAK_RSS_GROWTH_KIB, curve


def test_the_player_plays_what_the_node_publishes(
    netns: LoopbackNamespace, node: NodeProcess, null_sink: NullSink, tmp_path: Path
) -> None:
    sent, captured, log = played_by_the_player(netns, null_sink, tmp_path, "Hello robot.")
    assert null_sink.snr_db(sent, captured) > 15, log.read_text()  # see test_cli's play test


# -- ~/text_stream (the stream assembly itself: test_ros_text_stream.py) --------------------------------------------


def steps(stream_id: str, text: str, final: bool = True, **first: Any) -> list[dict[str, Any]]:
    """A text sent word by word as TextChunk steps, the request fields on the first."""
    words = [word for word in text.replace(" ", "\0 ").split("\0") if word]
    out = [{"chunk": {"stream_id": stream_id, "text": word}} for word in words]
    out[0]["chunk"] |= first
    if final:
        out.append({"chunk": {"stream_id": stream_id, "final": True}})
    return out


def interleaved(*streams: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for number in range(max(map(len, streams))):
        out += [stream[number] for stream in streams if number < len(stream)]
    return out


def test_interleaved_streams_are_each_one_request_in_line_order(netns: LoopbackNamespace, node: NodeProcess) -> None:
    texts = {"first": "Hello there. I am a robot.", "second": "你好。How are you?"}
    before = netns.client("diagnostics")["values"]
    answer = netns.client(
        "text_stream",
        steps=interleaved(steps("first", texts["first"], seed=3), steps("second", texts["second"], seed=4)),
        finals=list(texts),
    )
    first, second = (chunks_of(answer, stream_id) for stream_id in texts)
    assert_stream(first)
    assert_stream(second)
    assert first[-1]["received"] <= second[0]["received"]  # one request after the other, in line order
    after = netns.client("diagnostics")["values"]  # published after both ended
    assert int(after["requests_completed"]) == int(before["requests_completed"]) + 2
    assert after["text_streams_open"] == "0"


def node_with(netns: LoopbackNamespace, params_file: Path, *params: str) -> AbstractContextManager[NodeProcess]:
    """A node of its own (in ``own_netns``) with parameters the module's node cannot take: the text stream bounds
    are read-only (docs/security.md, "Request checks")."""
    return serving(netns, ["--params-file", str(params_file), "-p", "languages:=[en, zh]", *params])


def test_an_abandoned_stream_is_spoken_after_the_idle_timeout(own_netns: LoopbackNamespace, params_file: Path) -> None:
    with node_with(own_netns, params_file, "-p", "text_stream_idle_timeout:=0.5") as node:
        answer = own_netns.client(
            "text_stream",
            steps=[
                *steps("abandoned", "Spoken though it never ends", final=False),
                {"wait_open": 0},  # the idle timeout closed it
                {"chunk": {"stream_id": "abandoned", "text": " late."}},
            ],
            finals=["abandoned"],
        )
        log = node.output()
    assert_stream(chunks_of(answer, "abandoned"))
    assert "'abandoned' got no chunk for 0.5 s" in log
    assert "text stream 'abandoned' has ended: its later chunks are dropped" in log


def test_a_new_request_interrupts_a_stream_and_the_streams_later_chunks_are_dropped(
    netns: LoopbackNamespace, node: NodeProcess
) -> None:
    answer = netns.client(
        "text_stream",
        steps=[
            *steps("talker", "This goes on and on. And", final=False),
            {"wait_chunks": ["talker", 2]},
            {"text": "Stop talking."},
            {"wait_open": 0},  # the interrupted stream's request has ended
            {"chunk": {"stream_id": "talker", "text": " more.", "final": True}},
        ],
        finals=[],
        # greedy text runs each piece to max_new_tokens: long enough to be interrupted, short enough to end
        params={"sampling.text_temperature": 0.0, "generation.max_new_tokens": 300, "queue_policy": "interrupt"},
        timeout=60,
    )
    talker = chunks_of(answer, "talker")
    assert_stream(talker, ended="interrupt")  # cut off: its final chunk says so
    others = [c for c in answer["chunks"] if c["request_id"] != "talker"]
    assert others and others[0]["received"] >= talker[-1]["received"]  # the new request spoke after it
    log = node.output()
    assert "interrupted by a newer request" in log
    assert "text stream 'talker' has ended: its later chunks are dropped" in log


def test_bad_chunks_are_refused_with_reasons_and_the_node_keeps_serving(
    own_netns: LoopbackNamespace, params_file: Path
) -> None:
    bounds = ("-p", "text_stream_max_open:=1", "-p", "text_stream_max_chars:=30")
    with node_with(own_netns, params_file, *bounds) as node:
        answer = own_netns.client(
            "text_stream",
            steps=[
                {"chunk": {"stream_id": "", "text": "no id"}},
                {"chunk": {"stream_id": "french", "text": "Held open,", "language": "fr"}},  # not a language here
                {"wait_refused": 2},  # checked on the intake's thread: refused, it no longer counts as open
                {"chunk": {"stream_id": "open", "text": "Held open, waiting"}},
                {"chunk": {"stream_id": "another", "text": "One too many."}},  # text_stream_max_open 1
                {"chunk": {"stream_id": "open", "text": " and then far too much text for the limit"}},
                {"wait_open": 0},  # closed at its limit
                *steps("good", "Still serving."),
            ],
            finals=["open", "good"],
        )
        log = node.output()
        refused = int(own_netns.client("diagnostics")["values"]["requests_refused"])
    assert_stream(chunks_of(answer, "good"))
    assert not chunks_of(answer, "another") and not chunks_of(answer, "french")
    assert f"stream_id must be 1 to {MAX_ID_CHARS} printable characters" in log
    assert "'french' refused: unknown language 'fr': this node accepts en, zh" in log  # the reason of any request
    assert "'another' refused: as many streams as text_stream_max_open (1) are open" in log
    assert "'open' would pass 30 characters (text_stream_max_chars): closed with the 18 it had" in log
    assert refused == 3


# Run before the relay of docs/ros.md: its rclpy.spin first waits until the node's subscription has matched the relay's
# publisher and says so. Seeing the publisher in the graph is not enough: chunks published before the match are
# lost (volatile QoS), which a loaded machine showed.
RELAY_MATCHED_PRELUDE = """
import rclpy as _rclpy

_spin = _rclpy.spin


def _spin_once_matched(node, executor=None):
    while node.out.get_subscription_count() == 0:
        _rclpy.spin_once(node, timeout_sec=0.1)
    print("matched", flush=True)
    _spin(node, executor)


_rclpy.spin = _spin_once_matched
"""


def test_the_relay_of_the_docs_speaks_an_llms_token_topic(
    netns: LoopbackNamespace, node: NodeProcess, tmp_path: Path
) -> None:
    """The relay of docs/ros.md as it is written there, run as its own process: two replies, token by token, each
    ended by an empty message, are two streams spoken to their final chunk; Ctrl-C then ends the relay cleanly."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "ros.md").read_text()
    code = page.split("**Relay from an LLM's token topic.**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "relay.py"
    script.write_text(RELAY_MATCHED_PRELUDE + code)
    relay = netns.popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert relay.stdout is not None
        watchdog = threading.Timer(60, relay.kill)
        watchdog.start()
        matched = relay.stdout.readline()
        watchdog.cancel()
        assert matched == "matched\n", "the relay's publisher never matched the node's ~/text_stream subscription"
        tokens = ["Hello", " there", ".", " I", " am", " here", ".", "", "Second", " reply", ".", ""]
        answer = netns.client(
            "text_stream", steps=[{"publish": ["/llm/tokens", token]} for token in tokens], final_count=2
        )
    finally:
        code = stop_process(relay)
    assert code == 0, f"the relay did not end cleanly on Ctrl-C (exit code {code}; None: it hung and was killed)"
    ids = list(dict.fromkeys(c["request_id"] for c in answer["chunks"]))
    assert len(ids) == 2
    for request_id in ids:
        assert_stream(chunks_of(answer, request_id))
