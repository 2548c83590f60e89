"""Quality-of-service profiles of the policy node's topics (shared by tools that talk to it)."""

from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

SENSOR_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.BEST_EFFORT,
                        durability=DurabilityPolicy.VOLATILE)  # fmt: skip
"""Images, pose and joint states: best effort, depth 1 (always act on the newest frame)."""
LATCHED_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)  # fmt: skip
"""Instruction: a latched message published before the node started still arrives."""
EVENT_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
"""Outputs and episode results: reliable, every message matters to a recorder."""
