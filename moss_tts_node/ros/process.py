"""What every executable of this package does around its node: start it, or say why it cannot, then wait
for SIGINT or SIGTERM (or another reason to stop) and let the caller shut down in order.

rclpy's own signal handlers would shut the context down at once, before a node could finish what it holds
(the requests in line, the audio queued for the speaker); these only set an event the main thread waits on.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import rclpy
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from moss_tts_node.errors import EXIT_BAD_INPUT

SIGNAL_POLL_S = 0.1
_Node = TypeVar("_Node", bound=Node)


def start_node(
    args: Sequence[str] | None,
    make: Callable[[], _Node],
    logger_name: str,
    failure_prefix: str,
    failures: tuple[type[BaseException], ...],
) -> tuple[_Node, threading.Event] | int:
    """``rclpy.init`` with signals that set the returned event, then the node ``make`` builds; when that
    raises one of ``failures``, or rcl cannot create the node, the reason is logged after ``failure_prefix``
    and the exit code is returned."""
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        return make(), stop
    except failures as err:
        reason = str(err)
    # e.g. ROS_SECURITY_ENABLE with a DDS built without security (docs/security.md, "SROS2")
    except _rclpy.RCLError as err:
        reason = f"rcl could not create the node: {err}"
    rclpy.logging.get_logger(logger_name).error(f"{failure_prefix}{reason}")
    rclpy.try_shutdown()
    return EXIT_BAD_INPUT


def wait_for_stop(*events: threading.Event) -> None:
    """Block until one of ``events`` is set. The kernel may hand a signal to any thread, and Python runs its
    handler in the main thread only when that thread next runs bytecode, so wait in short slices rather than
    block."""
    while not any(event.wait(SIGNAL_POLL_S / len(events)) for event in events):
        pass
