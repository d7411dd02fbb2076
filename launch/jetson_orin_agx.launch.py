"""moss_tts.launch.py with config/jetson_orin_agx.yaml: every layer on the Orin GPU, flash attention,
an 8-bit KV cache and the TensorRT codec (build its engines on the board first: see that file).

    ros2 launch moss_tts_node jetson_orin_agx.launch.py namespace:=robot1
"""

from launch import LaunchDescription
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    share = FindPackageShare("moss_tts_node")
    main = PathJoinSubstitution([share, "launch", "moss_tts.launch.py"])
    params_file = PathJoinSubstitution([share, "config", "jetson_orin_agx.yaml"])
    return LaunchDescription(
        [
            IncludeLaunchDescription(
                PythonLaunchDescriptionSource(main), launch_arguments={"params_file": params_file}.items()
            )
        ]
    )
