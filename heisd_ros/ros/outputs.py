"""The policy node's per-step outputs: the command (ArmCommand, optionally TwistStamped + gripper
Float64) and the step's DecodeStats."""

from __future__ import annotations

from typing import Any

import numpy as np
from geometry_msgs.msg import TwistStamped
from std_msgs.msg import Float64

from heisd_ros.core.types import StepStats
from heisd_ros.ros import conversions as conv
from heisd_ros.ros.params import NodeConfig
from heisd_ros.ros.qos import EVENT_QOS


class CommandOutputs:
    """Publishers of one node's outputs; the twist and gripper topics exist only with publish_twist."""

    def __init__(self, node: Any, n: NodeConfig) -> None:
        from heisd_ros.msg import ArmCommand, DecodeStats

        self.command = node.create_publisher(ArmCommand, n.command_topic, EVENT_QOS)
        self.stats = node.create_publisher(DecodeStats, n.stats_topic, EVENT_QOS)
        self.twist = self.gripper = None
        if n.publish_twist:
            self.twist = node.create_publisher(TwistStamped, n.twist_topic, EVENT_QOS)
            self.gripper = node.create_publisher(Float64, n.gripper_topic, EVENT_QOS)

    def publish(self, action: np.ndarray, stats: StepStats, stamp_s: float, step_id: int, n: NodeConfig) -> None:
        """Publish a checked, clipped action stamped like its inputs; with dry_run only the stats."""
        frame = n.command_frame_id
        if not n.dry_run:
            self.command.publish(conv.to_arm_command(action, stats, stamp_s, frame, step_id))
            if self.twist is not None:
                self.twist.publish(conv.to_twist(action, stamp_s, frame, n.twist_linear_scale, n.twist_angular_scale))
                self.gripper.publish(conv.to_gripper(action))
        self.stats.publish(conv.to_decode_stats(stats, stamp_s, frame, step_id))
