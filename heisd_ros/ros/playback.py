"""The live-topic side of `heisd replay`: a bag's messages published as raw CDR, outputs recorded.

`read_bag` loads a bag's input messages (deserialised and checked by `heisd_ros.pipeline.bags`
before anything is published) and marks its synchronised image sets; `Player` publishes them on
ROS 2 topics, paced by their recorded times or in lockstep with the node; `Recorder` subscribes to
the node's outputs without deserialising them and writes them into an MCAP bag. rclpy is imported
only by `Player` and `Recorder`.
"""

from __future__ import annotations

import importlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline import bags
from heisd_ros.ros.sync import ApproxTimeSync, SyncConfig

OUTPUT_TYPES = {
    "arm_command": bags.ARM_COMMAND,
    "decode_stats": bags.DECODE_STATS,
    "cmd_twist": "geometry_msgs/msg/TwistStamped",
    "gripper_command": "std_msgs/msg/Float64",
    "/diagnostics": "diagnostic_msgs/msg/DiagnosticArray",
}
"""Default output topics of the node and their types."""
IMAGE_TYPES = (bags.IMAGE, bags.COMPRESSED_IMAGE)
INPUT_TYPES = IMAGE_TYPES + (bags.POSE, bags.JOINT_STATE, bags.STRING, bags.BOOL)


# ---------------------------------------------------------------------------------------------
# bag side


@dataclass
class BagMessage:
    """One input message of the bag, as it will be published."""

    topic: str
    msgtype: str
    t_ns: int
    """Recorded (log) time."""
    raw: bytes
    stamp_ns: int | None
    """Header stamp, None for messages without a header."""
    step_end: bool = False
    """The last image of a synchronised set: lockstep waits after publishing it."""


def read_bag(path: str | Path, remap: dict[str, str], slop_s: float) -> tuple[list[BagMessage], int]:
    """The bag's input messages in recorded order, with synchronised steps marked; and the step count.

    A bag is untrusted input: every message is deserialised and checked before anything is
    published (a malformed message must fail the replay with the reason, never reach the node), and
    any damage raises ConfigError naming the bag.
    """
    try:
        out = [BagMessage(remap.get(r.topic, r.topic), r.msgtype, r.t_ns, r.raw, r.stamp_ns)
               for r in bags.read_messages(path, msgtypes=INPUT_TYPES)]  # fmt: skip
    except bags.BagError as err:
        raise ConfigError(str(err)) from err
    if not out:
        raise ConfigError(f"{path}: no image/pose/instruction/episode-result messages ({INPUT_TYPES})")
    return out, _mark_steps(out, slop_s)


def _mark_steps(messages: list[BagMessage], slop_s: float) -> int:
    """Mark the image that completes each synchronised set (`step_end`); returns the set count."""
    views = tuple(sorted({m.topic for m in messages if m.msgtype in IMAGE_TYPES}))
    if not views:
        return 0
    steps = 0
    sync = ApproxTimeSync(SyncConfig(views, slop_s, 1e12, 1e12))
    sync.add_pose(0.0, None)  # grouping only needs the images
    for m in messages:
        if m.msgtype in IMAGE_TYPES:
            sync.add_frame(m.topic, m.stamp_ns * 1e-9, m)
            synced = sync.poll(m.stamp_ns * 1e-9)
            if synced is not None:
                sync.consume(synced)
                m.step_end = True
                steps += 1
    return steps


def restamp(m: BagMessage, offset_ns: int) -> bytes:
    """The message's CDR with its header stamp shifted by offset_ns."""
    if m.stamp_ns is None or offset_ns == 0:
        return m.raw
    return bags.restamp_cdr(m.raw, m.msgtype, m.stamp_ns + offset_ns)


# ---------------------------------------------------------------------------------------------
# ROS side (rclpy)


def _ros_class(msgtype: str) -> Any:
    pkg, _, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.msg"), name)


@dataclass
class MethodRun:
    """What one replay of the bag produced."""

    method: str
    stats: list = field(default_factory=list)
    """(receive time s, DecodeStats)."""
    commands: list = field(default_factory=list)
    """(receive time s, ArmCommand)."""
    diagnostics: list = field(default_factory=list)
    timeouts: int = 0
    wall_s: float = 0.0


