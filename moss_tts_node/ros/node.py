"""The ROS 2 node: text in, streamed speech out. A thin adapter over ``Synthesizer``, managed by the lifecycle.

- ``~/text`` (std_msgs/String): speak it; the audio goes to ``~/audio``.
- ``~/text_stream`` (moss_tts_msgs/TextChunk): text that arrives in pieces (an LLM's tokens), one request per
  stream id, spoken sentence by sentence as it arrives (ros/text_stream.py).
- ``~/speak`` (moss_tts_msgs/action/Speak): the same with feedback, a result and cancel (ros/goals.py).
- ``~/synthesize`` (moss_tts_msgs/srv/Synthesize): the whole utterance back in the response.
- ``~/stop`` (std_srvs/Trigger, and a std_msgs/Empty topic of the same name for a VAD or a button): stop the
  request being spoken and, with ``stop_empties_queue``, those behind it (ros/requests.py).
- ``~/list_voices`` (moss_tts_msgs/srv/ListVoices): the voices a request may name (ros/voices.py).
- ``~/audio`` (moss_tts_msgs/AudioChunk): chunks as they are decoded (see ros/audio.py).
- ``/diagnostics``: lifecycle state, readiness, the model, queue depth, last real-time factor and time to first
  audio, under the node's full name (two nodes in two namespaces are told apart).

A lifecycle node (docs/ros.md, "Lifecycle"): configure loads the model and encodes its voices, activate serves,
deactivate ends the requests in line, cleanup frees the model; ``autostart`` (default true) configures and
activates at start-up (ros/main.py runs the process). Every interface exists in every state, and what it
refuses, and why, is ros/lifecycle.py's. This module is the wiring, one short callback per interface, each
handing over to a unit of its own: requests to ros/requests.py (checked one at a time on the intake's thread,
then in the line of the activation), the Speak action's goals to ros/goals.py, text stream chunks to
ros/text_stream.py, parameters to ros/parameters.py (declared and checked: the config keys, with the same files
and checks as the CLI, plus the few only a node has) and ros/lifecycle.py (when they may change), voices to
ros/voices.py, messages and diagnostics to ros/messages.py, audio to ros/audio.py.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Sequence
from functools import wraps
from pathlib import Path
from typing import Any

from diagnostic_msgs.msg import DiagnosticArray
from moss_tts_msgs.action import Speak
from moss_tts_msgs.msg import TextChunk
from moss_tts_msgs.srv import ListVoices, Synthesize
from rcl_interfaces.msg import SetParametersResult
from rclpy.action import ActionServer
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile
from std_msgs.msg import Empty, String
from std_srvs.srv import Trigger

from moss_tts_node.config import NODE_NAME
from moss_tts_node.ros.audio import AudioOut
from moss_tts_node.ros.goals import SpeakGoals
from moss_tts_node.ros.lifecycle import (
    DEACTIVATING,
    SHUTTING_DOWN,
    ConfigureFailed,
    Phase,
    change_refusal,
    voices_refusal,
)
from moss_tts_node.ros.loaded_model import LoadedModel
from moss_tts_node.ros.messages import NodeStatus, diagnostics
from moss_tts_node.ros.parameters import (
    ALL_OPTIONS,
    STARTUP_KEYS,
    Settings,
    checked_settings,
    checked_startup,
    declarations,
)
from moss_tts_node.ros.requests import TEXT_STREAM, Requests
from moss_tts_node.ros.text_stream import ChunkDropped, TextStreams
from moss_tts_node.ros.voices import voice_infos
from moss_tts_node.serving.queue import Refused

DIAGNOSTICS_PERIOD_S = 1.0
TEXT_STREAM_CHECK_S = 0.1  # how often open text streams are checked for their idle timeout and their life
# Chunks of text streams: one per LLM token, so a burst must not overflow the subscription's queue.
TEXT_STREAM_QOS = QoSProfile(depth=1000)
# One feedback per chunk for every goal on one topic: deep enough that a burst (the model can run
# many times faster than real time) does not push a waiting goal's queue position out.
FEEDBACK_QOS = QoSProfile(depth=100)
# Stop messages: each one stops at once, so a storm of them needs no room; the last few are enough.
STOP_QOS = QoSProfile(depth=10)


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
    their own and are answered in every state. Callbacks only hand over and return; the intake's thread checks
    requests, the line's worker thread generates and publishes.
    """

    def __init__(self) -> None:
        super().__init__(NODE_NAME)
        self.declare_parameters("", declarations())
        self._startup = checked_startup(self._parameter_values(STARTUP_KEYS), self._source)
        self._phase = Phase.UNCONFIGURED
        self._full_name = self.get_fully_qualified_name()  # as ros2 lifecycle set takes it, in refusals
        self._autostarting = False
        self.finalized = threading.Event()  # set once the shutdown transition has run
        self._audio = AudioOut(self)
        self._model = LoadedModel(self.get_logger())
        self._requests = Requests(
            self._model.loan, lambda: self._phase, self._full_name, self._audio.publish, self.get_logger()
        )
        self._goals = SpeakGoals(self._requests)
        self._text_streams = TextStreams()
        self._serve()

    def _serve(self) -> None:
        """Open the interfaces: parameter changes, the topics, the services, the action, diagnostics."""
        self.add_on_set_parameters_callback(self._check_new_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)
        self.create_subscription(String, "~/text", self._on_text, 10)
        self.create_subscription(TextChunk, "~/text_stream", self._on_text_chunk, TEXT_STREAM_QOS)
        self.create_timer(TEXT_STREAM_CHECK_S, self._expire_text_streams)
        # A service call waits for its request's turn, so calls must run side by side.
        self.create_service(Synthesize, "~/synthesize", self._on_synthesize, callback_group=ReentrantCallbackGroup())
        self.create_service(ListVoices, "~/list_voices", self._on_list_voices)
        # A group of its own: a stop is never held behind a transition, a parameter change or a text's callback.
        stops = MutuallyExclusiveCallbackGroup()
        self.create_service(Trigger, "~/stop", self._on_stop_call, callback_group=stops)
        self.create_subscription(Empty, "~/stop", self._on_stop_message, STOP_QOS, callback_group=stops)
        # Goal requests one at a time: rclpy answers a goal before ``accept`` puts it in line, so a client's
        # next goal could otherwise overtake it (ros/goals.py). Execute callbacks run as tasks of their own.
        self._speak = ActionServer(
            self,
            Speak,
            "~/speak",
            execute_callback=self._goals.execute,
            handle_accepted_callback=self._goals.accept,
            cancel_callback=self._goals.cancel,
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
        ends; five more keep the default group (topic, parameters, transitions), diagnostics, goals and
        cancels, stops, and the answers to refused calls moving."""
        return self._startup.queue_size + 1 + 5

    def autostart(self) -> None:
        """Configure and activate (``autostart``), before the executor spins; raises ConfigureFailed with the
        reason when configuring fails."""
        self._autostarting = True  # the caller reports a failure: on_configure does not log it as well
        try:
            if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                raise ConfigureFailed(self._model.failure or "configure failed")
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
        try:
            settings = self._checked(self._parameter_values())
            self._model.load(settings)
        except Exception as err:  # whatever fails, the node stays up and unconfigured, saying why
            failure = self._model.failed(err)
            self._phase = Phase.UNCONFIGURED
            if not self._autostarting:
                self.get_logger().error(
                    f"configure failed: {failure}; the node stays unconfigured: fix the parameters "
                    "(ros2 param set) and configure again"
                )
            return TransitionCallbackReturn.FAILURE
        self._requests.apply(settings)
        self._audio.announce(self._model.audio.sample_rate, self._model.audio.channels)
        self._phase = Phase.INACTIVE
        self.get_logger().info(f"configured: {self._model.loaded}")
        return TransitionCallbackReturn.SUCCESS

    @_transition
    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Open a new line of requests and serve."""
        self._requests.open(self._startup.queue_size)
        self._phase = Phase.ACTIVE
        self.get_logger().info(
            f"ready: {self._model.loaded}; listening on {self.resolve_topic_name('~/text')}, "
            f"{self.resolve_topic_name('~/text_stream')}, {self.resolve_service_name('~/synthesize')} "
            f"and the {self.resolve_service_name('~/speak')} action"
        )
        return TransitionCallbackReturn.SUCCESS

    @_transition
    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """End the request being spoken and those waiting; the model stays loaded."""
        self._phase = Phase.DEACTIVATING
        self._requests.end(DEACTIVATING)
        self._phase = Phase.INACTIVE
        self.get_logger().info("inactive: the requests in line ended; the model stays loaded (activate to serve)")
        return TransitionCallbackReturn.SUCCESS

    @_transition
    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Free the model and every stage."""
        self._phase = Phase.CLEANING_UP
        self._model.free()
        self._phase = Phase.UNCONFIGURED
        return TransitionCallbackReturn.SUCCESS

    @_transition
    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """From any state: end the requests in line, free the model, and let the process end."""
        previous, self._phase = self._phase, Phase.SHUTTING_DOWN
        if previous is Phase.ACTIVE:
            self.get_logger().info(f"{SHUTTING_DOWN}: stopping the current request, aborting the queued ones")
            self._requests.end(SHUTTING_DOWN)
        self._requests.close(SHUTTING_DOWN)  # the checks still queued refuse their requests with that reason
        if previous.loaded:
            self._model.free()
        self._phase = Phase.FINALIZED
        self.finalized.set()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """A transition raised (logged by ``_transition``): end what it left serving and free what it left
        loaded, so that the node is truly unconfigured, where rclpy puts it."""
        self._requests.end(f"the node failed to {state.label}")
        if self._phase.loaded or self._phase is Phase.CLEANING_UP:
            self._model.free()
        self._phase = Phase.UNCONFIGURED
        return TransitionCallbackReturn.SUCCESS

    # -- parameters ---------------------------------------------------------------------------

    @property
    def _source(self) -> str:
        return f"{self.get_name()} parameters"

    def _parameter_values(self, names: Sequence[str] = tuple(ALL_OPTIONS)) -> dict[str, Any]:
        return {key: self.get_parameter(key).value for key in names}

    def _checked(self, values: dict[str, Any]) -> Settings:
        return checked_settings(values, self._source, Path.cwd())

    def _check_new_parameters(self, parameters: list[Parameter]) -> SetParametersResult:
        changed = {p.name: p.value for p in parameters}
        refusal = change_refusal(changed, self._parameter_values(), self._phase, self._full_name, self._source)
        return SetParametersResult(successful=refusal is None, reason=refusal or "")

    def _apply_parameters(self, parameters: list[Parameter]) -> None:
        if not self._phase.loaded:
            return  # read by the next configure
        settings = self._checked(self._parameter_values())
        self._requests.apply(settings)  # for requests accepted from now on
        self._model.apply(settings, voice_changed=any(p.name.startswith("generation.") for p in parameters))

    # -- interfaces ---------------------------------------------------------------------------

    def _on_text(self, msg: String) -> None:
        self._requests.text(msg.data)

    def _on_text_chunk(self, msg: TextChunk) -> None:
        try:
            new = self._text_streams.receive(msg, self._startup.text_stream_limits, time.monotonic())
        except Refused as refusal:
            self._requests.refuse(TEXT_STREAM, refusal)
        except ChunkDropped as err:
            self.get_logger().warning(f"~/text_stream chunk dropped: {err}")
        else:
            if new is not None:
                self._requests.text_stream(new, self._text_streams.ended)

    def _expire_text_streams(self) -> None:
        for reason in self._text_streams.expire(self._startup.text_stream_limits, time.monotonic()):
            self.get_logger().warning(reason)

    def _on_stop_call(self, request: Trigger.Request, response: Trigger.Response) -> Trigger.Response:
        response.success, response.message = True, self._stop()
        return response

    def _on_stop_message(self, msg: Empty) -> None:
        self._stop()

    def _stop(self) -> str:
        """What a stop did; in a state that speaks nothing, why there is nothing to stop."""
        if self._phase is not Phase.ACTIVE:
            return f"nothing to stop: the node is {self._phase.value}"
        return self._requests.stop()

    def _on_synthesize(self, request: Synthesize.Request, response: Synthesize.Response) -> Synthesize.Response:
        encoding = self.get_parameter("output_encoding").value
        return self._requests.synthesize(request, response, self._model.audio, encoding)

    def _on_list_voices(self, request: ListVoices.Request, response: ListVoices.Response) -> ListVoices.Response:
        with self._model.loan.borrow() as synth:
            if synth is None:
                response.message = voices_refusal(self._phase, self._full_name)
            else:
                response.success = True
                response.voices = voice_infos(synth.voices)
        return response

    def _publish_diagnostics(self) -> None:
        phase = self._phase
        status = NodeStatus(
            lifecycle_state=phase.value,
            model_loaded=phase.loaded,
            model=self._model.name if phase.loaded else "",
            model_load_s=self._model.load_s if phase.loaded else None,
            weight_layout=self._model.weight_layout if phase.loaded else "",
            configure_failure=self._model.failure,
            queue_size=self._startup.queue_size,
            queue_policy=self.get_parameter("queue_policy").value,
            requests=self._requests.counts(serving=phase is Phase.ACTIVE),
            text_streams_open=self._text_streams.open_count,
            audio_listeners=self._audio.listeners(),
        )
        name = self._full_name.lstrip("/")  # "moss_tts_node", or "sounds/moss_tts_node" in a namespace
        self._diagnostics.publish(diagnostics(name, status, self.get_clock().now().to_msg()))
