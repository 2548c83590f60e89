"""The policy node's per-step outputs: the command (ArmCommand, optionally TwistStamped + gripper
Float64) and the step's DecodeStats.

A step still in flight when the node shuts down publishes nothing: once the node closes its
outputs, its context is shut down or the node is destroyed, publishing is skipped quietly instead
of raising on the inference thread."""

from __future__ import annotations

from typing import Any

import numpy as np
from geometry_msgs.msg import TwistStamped
from rclpy.exceptions import InvalidHandle
from std_msgs.msg import Float64

from heisd_ros.core.types import StepStats
from heisd_ros.ros import conversions as conv
from heisd_ros.ros.params import NodeConfig
from heisd_ros.ros.qos import EVENT_QOS


class CommandOutputs:
    """Publishers of one node's outputs; the twist and gripper topics exist only with publish_twist."""

    def __init__(self, node: Any, n: NodeConfig) -> None:
        from heisd_ros.msg import ArmCommand, DecodeStats

        self._context = node.context
        self._closed = False
        self.command = node.create_publisher(ArmCommand, n.command_topic, EVENT_QOS)
        self.stats = node.create_publisher(DecodeStats, n.stats_topic, EVENT_QOS)
        self.twist = self.gripper = None
        if n.publish_twist:
            self.twist = node.create_publisher(TwistStamped, n.twist_topic, EVENT_QOS)
            self.gripper = node.create_publisher(Float64, n.gripper_topic, EVENT_QOS)

    def publish(self, action: np.ndarray, stats: StepStats, stamp_s: float, step_id: int, n: NodeConfig) -> None:
        """Publish a checked, clipped action stamped like its inputs; with dry_run only the stats.
        Nothing is published once the node is shutting down."""
        frame = n.command_frame_id
        if not n.dry_run:
            self._send(self.command, conv.to_arm_command(action, stats, stamp_s, frame, step_id))
            if self.twist is not None:
                self._send(self.twist, conv.to_twist(action, stamp_s, frame, n.twist_linear_scale, n.twist_angular_scale))
                self._send(self.gripper, conv.to_gripper(action))
        self._send(self.stats, conv.to_decode_stats(stats, stamp_s, frame, step_id))

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
