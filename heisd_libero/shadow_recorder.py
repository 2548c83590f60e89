"""A `ros2 bag record` of the policy node's shadow_steps, inside the workbench's own process.

`ros2 bag` (rosbag2_py) has no wheels here; sim-episodes records what a user would record on their
arm with `ros2 bag record /shadow_steps` into the same kind of bag (MCAP, heisd_ros's message
definitions), which `heisd choose-point --shadow` reads.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from heisd_ros.pipeline.bags import BagWriter
from heisd_ros.pipeline.shadow_bags import MSGTYPE
from heisd_ros.ros import topics

TOPIC = "/" + topics.SHADOW_STEPS
"""Where the node (at the root namespace) publishes its records, and the bag topic they are kept under."""


class ShadowRecorder:
    """Raw subscription on `TOPIC` written to a new bag at `path`; `close()` ends the bag."""

    def __init__(self, path: str | Path, context: Any) -> None:
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.node import Node
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        from heisd_ros.msg import ShadowStep

        self._bag = BagWriter(path)
        self._bag.add(TOPIC, MSGTYPE)
        self._lock = threading.Lock()
        self.node = Node("shadow_recorder", context=context)
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.node.create_subscription(ShadowStep, TOPIC, self._on_raw, qos, raw=True)
        self._executor = SingleThreadedExecutor(context=context)
        self._executor.add_node(self.node)
        self._spin = threading.Thread(target=self._executor.spin, name="shadow-recorder", daemon=True)
        self._spin.start()

    @property
    def records(self) -> int:
        with self._lock:
            return self._bag.counts.get(TOPIC, 0)

    def _on_raw(self, raw: bytes) -> None:
        with self._lock:
            self._bag.write_raw(TOPIC, self.node.get_clock().now().nanoseconds, raw)

    def close(self) -> None:
        self._executor.shutdown(timeout_sec=5.0)
        self._spin.join(timeout=5.0)
        self.node.destroy_node()
        with self._lock:
            self._bag.close()
