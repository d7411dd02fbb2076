"""Two moss_tts_node nodes in one launch: speech from one model and sound effects from another, each in a namespace
of its own with a params file of its own (docs/ros.md, "Two nodes in one launch").

    ros2 launch moss_tts_node voice_and_sounds.launch.py speech_params_file:=/path/to/speech.yaml \\
        sounds_params_file:=/path/to/sounds.yaml

speech_params_file names the weights of a speech model (MOSS-TTS, MOSS-VoiceGenerator), sounds_params_file those of
MOSS-SoundEffect (docs/family.md); each is a params file as moss_tts.launch.py takes it, which this file includes
once for each node, in the namespaces speech_namespace (default speech) and sounds_namespace (default sounds):
/speech/moss_tts_node/speak, /sounds/moss_tts_node/synthesize, and so on. Each include is scoped, so the arguments
it is given stay its own. As with one node, the launch ends with either node, and one that cannot start says why in
the launch's last line.
"""

from pathlib import Path

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, GroupAction, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration

NODE_LAUNCH = "moss_tts.launch.py"  # one node: installed beside this file
NODES = {"speech": "a speech model (MOSS-TTS, MOSS-VoiceGenerator)", "sounds": "MOSS-SoundEffect"}


def generate_launch_description() -> LaunchDescription:
    arguments = [
        argument
        for role, model in NODES.items()
        for argument in (
            DeclareLaunchArgument(f"{role}_params_file", description=f"the params file of the {role} node: {model}"),
            DeclareLaunchArgument(f"{role}_namespace", default_value=role, description=f"namespace of the {role} node"),
        )
    ]
    return LaunchDescription(
        [
            *arguments,
            DeclareLaunchArgument("log_level", default_value="info", description="debug, info, warn or error"),
            DeclareLaunchArgument(
                "play", default_value="false", description="true: also play each node's audio on this machine's speaker"
            ),
            *(_node(role) for role in NODES),
        ]
    )


def _node(role: str) -> GroupAction:
    """moss_tts.launch.py for one node, its launch arguments scoped to it."""
    include = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(str(Path(__file__).resolve().parent / NODE_LAUNCH)),
        launch_arguments={
            "params_file": LaunchConfiguration(f"{role}_params_file"),
            "namespace": LaunchConfiguration(f"{role}_namespace"),
            "log_level": LaunchConfiguration("log_level"),
            "play": LaunchConfiguration("play"),
        }.items(),
    )
    return GroupAction([include], scoped=True)
