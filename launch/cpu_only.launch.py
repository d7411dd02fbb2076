"""moss_tts.launch.py with config/cpu_only.yaml: no GPU offload, the ONNX Runtime codec on the CPU.
Slow with the 8B model; for checks, and for robots without a GPU.

    ros2 launch moss_tts_node cpu_only.launch.py namespace:=robot1
"""

from launch import LaunchDescription
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    share = FindPackageShare("moss_tts_node")
    main = PathJoinSubstitution([share, "launch", "moss_tts.launch.py"])
    params_file = PathJoinSubstitution([share, "config", "cpu_only.yaml"])
    return LaunchDescription(
        [
            IncludeLaunchDescription(
                PythonLaunchDescriptionSource(main), launch_arguments={"params_file": params_file}.items()
            )
        ]
    )
