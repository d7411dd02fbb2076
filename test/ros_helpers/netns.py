"""Run ROS processes of a test inside one loopback-only network namespace.

DDS discovery multicasts, so no test process may start a ROS node on the machine's real
network. A ``LoopbackNamespace`` is a fresh namespace holding only ``lo``, kept open by a
sleeping process; the node and the client processes join it with ``nsenter`` so they can
talk to each other and to nothing else. Needs root (``unshare -n``), as on the CI machine.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

HELPERS = Path(__file__).resolve().parent
CLIENT = HELPERS / "client.py"
SECURITY_CLIENT = HELPERS / "security_client.py"
READY_LINE = "ready: model loaded"
UNCONFIGURED_LINE = "unconfigured, every interface up"  # what a node started with autostart false logs
PLAYING_LINE = "playing /moss_tts_node/audio"  # what the player logs once it subscribes
DAEMON_COMMAND = b"ros2cli.daemon"  # in the command line of the daemon that `ros2` commands start
DAEMON_STOP_S = 5.0
POLL_S = 0.05  # how often a wait looks at what it waits for


def wait_for_line(output: Callable[[], str], line: str, running: Callable[[], bool], what: str, timeout: float) -> None:
    """Wait until ``output()`` holds ``line``; fail with that output if ``what`` stops ``running()`` first, or
    ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while line not in output():
        assert running(), f"{what} ended before it printed {line!r}:\n{output()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} did not print {line!r} within {timeout} s:\n{output()[-3000:]}"
        time.sleep(POLL_S)


def stop_process(
    process: subprocess.Popen[str], signum: int = signal.SIGINT, timeout: float = 30.0, *, to_group: bool = False
) -> int | None:
    """Send ``signum`` (to the process's whole group with ``to_group``) and return the exit code; None when it had
    not ended within ``timeout``: it is killed then, with its group when it leads one (``start_new_session``)."""
    if process.poll() is None:
        if to_group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        process.wait()
        return None


def retry_until(run: Callable[[], str], expected: str, what: str, timeout: float = 60.0) -> str:
    """Run ``run`` until what it prints holds ``expected`` (a ``ros2`` command: the ros2 daemon, started by the first
    command, may not have discovered a fresh node or topic yet); what it printed."""
    deadline = time.monotonic() + timeout
    while True:
        out = run()
        if expected in out or time.monotonic() > deadline:
            assert expected in out, f"`{what}` never printed {expected!r}:\n{out[-3000:]}"
            return out
        time.sleep(0.5)  # between tries of a command that takes about a second itself


def _namespace(pid: int) -> tuple[int, int]:
    """Which network namespace a process is in."""
    info = os.stat(f"/proc/{pid}/ns/net")
    return info.st_dev, info.st_ino


def _end(pid: int) -> None:
    """SIGTERM a process that is not our child and wait for it to end; SIGKILL it if it lingers."""
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + DAEMON_STOP_S
        while _running(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(0.05)
    except ProcessLookupError:
        return


def _running(pid: int) -> bool:
    """Whether the process is still there and not a zombie (its parent, not us, reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


class LoopbackNamespace:
    """A loopback-only network namespace with a ROS domain of its own; close() ends it."""

    def __init__(self, log_dir: Path) -> None:
        self._holder = subprocess.Popen(
            ["unshare", "-n", "sh", "-c", "ip link set lo up && echo up && exec sleep infinity"],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self._holder.stdout is not None
        if self._holder.stdout.readline().strip() != "up":
            self.close()
            raise RuntimeError("could not create a loopback-only network namespace (unshare -n needs root)")
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.env = {
            **os.environ,
            "ROS_DOMAIN_ID": str(random.randint(1, 100)),
            "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
            "ROS_LOG_DIR": str(log_dir / "ros"),
            "PYTHONUNBUFFERED": "1",
        }

    def popen(self, argv: list[str], env: dict[str, str] | None = None, **kwargs: Any) -> subprocess.Popen[str]:
        """Start a process inside the namespace, with ``env`` (which should build on ``self.env``) or ``self.env``."""
        return subprocess.Popen(
            ["nsenter", "-t", str(self._holder.pid), "-n", *argv], env=env or self.env, text=True, **kwargs
        )

    def client(
        self,
        command: str,
        timeout: float = 60.0,
        on_line: Callable[[Any], None] | None = None,
        script: Path = CLIENT,
        **args: Any,
    ) -> Any:
        """Run one client.py command (or one of ``script``'s) in the namespace and return its JSON answer (its
        last line).

        ``on_line`` is given each JSON line as it is printed (progress; the answer last).
        """
        # Errors to a file: a full pipe would block the client while stdout is read. The arguments in a file
        # too: a request may be longer than a command line may be.
        with (
            tempfile.TemporaryFile("w+", dir=self.log_dir) as errors,
            tempfile.NamedTemporaryFile("w", dir=self.log_dir, suffix=".json") as arguments,
        ):
            json.dump(args, arguments)
            arguments.flush()
            process = self.popen(
                [sys.executable, str(script), command, arguments.name], stdout=subprocess.PIPE, stderr=errors
            )
            assert process.stdout is not None
            watchdog = threading.Timer(timeout, process.kill)
            watchdog.start()
            answer = None
            try:
                for line in process.stdout:
                    answer = json.loads(line)
                    if on_line is not None:
                        on_line(answer)
                process.wait()
            finally:
                watchdog.cancel()
            errors.seek(0)
            err = errors.read()
        if process.returncode == -signal.SIGKILL:
            raise AssertionError(f"client {command} timed out after {timeout} s\n{err[-3000:]}")
        if process.returncode != 0 or answer is None:
            raise AssertionError(f"client {command} failed ({process.returncode}):\n{err[-3000:]}")
        return answer

    def ros2(self, *args: str, cwd: Path | None = None, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """The real ``ros2`` command line in the namespace, found as ``source /opt/ros/<distro>/setup.bash`` would
        have it: the venv's bin on PATH and its prefix in AMENT_PREFIX_PATH."""
        env = {
            **self.env,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}",
            "AMENT_PREFIX_PATH": sys.prefix,
        }
        process = self.popen(["ros2", *args], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out)

    def close(self) -> None:
        """End the ros2 daemon a ``ros2`` command started here (it outlives the command), then the namespace."""
        if self._holder.poll() is None:
            for pid in self._ros2_daemons():
                _end(pid)
            os.killpg(self._holder.pid, signal.SIGKILL)
        self._holder.wait()

    def _ros2_daemons(self) -> list[int]:
        """The pids of the ros2 daemons in this namespace: processes that joined it and run ros2cli's daemon."""
        mine = _namespace(self._holder.pid)
        daemons = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if _namespace(int(entry.name)) == mine and DAEMON_COMMAND in (entry / "cmdline").read_bytes():
                    daemons.append(int(entry.name))
            except OSError:  # it ended meanwhile, or is not ours to read
                continue
        return daemons