class Recorder:
    """Raw subscriptions on the node's outputs, written into one MCAP bag (executor thread only)."""

    def __init__(self, node: Any, out: Path) -> None:
        self.node = node
        self.writer = bags.BagWriter(out)
        self.subs: list = []
        self.lock = threading.Lock()
        self.on_stats: Callable[[Any], None] | None = None
        self.run: MethodRun | None = None

    def record(self, topic: str, msgtype: str, bag_topic: str) -> None:
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from rclpy.serialization import deserialize_message

        cls = _ros_class(msgtype)
        self.writer.add(bag_topic, msgtype)

        def on_raw(raw: bytes) -> None:
            now = self.node.get_clock().now().nanoseconds
            with self.lock:
                self.writer.write_raw(bag_topic, now, raw)
                run = self.run
            if run is None:
                return
            if msgtype == OUTPUT_TYPES["decode_stats"]:
                msg = deserialize_message(raw, cls)
                run.stats.append((now * 1e-9, msg))
                if self.on_stats:
                    self.on_stats(msg)
            elif msgtype == OUTPUT_TYPES["arm_command"]:
                run.commands.append((now * 1e-9, deserialize_message(raw, cls)))
            elif msgtype == OUTPUT_TYPES["/diagnostics"]:
                run.diagnostics.append(deserialize_message(raw, cls))

        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.subs.append(self.node.create_subscription(cls, topic, on_raw, qos, raw=True))

    def wait_matched(self, timeout_s: float) -> list[str]:
        """Wait until the command and stats topics have a publisher; the topics that still have none."""
        required = [s for s in self.subs if s.msg_type.__name__ in ("ArmCommand", "DecodeStats")]
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and any(s.get_publisher_count() == 0 for s in required):
            time.sleep(0.02)
        return [s.topic_name for s in required if s.get_publisher_count() == 0]

    def stop(self) -> None:
        for s in self.subs:
            self.node.destroy_subscription(s)
        self.subs = []

    def close(self) -> None:
        with self.lock:
            self.writer.close()


class Player:
    """Publishes the bag's messages as raw CDR from the calling thread.

    Paced: at their recorded times divided by `rate`. Lockstep (`fast`): after each synchronised
    image set, wait up to `step_timeout_s` for the node's answer. With `restamp`, header stamps are
    moved onto the replay clock.
    """

    def __init__(self, node: Any, messages: list[BagMessage], *, fast: bool, rate: float, restamp: bool,
                 step_timeout_s: float) -> None:  # fmt: skip
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

        self.node, self.messages = node, messages
        self.fast, self.rate, self.restamp, self.step_timeout_s = fast, rate, restamp, step_timeout_s
        self.pubs: dict[str, Any] = {}
        for m in messages:
            if m.topic in self.pubs:
                continue
            if m.msgtype == bags.STRING:  # the instruction is latched
                qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
            else:
                qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
            self.pubs[m.topic] = node.create_publisher(_ros_class(m.msgtype), m.topic, qos)

    def now_ns(self) -> int:
        return self.node.get_clock().now().nanoseconds

    def wait_for_subscribers(self, timeout_s: float) -> list[str]:
        """Topics that still have no subscriber after timeout_s."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            missing = [t for t, p in self.pubs.items() if p.get_subscription_count() == 0]
            if not missing:
                return []
            time.sleep(0.02)
        return [t for t, p in self.pubs.items() if p.get_subscription_count() == 0]

    def play(self, run: MethodRun, got_step: Callable[[float], bool]) -> None:
        """Publish everything; in lockstep call got_step(stamp_s) until it is True after each step."""
        t0_bag = self.messages[0].t_ns
        t0_wall = self.now_ns()
        offset = None
        for m in self.messages:
            if self.fast:
                if offset is None:  # one offset per step keeps the views' relative stamps
                    offset = self.now_ns() - (m.stamp_ns if m.stamp_ns is not None else m.t_ns)
            else:
                due = t0_wall + int((m.t_ns - t0_bag) / self.rate)
                delay = (due - self.now_ns()) * 1e-9
                if delay > 0:
                    time.sleep(delay)
                # recorded stamps are mapped onto the replay clock at the playback rate
                offset = None if m.stamp_ns is None else t0_wall + int((m.stamp_ns - t0_bag) / self.rate) - m.stamp_ns
            shift = (offset or 0) if self.restamp else 0
            self.pubs[m.topic].publish(restamp(m, shift))
            if self.fast and m.msgtype in (bags.STRING, bags.BOOL):
                time.sleep(0.05)  # let the node take the instruction/result before the next images
                offset = None
            if self.fast and m.step_end:
                stamp_s = (m.stamp_ns + shift) * 1e-9
                end = time.monotonic() + self.step_timeout_s
                while not got_step(stamp_s) and time.monotonic() < end:
                    time.sleep(0.002)
                if not got_step(stamp_s):
                    run.timeouts += 1
                offset = None
