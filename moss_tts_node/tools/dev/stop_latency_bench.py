"""How fast ``~/stop`` silences the robot: the node, ``moss_tts_player`` and a PulseAudio null sink, measured.

Run by hand, not in CI, as root (PulseAudio and the network rule) inside a loopback-only network namespace:

    unshare -n sh -c 'ip link set lo up && ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST ROS_DOMAIN_ID=42 \\
        .venv/bin/python -m moss_tts_node.tools.dev.stop_latency_bench --params node.yaml --tries 20'

``--params`` is a node params file (absolute paths, as ``ros2 run --params-file`` takes them). The bench starts
a private PulseAudio server whose default output is a null sink, the node (every request made long: greedy
text, 8000 steps, so it speaks until stopped) and the player (``prebuffer_s`` at its default) playing into the
sink, and records the sink's monitor with ``parec``. Then, ``--tries`` times for each kind of request (a Speak
goal, a ``~/text`` message, a ``~/text_stream`` stream), it starts one, waits until the sink plays it, calls the
``~/stop`` service, and measures from the call:

- to the stop's final chunk published (its header stamp, the node's clock: the same system clock here);
- to the sink's last sound: the last sample above silence in the monitor's recording, placed in time by when
  ``parec`` delivered it (a sample is played no later than it is delivered; the earliest delivery sets the
  offset). The player aborts its output on the final chunk, which drops what the device had buffered, so this
  is when its last write stops sounding.

Prints the median and worst of each, by kind.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

RATE = 24000  # the sink's rate: the codec's
SILENCE = 1e-4  # a sample above this is sound
LONG = ("-p", "sampling.text_temperature:=0.0", "-p", "generation.max_new_tokens:=8000")
KINDS = ("goal", "text", "stream")
PLAYING_S = 0.6  # what the sink must have played of an utterance before it is stopped
AFTER_S = 0.6  # recorded after the stop's final chunk, for the last sound to arrive
WAIT_S = 60.0


class SinkRecording:
    """``parec`` of the null sink's monitor, read as it comes: the samples, and when each read returned."""

    def __init__(self, env: dict[str, str], sink: str) -> None:
        self._process = subprocess.Popen(
            [
                "parec",
                "-d",
                f"{sink}.monitor",
                "--raw",
                "--format=float32le",
                f"--rate={RATE}",
                "--channels=1",
                "--latency-msec=10",
            ],
            env=env,
            stdout=subprocess.PIPE,
        )
        self._lock = threading.Lock()
        self._parts: list[np.ndarray] = []
        self.samples = 0
        self.offset = float("inf")  # monotonic time of sample 0, the earliest any delivery allows
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        pending = b""
        while chunk := self._process.stdout.read1(4096):
            now = time.monotonic()
            pending += chunk
            whole = len(pending) // 4 * 4
            samples = np.frombuffer(pending[:whole], "<f4")
            pending = pending[whole:]
            with self._lock:
                self._parts.append(samples)
                self.samples += samples.size
                self.offset = min(self.offset, now - self.samples / RATE)

    def loud_since(self, start: float) -> float | None:
        """The monotonic time of the last sound after ``start``, None if none."""
        with self._lock:
            audio = np.concatenate(self._parts) if self._parts else np.empty(0, np.float32)
            offset = self.offset
        first = max(0, int((start - offset) * RATE))
        loud = np.flatnonzero(np.abs(audio[first:]) > SILENCE)
        return None if loud.size == 0 else offset + (first + loud[-1]) / RATE

    def playing(self, seconds: float) -> bool:
        """Whether the last ``seconds`` recorded were sound throughout."""
        with self._lock:
            recent = np.concatenate(self._parts[-64:]) if self._parts else np.empty(0, np.float32)
        tail = recent[-int(seconds * RATE) :]
        return tail.size >= int(seconds * RATE) and bool((np.abs(tail) > SILENCE).mean() > 0.5)

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(10)


def _wait(condition: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"stop_latency_bench: timed out waiting for {what}")
        time.sleep(0.005)


