"""Launch the heisd_ros policy node.

    ros2 launch heisd_ros policy.launch.py
    ros2 launch heisd_ros policy.launch.py params_file:=/path/policy.yaml namespace:=arm \
        agentview_image:=/cam_front/color/image_raw wrist_image:=/cam_wrist/color/image_raw \
        ee_pose:=/franka/ee_pose arm_command:=/franka/policy_command

Standalone equivalent (venv, no launch): policy_node --params-file config/policy.yaml \
    --ros-args -r __ns:=/arm -r agentview/image_raw:=/cam_front/color/image_raw ...

Each topic argument remaps the node's default topic name (config/policy.yaml) to the given one.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

# launch argument -> (the node's default topic name, what it carries)
TOPICS = {
    "agentview_image": ("agentview/image_raw", "sensor_msgs/Image of the primary view"),
    "wrist_image": ("wrist/image_raw", "sensor_msgs/Image of the wrist view"),
    "ee_pose": ("ee_pose", "geometry_msgs/PoseStamped end-effector pose"),
    "joint_states": ("joint_states", "sensor_msgs/JointState finger joints (models that read the finger gap)"),
    "instruction": ("instruction", "std_msgs/String instruction (latched)"),
    "episode_result": ("episode_result", "std_msgs/Bool episode outcome"),
    "arm_command": ("arm_command", "heisd_ros/ArmCommand output"),
    "decode_stats": ("decode_stats", "heisd_ros/DecodeStats output"),
    "cmd_twist": ("cmd_twist", "geometry_msgs/TwistStamped output (publish_twist)"),
    "gripper_command": ("gripper_command", "std_msgs/Float64 gripper output (publish_twist)"),
}


def generate_launch_description() -> LaunchDescription:
    default_params = PathJoinSubstitution([FindPackageShare("heisd_ros"), "config", "policy.yaml"])
    arguments = [
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="ROS 2 parameter file of the policy node"),
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
    node = Node(
        package="heisd_ros",
        executable="policy_node",
        name=LaunchConfiguration("node_name"),
        namespace=LaunchConfiguration("namespace"),
        parameters=[
            LaunchConfiguration("params_file"),
            {"use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool)},
        ],
        remappings=[(topic, LaunchConfiguration(arg)) for arg, (topic, _) in TOPICS.items()],
        ros_arguments=["--log-level", LaunchConfiguration("log_level")],
        output="screen",
        emulate_tty=True,
    )
    return LaunchDescription(arguments + [node])
