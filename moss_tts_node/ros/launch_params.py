"""What the launch file needs: the params file to use, and its values for the node.

Kept apart from the node (ros/node.py, ros/main.py) so that ``ros2 launch`` can read them with nothing but
PyYAML: on an apt ROS install the ``ros2`` command runs the system Python, which does not see the virtualenv that
holds the node's pip-only dependencies (only the node's own entry point runs with that venv's interpreter).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from moss_tts_node.config import OPTIONS, read_params_file
from moss_tts_node.errors import ConfigError

# How the node's log line begins when it exits without serving (main.main); the launch file quotes its reason.
START_FAILURE = "cannot start: "
_TERMINAL_COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # rcutils colours its lines on a terminal (emulate_tty)


def choose_params_file(params_file: str, config: str, config_dir: Path) -> Path:
    """The params file a launch uses: ``params_file`` when given, else the shipped ``config_dir/<config>.yaml``."""
    if params_file:
        return Path(params_file)
    shipped = sorted(p.stem for p in Path(config_dir).glob("*.yaml"))
    config = config.removesuffix(".yaml")  # config:=cpu_only.yaml means the same
    if config not in shipped:
        raise ConfigError(
            f"config:={config!r} is not one of the shipped configs ({', '.join(shipped)}); "
            "pass params_file:=/path/to/your.yaml for your own"
        )
    return Path(config_dir) / f"{config}.yaml"


def launch_parameters(params_file: str | Path) -> dict[str, Any]:
    """A params file's parameters for this node, flat, for a launch file to pass as a dict.

    Given a dict, launch_ros hands the values to the node under its full name, so the file's
    ``moss_tts_node:`` section applies in any namespace (as a ``--params-file`` it only matches a
    node in the root namespace). Relative paths are resolved against the file's folder, as the
    CLI does; ``ros2 run ... --params-file`` resolves them against the working directory. An empty list is
    left out: the node's list parameters are empty by default.
    """
    path = Path(params_file)
    values = read_params_file(path)
    for key, value in values.items():
        option = OPTIONS.get(key)  # the node's own options are never paths
        if option is not None:
            values[key] = option.resolved(value, path.parent)
    # launch_ros cannot type an empty list (it refuses the launch), and an empty list is what the node has anyway.
    return {key: value for key, value in values.items() if value != []}


def start_failure(output: str) -> str | None:
    """The reason of the last "cannot start" line in ``output`` (the node's own words), or None."""
    lines = _TERMINAL_COLOURS.sub("", output).splitlines()
    reasons = [line.partition(START_FAILURE)[2].strip() for line in lines if START_FAILURE in line]
    return reasons[-1] if reasons else None
