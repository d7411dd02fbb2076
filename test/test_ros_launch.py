"""Launch files: what they reference exists; each builds a LaunchDescription where ROS 2 launch is
installed (it is not on PyPI, so here that part skips); the node's executable says why it cannot start
in words the launch file reads. What the launch file imports (``ros/launch_params.py``) needs PyYAML
only, as the system Python of an apt ROS install has: those tests run without ROS.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from ros_helpers import require_ros
from ros_helpers.netns import LoopbackNamespace

from moss_tts_node.errors import ConfigError
from moss_tts_node.ros.launch_params import choose_params_file, launch_parameters, start_failure

ROOT = Path(__file__).resolve().parent.parent
EXECUTABLES = {"moss_tts_node": "moss_tts_node.ros.main:main", "moss_tts_player": "moss_tts_node.ros.player:main"}
LAUNCH_FILES = sorted((ROOT / "launch").glob("*.launch.py"))


def test_the_launch_files_are_there_and_the_nodes_names_every_shipped_config() -> None:
    assert [f.name for f in LAUNCH_FILES] == ["moss_tts.launch.py", "voice_and_sounds.launch.py"]
    source = LAUNCH_FILES[0].read_text()
    for config in (ROOT / "config").glob("*.yaml"):
        assert config.stem in source, f"the launch file's docs do not name config {config.stem}"


def test_the_launch_chooses_a_shipped_config_or_your_params_file(tmp_path: Path) -> None:
    config_dir = ROOT / "config"
    assert choose_params_file("", "jetson_orin_nx_8gb", config_dir) == config_dir / "jetson_orin_nx_8gb.yaml"
    assert choose_params_file("", "cpu_only.yaml", config_dir) == config_dir / "cpu_only.yaml"
    assert choose_params_file(str(tmp_path / "my.yaml"), "cpu_only", config_dir) == tmp_path / "my.yaml"
    with pytest.raises(ConfigError, match=r"config:='jetson' is not one of the shipped configs \(cpu_only, default"):
        choose_params_file("", "jetson", config_dir)


@pytest.mark.parametrize("launch_file", LAUNCH_FILES, ids=lambda f: f.name)
def test_what_a_launch_file_names_exists(launch_file: Path) -> None:
    source = launch_file.read_text()
    for config in re.findall(r'"(\w+\.yaml)"', source):
        assert (ROOT / "config" / config).is_file(), config
    for included in re.findall(r'"(\w+\.launch\.py)"', source):
        assert (ROOT / "launch" / included).is_file(), included
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    for executable in re.findall(r'executable="(\w+)"', source):
        assert scripts.get(executable) == EXECUTABLES[executable], f"no console script {executable!r} (setup.py)"


def test_the_node_console_script_says_why_it_cannot_start_in_the_words_the_launch_file_reads(
    own_netns: LoopbackNamespace,
) -> None:
    """The executable the launch file starts, run as it runs it: a node that cannot start exits 2, and the
    launch file's ``start_failure`` finds the node's reason in what it printed (log prefix and all)."""
    require_ros()
    script = Path(sys.executable).with_name("moss_tts_node")  # setup.py's console script, beside the interpreter
    assert script.is_file(), f"{script} not found: pip install -e . installs it"
    node = own_netns.popen(
        [str(script), "--ros-args", "-p", "model.weights_dir:=/nonexistent"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        output, _ = node.communicate(timeout=120)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    assert node.returncode == 2, output
    reason = start_failure(output)
    assert reason is not None and reason.endswith("'model.weights_dir' directory not found: /nonexistent"), output


@pytest.mark.parametrize("launch_file", LAUNCH_FILES, ids=lambda f: f.name)
def test_a_launch_file_builds_a_launch_description(launch_file: Path) -> None:
    try:  # the PyPI package named "launch" is unrelated; only ROS 2's has these
        from launch import LaunchDescription
        from launch_ros.actions import Node  # noqa: F401
    except ImportError:
        pytest.skip("ROS 2 launch is not installed (it is not on PyPI): install ros-<distro>-launch-ros")
    spec = importlib.util.spec_from_file_location(launch_file.name.removesuffix(".py"), launch_file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.generate_launch_description(), LaunchDescription)


def test_launch_parameters_flatten_the_node_section_and_anchor_relative_paths(tmp_path: Path) -> None:
    params = tmp_path / "robot" / "tts.yaml"
    params.parent.mkdir()
    params.write_text(
        "moss_tts_node:\n"
        "  ros__parameters:\n"
        "    model: {weights_dir: ../models/gguf, codec_dir: /abs/codec}\n"
        "    llama: {n_gpu_layers: -1}\n"
        "    queue_policy: interrupt\n"
        "    voices: {files: [voices/a.npy, /abs/b.wav], directories: []}\n"  # launch_ros refuses an empty list
        "    languages: []\n"
    )
    assert launch_parameters(params) == {
        "model.weights_dir": str(tmp_path / "models" / "gguf"),
        "model.codec_dir": "/abs/codec",
        "llama.n_gpu_layers": -1,
        "queue_policy": "interrupt",
        "voices.files": [str(tmp_path / "robot" / "voices" / "a.npy"), "/abs/b.wav"],
    }
    with pytest.raises(ConfigError, match="config file not found"):
        launch_parameters(tmp_path / "missing.yaml")
    params.write_text("other_node:\n  ros__parameters: {}\n")
    with pytest.raises(ConfigError, match="expected 'moss_tts_node:'"):
        launch_parameters(params)
