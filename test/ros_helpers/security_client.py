"""A hostile or curious ROS client of moss_tts_node, for test_ros_security.py: ``security_client.py COMMAND
ARGUMENTS_FILE`` (a JSON object).

Like client.py (whose ``Client`` it uses), it plays one scenario and prints one JSON line. Commands:

- ``graph``     the node's topics, services and actions as DDS names (what an SROS2 permissions file grants)
- ``voices``    call ~/list_voices
- ``requests``  send requests one after another (``via`` synthesize or speak, any fields), collect the answers
- ``order``     a request whose check takes long, then a parameter change, a bad request, a goal and its
                cancel, and diagnostics: when each was answered, and when the long one first spoke
"""

from __future__ import annotations

import sys
import time
from typing import Any

import rclpy
from client import MATCH_TIMEOUT, NODE, Client, main, request_message
from diagnostic_msgs.msg import DiagnosticArray
from moss_tts_msgs.action import Speak
from moss_tts_msgs.srv import ListVoices, Synthesize
from rclpy.action import ActionClient, get_action_server_names_and_types_by_node
from rclpy.parameter import Parameter
from std_msgs.msg import String


def run_graph(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """What the node ``args["node"]`` (in /) reads, writes, serves and calls, once the services and topics of
    ``args["expect"]`` are among them."""
    name = args["node"]

    def seen() -> dict[str, Any] | None:
        if (name, "/") not in client.get_node_names_and_namespaces():
            return None
        graph = {
            "publish": sorted(topic for topic, _ in client.get_publisher_names_and_types_by_node(name, "/")),
            "subscribe": sorted(topic for topic, _ in client.get_subscriber_names_and_types_by_node(name, "/")),
            "services": sorted(service for service, _ in client.get_service_names_and_types_by_node(name, "/")),
            "clients": sorted(service for service, _ in client.get_client_names_and_types_by_node(name, "/")),
            "actions": sorted(action for action, _ in get_action_server_names_and_types_by_node(client, name, "/")),
        }
        everything = {entry for entries in graph.values() for entry in entries}
        return graph if set(args["expect"]) <= everything else None

    # The graph fills in as discovery goes on: take it once two looks half a second apart agree.
    deadline = time.monotonic() + MATCH_TIMEOUT
    graph = None
    while time.monotonic() < deadline:
        again = seen()
        if again is not None and again == graph:
            return graph
        graph = again
        pause = time.monotonic() + 0.5
        while time.monotonic() < pause:
            rclpy.spin_once(client, timeout_sec=0.05)
    raise TimeoutError(f"the node's graph did not settle: {graph}")


def run_voices(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    service = client.create_client(ListVoices, f"{NODE}/list_voices")
    if not service.wait_for_service(MATCH_TIMEOUT):
        raise TimeoutError("~/list_voices did not appear")
    response = client.result(service.call_async(ListVoices.Request()), 10, "the voices")
    fields = ("name", "kind", "duration", "is_default", "has_transcript")
    voices = [{field: getattr(voice, field) for field in fields} for voice in response.voices]
    return {"success": response.success, "message": response.message, "voices": voices}


def run_requests(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Each request answered before the next is sent: ``{"via": "synthesize" | "speak", fields...}``."""
    service = client.create_client(Synthesize, f"{NODE}/synthesize")
    action = ActionClient(client, Speak, f"{NODE}/speak")
    if not service.wait_for_service(MATCH_TIMEOUT) or not action.wait_for_server(MATCH_TIMEOUT):
        raise TimeoutError("~/synthesize or ~/speak did not appear")
    timeout = args.get("timeout", 60)
    answers = []
    for request in args["requests"]:
        if request["via"] == "synthesize":
            call = service.call_async(request_message(request, Synthesize.Request(), ("via",)))
            response = client.result(call, timeout, "a reply")
            answers.append(
                {
                    "success": response.success,
                    "message": response.message,
                    "duration": response.duration,
                    "bytes": len(response.audio),
                    "stop_reason": response.timing.stop_reason,
                    "prompt_rows": response.timing.prompt_rows,
                }
            )
        else:
            sent = action.send_goal_async(request_message(request, Speak.Goal(), ("via",)))
            handle = client.result(sent, 10, "goal acceptance")
            result = client.result(handle.get_result_async(), timeout, "a result")
            answers.append(
                {
                    "success": result.result.success,
                    "message": result.result.message,
                    "status": result.status,
                    "duration": result.result.duration,
                    "stop_reason": result.result.timing.stop_reason,
                    "prompt_rows": result.result.timing.prompt_rows,
                }
            )
    return {"answers": answers}


def run_order(client: Client, args: dict[str, Any]) -> dict[str, Any]:
    """Send a long text (``unit`` ``times`` over: a text whose check takes seconds; too long for a command
    line) on ~/text, then at once: a parameter change, a request refused by its fields, a goal and its cancel,
    and listen to /diagnostics. Returns when each was answered (the system's monotonic clock) and when the
    long text's first chunk arrived."""
    text = client.create_publisher(String, f"{NODE}/text", 10)
    service = client.create_client(Synthesize, f"{NODE}/synthesize")
    action = ActionClient(client, Speak, f"{NODE}/speak")
    params = client.param_client()
    if not service.wait_for_service(MATCH_TIMEOUT) or not action.wait_for_server(MATCH_TIMEOUT):
        raise TimeoutError("~/synthesize or ~/speak did not appear")
    client.spin_until(lambda: text.get_subscription_count() > 0, MATCH_TIMEOUT, "the ~/text subscriber")
    client.wait_audio_matched()
    diagnostics: list[float] = []
    client.create_subscription(DiagnosticArray, "/diagnostics", lambda _: diagnostics.append(client.now()), 10)
    client.spin_until(lambda: bool(diagnostics), MATCH_TIMEOUT, "diagnostics")  # matched, and publishing

    answered: dict[str, float] = {}

    def when(name: str) -> Any:
        return lambda _future: answered.setdefault(name, client.now())

    sent = client.now()
    text.publish(String(data=args["unit"] * args["times"]))
    params.set_parameters([Parameter("sampling.seed", value=11)]).add_done_callback(when("parameter"))
    bad = service.call_async(Synthesize.Request(text="Hello.", seed=-5))
    bad.add_done_callback(when("bad request"))
    goal_future = action.send_goal_async(Speak.Goal(text="A goal cancelled at once."))
    client.spin_until(goal_future.done, 10, "goal acceptance")
    answered["goal accepted"] = client.now()
    cancel = goal_future.result().cancel_goal_async()
    cancel.add_done_callback(when("cancel"))
    client.spin_until(lambda: len(answered) == 4, 60, "every answer")
    # The long text's chunks: not the goal's (spoken, it ends with a final chunk that says it was canceled).
    goal_id = bytes(goal_future.result().goal_id.uuid).hex()

    def long_text() -> list[float]:
        return [c["received"] for c in client.chunks if c["request_id"] != goal_id]

    client.spin_until(lambda: bool(long_text()), args.get("timeout", 120), "the long text")
    first_chunk = min(long_text())
    return {
        "sent": sent,
        "answered": answered,
        "bad_request": bad.result().message,
        "diagnostics": [t for t in diagnostics if sent < t < first_chunk],
        "first_chunk": first_chunk,
    }


COMMANDS = {"graph": run_graph, "voices": run_voices, "requests": run_requests, "order": run_order}


if __name__ == "__main__":
    sys.exit(main(COMMANDS))
