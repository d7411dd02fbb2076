"""Helpers of the ROS tests: a loopback-only network namespace (netns.py), a client (client.py)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moss_tts_node.model.rates import SAMPLE_RATE as SAMPLE_RATE_HZ

PARAMS_FILE_SEED = 5  # the sampling.seed of conftest's params_file, for a test to find


def require_ros() -> None:
    """Skip unless rclpy and the built moss_tts_msgs import (``make test`` provides both)."""
    pytest.importorskip("rclpy", reason="ROS 2 is not installed: pip install -r requirements-ros.txt")
    try:  # from the repository root, the unbuilt moss_tts_msgs/ folder imports as an empty namespace
        from moss_tts_msgs.msg import AudioChunk  # noqa: F401
    except ImportError:
        pytest.skip("moss_tts_msgs is not built: scripts/build_msgs.sh .venv", allow_module_level=True)


def node_params_file(demo_config: Path, path: Path, **values: Any) -> Path:
    """The demo config as a node params file at ``path``, with absolute paths (``ros2 run --params-file`` takes
    relative ones from its working directory) and ``values`` (dotted keys) over it."""
    from moss_tts_node.config import flatten, load_config, write_params_file

    write_params_file(path, dict(flatten(load_config(demo_config))) | values)
    return path


def parameter_values(demo_config: Path, **changes: Any) -> dict[str, Any]:
    """A value for every parameter of the node: the demo config's, the node options' defaults, then ``changes``
    (``__`` for the dots of a key)."""
    from moss_tts_node.config import flatten, load_config
    from moss_tts_node.ros.parameters import NODE_OPTIONS

    values: dict[str, Any] = dict(flatten(load_config(demo_config)))
    values |= {o.key: o.default for o in NODE_OPTIONS}
    return values | {key.replace("__", "."): value for key, value in changes.items()}


def played_span(raw: Path) -> int:
    """Samples from the first to the last that is not silence, in a float32 recording."""
    loud = np.flatnonzero(np.abs(np.fromfile(raw, dtype="<f4")) > 1e-4)
    return int(loud[-1] - loud[0] + 1) if loud.size else 0


def wait_played(raw: Path, samples: int, player: subprocess.Popen[str], log: Path, timeout: float = 60.0) -> None:
    """Wait until the recording ``raw`` spans ``samples`` of played sound (less 10 ms, the quiet edges of speech),
    failing with the player's log if the player dies or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while played_span(raw) < samples - SAMPLE_RATE_HZ // 100:
        assert player.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"played {played_span(raw)} of {samples} samples:\n{log.read_text()}"
        time.sleep(0.1)
