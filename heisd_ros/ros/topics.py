"""The policy node's topic names.

The node subscribes and publishes on fixed names relative to its namespace, the ROS convention
(as camera drivers and MoveIt Servo do): a user changes one with a remap, `--ros-args -r
ee_pose:=/franka/ee_pose`, or the launch file's argument of the same name. No parameter names a
topic, so a remap is the one way, and replay, the launch file and the docs all use these names.
"""

from __future__ import annotations

POSE = "ee_pose"
"""geometry_msgs/PoseStamped end-effector pose in the robot base frame."""
JOINT_STATES = "joint_states"
"""sensor_msgs/JointState with the gripper's finger joints (models that read the finger gap)."""
INSTRUCTION = "instruction"
"""std_msgs/String task instruction; a new one starts an episode, an empty one ends it."""
EPISODE_RESULT = "episode_result"
"""std_msgs/Bool episode outcome (true = success)."""
ARM_COMMAND = "arm_command"
"""heisd_ros/ArmCommand output."""
DECODE_STATS = "decode_stats"
"""heisd_ros/DecodeStats output, one per decoded step."""
SERVO_TWIST = "delta_twist_cmds"
"""geometry_msgs/TwistStamped for MoveIt Servo (remap to Servo's ~/delta_twist_cmds)."""
POSE_TARGET = "target_pose"
"""geometry_msgs/PoseStamped absolute target (remap to the controller's target topic)."""
GRIPPER_TRAJECTORY = "gripper_trajectory"
"""trajectory_msgs/JointTrajectory of the fingers (remap to <controller>/joint_trajectory)."""
GRIPPER_POSITIONS = "gripper_positions"
"""std_msgs/Float64MultiArray of the fingers (remap to <controller>/commands)."""
SHADOW_STEPS = "shadow_steps"
"""heisd_ros/ShadowStep output in shadow mode (shadow.method), one per shadowed step."""


def image_topic(view: str, compressed: bool = False) -> str:
    """A view's camera topic: `<view>/image_raw`, or image_transport's `<view>/image_raw/compressed`."""
    return f"{view}/image_raw/compressed" if compressed else f"{view}/image_raw"


REMOVED_TOPIC_PARAMETERS: dict[str, str] = {
    "image_topics": "<view>/image_raw:=YOUR_TOPIC for each of decoder.views (e.g. agentview/image_raw:=/cam/image_raw)",
    "pose_topic": f"{POSE}:=YOUR_TOPIC",
    "joint_states_topic": f"{JOINT_STATES}:=YOUR_TOPIC",
    "instruction_topic": f"{INSTRUCTION}:=YOUR_TOPIC",
    "episode_result_topic": f"{EPISODE_RESULT}:=YOUR_TOPIC",
    "command_topic": f"{ARM_COMMAND}:=YOUR_TOPIC",
    "stats_topic": f"{DECODE_STATS}:=YOUR_TOPIC",
    "arm_outputs.twist_topic": f"{SERVO_TWIST}:=YOUR_TOPIC",
    "arm_outputs.pose_target_topic": f"{POSE_TARGET}:=YOUR_TOPIC",
    "arm_outputs.gripper_trajectory_topic": f"{GRIPPER_TRAJECTORY}:=YOUR_TOPIC",
    "arm_outputs.gripper_positions_topic": f"{GRIPPER_POSITIONS}:=YOUR_TOPIC",
}
"""Topic-name parameters of earlier releases -> the remap that replaces each."""

