"""Helpers of the ROS tests: a loopback-only network namespace (netns.py), a client (client.py)."""

from __future__ import annotations

import pytest


def require_ros() -> None:
    """Skip unless rclpy and the built moss_tts_msgs import (``make test`` provides both)."""
    pytest.importorskip("rclpy", reason="ROS 2 is not installed: pip install -r requirements-ros.txt")
    try:  # from the repository root, the unbuilt moss_tts_msgs/ folder imports as an empty namespace
        from moss_tts_msgs.msg import AudioChunk  # noqa: F401
    except ImportError:
        pytest.skip("moss_tts_msgs is not built: scripts/build_msgs.sh .venv", allow_module_level=True)
