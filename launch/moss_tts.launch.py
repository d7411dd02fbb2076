"""Start moss_tts_node with one of the package's configs, or your own params file, in a namespace.

    ros2 launch moss_tts_node moss_tts.launch.py config:=jetson_orin_nx_8gb namespace:=robot1
    ros2 launch moss_tts_node moss_tts.launch.py params_file:=/path/to/my.yaml
    ros2 launch moss_tts_node moss_tts.launch.py config:=cpu_only play:=true   # and hear it here
    ros2 launch moss_tts_node moss_tts.launch.py config:=nano_cpu   # MOSS-TTS-Nano on a CPU-only robot
    ros2 launch moss_tts_node moss_tts.launch.py params_file:=/path/to/my.yaml autostart:=false  # for a manager

config names a file of the package's config/ folder: default (GPU offload), cpu_only, jetson_orin_agx,
jetson_orin_nx_8gb or nano_cpu (MOSS-TTS-Nano, 48 kHz stereo, on the CPU: docs/nano.md, "On a robot"); edit their
model paths, or copy one and pass it as params_file. The file is
read here and handed to the node as a dict, so its ``moss_tts_node:`` section applies in any namespace
and its relative paths are taken from the file's folder, as with the CLI.

The node is a lifecycle node (docs/ros.md, "Lifecycle"), started as launch_ros's ``LifecycleNode``, so launch files
that include this one can follow its transitions and ask for them. By default it configures and activates itself
(its ``autostart`` parameter); ``autostart:=false`` leaves it unconfigured, for a lifecycle manager (nav2's
``lifecycle_manager``) to bring up.

The launch ends with the node: one that cannot start (missing weights, a bad parameter) does not leave
``ros2 launch`` running without it, and the reason it gave is the launch's last line; so does the shutdown
transition, after which the node's process ends.
"""

from pathlib import Path

from ament_index_python.packages import get_package_share_directory
from launch import LaunchContext, LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, LogInfo, OpaqueFunction, RegisterEventHandler
from launch.conditions import IfCondition
from launch.event_handlers import OnProcessIO
from launch.events import Shutdown
from launch.events.process import ProcessExited, ProcessIO
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode, Node

from moss_tts_node.ros.launch_params import choose_params_file, launch_parameters, start_failure

PACKAGE = "moss_tts_node"


def generate_launch_description() -> LaunchDescription:
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                "config",
                default_value="default",
                description="a config of the package: default, cpu_only, jetson_orin_agx, jetson_orin_nx_8gb, nano_cpu",
            ),
            DeclareLaunchArgument(
                "params_file", default_value="", description="your own params file (overrides config)"
            ),
            DeclareLaunchArgument("namespace", default_value="", description="namespace of the node"),
            DeclareLaunchArgument("log_level", default_value="info", description="debug, info, warn or error"),
            DeclareLaunchArgument(
                "play", default_value="false", description="true: also start moss_tts_player on this machine's speaker"
            ),
            DeclareLaunchArgument(
                "autostart",
                default_value="true",
                description="false: leave the node unconfigured, for a lifecycle manager to configure and activate",
            ),
            OpaqueFunction(function=_node),
        ]
    )


def _node(context: LaunchContext) -> list[LifecycleNode | Node | RegisterEventHandler]:
    params_file = choose_params_file(
        LaunchConfiguration("params_file").perform(context),
        LaunchConfiguration("config").perform(context),
        Path(get_package_share_directory(PACKAGE)) / "config",
    )
    reasons: list[str] = []  # why the node could not start, from what it printed

    def remember(event: ProcessIO) -> None:
        reason = start_failure(event.text.decode(errors="replace"))
        if reason is not None:
            reasons.append(reason)

    def end_launch(event: ProcessExited, launch: LaunchContext) -> list[LogInfo | EmitEvent]:
        reason = f"{event.action.node_name} exited with code {event.returncode}"
        if reasons:
            reason += f": {reasons[-1]}"
        # When the launch is ending already (Ctrl-C), no second Shutdown: it would shut down launch_ros's ROS
        # adapter (LifecycleNode starts one) twice, and launch would exit 1 ("Cannot shutdown a ROS adapter that
        # is not running"). Otherwise the event first, the line last: nothing launch logs while shutting down
        # comes after it.
        ending = [] if launch.is_shutdown else [EmitEvent(event=Shutdown(reason=reason))]
        return ending if event.returncode == 0 else [*ending, LogInfo(msg=reason)]

    node = LifecycleNode(
        package=PACKAGE,
        executable="moss_tts_node",
        name="moss_tts_node",
        namespace=LaunchConfiguration("namespace"),
        parameters=[launch_parameters(params_file), {"autostart": LaunchConfiguration("autostart")}],
        arguments=["--ros-args", "--log-level", LaunchConfiguration("log_level")],
        output="screen",
        emulate_tty=True,
        on_exit=end_launch,
    )
    player = Node(
        package=PACKAGE,
        executable="moss_tts_player",
        name="moss_tts_player",
        namespace=LaunchConfiguration("namespace"),
        arguments=["--ros-args", "--log-level", LaunchConfiguration("log_level")],
        output="screen",
        emulate_tty=True,
        condition=IfCondition(LaunchConfiguration("play")),
    )
    return [node, player, RegisterEventHandler(OnProcessIO(target_action=node, on_stdout=remember, on_stderr=remember))]
