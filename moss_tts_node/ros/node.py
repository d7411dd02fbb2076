"""The ROS 2 node: text in, streamed speech out. A thin adapter over ``Synthesizer``, managed by the lifecycle.

    ros2 run moss_tts_node moss_tts_node --ros-args --params-file config/default.yaml

- ``~/text`` (std_msgs/String): speak it; the audio goes to ``~/audio``.
- ``~/text_stream`` (moss_tts_msgs/TextChunk): text that arrives in pieces (an LLM's tokens), one request per
  stream id, spoken sentence by sentence as it arrives (ros/text_stream.py).
- ``~/speak`` (moss_tts_msgs/action/Speak): the same with feedback, a result and cancel.
- ``~/synthesize`` (moss_tts_msgs/srv/Synthesize): the whole utterance back in the response.
- ``~/list_voices`` (moss_tts_msgs/srv/ListVoices): the voices a request may name (ros/voices.py).
- ``~/audio`` (moss_tts_msgs/AudioChunk): chunks as they are decoded (see ros/audio.py).
- ``/diagnostics``: lifecycle state, readiness, queue depth, last real-time factor and time to first audio.

A lifecycle node (docs/ros.md, "Lifecycle"): configure loads the model and encodes its voices, activate serves,
deactivate ends the requests in line, cleanup frees the model; ``autostart`` (default true) configures and
activates at start-up. Every interface exists in every state, and what it refuses, and why, is
ros/lifecycle.py's. This module is the wiring: parameters are declared and checked in ros/parameters.py (the
config keys, with the same files and checks as the CLI, plus the few only a node has), messages converted in
ros/messages.py, a request's voice looked up by name in ros/voices.py, audio published by ros/audio.py.
Requests are checked one at a time on the intake's thread (ros/intake.py), then wait in a RequestQueue
(ros/queue.py), one per activation, and run one at a time on it.
"""

from __future__ import annotations

# First: one malloc heap for the process, set before rclpy (imported below) starts its threads (see heap.py).
import moss_tts_node.ros.heap  # noqa: F401

# isort: split
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial, wraps
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from moss_tts_msgs.action import Speak
from moss_tts_msgs.msg import TextChunk
from moss_tts_msgs.srv import ListVoices, Synthesize
from rcl_interfaces.msg import SetParametersResult
from rclpy.action import ActionServer, CancelResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.exceptions import ParameterException
from rclpy.executors import MultiThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile
from std_msgs.msg import Header, String

from moss_tts_node.config import NODE_NAME
from moss_tts_node.errors import ConfigError, MossTTSError, RequestError
from moss_tts_node.ros.audio import AudioOut, encode
from moss_tts_node.ros.heap import release_freed_memory, resident_mib
from moss_tts_node.ros.intake import Intake
from moss_tts_node.ros.launch_params import START_FAILURE
from moss_tts_node.ros.lifecycle import (
    DEACTIVATING,
    SHUTTING_DOWN,
    ConfigureFailed,
    Loan,
    Phase,
    parameter_refusal,
    request_refusal,
    voices_refusal,
)
from moss_tts_node.ros.messages import (
    NodeStatus,
    diagnostic_status,
    speak_feedback,
    speech_request,
    text_request,
    timing_message,
)
from moss_tts_node.ros.parameters import (
    ALL_OPTIONS,
    STARTUP_KEYS,
    Settings,
    checked_settings,
    checked_startup,
    checked_values,
    declarations,
)
from moss_tts_node.ros.process import start_node, wait_for_stop
from moss_tts_node.ros.queue import Outcome, Rejected, RequestQueue, State, Ticket
from moss_tts_node.ros.text_stream import ChunkDropped, StreamRefused, TextStreams
from moss_tts_node.ros.voices import requested_voice, voice_infos
from moss_tts_node.synthesis.feed import TextFeed
from moss_tts_node.synthesis.request import SpeechRequest, check_request
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
# After the shutdown transition: time for the executor and DDS to deliver the last answers (and the
# transition's own response, when it was asked for over ROS).
SHUTDOWN_FLUSH_S = 0.5
# How long a transition that ends the requests in line waits for the last of them to be answered.
ANSWERS_WAIT_S = 5.0
CLIENT_CANCEL = "canceled by the client"
# rclpy marks a goal canceling just after _cancel_goal returns, and the request may end before that; its
# execute callback waits for the mark, up to this bound (rclpy sets it a few statements after the return).
CANCELING_MARK_WAIT_S = 1.0
CANCELING_MARK_POLL_S = 0.001
# Requests that may wait for their check (docs/security.md, "Request checks"): more than a burst of clients sends
# at once.
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


