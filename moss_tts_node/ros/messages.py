"""The node's messages to and from the synthesizer's types: requests in; Timing, feedback and diagnostics out.

Pure (no node), so every conversion is tested without a middleware (``test/test_ros_messages.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from builtin_interfaces.msg import Time as TimeMsg
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from moss_tts_msgs.action import Speak
from moss_tts_msgs.msg import TextChunk, Timing
from moss_tts_msgs.srv import Synthesize
from std_msgs.msg import Header

from moss_tts_node.config import NODE_NAME
from moss_tts_node.serving.queue import State
from moss_tts_node.synthesis.request import REQUEST_FIELDS, SpeechRequest, Voices
from moss_tts_node.synthesis.voices import LibraryVoice
from moss_tts_node.timing import TimingReport


def speech_request(
    msg: Speak.Goal | Synthesize.Request | TextChunk, voice: Voices, prefix: LibraryVoice | None
) -> SpeechRequest:
    """A Speak goal, a Synthesize request or a TextChunk (the first of a stream) as a SpeechRequest, with the voices
    it names (looked up by ros/voices.py: a message never gives the synthesizer a path): its references ``voice``
    and the voice it continues, ``prefix``.

    The fields are those the declaration of ``SpeechRequest`` says the messages carry (``RequestField.ros``); an
    empty one (its ``unset`` value) is None: the node's defaults (``generation.language``, ...) or none (upstream
    prints the prompt's other fields as None), a seed of -1 ``sampling.seed``, ``tokens`` 0 no duration. The
    text, the seed and ``tokens`` are kept as they came, for the synthesizer to check (a seed below -1 or too many
    tokens is refused there).
    """
    given = {field.name: field.from_ros(msg) for field in REQUEST_FIELDS if field.ros and not field.ros_by_name}
    return SpeechRequest(**given, voice=voice, prefix=prefix)


def timing_message(report: TimingReport | None, queue_wait_s: float | None) -> Timing:
    """The Timing message of a request: its report (None: it never ran, or never ended) and how long it
    waited in line (None: it never left the line); NaN where nothing was measured."""
    nan = math.nan
    message = Timing(
        queue_wait=_or_nan(queue_wait_s),
        time_to_first_audio=nan,
        wall_time=nan,
        real_time_factor=nan,
        prefill_time=nan,
        steps_per_second=nan,
        seed=-1,  # no seed, as in the request messages
        codec_rtf=nan,
    )
    if report is not None:
        message.time_to_first_audio = _or_nan(report.time_to_first_audio_s)
        message.wall_time = report.wall_s
        message.real_time_factor = _or_nan(report.real_time_factor)
        message.prefill_time = report.prefill_ms / 1000.0
        message.steps_per_second = report.steps_per_second
        message.steps = report.steps
        message.frames = report.frames
        message.prompt_rows = report.prompt_rows
        message.seed = report.seed
        message.stop_reason = str(report.stop_reason)
        message.codec_decode = report.codec_decode
        message.codec_rtf = _or_nan(report.codec_rtf)
    return message


def speak_feedback(state: State, queue_position: int, audio_s: float, chunks: int) -> Speak.Feedback:
    """A Speak goal's progress: where it is, requests ahead of it, seconds and chunks of audio published."""
    return Speak.Feedback(
        state=int(state), audio_produced=audio_s, chunks_published=chunks, queue_position=queue_position
    )


@dataclass(frozen=True)
class RequestCounts:
    """What the node's requests report on ``/diagnostics``, read at one moment (ros/requests.py)."""

    queue_depth: int  # requests waiting, the one being spoken not included
    busy: bool  # a request is being spoken
    completed: int  # requests spoken to their end
    refused: int  # bad requests, and those the line or the node's state turned away
    last: TimingReport | None  # the last request's figures, None before the first one ends


@dataclass(frozen=True)
class NodeStatus:
    """What the node reports on ``/diagnostics``, read at one moment."""

    lifecycle_state: str  # the label ``ros2 lifecycle get`` prints
    model_loaded: bool
    model: str  # which model of the family the loaded weights are (``ModelIdentity.name``); "" when none is loaded
    model_load_s: float | None  # how long the loaded model took to configure; None when none is loaded
    weight_layout: str  # where llama.cpp keeps the loaded model's weights, and why; "" when none is loaded
    configure_failure: str | None  # why the last configure failed, until one succeeds
    queue_size: int
    queue_policy: str
    requests: RequestCounts
    text_streams_open: int = 0  # ~/text_stream streams receiving text
    audio_listeners: int = 0  # subscriptions matched to ~/audio: whether anything hears the node


def diagnostics(node_name: str, status: NodeStatus, stamp: TimeMsg) -> DiagnosticArray:
    """The node's ``/diagnostics`` message, stamped; ``node_name`` is its full name without the first "/", so
    that the statuses of nodes in two namespaces have two names."""
    return DiagnosticArray(header=Header(stamp=stamp), status=[diagnostic_status(node_name, status)])


def diagnostic_status(node_name: str, status: NodeStatus) -> DiagnosticStatus:
    """The node's DiagnosticStatus, with the figures as key-values.

    Active, it says ready, speaking or (WARN) queue full; in another state, the state's label; after a failed
    configure (ERROR), why it failed, until a configure succeeds.
    """
    requests = status.requests
    active = status.lifecycle_state == "active"
    full = active and requests.busy and requests.queue_depth >= status.queue_size
    last = requests.last
    values = {
        "lifecycle_state": status.lifecycle_state,
        "model_loaded": str(status.model_loaded).lower(),
        "model": status.model,
        "model_load_s": _figure(status.model_load_s),
        "weight_layout": status.weight_layout,
        "queue_depth": requests.queue_depth,
        "queue_size": status.queue_size,
        "queue_policy": status.queue_policy,
        "requests_completed": requests.completed,
        "requests_refused": requests.refused,
        "text_streams_open": status.text_streams_open,
        "audio_listeners": status.audio_listeners,
        "last_real_time_factor": _figure(last.real_time_factor if last else None),
        "last_time_to_first_audio_s": _figure(last.time_to_first_audio_s if last else None),
        "last_stop_reason": str(last.stop_reason) if last else "",
    }
    if status.configure_failure is not None:
        level, message = DiagnosticStatus.ERROR, f"configure failed: {status.configure_failure}"
    elif full:
        level, message = DiagnosticStatus.WARN, "queue full"
    else:
        level = DiagnosticStatus.OK
        message = ("speaking" if requests.busy else "ready") if active else status.lifecycle_state
    return DiagnosticStatus(
        name=f"{node_name}: synthesizer",
        hardware_id=NODE_NAME,
        level=level,
        message=message,
        values=[KeyValue(key=key, value=str(value)) for key, value in values.items()],
    )


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _figure(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"
