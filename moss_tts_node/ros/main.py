"""The ``moss_tts_node`` executable: start the node, serve until SIGINT, SIGTERM or the shutdown transition, then
shut down in order.

    ros2 run moss_tts_node moss_tts_node --ros-args --params-file config/default.yaml

The node (ros/node.py) runs on a multi-threaded executor spun by a thread of its own, while the main thread
waits for a reason to stop (ros/process.py).
"""

from __future__ import annotations

# First: one malloc heap for the process, set before rclpy (imported below) starts its threads (see heap.py).
import moss_tts_node.ros.heap  # noqa: F401

# isort: split
import sys
import threading
import time
from collections.abc import Sequence

import rclpy
from rclpy.exceptions import ParameterException
from rclpy.executors import MultiThreadedExecutor

from moss_tts_node.config import NODE_NAME
from moss_tts_node.errors import MossTTSError
from moss_tts_node.ros.launch_params import START_FAILURE
from moss_tts_node.ros.node import TtsNode
from moss_tts_node.ros.process import start_node, wait_for_stop

# After the shutdown transition: time for the executor and DDS to deliver the last answers (and the
# transition's own response, when it was asked for over ROS).
SHUTDOWN_FLUSH_S = 0.5


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
