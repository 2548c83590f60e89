"""The policy node's per-step outputs, in two calls: `publish_command` (everything that moves the
arm) and `publish_stats` (DecodeStats, published whether or not the node commands).

The command: ArmCommand, the complete record, stamped like the inputs it was decoded from; the
switched-on arm-stack outputs of `arm_outputs` (MoveIt Servo twist, pose target, gripper
trajectory / positions), stamped at publication time, since the stacks that read them judge a
command's age by its stamp.

A step still in flight when the node shuts down publishes nothing: once the node closes its
outputs, its context is shut down or the node is destroyed, publishing is skipped quietly instead
of raising on the inference thread."""

from __future__ import annotations

from typing import Any

import numpy as np
from geometry_msgs.msg import PoseStamped, TwistStamped
from rclpy.exceptions import InvalidHandle
from std_msgs.msg import Float64MultiArray

from heisd_ros.core.errors import ConfigError
from heisd_ros.core.types import StepStats
from heisd_ros.ros import conversions as conv
from heisd_ros.ros import topics
from heisd_ros.ros.arm_outputs import ArmMessages, arm_messages
from heisd_ros.ros.params import NodeConfig
from heisd_ros.ros.qos import EVENT_QOS


class CommandOutputs:
    """Publishers of one node's outputs; each optional topic exists only when its switch is on."""

    def __init__(self, node: Any, n: NodeConfig) -> None:
        from heisd_ros.msg import ArmCommand, DecodeStats, ShadowStep

        self._context = node.context
        self._clock = node.get_clock()
        self._closed = False
        self.command = node.create_publisher(ArmCommand, topics.ARM_COMMAND, EVENT_QOS)
        self.stats = node.create_publisher(DecodeStats, topics.DECODE_STATS, EVENT_QOS)
        a = n.arm_outputs
        self.servo_twist = self.pose_target = self.gripper_trajectory = self.gripper_positions = None
        if a.publish_twist:
            self.servo_twist = node.create_publisher(TwistStamped, topics.SERVO_TWIST, EVENT_QOS)
        if a.publish_pose_target:
            self.pose_target = node.create_publisher(PoseStamped, topics.POSE_TARGET, EVENT_QOS)
        if a.publish_gripper_trajectory:
            try:  # only this output needs the package
                from trajectory_msgs.msg import JointTrajectory
            except ImportError as err:
                raise ConfigError(f"arm_outputs.publish_gripper_trajectory needs trajectory_msgs: {err}") from err
            self.gripper_trajectory = node.create_publisher(JointTrajectory, topics.GRIPPER_TRAJECTORY, EVENT_QOS)
        if a.publish_gripper_positions:
            self.gripper_positions = node.create_publisher(Float64MultiArray, topics.GRIPPER_POSITIONS, EVENT_QOS)
        self.shadow_steps = None
        if n.shadow.method:
            self.shadow_steps = node.create_publisher(ShadowStep, topics.SHADOW_STEPS, EVENT_QOS)

    def publish_command(self, action: np.ndarray, stats: StepStats, stamp_s: float, step_id: int, pose: Any,
                        n: NodeConfig) -> ArmMessages:  # fmt: skip
        """Publish one step's command: a checked, clipped action [7] decoded from inputs stamped
        `stamp_s`, with `pose` the end effector's PoseStamped it was decoded from (in
        command_frame_id). Returns the arm-stack messages (their `note` says why the motion outputs
        were left out, '' when they were not). Nothing is published once the node is shutting down."""
        frame = n.command_frame_id
        # Every message is built before any is sent: a step whose pose cannot be composed (it raises)
        # sends nothing, rather than an ArmCommand without the arm outputs it records.
        command = conv.to_arm_command(action, stats, stamp_s, frame, step_id)
        now_s = self._clock.now().nanoseconds * 1e-9
        msgs = arm_messages(action, pose, n.control_period_s, now_s, frame, n.arm_outputs)
        self._send(self.command, command)
        for publisher, msg in ((self.servo_twist, msgs.twist), (self.pose_target, msgs.pose_target),
                               (self.gripper_trajectory, msgs.gripper_trajectory),
                               (self.gripper_positions, msgs.gripper_positions)):  # fmt: skip
            if publisher is not None and msg is not None:
                self._send(publisher, msg)
        return msgs

    def publish_stats(self, stats: StepStats, stamp_s: float, step_id: int, n: NodeConfig) -> None:
        """Publish a decoded step's DecodeStats, stamped like its inputs."""
        self._send(self.stats, conv.to_decode_stats(stats, stamp_s, n.command_frame_id, step_id))

    def publish_shadow(self, msg: Any) -> None:
        """Publish a ShadowStep (shadow mode; ros.shadow builds it)."""
        self._send(self.shadow_steps, msg)

    def close(self) -> None:
        """Publish nothing from now on (the node is shutting down)."""
        self._closed = True

    def _send(self, publisher: Any, msg: Any) -> None:
        if self._closed or not self._context.ok():
            return
        try:
            publisher.publish(msg)
        except InvalidHandle:  # the node was destroyed under the step
            return
        except RuntimeError:  # rclpy's RCLError: the context was shut down between check and publish
            if self._context.ok():
                raise