def _transition(callback: Callable[[TtsNode, LifecycleState], TransitionCallbackReturn]) -> Any:
    """A transition callback that logs what it raised: rclpy turns an exception into ERROR without a word
    (and then calls ``on_error``)."""

    @wraps(callback)
    def logged(node: TtsNode, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            return callback(node, state)
        except Exception:
            node.get_logger().error(f"{callback.__name__} failed:\n{traceback.format_exc()}")
            raise

    return logged


class TtsNode(LifecycleNode):
    """The node: declares the parameters and opens every interface; the lifecycle loads the model and serves.

    The transitions run in the default callback group, as do the parameter services and ~/text, so no
    transition ever runs beside a parameter change; the service, the action and diagnostics have groups of
    their own and are answered in every state. Callbacks only validate and queue; the queue's worker thread
    generates and publishes.
    """

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self.declare_parameters("", declarations())
        self._startup = checked_startup(self._parameter_values(STARTUP_KEYS), self._source)
        self._phase = Phase.UNCONFIGURED
        self._full_name = self.get_fully_qualified_name()  # as ros2 lifecycle set takes it, in refusals
        self._model: Loan[Synthesizer] = Loan()  # lent to callbacks that check a request with it
        self._settings: Settings | None = None  # the parameters in force, checked, from the first configure on
        self._sample_rate = 0  # the loaded model's
        self._load_s: float | None = None  # how long the last configure took
        self._failure: str | None = None  # why the last configure failed, until one succeeds
        self._autostarting = False
        self._queue: RequestQueue[Job] | None = None  # the line of requests, one per activation
        self._last: TimingReport | None = None  # the last request's figures, for diagnostics
        self._counts = threading.Lock()  # callbacks on several executor threads refuse requests at once
        self._completed = 0  # requests spoken to their end
        self._refused = 0  # bad requests, those a full queue turned away, and those the node's state refused
        self._intake = Intake(CHECKS_WAITING)  # every request's check, in the order they arrive
        # Speak goal id -> its check (then its place in line), or its refusal
        self._goals: dict[str, Future[Ticket[Job]] | Refused] = {}
        self._text_streams = TextStreams(self._start_text_stream)
        self._pending = 0  # service and action callbacks waiting for an outcome
        self._pending_changed = threading.Condition()
        self.finalized = threading.Event()  # set once the shutdown transition has run
        self._serve()

    def _serve(self) -> None:
        """Open the interfaces: parameter changes, audio out, the topic, the service, the action, diagnostics."""
        self.add_on_set_parameters_callback(self._check_new_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)
        self._audio = AudioOut(self)
        self.create_subscription(String, "~/text", self._on_text, 10)
        self.create_subscription(TextChunk, "~/text_stream", self._on_text_chunk, TEXT_STREAM_QOS)
        self.create_timer(TEXT_STREAM_CHECK_S, self._expire_text_streams)
        # A service call waits for its request's turn, so calls must run side by side.
        self.create_service(Synthesize, "~/synthesize", self._on_synthesize, callback_group=ReentrantCallbackGroup())
        self.create_service(ListVoices, "~/list_voices", self._on_list_voices)
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
        # Its own group: diagnostics go on while a transition (a model loading) holds the default one.
        self.create_timer(
            DIAGNOSTICS_PERIOD_S, self._publish_diagnostics, callback_group=MutuallyExclusiveCallbackGroup()
        )
        # Shutdown on a signal runs in the default group too, in turn with the transitions asked for over ROS.
        self._shutdown_asked = self.create_guard_condition(self._shut_down_in_turn)

    @property
    def autostarts(self) -> bool:
        return self._startup.autostart

    @property
    def executor_threads(self) -> int:
        """Threads the executor needs: each waiting request and the one being spoken may hold one until it
        ends; four more keep the default group (topic, parameters, transitions), diagnostics, goals and
        cancels, and the answers to refused calls moving."""
        return self._startup.queue_size + 1 + 4

    def autostart(self) -> None:
        """Configure and activate (``autostart``), before the executor spins; raises ConfigureFailed with the
        reason when configuring fails."""
        self._autostarting = True  # the caller reports a failure: on_configure does not log it as well
        try:
            if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                raise ConfigureFailed(self._failure or "configure failed")
        finally:
            self._autostarting = False
        self.trigger_activate()

    def shut_down(self) -> None:
        """The shutdown transition from whatever state the node is in, once any transition under way has ended;
        returns once it has run (at once if it already has)."""
        self._shutdown_asked.trigger()
        self.finalized.wait()

    def _shut_down_in_turn(self) -> None:
        if not self.finalized.is_set():
            self.trigger_shutdown()

    # -- lifecycle ----------------------------------------------------------------------------

    @_transition
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Check the parameters, load the model, prepare the configured voice; on any failure, log the reason
        and stay unconfigured (the process stays up for another try)."""
        self._phase = Phase.CONFIGURING
        started = time.monotonic()
        try:
            settings = self._checked(self._parameter_values())
            synth = Synthesizer(settings.config)
            try:
                synth.prepare_voice()  # the first request prefills only its text
            except BaseException:
                synth.close()
                raise
        except Exception as err:  # whatever fails, the node stays up and unconfigured, saying why
            expected = isinstance(err, MossTTSError)
            self._failure = str(err) if expected else f"{type(err).__name__}: {err}"
            self._phase = Phase.UNCONFIGURED
            release_freed_memory()  # what a half-made model held
            if not expected:
                self.get_logger().error(traceback.format_exc())
            if not self._autostarting:
                self.get_logger().error(
                    f"configure failed: {self._failure}; the node stays unconfigured: fix the parameters "
                    "(ros2 param set) and configure again"
                )
            return TransitionCallbackReturn.FAILURE
        self._failure = None
        self._settings = settings
        self._sample_rate = synth.spec.sampling_rate
        self._load_s = time.monotonic() - started
        self._model.give(synth)
        self._audio.announce(self._sample_rate)
        self._phase = Phase.INACTIVE
        self.get_logger().info(
            f"configured: model loaded in {self._load_s:.1f} s from {settings.config.model.weights_dir}"
        )
        return TransitionCallbackReturn.SUCCESS

    @_transition
    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Open a new line of requests and serve."""
        assert self._settings is not None and self._load_s is not None  # set by the configure before
        self._queue = RequestQueue(self._generate, self._startup.queue_size, self._settings.queue_policy)
        self._phase = Phase.ACTIVE
        self.get_logger().info(
            f"ready: model loaded in {self._load_s:.1f} s from {self._settings.config.model.weights_dir}; "
            f"listening on {self.resolve_topic_name('~/text')}, {self.resolve_topic_name('~/text_stream')}, "
            f"{self.resolve_service_name('~/synthesize')} "
            f"and the {self.resolve_service_name('~/speak')} action"
        )
        return TransitionCallbackReturn.SUCCESS

    @_transition
    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """End the request being spoken and those waiting; the model stays loaded."""
        self._phase = Phase.DEACTIVATING
        self._end_requests(DEACTIVATING)
        self._phase = Phase.INACTIVE
        self.get_logger().info("inactive: the requests in line ended; the model stays loaded (activate to serve)")
        return TransitionCallbackReturn.SUCCESS

    @_transition
    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Free the model and every stage."""
        self._phase = Phase.CLEANING_UP
        self._free_model()
        self._phase = Phase.UNCONFIGURED
        return TransitionCallbackReturn.SUCCESS

    @_transition
    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """From any state: end the requests in line, free the model, and let the process end."""
        previous, self._phase = self._phase, Phase.SHUTTING_DOWN
        if previous is Phase.ACTIVE:
            self.get_logger().info(f"{SHUTTING_DOWN}: stopping the current request, aborting the queued ones")
            self._end_requests(SHUTTING_DOWN)
        self._intake.close(SHUTTING_DOWN)  # the checks still queued refuse their requests with that reason
        if previous.loaded:
            self._free_model()
        self._phase = Phase.FINALIZED
        self.finalized.set()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """A transition raised (logged by ``_transition``): end what it left serving and free what it left
        loaded, so that the node is truly unconfigured, where rclpy puts it."""
        if self._queue is not None:
            self._end_requests(f"the node failed to {state.label}")
        if self._phase.loaded or self._phase is Phase.CLEANING_UP:
            self._free_model()
        self._phase = Phase.UNCONFIGURED
        return TransitionCallbackReturn.SUCCESS

    def _end_requests(self, reason: str) -> None:
        """End the request being spoken (within one step) and those waiting with ``reason``, refuse new ones,
        and wait until each has been answered (those still being checked are refused by the node's state)."""
        assert self._queue is not None  # the node was activated
        self._queue.close(reason)
        with self._pending_changed:
            self._pending_changed.wait_for(lambda: self._pending == 0, timeout=ANSWERS_WAIT_S)

    def _free_model(self) -> None:
        """Free the model once no callback holds it, and give its memory back to the system."""
        started, before = time.monotonic(), resident_mib()
        synth = self._model.take_back()
        if synth is not None:
            synth.close()
        del synth
        release_freed_memory()
        after = resident_mib()
        memory = "" if before is None or after is None else f": resident memory {before:.0f} -> {after:.0f} MiB"
        self.get_logger().info(f"unconfigured: model freed in {time.monotonic() - started:.2f} s{memory}")

    # -- parameters ---------------------------------------------------------------------------

    @property
    def _source(self) -> str:
        return f"{self.get_name()} parameters"

    def _parameter_values(self, names: Sequence[str] = tuple(ALL_OPTIONS)) -> dict[str, Any]:
        return {key: self.get_parameter(key).value for key in names}

    def _checked(self, values: dict[str, Any]) -> Settings:
        return checked_settings(values, self._source, Path.cwd())

    def _check_new_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        """A load-time parameter only while no model is loaded; then each value alone (the whole set is checked
        at configure, so parameters that are wrong together can be fixed one at a time); with a model
        loaded, the whole set as it would be."""
        changed = {p.name: p.value for p in parameters}
        refusal = parameter_refusal(changed, self._phase, self._full_name)
        if refusal is not None:
            return SetParametersResult(successful=False, reason=refusal)
        try:
            if self._phase.loaded:
                self._checked(self._parameter_values() | changed)
            else:
                checked_values(changed, self._source)
        except ConfigError as err:
            return SetParametersResult(successful=False, reason=str(err))
        return SetParametersResult(successful=True)

    def _apply_parameters(self, parameters: list[Parameter]) -> None:
        if not self._phase.loaded:
            return  # read by the next configure
        self._settings = settings = self._checked(self._parameter_values())  # for requests accepted from now on
        with self._model.borrow() as synth:
            if synth is not None:
                synth.config = settings.config  # what the synthesizer reads on its own (the default voice)
        if self._queue is not None:
            self._queue.policy = settings.queue_policy
        if any(p.name.startswith("generation.") for p in parameters):
            # Off this callback's thread: preparing waits for the request being spoken to end.
            threading.Thread(target=self._prepare_voice, name="prepare-voice", daemon=True).start()

    def _prepare_voice(self) -> None:
        """Prefill the prompt prefix the new generation defaults give (nothing when it is already there)."""
        with self._model.borrow() as synth:
            if synth is None:
                return  # freed meanwhile: the next configure prepares it
            try:
                rows = synth.prepare_voice()
            except MossTTSError as err:
                self.get_logger().warning(f"could not prepare the voice for the new generation defaults: {err}")
                return
        if rows:
            self.get_logger().info(f"voice prepared: {rows} prompt rows prefilled for the new generation defaults")

    # -- requests -----------------------------------------------------------------------------

    def _submit(
        self,
        request: Callable[[Synthesizer], SpeechRequest],
        request_id: str,
        *,
        collect: bool,
        on_update: Callable[[Ticket[Job]], None] | None = None,
        feed: TextFeed | None = None,
    ) -> Ticket[Job]:
        """Validate a request and put it in line; raises RequestError or Rejected with the reason. Runs on the
        intake's thread: the check of a long text takes tens of milliseconds (docs/security.md, "Nothing holds the
        executor").

        A node that is not active refuses it (ros/lifecycle.py). ``stream()`` checks the request now
        (text, reference, room in the context) without generating, so a bad request never takes a turn,
        nor interrupts the one being spoken. The request is checked and runs with the parameters in force
        now (one Settings object). A whole-utterance answer (``collect``) holds at most
        ``max_response_seconds`` of audio. With a ``feed`` the text arrives there, in pieces (``stream_text``;
        the request's text is empty). ``request`` is what a message asks for, made with the loaded model (its
        voices).
        """
        refusal = request_refusal(self._phase, self._full_name)
        if refusal is not None:
            raise Rejected(refusal)
        with self._model.borrow() as synth:
            if synth is None:  # deactivated and cleaned up since the state was read
                raise Rejected(request_refusal(Phase.UNCONFIGURED, self._full_name) or "")
            settings, queue = self._settings, self._queue
            assert settings is not None and queue is not None  # set before the model was lent and the node served
            speech = request(synth)
            check_request(speech, settings.config.limits)  # bounded before its language is looked up and quoted
            settings.check_language(speech.language)
            cancel = threading.Event()
            if feed is None:
                limit = settings.max_response_seconds if collect else None
                stream = synth.stream(
                    speech,
                    cancel=cancel,
                    streaming=not collect,  # a whole-utterance answer is the codec's offline decode
                    config=settings.config,
                    max_audio_s=limit,
                )
                if limit is not None and stream.estimated_seconds is not None and stream.estimated_seconds > limit:
                    raise RequestError(
                        f"the speech is expected to take {stream.estimated_seconds:.1f} s, more than a "
                        f"~/synthesize response holds (parameter 'max_response_seconds' ({limit:g} s)): split "
                        "the text, or use ~/speak or ~/text, which stream it"
                    )
            else:
                stream = synth.stream_text(feed, speech, cancel=cancel, config=settings.config)
        job = Job(stream, request_id, settings.output_encoding, [] if collect else None)
        ticket = Ticket(job, cancel, on_update)
        queue.submit(ticket)  # a line closed since the state was read refuses it with the reason it closed
        return ticket

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
            self._submit(lambda synth: text_request(text), uuid.uuid4().hex, collect=False)
        except (MossTTSError, Rejected) as err:
            self._refuse("~/text", err)
        except Exception as exc:
            self.get_logger().error(f"~/text request failed to be checked: {exc!r}")
            raise

    def _on_text_chunk(self, msg: TextChunk) -> None:
        try:
            self._text_streams.receive(msg, self._startup.text_stream_limits, time.monotonic())
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
            self._submit(
                lambda synth: replace(_speech_request(first, synth), text=""),  # the text arrives in the feed
                stream_id,
                collect=False,
                on_update=on_update,
                feed=feed,
            )
        except (MossTTSError, Rejected) as err:
            self._text_streams.ended(stream_id)
            self._refuse("~/text_stream", StreamRefused(f"text stream {stream_id!r} refused: {err}"))
        except Exception as exc:  # no one waits for this check: a failure of it is logged here (see _check_text)
            self._text_streams.ended(stream_id)
            self.get_logger().error(f"text stream {stream_id!r} failed to be checked: {exc!r}")
            raise

    def _expire_text_streams(self) -> None:
        limits = self._startup.text_stream_limits
        for stream_id in self._text_streams.expire(limits, time.monotonic()):
            self.get_logger().warning(
                f"text stream {stream_id!r} got no chunk for {limits.idle_timeout_s:g} s "
                "(text_stream_idle_timeout): speaking what it received, then ending it"
            )

    def _on_list_voices(self, request: ListVoices.Request, response: ListVoices.Response) -> ListVoices.Response:
        with self._model.borrow() as synth:
            if synth is None:
                response.message = voices_refusal(self._phase, self._full_name)
            else:
                response.success = True
                response.voices = voice_infos(synth.voices)
        return response

    def _on_synthesize(self, request: Synthesize.Request, response: Synthesize.Response) -> Synthesize.Response:
        response.sample_rate = self._sample_rate
        response.channels = 1
        response.encoding = self.get_parameter("output_encoding").value
        response.timing = timing_message(None, None)
        with self._waiting_reply():
            try:
                check = self._intake.submit(
                    lambda: self._submit(partial(_speech_request, request), uuid.uuid4().hex, collect=True)
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
                    partial(_speech_request, goal_handle.request), goal_id, collect=False, on_update=feedback
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
            check.add_done_callback(self._cancel_checked_goal)
        return CancelResponse.ACCEPT

    def _cancel_checked_goal(self, check: Future[Ticket[Job]]) -> None:
        """What a client's cancel does to its goal once the goal's check is done: nothing to a refused one."""
        queue = self._queue
        if check.exception() is None and queue is not None:
            ticket = check.result()
            ticket.job.client_canceled = True  # before the request can end by it
            queue.cancel(ticket, CLIENT_CANCEL)

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
        phase, queue = self._phase, self._queue
        serving = queue is not None and phase is Phase.ACTIVE
        status = NodeStatus(
            lifecycle_state=phase.value,
            model_loaded=phase.loaded,
            model_load_s=self._load_s if phase.loaded else None,
            configure_failure=self._failure,
            queue_depth=queue.depth if serving else 0,
            queue_size=self._startup.queue_size,
            busy=queue.busy if serving else False,
            queue_policy=self.get_parameter("queue_policy").value,
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


def _speech_request(msg: Speak.Goal | Synthesize.Request | TextChunk, synth: Synthesizer) -> SpeechRequest:
    """A goal, a service request or a stream's first chunk as the synthesizer takes it, its voice looked up among
    the loaded model's."""
    return speech_request(msg, requested_voice(synth.voices, msg.voice, msg.reference_audio))


def _goal_id(goal_handle: ServerGoalHandle) -> str:
    """A goal's UUID in hex: the request_id of its AudioChunk messages."""
    return bytes(goal_handle.goal_id.uuid).hex()


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


def _started() -> TtsNode:
    """The node, configured and activated unless ``autostart`` is false; raises with the reason it cannot start."""
    node = TtsNode()
    if node.autostarts:
        node.autostart()
    else:
        node.get_logger().info(
            "unconfigured, every interface up (autostart false): configure and activate it with a lifecycle manager or "
            f"`ros2 lifecycle set {node.get_fully_qualified_name()} configure`, then activate"
        )
    return node


def main(args: Sequence[str] | None = None) -> int:
    """Run the node until SIGINT, SIGTERM or the shutdown transition; exit 0 after a clean shutdown, 2 when
    autostart cannot configure it (bad parameters, missing weights), 1 if a callback crashed.
    """
    started = start_node(args, _started, NODE_NAME, START_FAILURE, (MossTTSError, ParameterException))
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
    wait_for_stop(stop, node.finalized)
    if crashed.is_set():
        if not node.finalized.is_set():
            node.trigger_shutdown()  # no executor runs transitions any more: this thread alone does
    else:
        node.shut_down()
    time.sleep(SHUTDOWN_FLUSH_S)
    executor.shutdown()
    spinner.join()  # a thread still inside rcl_wait when the context goes aborts the process
    node.destroy_node()
    rclpy.try_shutdown()
    return 1 if crashed.is_set() else 0


if __name__ == "__main__":
    sys.exit(main())