def _check_network() -> None:
    interfaces = {name for _, name in socket.if_nameindex()}  # this network namespace's
    if interfaces != {"lo"} or os.environ.get("ROS_AUTOMATIC_DISCOVERY_RANGE") != "LOCALHOST":
        raise SystemExit(
            "stop_latency_bench starts ROS nodes: run it in a loopback-only network namespace with "
            "ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST (see this module's docstring); interfaces here: "
            + ", ".join(sorted(interfaces))
        )


def _start_pulse(folder: Path) -> tuple[subprocess.Popen[bytes], dict[str, str], str]:
    sink = "moss_bench"
    socket = folder / "native"
    env = {**os.environ, "PULSE_SERVER": f"unix:{socket}"}
    server = subprocess.Popen(
        [
            "pulseaudio",
            "-n",
            "--daemonize=no",
            "--exit-idle-time=-1",
            "--disallow-exit",
            "--use-pid-file=no",
            "-L",
            f"module-native-protocol-unix socket={socket} auth-anonymous=1",
            "-L",
            f"module-null-sink sink_name={sink} rate={RATE} channels=1",
        ],
        env={**os.environ, "HOME": str(folder), "XDG_RUNTIME_DIR": str(folder)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _wait(lambda: subprocess.run(["pactl", "info"], env=env, capture_output=True).returncode == 0, "PulseAudio", 20)
    return server, env, sink


def _start(argv: list[str], log: Path, env: dict[str, str], line: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    _wait(lambda: line in log.read_text(errors="replace") or process.poll() is not None, f"{log.name}: {line!r}")
    if process.poll() is not None:
        raise SystemExit(f"stop_latency_bench: {argv[2]} ended:\n{log.read_text()[-3000:]}")
    return process


class Bench:
    """The bench's ROS side: a client of the node that starts requests, calls ~/stop and hears ~/audio."""

    def __init__(self) -> None:
        import rclpy
        from moss_tts_msgs.action import Speak
        from moss_tts_msgs.msg import AudioChunk, TextChunk
        from rclpy.action import ActionClient
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from std_msgs.msg import String
        from std_srvs.srv import Trigger

        rclpy.init()
        self._rclpy = rclpy
        self.node = rclpy.create_node("moss_tts_stop_bench")
        self._Speak, self._TextChunk, self._String, self._Trigger = Speak, TextChunk, String, Trigger
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.finals: dict[str, tuple[str, float]] = {}  # request id -> (end reason, header stamp, s since epoch)
        self.chunks: dict[str, int] = {}  # chunks heard, by request id
        self._lock = threading.Lock()
        self.node.create_subscription(AudioChunk, "/moss_tts_node/audio", self._on_chunk, qos)
        self.action = ActionClient(self.node, Speak, "/moss_tts_node/speak")
        self.stop = self.node.create_client(Trigger, "/moss_tts_node/stop")
        self.text = self.node.create_publisher(String, "/moss_tts_node/text", qos)
        self.stream = self.node.create_publisher(TextChunk, "/moss_tts_node/text_stream", qos)
        self._spinner = threading.Thread(target=rclpy.spin, args=(self.node,), daemon=True)
        self._spinner.start()
        _wait(lambda: self.action.server_is_ready() and self.stop.service_is_ready(), "the node's interfaces")
        _wait(lambda: self.text.get_subscription_count() > 0 and self.stream.get_subscription_count() > 0, "topics")
        _wait(lambda: self.node.count_subscribers("/moss_tts_node/audio") >= 2, "the player's subscription")

    def _on_chunk(self, msg: Any) -> None:
        with self._lock:
            self.chunks[msg.request_id] = self.chunks.get(msg.request_id, 0) + 1
            if msg.is_final:
                self.finals[msg.request_id] = (msg.end_reason, msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9)

    def heard(self) -> set[str]:
        """The request ids heard on ~/audio so far."""
        with self._lock:
            return set(self.chunks)

    def newest(self, known: set[str]) -> str | None:
        """The first request id heard that is not in ``known``."""
        with self._lock:
            fresh = [key for key in self.chunks if key not in known]
        return fresh[0] if fresh else None

    def start(self, kind: str, number: int) -> str | None:
        """Start a request; its id when the bench knows it in advance (a goal's, a stream's)."""
        text = f"Stop latency, try {number}."
        if kind == "goal":
            sent = self.action.send_goal_async(self._Speak.Goal(text=text))
            _wait(sent.done, "the goal's acceptance")
            return bytes(sent.result().goal_id.uuid).hex()
        if kind == "text":
            self.text.publish(self._String(data=text))
            return None
        stream_id = f"stop-bench-{number}-{time.monotonic_ns()}"
        self.stream.publish(self._TextChunk(stream_id=stream_id, text=text, final=True))
        return stream_id

    def call_stop(self) -> str:
        answer = self.stop.call_async(self._Trigger.Request())
        _wait(answer.done, "the stop's answer")
        return answer.result().message

    def close(self) -> None:
        self.node.destroy_node()
        self._rclpy.try_shutdown()


def _stop_once(bench: Bench, recording: SinkRecording, kind: str, number: int) -> tuple[float, float]:
    """Start a request of ``kind``, stop it once the sink plays it; seconds from the stop call to its final chunk
    published and to the sink's last sound."""
    known = bench.heard()
    given = bench.start(kind, number)
    _wait(lambda: (given or bench.newest(known)) is not None, "the request's audio")
    key = given or bench.newest(known)
    assert key is not None
    _wait(lambda: recording.playing(PLAYING_S), "the sink to play it")
    asked_wall, asked = time.time(), time.monotonic()
    answer = bench.call_stop()
    _wait(lambda: key in bench.finals, "the stop's final chunk")
    reason, stamp = bench.finals[key]
    if reason != "stop" or not answer.startswith("stopped"):
        raise SystemExit(f"stop_latency_bench: {kind} try {number}: {answer!r}, final chunk {reason!r}")
    time.sleep(AFTER_S)
    last = recording.loud_since(asked)
    _wait(lambda: not recording.playing(0.05), "silence before the next try")
    return stamp - asked_wall, 0.0 if last is None else max(0.0, last - asked)


def _figures(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:6.1f} ms, worst {max(values) * 1000:6.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, required=True, help="the node's params file (absolute paths)")
    parser.add_argument("--tries", type=int, default=20, help="stops of each kind of request")
    parser.add_argument("--kinds", default=",".join(KINDS), help="goal, text, stream; comma-separated")
    args = parser.parse_args(argv)
    _check_network()
    folder = Path(tempfile.mkdtemp(prefix="stop-bench-"))
    pulse, env, sink = _start_pulse(folder)
    env |= {"ROS_LOG_DIR": str(folder / "ros"), "PYTHONUNBUFFERED": "1"}
    processes: list[subprocess.Popen[bytes]] = []
    recording: SinkRecording | None = None
    bench: Bench | None = None
    try:
        node_argv = [sys.executable, "-m", "moss_tts_node.ros.main", "--ros-args", "--params-file", str(args.params)]
        processes.append(_start([*node_argv, *LONG], folder / "node.log", env, "ready: model loaded"))
        player_argv = [sys.executable, "-m", "moss_tts_node.ros.player"]
        processes.append(_start(player_argv, folder / "player.log", env, "playing /moss_tts_node/audio"))
        recording = SinkRecording(env, sink)
        bench = Bench()
        for kind in args.kinds.split(","):
            published, silent = [], []
            for number in range(args.tries):
                to_final, to_silence = _stop_once(bench, recording, kind, number)
                published.append(to_final)
                silent.append(to_silence)
            print(f"{kind:6} stop call -> final chunk published: {_figures(published)}")
            print(f"{kind:6} stop call -> sink's last sound:      {_figures(silent)}  ({args.tries} tries)")
    finally:
        if bench is not None:
            bench.close()
        if recording is not None:
            recording.close()
        for process in reversed(processes):
            process.send_signal(signal.SIGINT)
            process.wait(30)
        pulse.terminate()
        pulse.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
