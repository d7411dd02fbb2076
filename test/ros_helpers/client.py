"""A ROS client of moss_tts_node for the tests, run in its own process: ``client.py COMMAND ARGUMENTS_FILE``
(a JSON object).

It plays one scenario against the node at ``/moss_tts_node`` and prints one JSON line with what
it saw. Commands:

- ``text``        publish on ~/text, collect ~/audio chunks up to the final one (``save``: their audio to a .npy)
- ``text_stream`` publish TextChunk messages on ~/text_stream (and texts on ~/text) step by step, collect ~/audio
- ``synthesize``  call ~/synthesize
- ``speak``       send Speak goals one after another; then optionally cancel them or signal the
                  node; collect feedback, results and chunks
- ``params``      get, then set parameters (each set reported separately)
- ``diagnostics`` wait for a /diagnostics status with the model loaded
- ``audio_common`` like ``text``, also collecting the audio_common topics (needs audio_common_msgs)
- ``burst``       rounds of Speak goals sent all at once, in step with other burst clients
- ``soak``        hundreds of mixed requests (topic, service, action, cancels, bad input), one after another
- ``transitions`` lifecycle transitions by label, in order, each with its success and the state after it
- ``cycles``      rounds of configure, activate, a service call, deactivate, cleanup (progress after each step)
- ``deactivate``  deactivate while a goal speaks with a service call and a goal waiting; then requests while
                  inactive, and activate again
- ``stop``        requests of every kind, then ~/stop (the service or the topic), step by step; collect ~/audio

Every command waits for the node's interfaces to match first (never a fixed sleep). ``params``
given to speak/text/synthesize are set before the scenario and restored after it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import rclpy
import rclpy.duration
from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray
from lifecycle_msgs.srv import ChangeState, GetState
from moss_tts_msgs.action import Speak
from moss_tts_msgs.msg import AudioChunk, TextChunk
from moss_tts_msgs.srv import Synthesize
from rclpy.action import ActionClient
from rclpy.node import Node
from rclpy.parameter import Parameter, parameter_value_to_python
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.task import Future
from std_msgs.msg import Empty, String
from std_srvs.srv import Trigger

from moss_tts_node.ros.audio import decode

NODE = "/moss_tts_node"
MATCH_TIMEOUT = 20.0
SPOKEN_TO_ITS_END = ("end", "max_new_tokens")  # the end reasons of an utterance that was not stopped
QUEUED, GENERATING = Speak.Feedback.STATE_QUEUED, Speak.Feedback.STATE_GENERATING
CANCELED = GoalStatus.STATUS_CANCELED


class Client(Node):
    def __init__(self) -> None:
        super().__init__("moss_tts_test_client")
        self.chunks: list[dict[str, Any]] = []
        self.samples: dict[str, list[np.ndarray]] = defaultdict(list)  # decoded audio by request id
        self.started = time.monotonic()
        self.feedback: dict[str, list[dict[str, Any]]] = defaultdict(list)  # by goal id
        self.received = 0  # messages of either kind, to tell when the node has gone quiet
        self._params: AsyncParameterClient | None = None
        self._change_state = self.create_client(ChangeState, f"{NODE}/change_state")
        self._get_state = self.create_client(GetState, f"{NODE}/get_state")
        # Deep queues: the demo model makes a chunk and a feedback every few milliseconds.
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.audio = self.create_subscription(AudioChunk, f"{NODE}/audio", self._on_chunk, qos)
        # Feedback straight from its topic: rclpy's ActionClient drops a goal's feedback once its
        # result is in, and a busy client can read the result before feedback sent long before.
        self.create_subscription(Speak.Impl.FeedbackMessage, f"{NODE}/speak/_action/feedback", self._on_feedback, qos)

    def _on_feedback(self, msg: Any) -> None:
        self.received += 1
        fb = msg.feedback
        self.feedback[bytes(msg.goal_id.uuid).hex()].append(
            {
                "state": fb.state,
                "audio_produced": fb.audio_produced,
                "chunks": fb.chunks_published,
                "ahead": fb.queue_position,
                "received": self.now(),
            }
        )

    def _on_chunk(self, msg: AudioChunk) -> None:
        self.received += 1
        self.samples[msg.request_id].append(decode(bytes(msg.data), msg.encoding))
        self.chunks.append(
            {
                "request_id": msg.request_id,
                "index": msg.chunk_index,
                "bytes": len(msg.data),
                "encoding": msg.encoding,
                "sample_rate": msg.sample_rate,
                "channels": msg.channels,
                "is_final": msg.is_final,
                "end_reason": msg.end_reason,
                "start_offset": msg.start_offset,
                "received": self.now(),
            }
        )

    def spin_until(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
            rclpy.spin_once(self, timeout_sec=0.05)

    def result(self, future: Future, timeout: float, what: str) -> Any:
        self.spin_until(future.done, timeout, what)
        return future.result()

    def now(self) -> float:
        """The system's monotonic clock: the same in every process, so clients' times compare."""
        return time.monotonic()

    def wait_chunks(self, request_id: str, count: int, timeout: float) -> None:
        self.spin_until(
            lambda: sum(c["request_id"] == request_id for c in self.chunks) >= count, timeout, f"{count} chunks"
        )

    def has_all_chunks(self, goal: dict[str, Any]) -> bool:
        """The result can overtake the last chunks (another topic): are they all in? A goal that was spoken, to
        its end or not, has its final chunk; one that never was has none."""
        mine = [c for c in self.chunks if c["request_id"] == goal["id"]]
        return any(c["is_final"] for c in mine) or (not mine and goal["duration"] == 0)

    def send_goal(
        self, action: ActionClient, request: dict[str, Any], scenario_keys: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """Send one Speak goal (the fields of ``request`` but the ``scenario_keys``) and wait for its acceptance."""
        goal = request_message(request, Speak.Goal(), scenario_keys)
        handle = self.result(action.send_goal_async(goal), 10, "goal acceptance")
        return {
            "handle": handle,
            "accepted": handle.accepted,
            "id": bytes(handle.goal_id.uuid).hex(),
            "result_future": handle.get_result_async(),
        }

    def drain(self, quiet: float = 0.3, timeout: float = 10.0) -> None:
        """Take what is still in flight: spin until nothing arrives for ``quiet`` seconds."""
        deadline = time.monotonic() + timeout
        last, since = self.received, time.monotonic()
        while time.monotonic() - since < quiet and time.monotonic() < deadline:
            rclpy.spin_once(self, timeout_sec=0.05)
            if self.received != last:
                last, since = self.received, time.monotonic()

    def wait_audio_matched(self) -> None:
        self.spin_until(lambda: self.audio.get_publisher_count() > 0, MATCH_TIMEOUT, "the ~/audio publisher")

    def set_params(self, pairs: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        """Set each parameter on its own, so each gets its own verdict; returns them in order."""
        params = self.param_client()
        verdicts = []
        for name, value in pairs:
            response = self.result(params.set_parameters([Parameter(name, value=value)]), 10, f"setting {name}")
            verdict = response.results[0]
            verdicts.append({"name": name, "successful": verdict.successful, "reason": verdict.reason})
        return verdicts

    def set_params_or_fail(self, values: dict[str, Any]) -> None:
        for verdict in self.set_params(list(values.items())):
            if not verdict["successful"]:
                raise RuntimeError(f"could not set {verdict['name']}: {verdict['reason']}")

    def get_params(self, names: list[str]) -> dict[str, Any]:
        params = self.param_client()
        response = self.result(params.get_parameters(names), 10, "parameters")
        return {name: parameter_value_to_python(value) for name, value in zip(names, response.values, strict=True)}

    def param_client(self) -> AsyncParameterClient:
        """One client of the node's parameter services for the whole run: each new one is six more
        endpoints that the node's middleware keeps track of (memory the soak would count)."""
        if self._params is None:
            self._params = AsyncParameterClient(self, NODE)
            if not self._params.wait_for_services(MATCH_TIMEOUT):
                raise TimeoutError("the node's parameter services did not appear")
        return self._params

    def transition(self, label: str, timeout: float = 60.0) -> bool:
        """Ask the node for the lifecycle transition ``label`` (configure, activate, ...); whether it succeeded."""
        if not self._change_state.wait_for_service(MATCH_TIMEOUT):
            raise TimeoutError("the node's change_state service did not appear")
        request = ChangeState.Request()
        request.transition.label = label
        return self.result(self._change_state.call_async(request), timeout, f"the {label} transition").success

    def state(self) -> str:
        if not self._get_state.wait_for_service(MATCH_TIMEOUT):
            raise TimeoutError("the node's get_state service did not appear")
        return self.result(self._get_state.call_async(GetState.Request()), 10, "the state").current_state.label


