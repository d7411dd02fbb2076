"""Start moss_tts_node with a params file, in a namespace.

    ros2 launch moss_tts_node moss_tts.launch.py params_file:=/path/to/my.yaml namespace:=robot1

params_file defaults to the package's config/default.yaml (GPU offload; edit the model paths).
The file is read here and handed to the node as a dict, so its ``moss_tts_node:`` section
applies in any namespace and its relative paths are taken from the file's folder, as with the
CLI. cpu_only.launch.py and jetson_orin_agx.launch.py include this file with their own configs.
"""

from pathlib import Path

from ament_index_python.packages import get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from moss_tts_node.ros_node import launch_parameters

PACKAGE = "moss_tts_node"


def generate_launch_description() -> LaunchDescription:
    default_params = Path(get_package_share_directory(PACKAGE)) / "config" / "default.yaml"
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                "params_file", default_value=str(default_params), description="ROS params file (config/*.yaml)"
            ),
            DeclareLaunchArgument("namespace", default_value="", description="namespace of the node"),
            DeclareLaunchArgument("log_level", default_value="info", description="debug, info, warn or error"),
            OpaqueFunction(function=_node),
        ]
    )


def _node(context: LaunchContext) -> list[Node]:
    params_file = LaunchConfiguration("params_file").perform(context)
    return [
        Node(
            package=PACKAGE,
            executable="moss_tts_node",
            name="moss_tts_node",
            namespace=LaunchConfiguration("namespace"),
            parameters=[launch_parameters(params_file)],
            arguments=["--ros-args", "--log-level", LaunchConfiguration("log_level")],
            output="screen",
            emulate_tty=True,
        )
    ]
