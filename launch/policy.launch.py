"""Launch the heisd_ros policy node (a managed lifecycle node).

    ros2 launch heisd_ros policy.launch.py model_dir:=/path/to/checkpoint method:=ar
    ros2 launch heisd_ros policy.launch.py model_dir:=/ckpt drafter_dir:=/drafter db_path:=/db \
        calibration_path:=/ckpt/calibration.json          # method heisd (the parameter file's default)
    ros2 launch heisd_ros policy.launch.py params_file:=/path/policy.yaml namespace:=arm autostart:=false \
        agentview_image:=/cam_front/color/image_raw wrist_image:=/cam_wrist/color/image_raw \
        ee_pose:=/franka/ee_pose arm_command:=/franka/policy_command

Standalone equivalent (venv, no launch): policy_node --params-file config/policy.yaml \
    -p model_dir:=/path/to/checkpoint --ros-args -r __ns:=/arm -r agentview/image_raw:=/cam_front/color/image_raw ...

The node is launched with launch_ros' LifecycleNode, so lifecycle events (ChangeState) from this
or an including launch file reach it. `autostart` (default true) is passed to the node, which then
configures and activates itself; launch_ros' own autostart is left off so the transitions are not
requested twice. With autostart:=false the node waits unconfigured for a lifecycle manager or
`ros2 lifecycle set`. Either way it commands nothing until command_enabled is set (~/enable).
`model_dir`, `drafter_dir`, `db_path`, `calibration_path` and `method` (decoder.method), when
given, override the parameter file's, so a checkpoint, drafter and database start without a YAML. Each topic argument remaps the node's
fixed topic name (heisd_ros/ros/topics.py) to the given one: topics are set only by remapping.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.substitutions import FindPackageShare

# launch argument -> (the node's default topic name, what it carries)
TOPICS = {
    "agentview_image": ("agentview/image_raw", "sensor_msgs/Image of the primary view"),
    "wrist_image": ("wrist/image_raw", "sensor_msgs/Image of the wrist view"),
    "ee_pose": ("ee_pose", "geometry_msgs/PoseStamped end-effector pose"),
    "joint_states": ("joint_states", "sensor_msgs/JointState finger joints (models that read the finger gap)"),
    "instruction": ("instruction", "std_msgs/String instruction (volatile unless instruction_durability)"),
    "episode_result": ("episode_result", "std_msgs/Bool episode outcome"),
    "arm_command": ("arm_command", "heisd_ros/ArmCommand output"),
    "decode_stats": ("decode_stats", "heisd_ros/DecodeStats output"),
    "servo_twist": ("delta_twist_cmds", "geometry_msgs/TwistStamped for MoveIt Servo (arm_outputs.publish_twist)"),
    "pose_target": ("target_pose", "geometry_msgs/PoseStamped target (arm_outputs.publish_pose_target)"),
    "gripper_trajectory": ("gripper_trajectory",
                           "trajectory_msgs/JointTrajectory fingers (arm_outputs.publish_gripper_trajectory)"),
    "gripper_positions": ("gripper_positions",
                          "std_msgs/Float64MultiArray fingers (arm_outputs.publish_gripper_positions)"),
}


# launch argument -> the node parameter it overrides (when given), and what it is
PATH_ARGUMENTS = {"model_dir": "model_dir", "drafter_dir": "drafter_dir", "db_path": "db_path",
                  "calibration_path": "calibration_path", "method": "decoder.method"}
PATH_HELP = {
    "model_dir": "the policy's checkpoint directory",
    "drafter_dir": "the drafter directory (methods drafter, specvla, heisd)",
    "db_path": "the demonstration database directory (methods retrieval, specvla, heisd)",
    "calibration_path": "the calibration file (tau, verify-skip thresholds)",
    "method": "decoding method: ar, drafter, specvla, retrieval or heisd",
}


def _true(text: str) -> bool:
    return text.strip().lower() in ("true", "1", "yes")


def _policy_node(context, *args, **kwargs):
    """The node, built once the arguments are known (the path, method and autostart arguments are
    passed only when given: an empty override would replace the parameter file's value)."""

    def value(name: str) -> str:
        return LaunchConfiguration(name).perform(context)

    overrides = {"use_sim_time": _true(value("use_sim_time"))}
    if value("autostart"):
        overrides["autostart"] = _true(value("autostart"))
    for arg, param in PATH_ARGUMENTS.items():
        if value(arg):
            overrides[param] = value(arg)
    files = [value("params_file")] + ([value("params_overlay")] if value("params_overlay") else [])
    return [LifecycleNode(
        package="heisd_ros",
        executable="policy_node",
        name=value("node_name"),
        namespace=value("namespace"),
        parameters=[*files, overrides],
        remappings=[(topic, value(arg)) for arg, (topic, _) in TOPICS.items()],
        ros_arguments=["--log-level", value("log_level")],
        output="screen",
        emulate_tty=True,
    )]


def generate_launch_description() -> LaunchDescription:
    default_params = PathJoinSubstitution([FindPackageShare("heisd_ros"), "config", "policy.yaml"])
    arguments = [
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="ROS 2 parameter file of the policy node"),
        DeclareLaunchArgument("params_overlay", default_value="",
                              description="a second parameter file applied over params_file (a site's or a "
                                          "simulator's settings); empty: none"),
        *(DeclareLaunchArgument(arg, default_value="", description=f"{PATH_HELP[arg]} (overrides the parameter file's)")
          for arg in PATH_ARGUMENTS),
        DeclareLaunchArgument("autostart", default_value="",
                              description="configure and activate at start-up: true or false (false: wait for a "
                                          "lifecycle manager); empty: the parameter file's autostart (default true)"),
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node and its topics"),
        DeclareLaunchArgument("node_name", default_value="policy_node", description="name of the node"),
        DeclareLaunchArgument("use_sim_time", default_value="false",
                              description="use /clock (e.g. when a bag is played with --clock)"),
        DeclareLaunchArgument("log_level", default_value="info", description="debug, info, warn, error"),
    ]
    arguments += [
        DeclareLaunchArgument(arg, default_value=topic, description=f"{text} (remaps '{topic}')")
        for arg, (topic, text) in TOPICS.items()
    ]
    return LaunchDescription(arguments + [OpaqueFunction(function=_policy_node)])
