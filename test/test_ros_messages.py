"""ros/messages.py without a middleware: requests in, Timing, Speak feedback and diagnostics out."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from ros_helpers import require_ros

from moss_tts_node.serving.queue import State
from moss_tts_node.synthesis.request import SpeechRequest
from moss_tts_node.synthesis.voices import LibraryVoice
from moss_tts_node.timing import StopReason, TimingReport

if TYPE_CHECKING:
    from moss_tts_node.synthesizer import Synthesizer

require_ros()

from builtin_interfaces.msg import Time as TimeMsg  # noqa: E402
from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from moss_tts_msgs.action import Speak  # noqa: E402
from moss_tts_msgs.msg import TextChunk, Timing  # noqa: E402
from moss_tts_msgs.srv import Synthesize  # noqa: E402

from moss_tts_node.ros.messages import (  # noqa: E402
    NodeStatus,
    RequestCounts,
    diagnostic_status,
    diagnostics,
    speak_feedback,
    speech_request,
    timing_message,
)

REQUEST_FIELDS = [f.name for f in dataclasses.fields(SpeechRequest)]


def fields_of(request: SpeechRequest) -> dict[str, object]:
    return {name: getattr(request, name) for name in REQUEST_FIELDS}


@pytest.fixture(scope="module")
def report(synth: Synthesizer) -> TimingReport:
    """The report of a real synthesis on the demo model: every figure measured."""
    return synth.synthesize("Hello there.", seed=3).report


REQUEST_MESSAGES = [Speak.Goal, Synthesize.Request, TextChunk]
# What a request message carries besides a SpeechRequest's fields of the same name: the voices by name (ros/voices.py
# looks them up), and a stream's own fields.
BY_NAME = {"voice", "reference_audio", "voices", "prefix_voice"}
STREAM = {"stream_id", "final"}


@pytest.mark.parametrize("message", REQUEST_MESSAGES)
def test_every_field_of_a_request_message_is_a_speech_requests_or_a_voice_by_name(message: type) -> None:
    """A field added to the messages without a way into the SpeechRequest fails here."""
    fields = set(message.get_fields_and_field_types()) - STREAM
    assert fields - BY_NAME <= set(REQUEST_FIELDS) - {"voice", "prefix"}, fields - BY_NAME - set(REQUEST_FIELDS)
    assert fields == set(Speak.Goal.get_fields_and_field_types())  # the three messages carry the same request


@pytest.mark.parametrize("message", REQUEST_MESSAGES)
def test_empty_fields_of_a_request_take_the_nodes_defaults(message: type) -> None:
    request = speech_request(message(text="Hello."), None, None)  # every other field as the message's default
    assert fields_of(request) == fields_of(SpeechRequest("Hello."))


@pytest.mark.parametrize("message", REQUEST_MESSAGES)
def test_the_fields_a_request_gives_reach_the_speech_request(message: type) -> None:
    codes = np.zeros((3, 32), dtype=np.int64)  # what ros/voices.py found for its voice
    request = speech_request(
        message(text=" Hi. ", language="zh", instruction="calm", voice="nurse", seed=0), codes, None
    )
    assert request.voice is codes
    assert fields_of(replace(request, voice=None)) == fields_of(
        SpeechRequest(" Hi. ", language="zh", instruction="calm", seed=0)
    )
    assert speech_request(message(text="Hi.", seed=2**63 - 1), None, None).seed == 2**63 - 1
    assert speech_request(message(text="Hi.", seed=-7), None, None).seed == -7  # kept, for the synthesizer to refuse


@pytest.mark.parametrize("message", REQUEST_MESSAGES)
def test_every_field_a_request_gives_reaches_the_speech_request(message: type) -> None:
    """Each field but the voices by name, given a value of its own, is that field of the SpeechRequest; the voices
    are what ros/voices.py looked up."""
    types = message.get_fields_and_field_types()
    given = {
        name: 40 if kind.startswith(("int", "uint")) else f"<{name}>"
        for name, kind in types.items()
        if name not in BY_NAME | STREAM
    }
    assert {"text", "seed", "tokens", "scene", "sound_event", "ambient_sound", "prefix_text"} <= set(given)
    alice, butler = (
        LibraryVoice(name, np.zeros((3, 32), np.int64), Path(f"{name}.npy"), Path(f"/v/{name}.npy"), False)
        for name in ("alice", "butler")
    )
    request = speech_request(message(voices=["alice", ""], prefix_voice="butler", **given), [alice, None], butler)
    assert {name: getattr(request, name) for name in given} == given
    assert (request.voice, request.prefix) == ([alice, None], butler)
    too_long = speech_request(message(text="Hi.", tokens=2_000_000), None, None)
    assert too_long.tokens == 2_000_000  # kept, for the synthesizer to refuse


def test_timing_is_nan_where_nothing_was_measured() -> None:
    never_ran = timing_message(None, None)
    floats = [name for name, kind in Timing.get_fields_and_field_types().items() if kind == "double"]
    assert floats and all(math.isnan(getattr(never_ran, name)) for name in floats)
    assert (never_ran.steps, never_ran.frames, never_ran.prompt_rows, never_ran.seed) == (0, 0, 0, -1)
    assert (never_ran.stop_reason, never_ran.codec_decode) == ("", "")
    waited = timing_message(None, 0.25)  # cancelled while it waited its turn
    assert waited.queue_wait == 0.25
    assert all(math.isnan(getattr(waited, name)) for name in floats if name != "queue_wait")


def test_every_timing_field_comes_from_the_report(report: TimingReport) -> None:
    message = timing_message(report, 0.5)
    expected = {
        "queue_wait": 0.5,
        "time_to_first_audio": report.time_to_first_audio_s,
        "wall_time": report.wall_s,
        "real_time_factor": report.real_time_factor,
        "prefill_time": report.prefill_ms / 1000.0,
        "steps_per_second": report.steps_per_second,
        "steps": report.steps,
        "frames": report.frames,
        "prompt_rows": report.prompt_rows,
        "seed": 3,
        "stop_reason": report.stop_reason.value,
        "codec_decode": "offline",
        "codec_rtf": report.codec_rtf,
    }
    assert set(expected) == set(Timing.get_fields_and_field_types())  # a field added to Timing.msg is mapped here
    assert {name: getattr(message, name) for name in expected} == expected
    assert type(message.stop_reason) is str
    assert report.steps > 0 and report.frames > 0 and report.prompt_rows > 0
    assert all(value is not None and value > 0 for value in (report.time_to_first_audio_s, report.codec_rtf))


def test_a_figure_the_report_could_not_give_is_nan(report: TimingReport) -> None:
    no_audio = dataclasses.replace(
        report, time_to_first_audio_s=None, real_time_factor=None, codec_rtf=None, stop_reason=StopReason.CANCELLED
    )
    message = timing_message(no_audio, 0.0)
    assert math.isnan(message.time_to_first_audio) and math.isnan(message.real_time_factor)
    assert math.isnan(message.codec_rtf)
    assert (message.queue_wait, message.wall_time, message.stop_reason) == (0.0, report.wall_s, "cancelled")


def test_speak_feedback_carries_the_tickets_state_and_progress() -> None:
    constants = {
        State.QUEUED: Speak.Feedback.STATE_QUEUED,
        State.GENERATING: Speak.Feedback.STATE_GENERATING,
        State.DONE: Speak.Feedback.STATE_DONE,
    }
    for state, constant in constants.items():
        feedback = speak_feedback(state, 2, 1.28, 5)
        assert (feedback.state, feedback.queue_position, feedback.audio_produced, feedback.chunks_published) == (
            constant,
            2,
            1.28,
            5,
        )


COUNTS = [f.name for f in dataclasses.fields(RequestCounts)]
LAYOUT = "CPU 12.9 MiB, CPU_REPACK 19.1 MiB (llama.cpp's CPU_REPACK layout where it takes a matrix, ...)"


def status(**changes: object) -> NodeStatus:
    """An active, idle node's status with ``changes``, of its own fields and of its requests' counts."""
    counts = RequestCounts(queue_depth=0, busy=False, completed=0, refused=0, last=None)
    idle = NodeStatus(
        lifecycle_state="active",
        model_loaded=True,
        model="MOSS-VoiceGenerator",
        model_load_s=1.23456,
        weight_layout=LAYOUT,
        configure_failure=None,
        queue_size=2,
        queue_policy="queue",
        requests=replace(counts, **{key: value for key, value in changes.items() if key in COUNTS}),
    )
    return replace(idle, **{key: value for key, value in changes.items() if key not in COUNTS})


NOT_LOADED = {"model_loaded": False, "model": "", "model_load_s": None, "weight_layout": ""}


@pytest.mark.parametrize(
    ("changes", "level", "message"),
    [
        ({}, DiagnosticStatus.OK, "ready"),
        ({"busy": True, "queue_depth": 1}, DiagnosticStatus.OK, "speaking"),
        ({"busy": True, "queue_depth": 2}, DiagnosticStatus.WARN, "queue full"),
        ({"busy": True, "queue_size": 0}, DiagnosticStatus.WARN, "queue full"),  # speaks when idle, refuses now
        ({"busy": False, "queue_size": 0}, DiagnosticStatus.OK, "ready"),
        ({"lifecycle_state": "inactive"}, DiagnosticStatus.OK, "inactive"),
        ({"lifecycle_state": "deactivating", "busy": True, "queue_size": 0}, DiagnosticStatus.OK, "deactivating"),
        ({"lifecycle_state": "unconfigured", **NOT_LOADED}, DiagnosticStatus.OK, "unconfigured"),
        (
            {"lifecycle_state": "unconfigured", **NOT_LOADED, "configure_failure": "'model.weights_dir' not found"},
            DiagnosticStatus.ERROR,
            "configure failed: 'model.weights_dir' not found",
        ),
    ],
)
def test_diagnostics_say_the_state_and_whether_the_node_is_ready_speaking_or_full(
    changes: dict[str, object], level: bytes, message: str
) -> None:
    diagnosed = diagnostic_status("moss_tts_node", status(**changes))
    assert (diagnosed.name, diagnosed.hardware_id) == ("moss_tts_node: synthesizer", "moss_tts_node")
    assert (diagnosed.level, diagnosed.message) == (level, message)
    values = {kv.key: kv.value for kv in diagnosed.values}
    assert values["lifecycle_state"] == changes.get("lifecycle_state", "active")


def test_diagnostics_values_before_and_after_the_first_request(report: TimingReport) -> None:
    before = {kv.key: kv.value for kv in diagnostic_status("tts", status()).values}
    assert before == {
        "lifecycle_state": "active",
        "model_loaded": "true",
        "model": "MOSS-VoiceGenerator",
        "model_load_s": "1.235",
        "weight_layout": LAYOUT,
        "queue_depth": "0",
        "queue_size": "2",
        "queue_policy": "queue",
        "requests_completed": "0",
        "requests_refused": "0",
        "text_streams_open": "0",
        "audio_listeners": "0",
        "last_real_time_factor": "",
        "last_time_to_first_audio_s": "",
        "last_stop_reason": "",
    }
    after = status(queue_depth=1, busy=True, queue_policy="interrupt", completed=4, refused=3, last=report)
    values = {kv.key: kv.value for kv in diagnostic_status("tts", after).values}
    assert values == before | {
        "queue_depth": "1",
        "queue_policy": "interrupt",
        "requests_completed": "4",
        "requests_refused": "3",
        "last_real_time_factor": f"{report.real_time_factor:.3f}",
        "last_time_to_first_audio_s": f"{report.time_to_first_audio_s:.3f}",
        "last_stop_reason": report.stop_reason.value,
    }


def test_diagnostics_of_a_node_without_a_model() -> None:
    values = {
        kv.key: kv.value for kv in diagnostic_status("tts", status(lifecycle_state="unconfigured", **NOT_LOADED)).values
    }
    assert (values["lifecycle_state"], values["model_loaded"], values["model"], values["model_load_s"]) == (
        "unconfigured",
        "false",
        "",
        "",
    )


def test_the_diagnostics_message_holds_the_status_stamped() -> None:
    stamp = TimeMsg(sec=12, nanosec=34)
    message = diagnostics("tts", status(busy=True), stamp)
    assert message.header.stamp == stamp
    assert [(diagnosed.name, diagnosed.message) for diagnosed in message.status] == [("tts: synthesizer", "speaking")]
