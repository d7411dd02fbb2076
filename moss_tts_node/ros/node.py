"""The ROS 2 node: text in, streamed speech out. A thin adapter over ``Synthesizer``.

    ros2 run moss_tts_node moss_tts_node --ros-args --params-file config/default.yaml

- ``~/text`` (std_msgs/String): speak it; the audio goes to ``~/audio``.
- ``~/text_stream`` (moss_tts_msgs/TextChunk): text that arrives in pieces (an LLM's tokens), one request per
  stream id, spoken sentence by sentence as it arrives (ros/text_stream.py).
- ``~/speak`` (moss_tts_msgs/action/Speak): the same with feedback, a result and cancel.
- ``~/synthesize`` (moss_tts_msgs/srv/Synthesize): the whole utterance back in the response.
- ``~/list_voices`` (moss_tts_msgs/srv/ListVoices): the voices a request may name (ros/voices.py).
- ``~/audio`` (moss_tts_msgs/AudioChunk): chunks as they are decoded (see ros/audio.py).
- ``/diagnostics``: readiness, queue depth, last real-time factor and time to first audio.

This module is the wiring: parameters are declared and checked in ros/parameters.py (the config
keys, with the same files and checks as the CLI, plus the few only a node has), messages converted in
ros/messages.py, a request's voice looked up by name in ros/voices.py, audio published by ros/audio.py.
The model and its voices load once, at startup; requests are checked one at a time on the intake's thread
(ros/intake.py), then wait in a RequestQueue (ros/queue.py) and run one at a time on it.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from moss_tts_msgs.action import Speak
from moss_tts_msgs.msg import TextChunk
from moss_tts_msgs.srv import Synthesize
from rcl_interfaces.msg import SetParametersResult
from rclpy.action import ActionServer, CancelResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.exceptions import ParameterException
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile
from std_msgs.msg import Header, String

from moss_tts_node.config import NODE_NAME
from moss_tts_node.errors import ConfigError, MossTTSError, RequestError
from moss_tts_node.ros.audio import AudioOut, encode
from moss_tts_node.ros.intake import Intake
from moss_tts_node.ros.launch_params import START_FAILURE
from moss_tts_node.ros.messages import (
    NodeStatus,
    diagnostic_status,
    speak_feedback,
    speech_request,
    text_request,
    timing_message,
)
from moss_tts_node.ros.parameters import ALL_OPTIONS, Settings, checked_settings, declarations
from moss_tts_node.ros.process import start_node, wait_for_stop
from moss_tts_node.ros.queue import Outcome, Rejected, RequestQueue, State, Ticket
from moss_tts_node.ros.text_stream import ChunkDropped, StreamRefused, TextStreams
from moss_tts_node.ros.voices import VoiceListing, requested_voice
from moss_tts_node.synthesis.feed import TextFeed
from moss_tts_node.synthesis.request import SpeechRequest
from moss_tts_node.synthesis.results import AudioStream
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.timing import TimingReport

DIAGNOSTICS_PERIOD_S = 1.0
TEXT_STREAM_CHECK_S = 0.1  # how often open text streams are checked for their idle timeout
# Chunks of text streams: one per LLM token, so a burst must not overflow the subscription's queue.
TEXT_STREAM_QOS = QoSProfile(depth=1000)
# One feedback per chunk for every goal on one topic: deep enough that a burst (the model can run
# many times faster than real time) does not push a waiting goal's queue position out.
FEEDBACK_QOS = QoSProfile(depth=100)
# After the last request is answered on shutdown: time for the executor and DDS to deliver it.
SHUTDOWN_FLUSH_S = 0.5
SHUTDOWN_REASON = "the node is shutting down"
CLIENT_CANCEL = "canceled by the client"
# rclpy marks a goal canceling just after _cancel_goal returns, and the request may end before that; its
# execute callback waits for the mark, up to this bound (rclpy sets it a few statements after the return).
CANCELING_MARK_WAIT_S = 1.0
CANCELING_MARK_POLL_S = 0.001
# Requests that may wait for their check (README "Security"): more than a burst of clients sends at once.
CHECKS_WAITING = 32


@dataclass
class Job:
    """One request as the node runs it: a validated stream, where its audio goes, its progress."""

    stream: AudioStream
    request_id: str
    encoding: str
    collected: list[np.ndarray] | None  # the synthesize service keeps the samples; None publishes them
    received: float = field(default_factory=time.monotonic)
    started: float | None = None
    chunks: int = 0
    audio_s: float = 0.0
    client_canceled: bool = False  # a Speak goal whose client's cancel was accepted

    @property
    def queue_wait_s(self) -> float | None:
        """Seconds from its arrival to the start of its generation; None while it has not started."""
        return None if self.started is None else self.started - self.received


@dataclass(frozen=True)
class Refused:
    """A Speak goal that never took a turn (a bad request, a full line): accepted, then aborted with ``reason``."""

    reason: str


class TtsNode(Node):
    """The node: declares and checks the parameters, loads the model, then serves.

    Constructing it loads the model, so it is ready when it returns (or raises with the reason).
    Callbacks only validate and queue; the queue's worker thread generates and publishes.
    """

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self.declare_parameters("", declarations())
        self._settings = self._checked(self._parameter_values())
        self._load()
        self._serve()

    def _load(self) -> None:
        """Load the model and prefill the configured voice, then start the line of requests."""
        started = time.monotonic()
        self._synth = Synthesizer(self._settings.config)
        self._synth.prepare_voice()  # the first request prefills only its text
        self._load_s = time.monotonic() - started
        self._last: TimingReport | None = None  # the last request's figures, for diagnostics
        self._counts = threading.Lock()  # callbacks on several executor threads refuse requests at once
        self._completed = 0  # requests spoken to their end
        self._refused = 0  # bad requests, and those a full queue turned away
        self._queue: RequestQueue[Job] = RequestQueue(
            self._generate, self._settings.queue_size, self._settings.queue_policy
        )
        self._intake = Intake(CHECKS_WAITING)  # every request's check, in the order they arrive
        # Speak goal id -> its check (then its place in line), or its refusal
        self._goals: dict[str, Future[Ticket[Job]] | Refused] = {}
        self._text_streams = TextStreams(self._start_text_stream)
        self._pending = 0  # service and action callbacks waiting for an outcome
        self._pending_changed = threading.Condition()

    def _serve(self) -> None:
        """Open the interfaces: parameter changes, audio out, the topic, the service, the action, diagnostics."""
        self.add_on_set_parameters_callback(self._check_new_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)
        self._audio = AudioOut(self, self._synth.spec.sampling_rate)
        self.create_subscription(String, "~/text", self._on_text, 10)
        self.create_subscription(TextChunk, "~/text_stream", self._on_text_chunk, TEXT_STREAM_QOS)
        self.create_timer(TEXT_STREAM_CHECK_S, self._expire_text_streams)
        # A service call waits for its request's turn, so calls must run side by side.
        self.create_service(Synthesize, "~/synthesize", self._on_synthesize, callback_group=ReentrantCallbackGroup())
        self._voice_listing = VoiceListing(self, self._synth.voices)
        # Goal requests one at a time: rclpy answers a goal before _accept_goal queues it, so a
        # client's next goal could otherwise overtake it. Execute callbacks run as tasks of their own.
        self._speak = ActionServer(
            self,
            Speak,
            "~/speak",
            execute_callback=self._execute_goal,
            handle_accepted_callback=self._accept_goal,
            cancel_callback=self._cancel_goal,
            callback_group=MutuallyExclusiveCallbackGroup(),
            feedback_pub_qos_profile=FEEDBACK_QOS,
        )
        self._diagnostics = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_timer(DIAGNOSTICS_PERIOD_S, self._publish_diagnostics)
        self.get_logger().info(
            f"ready: model loaded in {self._load_s:.1f} s from {self._settings.config.model.weights_dir}; "
            f"listening on {self.resolve_topic_name('~/text')}, {self.resolve_topic_name('~/text_stream')}, "
            f"{self.resolve_service_name('~/synthesize')} "
            f"and the {self.resolve_service_name('~/speak')} action"
        )

    @property
    def executor_threads(self) -> int:
        """Threads the executor needs: each waiting request and the one being spoken may hold one
        until it ends; three more keep the topic, timer, goals, cancels and parameters moving."""
        return self._settings.queue_size + 1 + 3

    def close(self) -> None:
        """Cancel the current request, answer the waiting ones as aborted, free the model."""
        self._queue.close(SHUTDOWN_REASON)
        self._intake.close(SHUTDOWN_REASON)  # the checks still queued refuse their requests with that reason
        with self._pending_changed:
            self._pending_changed.wait_for(lambda: self._pending == 0, timeout=5.0)
        time.sleep(SHUTDOWN_FLUSH_S)
        self._synth.close()

    # -- parameters ---------------------------------------------------------------------------

    def _parameter_values(self) -> dict[str, Any]:
        return {key: self.get_parameter(key).value for key in ALL_OPTIONS}

    def _checked(self, values: dict[str, Any]) -> Settings:
        return checked_settings(values, f"{self.get_name()} parameters", Path.cwd())

    def _check_new_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        try:
            self._checked(self._parameter_values() | {p.name: p.value for p in parameters})
        except ConfigError as err:
            return SetParametersResult(successful=False, reason=str(err))
        return SetParametersResult(successful=True)

    def _apply_parameters(self, parameters: list[Parameter]) -> None:
        self._settings = self._checked(self._parameter_values())  # for requests accepted from now on
        self._synth.config = self._settings.config  # what the synthesizer reads on its own (the default voice)
        self._queue.policy = self._settings.queue_policy
        if any(p.name.startswith("generation.") for p in parameters):
            # Off this callback's thread: preparing waits for the request being spoken to end.
            threading.Thread(target=self._prepare_voice, name="prepare-voice", daemon=True).start()

    def _prepare_voice(self) -> None:
        """Prefill the prompt prefix the new generation defaults give (nothing when it is already there)."""
        try:
            rows = self._synth.prepare_voice()
        except MossTTSError as err:
            self.get_logger().warning(f"could not prepare the voice for the new generation defaults: {err}")
            return
        if rows:
            self.get_logger().info(f"voice prepared: {rows} prompt rows prefilled for the new generation defaults")

    # -- requests -----------------------------------------------------------------------------

    def _submit(
        self,
        request: SpeechRequest,
        request_id: str,
        *,
        collect: bool,
        on_update: Callable[[Ticket[Job]], None] | None = None,
        feed: TextFeed | None = None,
    ) -> Ticket[Job]:
        """Validate a request and put it in line; raises RequestError or Rejected with the reason. Runs on the
        intake's thread: the check of a long text takes tens of milliseconds (README "Security").

        ``stream()`` checks the request now (text, reference, room in the context) without
        generating, so a bad request never takes a turn, nor interrupts the one being spoken.
        The request is checked and runs with the parameters in force now (one Settings object). A
        whole-utterance answer (``collect``) holds at most ``max_response_seconds`` of audio. With a ``feed``
        the text arrives there, in pieces (``stream_text``; the request's text is empty).
        """
        settings = self._settings
        settings.check_language(request.language)
        cancel = threading.Event()
        if feed is None:
            limit = settings.max_response_seconds if collect else None
            stream = self._synth.stream(
                request,
                cancel=cancel,
                streaming=not collect,  # a whole-utterance answer is the codec's offline decode
                config=settings.config,
                max_audio_s=limit,
            )
            if limit is not None and stream.estimated_seconds is not None and stream.estimated_seconds > limit:
                raise RequestError(
                    f"the speech is expected to take {stream.estimated_seconds:.1f} s, more than a ~/synthesize "
                    f"response holds (parameter 'max_response_seconds' ({limit:g} s)): split the text, or use "
                    "~/speak or ~/text, which stream it"
                )
        else:
            stream = self._synth.stream_text(feed, request, cancel=cancel, config=settings.config)
        job = Job(stream, request_id, settings.output_encoding, [] if collect else None)
        ticket = Ticket(job, cancel, on_update)
        self._queue.submit(ticket)
        return ticket

    def _speech_request(self, msg: Speak.Goal | Synthesize.Request | TextChunk) -> SpeechRequest:
        """A goal, a service request or a stream's first chunk as the synthesizer takes it, its voice looked up
        among the node's."""
        return speech_request(msg, requested_voice(self._synth.voices, msg.voice, msg.reference_audio))

    def _generate(self, ticket: Ticket[Job]) -> Outcome:
        """Run one request on the worker thread, publishing or keeping each chunk as it comes."""
        job = ticket.job
        job.started = time.monotonic()
        for chunk in job.stream:
            if job.collected is None:
                self._audio.publish(job.request_id, chunk, job.encoding)
            else:
                job.collected.append(chunk.samples)
            job.chunks += 1
            job.audio_s = chunk.start_s + chunk.samples.shape[0] / chunk.sample_rate
            ticket.updated()
        report = job.stream.report
        assert report is not None  # set when the stream ends
        self._last = report
        if job.stream.cancelled:
            outcome = Outcome(False, ticket.cancel_reason)
        else:
            with self._counts:
                self._completed += 1
            rtf = "-" if report.real_time_factor is None else f"{report.real_time_factor:.2f}"
            outcome = Outcome(
                True,
                f"{report.audio_seconds:.2f} s of audio in {report.wall_s:.2f} s (real-time factor {rtf}, "
                f"stop: {report.stop_reason})",
            )
        self.get_logger().info(f"request {job.request_id[:8]}: {outcome.message}")
        return outcome

    @contextmanager
    def _waiting_reply(self) -> Iterator[None]:
        """Count a callback that answers once its request ends, so shutdown can wait for it."""
        with self._pending_changed:
            self._pending += 1
        try:
            yield
        finally:
            with self._pending_changed:
                self._pending -= 1
                self._pending_changed.notify_all()

    def _refuse(self, interface: str, err: Exception) -> Refused:
        """Count and log a request that never took a turn; returns the refusal, for its answer.

        For ~/text this log line and the diagnostics counter are the only trace: a topic has no answer.
        """
        with self._counts:
            self._refused += 1
        self.get_logger().warning(f"{interface} request refused: {err}")
        return Refused(str(err))

    def _on_text(self, msg: String) -> None:
        try:
            self._intake.submit(partial(self._check_text, msg.data))
        except Rejected as err:
            self._refuse("~/text", err)

    def _check_text(self, text: str) -> None:
        """On the intake's thread: put a ~/text message in line, or log and count why not. No one waits for this
        check, so a failure of the check itself is logged here too (a service call or a goal gets it back)."""
        try:
            self._submit(text_request(text), uuid.uuid4().hex, collect=False)
        except (MossTTSError, Rejected) as err:
            self._refuse("~/text", err)
        except Exception as exc:
            self.get_logger().error(f"~/text request failed to be checked: {exc!r}")
            raise

    def _on_text_chunk(self, msg: TextChunk) -> None:
        try:
            self._text_streams.receive(msg, self._settings.text_stream_limits, time.monotonic())
        except StreamRefused as err:
            self._refuse("~/text_stream", err)
        except ChunkDropped as err:
            self.get_logger().warning(f"~/text_stream chunk dropped: {err}")

    def _start_text_stream(self, stream_id: str, first: TextChunk, feed: TextFeed) -> None:
        """Hand a new text stream to the intake, which checks its first chunk's request and puts it in line."""
        self._intake.submit(partial(self._check_text_stream, stream_id, first, feed))

    def _check_text_stream(self, stream_id: str, first: TextChunk, feed: TextFeed) -> None:
        """On the intake's thread: put a text stream in line; it leaves the open streams when its request ends,
        or at once, logged and counted, when it is refused (its later chunks are dropped)."""

        def on_update(ticket: Ticket[Job]) -> None:
            if ticket.state is State.DONE:
                self._text_streams.ended(stream_id)

        try:
            request = replace(self._speech_request(first), text="")  # the text arrives in the feed
            self._submit(request, stream_id, collect=False, on_update=on_update, feed=feed)
        except (MossTTSError, Rejected) as err:
            self._text_streams.ended(stream_id)
            self._refuse("~/text_stream", StreamRefused(f"text stream {stream_id!r} refused: {err}"))
        except Exception as exc:  # no one waits for this check: a failure of it is logged here (see _check_text)
            self._text_streams.ended(stream_id)
            self.get_logger().error(f"text stream {stream_id!r} failed to be checked: {exc!r}")
            raise

    def _expire_text_streams(self) -> None:
        for stream_id in self._text_streams.expire(self._settings.text_stream_limits, time.monotonic()):
            self.get_logger().warning(
                f"text stream {stream_id!r} got no chunk for {self._settings.text_stream_idle_timeout:g} s "
                "(text_stream_idle_timeout): speaking what it received, then ending it"
            )

    def _on_synthesize(self, request: Synthesize.Request, response: Synthesize.Response) -> Synthesize.Response:
        response.sample_rate = self._synth.spec.sampling_rate
        response.channels = 1
        response.encoding = self._settings.output_encoding
        response.timing = timing_message(None, None)
        with self._waiting_reply():
            try:
                check = self._intake.submit(
                    lambda: self._submit(self._speech_request(request), uuid.uuid4().hex, collect=True)
                )
                ticket = check.result()
            except (MossTTSError, Rejected) as err:
                response.message = self._refuse("~/synthesize", err).reason
                return response
            outcome = ticket.wait()
            job = ticket.job
            assert outcome is not None and job.collected is not None
            audio = np.concatenate(job.collected) if job.collected else np.empty(0, np.float32)
            response.success = outcome.success
            response.message = outcome.message
            response.encoding = job.encoding
            response.audio = encode(audio, job.encoding)
            response.duration = audio.shape[0] / response.sample_rate
            response.timing = timing_message(job.stream.report, job.queue_wait_s)
            return response

    def _accept_goal(self, goal_handle: ServerGoalHandle) -> None:
        """Hand an accepted Speak goal to the intake (before the next goal or a cancel is looked at), which
        checks it and puts it in line in the order the goals came."""
        goal_id = _goal_id(goal_handle)
        feedback = partial(_publish_feedback, goal_handle)
        try:
            self._goals[goal_id] = self._intake.submit(
                lambda: self._submit(
                    self._speech_request(goal_handle.request), goal_id, collect=False, on_update=feedback
                )
            )
        except Rejected as err:
            # Accepted all the same and aborted by _execute_goal: a rejected goal cannot say why.
            self._goals[goal_id] = self._refuse("~/speak", err)
        goal_handle.execute()

    def _cancel_goal(self, goal_handle: ServerGoalHandle) -> CancelResponse:
        """Accept every cancel: the goal leaves the queue now, or stops within one generation step; one still
        being checked does so as soon as it is in line."""
        check = self._goals.get(_goal_id(goal_handle))
        if isinstance(check, Future):
            check.add_done_callback(_cancel_by_client(self._queue))
        return CancelResponse.ACCEPT

    def _execute_goal(self, goal_handle: ServerGoalHandle) -> Speak.Result:
        goal_id = _goal_id(goal_handle)
        with self._waiting_reply():
            entry = self._goals[goal_id]
            if isinstance(entry, Future):
                try:
                    entry = entry.result()
                except (MossTTSError, Rejected) as err:
                    entry = self._refuse("~/speak", err)
            if isinstance(entry, Refused):
                result = Speak.Result(success=False, message=entry.reason, timing=timing_message(None, None))
                goal_handle.abort()
            else:
                outcome = entry.wait()
                assert outcome is not None
                job = entry.job
                result = Speak.Result(
                    success=outcome.success,
                    message=outcome.message,
                    duration=job.audio_s,
                    timing=timing_message(job.stream.report, job.queue_wait_s),
                )
                if outcome.success:
                    goal_handle.succeed()
                elif _marked_canceling(goal_handle, job.client_canceled):
                    goal_handle.canceled()
                else:
                    goal_handle.abort()
            del self._goals[goal_id]  # after the terminal state: no cancel can come for it now
            return result

    # -- diagnostics --------------------------------------------------------------------------

    def _publish_diagnostics(self) -> None:
        with self._counts:
            completed, refused = self._completed, self._refused
        status = NodeStatus(
            model_load_s=self._load_s,
            queue_depth=self._queue.depth,
            queue_size=self._settings.queue_size,
            busy=self._queue.busy,
            queue_policy=self._settings.queue_policy,
            completed=completed,
            refused=refused,
            last=self._last,
            text_streams_open=self._text_streams.open_count,
        )
        self._diagnostics.publish(
            DiagnosticArray(
                header=Header(stamp=self.get_clock().now().to_msg()),
                status=[diagnostic_status(self.get_name(), status)],
            )
        )


def _goal_id(goal_handle: ServerGoalHandle) -> str:
    """A goal's UUID in hex: the request_id of its AudioChunk messages."""
    return bytes(goal_handle.goal_id.uuid).hex()


def _cancel_by_client(queue: RequestQueue[Job]) -> Callable[[Future[Ticket[Job]]], None]:
    """What a client's cancel does to its goal once the goal's check is done: nothing to a refused one."""

    def cancel(check: Future[Ticket[Job]]) -> None:
        if check.exception() is None:
            ticket = check.result()
            ticket.job.client_canceled = True  # before the request can end by it
            queue.cancel(ticket, CLIENT_CANCEL)

    return cancel


def _marked_canceling(goal_handle: ServerGoalHandle, client_canceled: bool) -> bool:
    """Whether a goal that did not succeed ends as canceled: rclpy has marked it canceling. When its client's
    cancel was accepted, the mark follows at once (it is the only state a goal may be canceled from), so wait
    for it: without it the goal would end aborted though the client asked, and was told yes."""
    deadline = time.monotonic() + CANCELING_MARK_WAIT_S
    while client_canceled and not goal_handle.is_cancel_requested and time.monotonic() < deadline:
        time.sleep(CANCELING_MARK_POLL_S)
    return goal_handle.is_cancel_requested


def _publish_feedback(goal_handle: ServerGoalHandle, ticket: Ticket[Job]) -> None:
    goal_handle.publish_feedback(speak_feedback(ticket.state, ticket.ahead, ticket.job.audio_s, ticket.job.chunks))


def main(args: Sequence[str] | None = None) -> int:
    """Run the node until SIGINT or SIGTERM; exit 0 after a clean shutdown, 2 on bad parameters,
    1 if a callback crashed.
    """
    started = start_node(args, TtsNode, NODE_NAME, START_FAILURE, (MossTTSError, ParameterException))
    if isinstance(started, int):
        return started
    node, stop = started
    executor = MultiThreadedExecutor(num_threads=node.executor_threads)
    executor.add_node(node)
    crashed = threading.Event()

    def spin() -> None:
        try:
            executor.spin()
        except BaseException:
            crashed.set()  # a callback raised: stop serving rather than hang; the traceback is printed
            raise
        finally:
            stop.set()

    spinner = threading.Thread(target=spin, name="executor")
    spinner.start()
    wait_for_stop(stop)
    node.get_logger().info(f"{SHUTDOWN_REASON}: stopping the current request, aborting the queued ones")
    node.close()
    executor.shutdown()
    spinner.join()  # a thread still inside rcl_wait when the context goes aborts the process
    node.destroy_node()
    rclpy.try_shutdown()
    return 1 if crashed.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
