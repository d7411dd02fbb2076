"""The ROS 2 route of docs/install.md, run as a user would: colcon builds a workspace (plain and
--symlink-install), and the real ``ros2`` command line talks to the node started from that install space.

Every command a user types here is a line of the user's docs (README.md, docs/install.md, docs/ros.md: checked
first), with their placeholders
(``/path/to/...``) replaced by this run's files. The ``ros2`` CLI, launch and launch_ros are not on PyPI:
``make test`` installs them from ``../shared/ros2cli/`` when that folder is there, else these tests skip.
``source /opt/ros/<distro>/setup.bash`` is stood in for by the venv's bin on PATH and AMENT_PREFIX_PATH.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from ros_helpers import node_params_file, require_ros
from ros_helpers.netns import (
    READY_LINE,
    UNCONFIGURED_LINE,
    LoopbackNamespace,
    retry_until,
    stop_process,
    wait_for_line,
)

ROOT = Path(__file__).resolve().parent.parent
# Where README sends a user for the install route and the node.
USER_DOCS = {page: (ROOT / page).read_text() for page in ("README.md", "docs/install.md", "docs/ros.md")}
PARAMS_PLACEHOLDER = "/path/to/my.yaml"
CONFIG_PLACEHOLDER = "/path/to/config.yaml"
SPEECH_PLACEHOLDER = "/path/to/speech.yaml"  # the params files of two nodes in one launch
SOUNDS_PLACEHOLDER = "/path/to/sounds.yaml"
NANO_PLACEHOLDER = "/path/to/nano.yaml"  # a params file of MOSS-TTS-Nano's
COPY_IGNORE = shutil.ignore_patterns(
    ".git", ".venv*", "build", "install", "log", "demo_weights", "__pycache__", "*.egg-info", ".*_cache"
)

# What the docs tell a user to type, in the order used here.
BUILD = "python3 -m colcon build"
BUILD_SYMLINK = "python3 -m colcon build --symlink-install"
LINK_MSGS = "ln -s moss_tts_node/moss_tts_msgs src/moss_tts_msgs"
DOCTOR = f"ros2 run moss_tts_node moss_tts doctor --config {CONFIG_PLACEHOLDER}"
LAUNCH = f"ros2 launch moss_tts_node moss_tts.launch.py params_file:={PARAMS_PLACEHOLDER}"
LAUNCH_IN_NAMESPACE = f"{LAUNCH} namespace:=robot1"
LAUNCH_SHIPPED = "ros2 launch moss_tts_node moss_tts.launch.py config:=cpu_only"
LAUNCH_UNMANAGED = f"{LAUNCH} autostart:=false"
LIFECYCLE_GET = "ros2 lifecycle get /moss_tts_node"
LIFECYCLE_SET = "ros2 lifecycle set /moss_tts_node {}"
TOPIC_PUB = "ros2 topic pub --once /moss_tts_node/text std_msgs/msg/String \"{data: 'Hello, I am a robot.'}\""
SERVICE_CALL = "ros2 service call /moss_tts_node/synthesize moss_tts_msgs/srv/Synthesize \"{text: 'Hello'}\""
SERVICE_CALL_IN_NAMESPACE = SERVICE_CALL.replace("/moss_tts_node/", "/robot1/moss_tts_node/")
SEND_GOAL = (
    "ros2 action send_goal --feedback /moss_tts_node/speak moss_tts_msgs/action/Speak \"{text: 'Hello', language: en}\""
)
PARAM_SET = "ros2 param set /moss_tts_node queue_policy interrupt"
LAUNCH_TWO_NODES = (
    f"ros2 launch moss_tts_node voice_and_sounds.launch.py speech_params_file:={SPEECH_PLACEHOLDER} "
    f"sounds_params_file:={SOUNDS_PLACEHOLDER}"
)
SEND_GOAL_TO_SPEECH = (
    "ros2 action send_goal /speech/moss_tts_node/speak moss_tts_msgs/action/Speak \"{text: 'It is raining.'}\""
)
SOUND_CALL = (
    "ros2 service call /sounds/moss_tts_node/synthesize moss_tts_msgs/srv/Synthesize "
    "\"{ambient_sound: 'rain on a tin roof', tokens: 125}\""
)
DIAGNOSTICS = "ros2 topic echo --once /diagnostics"
LAUNCH_NANO = f"ros2 launch moss_tts_node moss_tts.launch.py params_file:={NANO_PLACEHOLDER}"
SEND_GOAL_NANO = "ros2 action send_goal --feedback /moss_tts_node/speak moss_tts_msgs/action/Speak \"{text: 'Hello'}\""
USER_COMMANDS = (
    LINK_MSGS,
    BUILD,
    BUILD_SYMLINK,
    DOCTOR,
    LAUNCH,
    LAUNCH_IN_NAMESPACE,
    LAUNCH_SHIPPED,
    TOPIC_PUB,
    SERVICE_CALL,
    SERVICE_CALL_IN_NAMESPACE,
    SEND_GOAL,
    PARAM_SET,
    DIAGNOSTICS,
    LAUNCH_TWO_NODES,
    SEND_GOAL_TO_SPEECH,
    SOUND_CALL,
    LAUNCH_NANO,
    SEND_GOAL_NANO,
    LAUNCH_UNMANAGED,
    LIFECYCLE_GET,
    *(LIFECYCLE_SET.format(transition) for transition in ("configure", "activate", "shutdown")),
)


def test_every_command_run_here_is_in_the_docs() -> None:
    missing = [command for command in USER_COMMANDS if not any(command in text for text in USER_DOCS.values())]
    assert not missing, f"{', '.join(USER_DOCS)} do not give these commands as the tests run them: {missing}"


def require_ros2_cli() -> None:
    require_ros()
    for module, what in (("ros2cli", "the ros2 CLI"), ("launch_ros", "launch_ros"), ("colcon_core", "colcon")):
        if importlib.util.find_spec(module) is None:
            pytest.skip(
                f"{what} is not installed for {sys.executable}: `make test` installs the ros2 CLI from "
                "../shared/ros2cli/ when present, and colcon-common-extensions from requirements-ros.txt"
            )


class Workspace:
    """A colcon workspace holding a copy of this repository, as the docs' clone gives, with a user's shell."""

    def __init__(self, root: Path, netns: LoopbackNamespace) -> None:
        self.root = root
        self.netns = netns
        shutil.copytree(ROOT, root / "src" / "moss_tts_node", ignore=COPY_IGNORE)
        self.cache = root / "cache"  # a fresh bridge cache: the node must compile the bridge it finds
        self.env = {
            **{k: v for k, v in netns.env.items() if k != "PYTHONPATH"},  # the install space, not this checkout
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "AMENT_PREFIX_PATH": sys.prefix,  # what `source /opt/ros/<distro>/setup.bash` sets
            "CMAKE_PREFIX_PATH": sys.prefix,
            "XDG_CACHE_HOME": str(self.cache),
        }

    def _argv(self, command: str) -> list[str]:
        setup = self.root / "install" / "setup.bash"
        return ["bash", "-c", f"source {setup} && {command}" if setup.is_file() else command]

    def run(self, command: str, timeout: float = 120.0) -> str:
        """Run a user's command in the workspace, inside the loopback-only namespace; return what it printed."""
        process = self.netns.popen(
            self._argv(command), cwd=self.root, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            raise AssertionError(f"`{command}` timed out after {timeout} s:\n{out[-3000:]}") from None
        assert process.returncode == 0, f"`{command}` exited with {process.returncode}:\n{out[-3000:]}"
        return out

    def retry(self, command: str, expected: str) -> str:
        """Run until the output has ``expected`` (``retry_until``); what it printed."""

        def run() -> str:
            process = self.netns.popen(
                self._argv(command), cwd=self.root, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            return process.communicate(timeout=60)[0]

        return retry_until(run, expected, command)

    def build(self, command: str) -> None:
        (self.root / "src" / "moss_tts_msgs").symlink_to(Path("moss_tts_node") / "moss_tts_msgs")  # LINK_MSGS
        out = self.run(command, timeout=900)
        assert "2 packages finished" in out, out[-3000:]

    def launch(self, command: str) -> Launch:
        return Launch(self, command)


class Launch:
    """``ros2 launch`` in the background, its output in a log file; stop() is Ctrl-C to its process group."""

    def __init__(self, workspace: Workspace, command: str) -> None:
        self.log = workspace.root / f"launch-{time.monotonic_ns()}.log"
        self._log_file = self.log.open("w")
        self.process = workspace.netns.popen(
            workspace._argv(f"exec {command}"),
            cwd=workspace.root,
            env=workspace.env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text()

    def wait_ready(self, timeout: float = 120.0, line: str = READY_LINE) -> None:
        wait_for_line(self.output, line, lambda: self.process.poll() is None, "the launch", timeout)

    def wait(self, timeout: float = 60.0) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self._log_file.close()

    def stop(self) -> int:
        """SIGINT to the whole group (a background launch ignores a SIGINT to itself alone); kill if it hangs."""
        code = stop_process(self.process, timeout=60, to_group=True)
        self._log_file.close()
        if code is None:
            raise AssertionError(f"ros2 launch did not stop within 60 s:\n{self.output()}")
        return code


@pytest.fixture(scope="module", autouse=True)
def ros2_cli() -> None:
    """Every test here runs the ros2 CLI and colcon: they skip, before any namespace is made, where those are not."""
    require_ros2_cli()


@pytest.fixture(scope="module")
def user_files(
    demo_config: Path,
    params_file: Path,
    family_demo: Callable[[str], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, str]:
    """The docs' placeholders -> the demo model's config and a node params file for it; for two nodes, that file
    and one of the MOSS-SoundEffect demo; for Nano, one of the MOSS-TTS-Nano demo."""
    folder = tmp_path_factory.mktemp("params")
    sounds_params = node_params_file(family_demo("sound-effect"), folder / "sounds.yaml", **{"llama.n_threads": 1})
    nano_params = node_params_file(family_demo("nano"), folder / "nano.yaml", **{"llama.n_threads": 1})
    return {
        PARAMS_PLACEHOLDER: str(params_file),
        CONFIG_PLACEHOLDER: str(demo_config),
        SPEECH_PLACEHOLDER: str(params_file),
        SOUNDS_PLACEHOLDER: str(sounds_params),
        NANO_PLACEHOLDER: str(nano_params),
    }


def as_user(command: str, files: dict[str, str]) -> str:
    for placeholder, path in files.items():
        command = command.replace(placeholder, path)
    return command


def installed_bridge_sources(workspace: Workspace) -> tuple[str, str]:
    """(where the installed module is, where it finds the bridge's C sources), asked from the install space."""
    out = workspace.run(
        "python3 -c 'import moss_tts_node.llama.bridge as b; print(b.__file__); print(b.bridge_source_dir())'"
    )
    module, sources = out.strip().splitlines()[-2:]
    return module, sources


def test_plain_colcon_build_then_the_readme_commands(
    netns: LoopbackNamespace, user_files: dict[str, str], tmp_path: Path
) -> None:
    ws = Workspace(tmp_path / "ws", netns)
    ws.build(BUILD)
    module, sources = installed_bridge_sources(ws)
    assert module.startswith(str(ws.root / "install" / "moss_tts_node" / "lib")), module
    assert sources == str(ws.root / "install" / "moss_tts_node" / "share" / "moss_tts_node" / "bridge")

    doctor = ws.run(as_user(DOCTOR, user_files))
    assert "llama.cpp bridge" in doctor and str(ws.cache) in doctor, doctor  # compiled from the install

    launch = ws.launch(as_user(LAUNCH, user_files))
    try:
        launch.wait_ready()
        assert "publishing #1" in ws.run(TOPIC_PUB)
        response = ws.run(SERVICE_CALL)
        assert "success=True" in response and "sample_rate=24000" in response, response[-2000:]
        goal = ws.run(SEND_GOAL)
        assert "Feedback:" in goal and "Goal finished with status: SUCCEEDED" in goal, goal[-2000:]
        ws.retry(PARAM_SET, "Set parameter successful")
        # The ros2 daemon may not list /diagnostics yet ("does not appear to be published yet"): retried as the
        # other graph-reading commands are.
        diagnostics = ws.retry(DIAGNOSTICS, "key: model_loaded")
        assert "key: model_loaded" in diagnostics and "key: queue_policy\n    value: interrupt" in diagnostics
    finally:
        code = launch.stop()
    assert code == 0 and "process has finished cleanly" in launch.output(), launch.output()[-3000:]

    # Left unconfigured for a lifecycle manager: brought up with the lifecycle CLI; its shutdown ends the launch.
    managed = ws.launch(as_user(LAUNCH_UNMANAGED, user_files))
    try:
        managed.wait_ready(line=UNCONFIGURED_LINE)
        ws.retry(LIFECYCLE_GET, "unconfigured [1]")
        for transition in ("configure", "activate"):
            assert "Transitioning successful" in ws.run(LIFECYCLE_SET.format(transition))
        assert "success=True" in ws.run(SERVICE_CALL)
        assert "Transitioning successful" in ws.run(LIFECYCLE_SET.format("shutdown"))
        code = managed.wait(60)
    finally:
        managed.stop()
    assert code == 0 and "process has finished cleanly" in managed.output(), managed.output()[-3000:]

    # A shipped config names weights this machine does not have: the launch ends, its last line says why.
    failed = ws.launch(LAUNCH_SHIPPED)
    try:
        failed.wait(120)
    finally:
        failed.stop()
    last = failed.output().strip().splitlines()[-1]
    assert "moss_tts_node exited with code 2: " in last and "not found" in last, failed.output()[-3000:]


def test_symlink_install_launches_in_a_namespace(
    netns: LoopbackNamespace, user_files: dict[str, str], tmp_path: Path
) -> None:
    ws = Workspace(tmp_path / "ws", netns)
    ws.build(BUILD_SYMLINK)
    module, sources = installed_bridge_sources(ws)
    checkout = ws.root / "src" / "moss_tts_node"
    assert Path(module).resolve().is_relative_to(checkout) and sources == str(checkout / "bridge"), (module, sources)

    launch = ws.launch(as_user(LAUNCH_IN_NAMESPACE, user_files))
    try:
        launch.wait_ready()
        response = ws.run(SERVICE_CALL_IN_NAMESPACE)
        assert "success=True" in response, response[-2000:]
    finally:
        assert launch.stop() == 0, launch.output()[-3000:]

    # Two nodes of two models, each in its namespace with its params file: each says which model it loaded.
    two = ws.launch(as_user(LAUNCH_TWO_NODES, user_files))
    try:
        for namespace, model in (("speech", "MOSS-TTS (release unknown)"), ("sounds", "MOSS-SoundEffect")):
            two.wait_ready(line=f"({model}); listening on /{namespace}/moss_tts_node/text")
        goal = ws.run(SEND_GOAL_TO_SPEECH)
        assert "Goal finished with status: SUCCEEDED" in goal, goal[-2000:]
        sounds = ws.run(SOUND_CALL)  # a sound effect: no text, a sound described
        assert "success=True" in sounds, sounds[-2000:]
    finally:
        assert two.stop() == 0, two.output()[-3000:]

    # MOSS-TTS-Nano from its params file: the same commands, its audio 48 kHz stereo.
    nano = ws.launch(as_user(LAUNCH_NANO, user_files))
    try:
        nano.wait_ready(line="(MOSS-TTS-Nano); listening on /moss_tts_node/text")
        response = ws.run(SERVICE_CALL)
        assert "success=True" in response and "sample_rate=48000, channels=2" in response, response[-2000:]
        goal = ws.run(SEND_GOAL_NANO)  # no language: Nano's prompt has no place for it
        assert "Goal finished with status: SUCCEEDED" in goal, goal[-2000:]
    finally:
        assert nano.stop() == 0, nano.output()[-3000:]
    assert any(ws.cache.rglob("libmoss_bridge-*.so")), "the node did not compile the bridge into its cache"
