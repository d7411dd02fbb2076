"""A ROS client of moss_tts_node for the tests, run in its own process: ``client.py COMMAND JSON``.

It plays one scenario against the node at ``/moss_tts_node`` and prints one JSON line with what
it saw. Commands:

- ``text``        publish on ~/text, collect ~/audio chunks up to the final one (``save``: their audio to a .npy)
- ``synthesize``  call ~/synthesize
- ``speak``       send Speak goals one after another; then optionally cancel them or signal the
                  node; collect feedback, results and chunks
- ``params``      get, then set parameters (each set reported separately)
- ``diagnostics`` wait for a /diagnostics status with the model loaded
- ``audio_common`` like ``text``, also collecting the audio_common topics (needs audio_common_msgs)

Every command waits for the node's interfaces to match first (never a fixed sleep). ``params``
given to speak/text/synthesize are set before the scenario and restored after it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from moss_tts_msgs.action import Speak
from moss_tts_msgs.msg import AudioChunk
from moss_tts_msgs.srv import Synthesize
from rclpy.action import ActionClient
from rclpy.node import Node
from rclpy.parameter import Parameter, parameter_value_to_python
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.task import Future
from std_msgs.msg import String

from moss_tts_node.ros.audio import decode

NODE = "/moss_tts_node"
MATCH_TIMEOUT = 20.0


class Client(Node):
    def __init__(self) -> None:
        super().__init__("moss_tts_test_client")
        self.chunks: list[dict[str, Any]] = []
        self.samples: dict[str, list[np.ndarray]] = defaultdict(list)  # decoded audio by request id
        self.started = time.monotonic()
        self.feedback: dict[str, list[dict[str, Any]]] = defaultdict(list)  # by goal id
        self.received = 0  # messages of either kind, to tell when the node has gone quiet
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
        return time.monotonic() - self.started

    def wait_chunks(self, request_id: str, count: int, timeout: float) -> None:
        self.spin_until(
            lambda: sum(c["request_id"] == request_id for c in self.chunks) >= count, timeout, f"{count} chunks"
        )

    def has_all_chunks(self, goal: dict[str, Any]) -> bool:
        """The result can overtake the last chunks (another topic): are they all in?"""
        mine = [c for c in self.chunks if c["request_id"] == goal["id"]]
        if goal["success"]:
            return any(c["is_final"] for c in mine)
        seconds = sum(c["bytes"] / (2 if c["encoding"] == "pcm_s16le" else 4) / c["sample_rate"] for c in mine)
        return seconds >= goal["duration"] - 1e-6

    def send_goal(self, action: ActionClient, request: dict[str, Any]) -> dict[str, Any]:
        """Send one Speak goal and wait for its acceptance."""
        goal = _request_fields(request, Speak.Goal())
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

    def get_params(self, names: list[str]) -> dict[str, Any]:
        params = self.param_client()
        response = self.result(params.get_parameters(names), 10, "parameters")
        return {name: parameter_value_to_python(value) for name, value in zip(names, response.values, strict=True)}

    def param_client(self) -> AsyncParameterClient:
        params = AsyncParameterClient(self, NODE)
        if not params.wait_for_services(MATCH_TIMEOUT):
            raise TimeoutError("the node's parameter services did not appear")
        return params


def _request_fields(args: dict[str, Any], message: Any) -> Any:
    for key in ("text", "language", "instruction", "reference_audio", "seed"):
        if key in args:
            setattr(message, key, args[key])
    return message


def _timing(timing: Any) -> dict[str, Any]:
    fields = ("queue_wait", "time_to_first_audio", "wall_time", "real_time_factor", "prefill_time")
    out: dict[str, Any] = {name: _number(getattr(timing, name)) for name in fields}
    out |= {"steps": timing.steps, "frames": timing.frames, "seed": timing.seed, "stop_reason": timing.stop_reason}
    return out


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def run_text(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    publisher = client.create_publisher(String, f"{NODE}/text", 10)
    client.spin_until(lambda: publisher.get_subscription_count() > 0, MATCH_TIMEOUT, "the ~/text subscriber")
    client.wait_audio_matched()
    for text in args["texts"]:
        publisher.publish(String(data=text))
    expected = args.get("finals", len(args["texts"]))
    client.spin_until(
        lambda: sum(c["is_final"] for c in client.chunks) >= expected, args.get("timeout", 30), "final chunks"
    )
    if "save" in args:  # the audio of every request, one after another, as float32 .npy
        np.save(args["save"], np.concatenate([np.concatenate(parts) for parts in client.samples.values()]))
    return {"chunks": client.chunks}


def run_synthesize(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    service = client.create_client(Synthesize, f"{NODE}/synthesize")
    if not service.wait_for_service(MATCH_TIMEOUT):
        raise TimeoutError("~/synthesize did not appear")
    answers = []
    for request in args["requests"]:
        response = client.result(
            service.call_async(_request_fields(request, Synthesize.Request())), args.get("timeout", 30), "a response"
        )
        answers.append(
            {
                "success": response.success,
                "message": response.message,
                "sample_rate": response.sample_rate,
                "channels": response.channels,
                "encoding": response.encoding,
                "bytes": len(response.audio),
                "duration": response.duration,
                "timing": _timing(response.timing),
            }
        )
    return {"responses": answers}


def run_speak(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Send goals in order, each once the previous one is accepted, and collect everything.

    A goal's ``wait_chunks``: send it only once the previous goal has published that many chunks.
    ``then``: ``{"goal": i, "chunks": n, "do": "cancel" | "SIGINT" | "SIGTERM", "pid": node pid}``:
    once goal i has published n chunks, cancel every goal (the last first, so the waiting ones
    leave the line before the current one stops), or send the node that signal.
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
        goals.append(client.send_goal(action, request))
    then = args.get("then")
    if then is not None:
        client.wait_chunks(goals[then["goal"]]["id"], then["chunks"], timeout)
        if then["do"] == "cancel":
            for record in reversed(goals):
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
    statuses: list[dict[str, Any]] = []

    def on_diagnostics(msg: DiagnosticArray) -> None:
        for status in msg.status:
            values = {kv.key: kv.value for kv in status.values}
            if status.name.startswith("moss_tts_node") and values.get("model_loaded") == "true":
                statuses.append({"level": int.from_bytes(status.level), "message": status.message, "values": values})

    client.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
    client.spin_until(lambda: statuses, args.get("timeout", 10), "diagnostics")
    return statuses[-1]


def run_audio_common(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Publish on ~/text and collect what the audio_common topics carry (what audio_play plays)."""
    from audio_common_msgs.msg import AudioData, AudioDataStamped, AudioInfo

    qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
    latched = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    raw: list[int] = []
    stamped: list[int] = []
    info: list[dict[str, Any]] = []
    client.create_subscription(AudioData, f"{NODE}/audio_common/audio", lambda m: raw.append(len(m.data)), qos)
    client.create_subscription(
        AudioDataStamped, f"{NODE}/audio_common/audio_stamped", lambda m: stamped.append(len(m.audio.data)), qos
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
    answer = run_text(client, args)
    client.spin_until(lambda: info, 10, "the latched AudioInfo")
    client.drain()
    return answer | {"raw": raw, "stamped": stamped, "info": info[-1]}


COMMANDS = {
    "text": run_text,
    "synthesize": run_synthesize,
    "speak": run_speak,
    "params": run_params,
    "diagnostics": run_diagnostics,
    "audio_common": run_audio_common,
}


def main() -> int:
    command, args = sys.argv[1], json.loads(sys.argv[2])
    rclpy.init()
    client = Client()
    try:
        changed = args.get("params", {})
        saved = client.get_params(list(changed)) if changed else {}
        for verdict in client.set_params(list(changed.items())):
            if not verdict["successful"]:
                raise RuntimeError(f"could not set {verdict['name']}: {verdict['reason']}")
        try:
            answer = COMMANDS[command](client, args)
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