def loopback_namespace(log_dir: Path) -> LoopbackNamespace:
    """A LoopbackNamespace, or skip the test where none can be made (``unshare -n`` needs root)."""
    try:
        return LoopbackNamespace(log_dir)
    except (RuntimeError, OSError) as err:
        pytest.skip(f"no loopback-only network namespace here: {err}")


class NodeProcess:
    """``python -m moss_tts_node.ros.main`` (the node's executable) in a namespace, its output kept in a log file."""

    def __init__(self, netns: LoopbackNamespace, ros_args: list[str], name: str = "node", cwd: Path | None = None):
        # What it logs once up: it serves, or (autostart false) it waits unconfigured for a lifecycle manager.
        self.up_line = UNCONFIGURED_LINE if "autostart:=false" in ros_args else READY_LINE
        self.log = netns.log_dir / f"{name}.log"
        self._log_file = self.log.open("w")
        self.process = netns.popen(
            [sys.executable, "-m", "moss_tts_node.ros.main", "--ros-args", *ros_args],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text()

    def rss_kib(self) -> int:
        """The node's resident memory, from /proc/PID/status."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError(f"no VmRSS for process {self.process.pid}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the node is up: it serves, or (autostart false) waits unconfigured."""
        wait_for_line(self.output, self.up_line, lambda: self.process.poll() is None, "the node", timeout)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self._log_file.close()

    def stop(self, signum: int = signal.SIGINT, timeout: float = 30.0) -> int:
        """Send ``signum`` and return the exit code; kills the process if it hangs."""
        code = stop_process(self.process, signum, timeout)
        self._log_file.close()
        if code is None:
            raise AssertionError(f"the node did not stop within {timeout} s:\n{self.output()}")
        return code


@contextmanager
def serving(netns: LoopbackNamespace, ros_args: list[str], name: str = "node") -> Iterator[NodeProcess]:
    """A node started with ``ros_args``, once it is up (``NodeProcess.wait_ready``); stopped after the block."""
    node = NodeProcess(netns, ros_args, name)
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()


@contextmanager
def playing(
    netns: LoopbackNamespace, log: Path, *ros_args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """The player (``moss_tts_player``) in the namespace, its output in ``log``, once it subscribes to the node's
    audio; after the block, Ctrl-C, from which it must exit 0."""
    with log.open("w") as out:
        player = netns.popen(
            [sys.executable, "-m", "moss_tts_node.ros.player", *(["--ros-args", *ros_args] if ros_args else [])],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_line(log.read_text, PLAYING_LINE, lambda: player.poll() is None, "the player", 60.0)
        yield player
    finally:
        assert stop_process(player) == 0, log.read_text()


def played_by_the_player(netns: LoopbackNamespace, sink: Any, tmp_path: Path, text: str) -> tuple[Any, Any, Path]:
    """``text`` spoken on ~/text while the player runs into ``sink`` (conftest's NullSink), with a prebuffer longer
    than the utterance, so that it plays once whole however slow the node is here: what the node sent (channels
    interleaved, as the chunks carried it), what the sink recorded, and the player's log."""
    import numpy as np

    from ros_helpers import wait_played

    log = tmp_path / "player.log"
    env = {**netns.env, "PULSE_SERVER": sink.env["PULSE_SERVER"]}
    with playing(netns, log, "-p", "prebuffer_s:=60.0", env=env) as player:
        sent_file = tmp_path / "sent.npy"
        with sink.recording(tmp_path / "sink.raw") as captured:
            netns.client("text", texts=[text], save=str(sent_file), other_listeners=1)
            sent = np.load(sent_file)
            wait_played(tmp_path / "sink.raw", sent.size, player, log)  # until it has all played
    return sent, captured[0], log
