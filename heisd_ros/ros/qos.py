"""Quality-of-service profiles of the policy node's topics (shared by tools that talk to it)."""

from __future__ import annotations

from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

SENSOR_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.BEST_EFFORT,
                        durability=DurabilityPolicy.VOLATILE)  # fmt: skip
"""Images, pose and joint states: best effort, depth 1 (always act on the newest frame)."""
LATCHED_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)  # fmt: skip
"""A latched publisher: its last message also reaches subscribers that join later (when they ask for
transient-local durability); it connects to volatile subscribers as well."""
EVENT_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
"""Outputs and episode results: reliable, every message matters to a recorder."""

_DURABILITY = {"volatile": DurabilityPolicy.VOLATILE, "transient_local": DurabilityPolicy.TRANSIENT_LOCAL}


def instruction_qos(durability: str) -> QoSProfile:
    """The instruction subscription: reliable, the newest message only, with the configured
    durability (NodeConfig.instruction_durability). Volatile connects to every publisher; a
    transient-local subscription also receives a latched message sent before it existed, but no
    volatile publisher's."""
    return QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
                      durability=_DURABILITY[durability])  # fmt: skip


def request_qos(depth: int) -> QoSProfile:
    """A service's requests (the node's and its action's): reliable, volatile, `depth` queued
    (NodeConfig.request_queue_depth), so a burst is answered request by request, not dropped."""
    return QoSProfile(depth=depth, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.VOLATILE)  # fmt: skip
