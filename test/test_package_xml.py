"""package.xml declares what the node's code imports, so that rosdep installs it on an apt ROS machine."""

from __future__ import annotations

import ast
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Imports that are ROS packages by name; each must be an exec_depend of the same name.
ROS_PACKAGES = {"rclpy", "launch", "launch_ros", "ament_index_python"}
# Other imports that apt has, by their rosdep keys (ros/rosdistro rosdep/python.yaml, read 2026-12-03).
ROSDEP_KEYS = {"numpy": "python3-numpy", "yaml": "python3-yaml", "soundfile": "python3-soundfile"}


def imported_modules() -> set[str]:
    """Top-level names imported by the package (its tools are not the node's) and the launch files."""
    files = [p for p in (ROOT / "moss_tts_node").rglob("*.py") if "tools" not in p.parts]
    names: set[str] = set()
    for path in [*files, *(ROOT / "launch").glob("*.launch.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.partition(".")[0])
    return names - set(sys.stdlib_module_names) - {"moss_tts_node"}


def exec_depends() -> set[str]:
    return {element.text or "" for element in ET.parse(ROOT / "package.xml").getroot().iter("exec_depend")}


def test_every_ros_package_imported_is_an_exec_depend() -> None:
    imported = imported_modules()
    ros = {name for name in imported if name in ROS_PACKAGES or name.endswith(("_msgs", "_srvs", "_interfaces"))}
    ros -= {"audio_common_msgs"}  # optional: the node publishes its topics only where it is installed
    assert ros <= exec_depends(), f"package.xml lacks {sorted(ros - exec_depends())}"


def test_what_apt_has_is_declared_by_its_rosdep_key() -> None:
    imported = imported_modules()
    wanted = {key for module, key in ROSDEP_KEYS.items() if module in imported}
    assert wanted == {key for key in exec_depends() if key.startswith("python3-")}