def request_message(args: dict[str, Any], message: Any, scenario_keys: tuple[str, ...] = ()) -> Any:
    """``message`` with the fields ``args`` gives: every key of ``args`` but the ``scenario_keys`` (what the scenario
    does around the message) must be a field of ``message``, so that a field misspelled, or one the interface lost,
    fails the test instead of leaving the message at its default."""
    fields = message.get_fields_and_field_types()
    unknown = sorted(key for key in args if key not in fields and key not in scenario_keys)
    if unknown:
        raise KeyError(f"{type(message).__name__} has no field {', '.join(unknown)}; its fields: {', '.join(fields)}")
    for key, value in args.items():
        if key not in scenario_keys:
            setattr(message, key, value)
    return message


def _timing(timing: Any) -> dict[str, Any]:
    fields = ("queue_wait", "time_to_first_audio", "wall_time", "real_time_factor", "prefill_time", "codec_rtf")
    out: dict[str, Any] = {name: _number(getattr(timing, name)) for name in fields}
    names = ("steps", "frames", "seed", "stop_reason", "codec_decode")
    out |= {name: getattr(timing, name) for name in names}
    return out


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def _node_diagnostics(client: Client) -> list[dict[str, str]]:
    """A list that fills with the node's /diagnostics values, one dict per message, as the client spins."""
    diagnostics: list[dict[str, str]] = []

    def on_diagnostics(msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name.startswith("moss_tts_node"):
                diagnostics.append({kv.key: kv.value for kv in status.values})

    client.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
    return diagnostics


def wait_other_listeners(client: Client, others: int) -> None:
    """Wait until the node's ~/audio has matched ``others`` subscriptions besides this client's (a player).

    ~/audio is volatile: what is published before the node has matched a reader is lost to it. This client's view
    of the graph can show a subscription before the node's writer has matched it (seen on a loaded machine: a
    player that heard nothing), so the wait is on the node's own count, which /diagnostics reports.
    """
    if others:
        diagnostics = _node_diagnostics(client)
        client.spin_until(
            lambda: bool(diagnostics) and int(diagnostics[-1]["audio_listeners"]) >= 1 + others,
            MATCH_TIMEOUT,
            "~/audio's listeners, as the node's /diagnostics count them",
        )


def run_text(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    publisher = client.create_publisher(String, f"{NODE}/text", 10)
    client.spin_until(lambda: publisher.get_subscription_count() > 0, MATCH_TIMEOUT, "the ~/text subscriber")
    client.wait_audio_matched()
    wait_other_listeners(client, args.get("other_listeners", 0))
    for text in args["texts"]:
        publisher.publish(String(data=text))
    if not publisher.wait_for_all_acked(rclpy.duration.Duration(seconds=10)):  # in the node's hands before we go
        raise TimeoutError("the node did not acknowledge the ~/text messages")
    expected = args.get("finals", len(args["texts"]))
    client.spin_until(
        lambda: sum(c["is_final"] for c in client.chunks) >= expected, args.get("timeout", 30), "final chunks"
    )
    if "save" in args:  # the audio of every request, one after another, as float32 .npy
        np.save(args["save"], np.concatenate([np.concatenate(parts) for parts in client.samples.values()]))
    return {"chunks": client.chunks}


def run_text_stream(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Play ``steps`` in order, then collect ~/audio until every request id in ``finals`` has its final chunk.

    A step is ``{"chunk": {TextChunk fields}}`` (publish it on ~/text_stream), ``{"text": s}`` (publish on ~/text),
    ``{"publish": [topic, s]}`` (a std_msgs/String on another topic, once it has a subscriber),
    ``{"wait_publishers": [topic, n]}`` (until n publishers of that topic are known),
    ``{"wait_chunks": [request_id, n]}`` (wait until that request has published n audio chunks),
    ``{"wait_refused": n}`` (until /diagnostics counts n requests refused: a stream refused on the intake has left
    the open streams by then) or ``{"wait_open": n}`` (wait until /diagnostics counts n open text streams).
    ``final_count``: also wait for that many final chunks in all. The answer also holds the last diagnostics values
    seen.
    """
    qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
    chunks = client.create_publisher(TextChunk, f"{NODE}/text_stream", qos)
    texts = client.create_publisher(String, f"{NODE}/text", 10)
    diagnostics = _node_diagnostics(client)
    for publisher, what in ((chunks, "~/text_stream"), (texts, "~/text")):
        client.spin_until(lambda p=publisher: p.get_subscription_count() > 0, MATCH_TIMEOUT, f"the {what} subscriber")
    client.wait_audio_matched()
    timeout = args.get("timeout", 30)
    others: dict[str, Any] = {}  # publishers of "publish" steps, by topic
    for step in args["steps"]:
        if "chunk" in step:
            fields = step["chunk"]
            message = TextChunk(
                stream_id=fields["stream_id"], text=fields.get("text", ""), final=fields.get("final", False)
            )
            chunks.publish(request_message(fields, message))
        elif "text" in step:
            texts.publish(String(data=step["text"]))
        elif "publish" in step:
            topic, data = step["publish"]
            if topic not in others:
                others[topic] = client.create_publisher(String, topic, qos)
                client.spin_until(lambda p=others[topic]: p.get_subscription_count() > 0, MATCH_TIMEOUT, topic)
            others[topic].publish(String(data=data))
        elif "wait_publishers" in step:
            topic, count = step["wait_publishers"]
            client.spin_until(lambda t=topic, n=count: client.count_publishers(t) >= n, MATCH_TIMEOUT, f"{topic}")
        elif "wait_chunks" in step:
            request_id, count = step["wait_chunks"]
            client.wait_chunks(request_id, count, timeout)
        elif "wait_refused" in step:
            refused = step["wait_refused"]
            client.spin_until(
                lambda refused=refused: bool(diagnostics) and int(diagnostics[-1]["requests_refused"]) >= refused,
                timeout,
                f"{refused} requests refused",
            )
        else:
            wanted = str(step["wait_open"])
            client.spin_until(
                lambda wanted=wanted: bool(diagnostics) and diagnostics[-1]["text_streams_open"] == wanted,
                timeout,
                "open streams",
            )
    for publisher in (chunks, texts, *others.values()):  # in their readers' hands before this client may go
        if not publisher.wait_for_all_acked(rclpy.duration.Duration(seconds=10)):
            raise TimeoutError(f"the subscribers of {publisher.topic_name} did not acknowledge what was published")
    finals = set(args.get("finals", []))
    client.spin_until(
        lambda: (
            finals <= {c["request_id"] for c in client.chunks if c["is_final"]}
            and sum(c["is_final"] for c in client.chunks) >= args.get("final_count", 0)
        ),
        timeout,
        f"final chunks of {finals}",
    )
    client.drain()
    return {"chunks": client.chunks, "diagnostics": diagnostics[-1] if diagnostics else {}}


def run_synthesize(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    service = client.create_client(Synthesize, f"{NODE}/synthesize")
    if not service.wait_for_service(MATCH_TIMEOUT):
        raise TimeoutError("~/synthesize did not appear")
    answers = []
    for request in args["requests"]:
        response = client.result(
            service.call_async(request_message(request, Synthesize.Request())), args.get("timeout", 30), "a response"
        )
        answers.append(
            {
                "success": response.success,
                "message": response.message,
                "sample_rate": response.sample_rate,
                "channels": response.channels,
                "encoding": response.encoding,
                "bytes": len(response.audio),
                "sha256": hashlib.sha256(bytes(response.audio)).hexdigest(),
                "duration": response.duration,
                "timing": _timing(response.timing),
            }
        )
    return {"responses": answers}


def run_speak(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Send goals in order, each once the previous one is accepted, and collect everything.

    A goal's ``wait_chunks``: send it only once the previous goal has published that many chunks;
    its ``params``: set them just before sending it (restored at the end), once the previous goal is in line
    (its first feedback: the node checks a goal on its intake's thread after accepting it, with the parameters
    in force then).
    ``then``: ``{"goal": i, "chunks": n, "do": "cancel" | "SIGINT" | "SIGTERM", "pid": node pid}``:
    once goal i has published n chunks, cancel every goal, or those listed in ``"cancel"`` (the
    last first, so the waiting ones leave the line before the current one stops), or send the
    node that signal.
    """
    action = ActionClient(client, Speak, f"{NODE}/speak")
    if not action.wait_for_server(MATCH_TIMEOUT):
        raise TimeoutError("~/speak did not appear")
    client.wait_audio_matched()
    timeout = args.get("timeout", 30)
    goals: list[dict[str, Any]] = []
    for request in args["goals"]:
        if goals and request.get("wait_chunks"):
            client.wait_chunks(goals[-1]["id"], request["wait_chunks"], timeout)
        if goals and request.get("params"):
            before = goals[-1]["id"]
            client.spin_until(lambda before=before: bool(client.feedback[before]), timeout, "the goal before in line")
        client.set_params_or_fail(request.get("params", {}))
        goals.append(client.send_goal(action, request, ("wait_chunks", "params")))
    then = args.get("then")
    if then is not None:
        client.wait_chunks(goals[then["goal"]]["id"], then["chunks"], timeout)
        if then["do"] == "cancel":
            for index in reversed(then.get("cancel", range(len(goals)))):
                record = goals[index]
                record["cancel_sent"] = client.now()
                client.result(record["handle"].cancel_goal_async(), 10, "the cancel response")
        else:
            os.kill(then["pid"], getattr(signal, then["do"]))
    out = []
    for record in goals:
        response = client.result(record["result_future"], timeout, "a result")
        result = response.result
        out.append(
            {
                "id": record["id"],
                "accepted": record["accepted"],
                "status": response.status,
                "success": result.success,
                "message": result.message,
                "duration": result.duration,
                "timing": _timing(result.timing),
                "cancel_sent": record.get("cancel_sent"),
                "result_received": client.now(),
            }
        )
    client.spin_until(lambda: all(client.has_all_chunks(goal) for goal in out), 10, "the last chunks")
    client.drain()
    for goal in out:
        goal["feedback"] = client.feedback[goal["id"]]
    return {"goals": out, "chunks": client.chunks}


def run_params(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Get ``get`` (names), then set ``set`` ([name, value] pairs, in order; not restored)."""
    return {"values": client.get_params(args.get("get", [])), "set": client.set_params(args.get("set", []))}


def run_diagnostics(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """The first /diagnostics status of the node whose values include ``where`` (default: the model loaded), within
    ``wait_s`` seconds (default 10)."""
    where = args.get("where", {"model_loaded": "true"})
    statuses: list[dict[str, Any]] = []
    seen: list[dict[str, str]] = []  # the node's last values, for the reason of a timeout

    def on_diagnostics(msg: DiagnosticArray) -> None:
        for status in msg.status:
            values = {kv.key: kv.value for kv in status.values}
            if status.name.startswith("moss_tts_node"):
                seen[:] = [values]
                if where.items() <= values.items():
                    statuses.append({"level": ord(status.level), "message": status.message, "values": values})

    client.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
    try:
        client.spin_until(lambda: statuses, args.get("wait_s", 10), f"diagnostics with {where}")
    except TimeoutError as timeout:
        raise TimeoutError(f"{timeout}; the last values seen: {seen}") from None
    return statuses[-1]


def run_audio_common(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Publish on ~/text and collect what the audio_common topics carry, subscribed to as ros-drivers' nodes do:
    ``audio`` with audio_play's QoS (reliable, volatile, depth 10), ``audio_stamped`` likewise, ``audio_info``
    latched (depth 1, transient local) and subscribed to only now, after the node published it. Returns each
    topic's messages (bytes and digest, header stamps) beside the ~/audio chunks' data and stamps."""
    from audio_common_msgs.msg import AudioData, AudioDataStamped, AudioInfo

    audio_play = QoSProfile(depth=10)
    latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    seen: dict[str, list[tuple[bytes, int | None]]] = {"raw": [], "stamped": [], "chunks": []}
    info: list[dict[str, Any]] = []

    def stamp(header: Any) -> int:
        return header.stamp.sec * 10**9 + header.stamp.nanosec

    subscriptions = [
        client.create_subscription(
            AudioData, f"{NODE}/audio_common/audio", lambda m: seen["raw"].append((bytes(m.data), None)), audio_play
        ),
        client.create_subscription(
            AudioDataStamped,
            f"{NODE}/audio_common/audio_stamped",
            lambda m: seen["stamped"].append((bytes(m.audio.data), stamp(m.header))),
            audio_play,
        ),
    ]
    client.create_subscription(
        AudioChunk,
        f"{NODE}/audio",
        lambda m: seen["chunks"].append((bytes(m.data), stamp(m.header))),
        QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE),
    )
    client.create_subscription(
        AudioInfo,
        f"{NODE}/audio_common/audio_info",
        lambda m: info.append(
            {
                "channels": m.channels,
                "sample_rate": m.sample_rate,
                "sample_format": m.sample_format,
                "bitrate": m.bitrate,
                "coding_format": m.coding_format,
            }
        ),
        latched,
    )
    client.spin_until(
        lambda: all(s.get_publisher_count() > 0 for s in subscriptions), MATCH_TIMEOUT, "the audio_common publishers"
    )
    answer = run_text(client, args)
    client.spin_until(lambda: info, 10, "the latched AudioInfo")
    client.drain()

    def summary(messages: list[tuple[bytes, int | None]]) -> dict[str, Any]:
        data = b"".join(chunk for chunk, _ in messages)
        return {
            "sizes": [len(chunk) for chunk, _ in messages],
            "sha256": hashlib.sha256(data).hexdigest(),
            "stamps": [stamped for _, stamped in messages],
        }

    return answer | {name: summary(messages) for name, messages in seen.items()} | {"info": info[-1]}


def run_burst(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Rounds of ``per_round`` Speak goals sent at once, in step with the other burst clients.

    The files in ``sync_dir`` keep the clients in step (each is ``name``, one of ``clients``):
    ``matched-NAME`` once this client sees the node; the test then writes ``go-R`` for round R.
    Each client sends its goals without waiting between them, and once every goal has an answer
    (feedback: in line; or a result: refused) writes ``answered-R-NAME``. When all clients have,
    each cancels its goals one by one as they start generating, so the line is spoken through in
    its own order, and writes ``done-R-NAME``. Every goal's acceptance stamp (the node's clock),
    status, message and feedback come back, per round.
    """
    sync = Path(args["sync_dir"])
    action = ActionClient(client, Speak, f"{NODE}/speak")
    if not action.wait_for_server(MATCH_TIMEOUT):
        raise TimeoutError("~/speak did not appear")
    (sync / f"matched-{args['name']}").touch()
    rounds = []
    for number in range(args["rounds"]):
        client.spin_until((sync / f"go-{number}").exists, args.get("timeout", 30), f"go-{number}")
        rounds.append(_burst_round(client, action, sync, number, args))
        (sync / f"done-{number}-{args['name']}").touch()
    return {"rounds": rounds}


def _burst_round(
    client: Client, action: ActionClient, sync: Path, number: int, args: dict[str, Any]
) -> list[dict[str, Any]]:
    timeout = args.get("timeout", 30)
    futures = [
        action.send_goal_async(Speak.Goal(text=f"round {number}, goal {index} of {args['name']}"))
        for index in range(args["per_round"])
    ]
    client.spin_until(lambda: all(f.done() for f in futures), timeout, "goal acceptance")
    handles = [f.result() for f in futures]
    results = [handle.get_result_async() for handle in handles]
    feedback = [client.feedback[bytes(handle.goal_id.uuid).hex()] for handle in handles]  # filled as it comes

    def answered() -> bool:  # a result (refused) or feedback (in line)
        return all(result.done() or bool(fb) for result, fb in zip(results, feedback, strict=True))

    client.spin_until(answered, timeout, "an answer to every goal")
    (sync / f"answered-{number}-{args['name']}").touch()
    client.spin_until(
        lambda: len(list(sync.glob(f"answered-{number}-*"))) == args["clients"], timeout, "the other clients"
    )
    cancelled: set[int] = set()

    def cancel_speaking() -> bool:
        for index, handle in enumerate(handles):
            if index not in cancelled and any(f["state"] == GENERATING for f in feedback[index]):
                cancelled.add(index)
                handle.cancel_goal_async()
        return all(result.done() for result in results)

    client.spin_until(cancel_speaking, timeout, "every goal's result")
    return [
        {
            "id": bytes(handle.goal_id.uuid).hex(),
            "stamp_ns": handle.stamp.sec * 10**9 + handle.stamp.nanosec,
            "accepted": handle.accepted,
            "status": result.result().status,
            "message": result.result().result.message,
            "feedback": goal_feedback,
        }
        for handle, result, goal_feedback in zip(handles, results, feedback, strict=True)
    ]


class Soak:
    """The requests of ``soak``, each answered before the next starts; tallies what came back."""

    def __init__(self, client: Client, timeout: float) -> None:
        self.client = client
        self.timeout = timeout
        self.service = client.create_client(Synthesize, f"{NODE}/synthesize")
        self.action = ActionClient(client, Speak, f"{NODE}/speak")
        self.text = client.create_publisher(String, f"{NODE}/text", 10)
        if not self.service.wait_for_service(MATCH_TIMEOUT) or not self.action.wait_for_server(MATCH_TIMEOUT):
            raise TimeoutError("~/synthesize or ~/speak did not appear")
        client.spin_until(lambda: self.text.get_subscription_count() > 0, MATCH_TIMEOUT, "the ~/text subscriber")
        client.wait_audio_matched()
        self.counts = {"requests": 0, "succeeded": 0, "cancelled": 0, "refused": 0}
        self.unexpected: list[str] = []

    def check(self, what: str, ok: bool, detail: Any) -> bool:
        if not ok:
            self.unexpected.append(f"{what}: {detail}")
        return ok

    def texts(self, *texts: str) -> None:
        """Publish at once; each must be spoken to its final chunk."""
        finals = self.final_chunks() + len(texts)
        for words in texts:
            self.text.publish(String(data=words))
        self.counts["requests"] += len(texts)
        self.client.spin_until(lambda: self.final_chunks() == finals, self.timeout, "the final chunks")
        self.counts["succeeded"] += len(texts)

    def bad_text(self, words: str) -> None:
        """Refused: only the node's log and diagnostics say so."""
        self.text.publish(String(data=words))
        self.counts["requests"] += 1
        self.counts["refused"] += 1

    def final_chunks(self) -> int:
        """Final chunks of utterances spoken to their end (a cancelled goal's says "cancel", and may come late)."""
        return sum(c["is_final"] and c["end_reason"] in SPOKEN_TO_ITS_END for c in self.client.chunks)

    def call(self, request: Synthesize.Request, refusal: str | None = None) -> None:
        self.counts["requests"] += 1
        response = self.client.result(self.service.call_async(request), self.timeout, "a synthesize response")
        self.tally(f"synthesize {request.text!r}", response.success, response.message, refusal)

    def send(self, goal: Speak.Goal) -> Any:
        self.counts["requests"] += 1
        return self.client.result(self.action.send_goal_async(goal), self.timeout, "goal acceptance")

    def result(self, handle: Any, refusal: str | None = None) -> None:
        response = self.client.result(handle.get_result_async(), self.timeout, "a result")
        result = response.result
        self.tally(f"goal {bytes(handle.goal_id.uuid).hex()[:8]}", result.success, result.message, refusal)

    def tally(self, what: str, success: bool, message: str, refusal: str | None) -> None:
        if refusal is None:
            self.counts["succeeded"] += self.check(what, success, message)
        else:
            self.counts["refused"] += self.check(what, not success and refusal in message, message)

    def wait_state(self, handle: Any, state: int) -> None:
        self.client.spin_until(lambda: state in self.states(handle), self.timeout, f"feedback state {state}")

    def cancel_when(self, handle: Any, state: int) -> None:
        """Cancel a goal once its feedback says ``state``; it must end cancelled, never spoken if waiting."""
        self.wait_state(handle, state)
        self.client.result(handle.cancel_goal_async(), self.timeout, "the cancel response")
        response = self.client.result(handle.get_result_async(), self.timeout, "a result")
        ok = response.status == CANCELED and response.result.message == "canceled by the client"
        self.counts["cancelled"] += self.check("cancel", ok, (response.status, response.result.message))
        if state == QUEUED:
            self.check("a goal cancelled while waiting was spoken", GENERATING not in self.states(handle), "")

    def states(self, handle: Any) -> set[int]:
        return {f["state"] for f in self.client.feedback[bytes(handle.goal_id.uuid).hex()]}


NOT_A_VOICE = "not a voice of this node"


def run_soak(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """``cycles`` rounds of every request kind, each answered before the next starts.

    Prints ``{"progress": requests so far}`` after each cycle (the test samples the node's memory
    then); returns the tallies and whatever went other than expected. The node must run with
    ``languages:=[en]``. No good request may be refused, so two texts at once (two requests) are
    always followed by a single request: the second text may still be finishing then.

    The goal cancelled while spoken is accepted under the parameters ``long`` (one that speaks until it
    is cancelled), so the goal sent after it waits, whatever the speed of the machine; the node's own
    parameters are back before that one is sent (once the long goal's feedback says it generates, it
    holds the settings it was accepted under).
    """
    soak = Soak(client, args.get("timeout", 30))
    long = args["long"]
    short = client.get_params(sorted(long))
    for _ in range(args["cycles"]):
        soak.texts("A text on the topic.", "And one right after it.")
        soak.call(Synthesize.Request(text="A service call."))
        soak.result(soak.send(Speak.Goal(text="An action goal.")))
        client.set_params_or_fail(long)
        speaking = soak.send(Speak.Goal(text="A goal cancelled while it is spoken."))
        soak.wait_state(speaking, GENERATING)
        client.set_params_or_fail(short)
        soak.cancel_when(soak.send(Speak.Goal(text="A goal cancelled while it waits.")), QUEUED)
        soak.cancel_when(speaking, GENERATING)
        soak.result(soak.send(Speak.Goal(text="A goal that is spoken.")))
        soak.call(Synthesize.Request(text=" "), refusal="text is empty")
        soak.call(Synthesize.Request(text="Hello.", reference_audio="/nonexistent/voice.wav"), refusal=NOT_A_VOICE)
        soak.result(soak.send(Speak.Goal(text="Bonjour.", language="fr")), refusal="unknown language 'fr'")
        soak.result(soak.send(Speak.Goal(text="")), refusal="text is empty")
        # Hostile and oversized (docs/security.md): a megabyte of text, a probe of the machine's files,
        # nothing to say, a seed out of range, an escape through the voice field.
        soak.bad_text("🤖" * 5000)
        soak.call(Synthesize.Request(text="word " * 200_000), refusal="'limits.max_text_chars'")
        soak.result(soak.send(Speak.Goal(text="Hello.", reference_audio="/etc/shadow")), refusal=NOT_A_VOICE)
        soak.call(Synthesize.Request(text="🤖🤖🤖 ... !!!"), refusal="nothing to say")
        soak.result(soak.send(Speak.Goal(text="Hello.", seed=-5)), refusal="the seed must be -1")
        soak.call(Synthesize.Request(text="Hello.", voice="../" * 20 + "proc/self/environ"), refusal=NOT_A_VOICE)
        soak.bad_text("  ")
        print(json.dumps({"progress": soak.counts["requests"]}), flush=True)
    # A last good request. The refusals of the texts before it are only counted by the node's diagnostics, which
    # the test waits for: a topic's message may reach the node after a later service request.
    soak.call(Synthesize.Request(text="The end."))
    return {"counts": soak.counts, "unexpected": soak.unexpected}


def run_transitions(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """``transitions`` (labels) in order, each answered before the next is asked for."""
    steps = []
    for label in args["transitions"]:
        success = client.transition(label, args.get("timeout", 60))
        steps.append({"transition": label, "success": success, "state": client.state()})
    return {"steps": steps}


def run_cycles(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """``cycles`` rounds of configure, activate, the synthesize ``request``, deactivate, cleanup.

    Prints ``{"cycle": n, "step": ..., "seconds": ...}`` once each step is answered (the test samples the
    node's memory then); returns each round's audio digest.
    """
    service = client.create_client(Synthesize, f"{NODE}/synthesize")
    if not service.wait_for_service(MATCH_TIMEOUT):
        raise TimeoutError("~/synthesize did not appear")
    timeout = args.get("timeout", 60)
    hashes = []

    def step(number: int, name: str, started: float) -> None:
        print(json.dumps({"cycle": number, "step": name, "seconds": time.monotonic() - started}), flush=True)

    for number in range(1, args["cycles"] + 1):
        for label in ("configure", "activate", "speak", "deactivate", "cleanup"):
            started = time.monotonic()
            if label == "speak":
                request = request_message(args["request"], Synthesize.Request())
                response = client.result(service.call_async(request), timeout, "a response")
                if not response.success:
                    raise RuntimeError(f"cycle {number}: {response.message}")
                hashes.append(hashlib.sha256(bytes(response.audio)).hexdigest())
            elif not client.transition(label, timeout):
                raise RuntimeError(f"cycle {number}: {label} failed")
            step(number, label, started)
    return {"sha256": hashes}


def run_deactivate(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Deactivate while a goal speaks, with a service call and a goal waiting behind it; then one request of
    each kind while inactive; then activate again and speak (a goal, cancelled once it has audio).

    The node must run with queue_size 2 or more and parameters that make every request long (``params``), so
    that the line is as described when the deactivate is asked for, whatever the speed of the machine.
    """
    action = ActionClient(client, Speak, f"{NODE}/speak")
    service = client.create_client(Synthesize, f"{NODE}/synthesize")
    if not action.wait_for_server(MATCH_TIMEOUT) or not service.wait_for_service(MATCH_TIMEOUT):
        raise TimeoutError("~/speak or ~/synthesize did not appear")
    client.wait_audio_matched()
    depths: list[str] = []  # the node's queue depth, as /diagnostics reports it

    def on_diagnostics(msg: DiagnosticArray) -> None:
        depths.extend(kv.value for status in msg.status for kv in status.values if kv.key == "queue_depth")

    client.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
    timeout = args.get("timeout", 30)
    speaking = client.send_goal(action, {"text": "one"})
    client.wait_chunks(speaking["id"], 1, timeout)
    call = service.call_async(Synthesize.Request(text="two"))
    # The call and the goal travel apart: send the goal once the call waits in line, so it comes second.
    client.spin_until(lambda: bool(depths) and depths[-1] == "1", timeout, "the service call to wait in line")
    waiting = client.send_goal(action, {"text": "three"})
    # Third in line (the service call is second): both are waiting when the deactivate is asked for.
    client.spin_until(
        lambda: any((f["state"], f["ahead"]) == (QUEUED, 2) for f in client.feedback[waiting["id"]]),
        timeout,
        "the goal to wait behind the service call",
    )
    asked = time.monotonic()
    deactivated = client.transition("deactivate")
    deactivate_s = time.monotonic() - asked
    state = client.state()
    goals = []
    for record in (speaking, waiting):
        response = client.result(record["result_future"], timeout, "a result")
        goals.append(
            {
                "id": record["id"],
                "status": response.status,
                "message": response.result.message,
                "timing": _timing(response.result.timing),
            }
        )
    response = client.result(call, timeout, "the synthesize response")
    called = {"success": response.success, "message": response.message, "timing": _timing(response.timing)}
    inactive_goal = client.send_goal(action, {"text": "four"})
    inactive_result = client.result(inactive_goal["result_future"], timeout, "a result")
    inactive_call = client.result(service.call_async(Synthesize.Request(text="five")), timeout, "a response")
    activated = client.transition("activate")
    again = client.send_goal(action, {"text": "six"})
    client.wait_chunks(again["id"], 1, timeout)
    client.result(again["handle"].cancel_goal_async(), 10, "the cancel response")
    again_result = client.result(again["result_future"], timeout, "a result")
    client.drain()
    for goal in goals:
        goal["feedback"] = client.feedback[goal["id"]]
    return {
        "deactivated": deactivated,
        "deactivate_s": deactivate_s,  # from asking to the answer, with three requests to end
        "state": state,
        "goals": goals,
        "call": called,
        "inactive": {
            "goal": {"status": inactive_result.status, "message": inactive_result.result.message},
            "call": {"success": inactive_call.success, "message": inactive_call.message},
        },
        "activated": activated,
        "again": {"status": again_result.status, "chunks": len(chunks_of(client, again["id"]))},
        "chunks": client.chunks,
    }


def run_stop(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Play ``steps`` in order, then wait for every goal's result and for a final chunk of every request that
    published audio; the answer has the chunks, the goals' results by name, the stop calls' answers, the ids of the
    requests in the order their audio began, and the last diagnostics values.

    A step is ``{"goal": name, "request": {fields}}`` (send a Speak goal, once accepted), ``{"text": s}``
    (publish on ~/text), ``{"chunk": {TextChunk fields}}`` (publish on ~/text_stream), ``{"params": {...}}`` (set
    them), ``{"wait_audio": [n, k]}`` (until the n-th request to publish audio has published k chunks: texts have
    no id to wait on), ``{"wait_depth": n}`` (until /diagnostics says n requests wait),
    ``{"wait_open": n}`` (until it counts n open text streams), ``{"wait_final": n}`` (until n final chunks are
    in), ``{"stop": "service" | "topic", "times": k}`` (k stops, each call answered before the next; messages
    all at once) or ``{"storm": [calls, messages]}`` (that many stop calls, all in flight at once, and messages).
    ``spoken``: also wait until that many requests have published audio; ``wait_finals`` false: return once the
    steps are done (a request left speaking); ``other_listeners``: ~/audio's subscriptions to wait for besides this
    client's before the first step (a player).
    """
    action = ActionClient(client, Speak, f"{NODE}/speak")
    stop_service = client.create_client(Trigger, f"{NODE}/stop")
    qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
    stop_topic = client.create_publisher(Empty, f"{NODE}/stop", qos)
    texts = client.create_publisher(String, f"{NODE}/text", qos)
    chunks = client.create_publisher(TextChunk, f"{NODE}/text_stream", qos)
    if not action.wait_for_server(MATCH_TIMEOUT) or not stop_service.wait_for_service(MATCH_TIMEOUT):
        raise TimeoutError("~/speak or the ~/stop service did not appear")
    for publisher in (stop_topic, texts, chunks):
        client.spin_until(lambda p=publisher: p.get_subscription_count() > 0, MATCH_TIMEOUT, "the node's subscribers")
    client.wait_audio_matched()
    wait_other_listeners(client, args.get("other_listeners", 0))
    diagnostics = _node_diagnostics(client)

    def spoken() -> list[str]:  # request ids in the order their audio began
        return list(dict.fromkeys(c["request_id"] for c in client.chunks))

    reported: dict[str, str] = {}  # the last value of each key waited for, printed when it changes

    def diagnosed(key: str, value: int) -> bool:
        if not diagnostics:
            return False
        seen = diagnostics[-1][key]
        if reported.get(key) != seen:  # on stderr: what a timeout's message shows
            print(f"/diagnostics {key}: {seen} (waiting for {value})", file=sys.stderr)
            reported[key] = seen
        return seen == str(value)

    timeout = args.get("timeout", 30)
    goals: dict[str, dict[str, Any]] = {}
    answers: list[str] = []
    for step in args["steps"]:
        if "goal" in step:
            goals[step["goal"]] = client.send_goal(action, step.get("request", {"text": step["goal"]}))
        elif "text" in step:
            texts.publish(String(data=step["text"]))
        elif "chunk" in step:
            fields = step["chunk"]
            message = TextChunk(
                stream_id=fields["stream_id"], text=fields.get("text", ""), final=fields.get("final", False)
            )
            chunks.publish(request_message(fields, message))
        elif "params" in step:
            client.set_params_or_fail(step["params"])
        elif "wait_audio" in step:
            number, count = step["wait_audio"]
            client.spin_until(lambda n=number: len(spoken()) > n, timeout, f"request {number}'s audio")
            client.wait_chunks(spoken()[number], count, timeout)
        elif "wait_depth" in step:
            client.spin_until(lambda n=step["wait_depth"]: diagnosed("queue_depth", n), timeout, "the queue depth")
        elif "wait_open" in step:
            client.spin_until(lambda n=step["wait_open"]: diagnosed("text_streams_open", n), timeout, "open streams")
        elif "wait_final" in step:
            wanted = step["wait_final"]
            client.spin_until(lambda n=wanted: sum(c["is_final"] for c in client.chunks) >= n, timeout, "final chunks")
        elif "stop" in step:
            for _ in range(step.get("times", 1)):
                if step["stop"] == "service":
                    response = client.result(stop_service.call_async(Trigger.Request()), timeout, "the stop answer")
                    answers.append(response.message)
                else:
                    stop_topic.publish(Empty())
            if not stop_topic.wait_for_all_acked(rclpy.duration.Duration(seconds=10)):  # in the node's hands
                raise TimeoutError("the node did not acknowledge the stop messages")
        else:
            count, messages = step["storm"]
            calls = [stop_service.call_async(Trigger.Request()) for _ in range(count)]
            for _ in range(messages):
                stop_topic.publish(Empty())
            client.spin_until(lambda calls=calls: all(c.done() for c in calls), timeout, "every stop answered")
            answers.extend(call.result().message for call in calls)
    for publisher in (stop_topic, texts, chunks):  # in the node's hands before this client may go
        if not publisher.wait_for_all_acked(rclpy.duration.Duration(seconds=10)):
            raise TimeoutError("the node did not acknowledge the messages published")
    if not args.get("wait_finals", True):
        return {"chunks": client.chunks, "spoken": spoken(), "answers": answers, "goals": {}, "diagnostics": {}}
    results = {
        name: client.result(record["result_future"], timeout, f"goal {name}'s result") for name, record in goals.items()
    }
    client.spin_until(
        lambda: (
            len(spoken()) >= args.get("spoken", 0)
            and all(any(c["is_final"] for c in chunks_of(client, key)) for key in spoken())
        ),
        timeout,
        "every final chunk",
    )
    client.drain(quiet=1.0)
    return {
        "chunks": client.chunks,
        "spoken": spoken(),
        "answers": answers,
        "goals": {
            name: {
                "id": goals[name]["id"],
                "status": response.status,
                "success": response.result.success,
                "message": response.result.message,
            }
            for name, response in results.items()
        },
        "diagnostics": diagnostics[-1] if diagnostics else {},
    }


def chunks_of(client: Client, request_id: str) -> list[dict[str, Any]]:
    return [c for c in client.chunks if c["request_id"] == request_id]


COMMANDS = {
    "text": run_text,
    "synthesize": run_synthesize,
    "speak": run_speak,
    "text_stream": run_text_stream,
    "params": run_params,
    "diagnostics": run_diagnostics,
    "audio_common": run_audio_common,
    "burst": run_burst,
    "soak": run_soak,
    "transitions": run_transitions,
    "cycles": run_cycles,
    "deactivate": run_deactivate,
    "stop": run_stop,
}


def command_line() -> tuple[str, dict[str, Any]]:
    """The command and its arguments: ``client.py COMMAND ARGUMENTS_FILE``, the file holding a JSON object."""
    return sys.argv[1], json.loads(Path(sys.argv[2]).read_text(encoding="utf-8"))


def main(commands: dict[str, Any] = COMMANDS) -> int:
    """Run one of ``commands`` as the command line says; ``params`` it is given are set first, restored after."""
    command, args = command_line()
    rclpy.init()
    client = Client()
    try:
        changed = args.get("params", {})
        later = [*args.get("goals", []), *args.get("steps", [])]  # a goal's or a step's parameters, restored too
        names = set(changed).union(*(item.get("params", {}) for item in later))
        saved = client.get_params(sorted(names)) if names else {}
        client.set_params_or_fail(changed)
        try:
            answer = commands[command](client, args)
        finally:
            if saved:
                client.set_params(list(saved.items()))
    finally:
        client.destroy_node()
        rclpy.try_shutdown()
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
