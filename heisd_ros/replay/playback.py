"""The live-topic side of `heisd replay`: a bag's segments published as raw CDR, outputs recorded.

`Player` publishes the segments of `heisd_ros.replay.bag_stream` on the node's input topics, paced by
their recorded times (optionally with `/clock` from the bag's time, like `ros2 bag play --clock`)
or in lockstep with the node; `Recorder` subscribes to the node's outputs without deserialising
them for the bag it writes, and keeps one small record per step. rclpy is imported lazily.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from heisd_ros.core.errors import HeisdError
from heisd_ros.pipeline import bags
from heisd_ros.replay.bag_stream import (
    EVENT_KINDS,
    BagMessage,
    RoutePlan,
    Segment,
    lockstep_order,
)

OUTPUT_TYPES = {
    "arm_command": bags.ARM_COMMAND,
    "decode_stats": bags.DECODE_STATS,
    "shadow_steps": "heisd_ros/msg/ShadowStep",
    "delta_twist_cmds": "geometry_msgs/msg/TwistStamped",
    "target_pose": "geometry_msgs/msg/PoseStamped",
    "gripper_trajectory": "trajectory_msgs/msg/JointTrajectory",
    "gripper_positions": "std_msgs/msg/Float64MultiArray",
    "/diagnostics": "diagnostic_msgs/msg/DiagnosticArray",
}
"""Default output topics of the node and their types."""
CLOCK = "rosgraph_msgs/msg/Clock"
EVENT_PAUSE_S = 0.05
"""Lockstep: time given to the node to take an instruction or episode result before the next images."""


def rss_mb() -> float:
    """Resident memory of this process, MB (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ros_class(msgtype: str) -> Any:
    pkg, _, name = msgtype.split("/")
    return getattr(importlib.import_module(f"{pkg}.msg"), name)


def _stamp_s(msg: Any) -> float:
    return msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec


# ---------------------------------------------------------------------------------------------
# what one replay produced


@dataclass(frozen=True)
class StepRecord:
    """One DecodeStats, as the summary and the plots need it."""

    stamp_s: float
    step_id: int
    mode: str
    total_ms: float
    llm_forwards: int
    skipped: bool


@dataclass(frozen=True)
class CommandRecord:
    """One ArmCommand: header stamp and the 7-D action."""

    stamp_s: float
    step_id: int
    action: tuple[float, ...]


@dataclass
class MethodRun:
    """What one replay of the bag produced (small records: memory stays flat on long bags)."""

    method: str
    stats: list = field(default_factory=list)
    """(receive time s, StepRecord)."""
    commands: list = field(default_factory=list)
    """(receive time s, CommandRecord)."""
    diagnostic: dict = field(default_factory=dict)
    """Key -> value of the node's newest '<node>: policy' diagnostic status."""
    steps: int = 0
    """Synchronised steps of the bag that were played."""
    step_map: list = field(default_factory=list)
    """(published stamp ns, recorded stamp ns) of every played step: maps outputs back to bag time."""
    timeouts: int = 0
    silent_steps: int = 0
    """Lockstep: consecutive steps the node gave no DecodeStats for."""
    refusals: dict = field(default_factory=dict)
    """Non-OK '<node>: policy' diagnostic message -> times seen since the node last answered a step."""
    wall_s: float = 0.0
    rss_mb: dict = field(default_factory=dict)
    """start / peak / end resident memory of this process during the replay, MB."""


class ReplayStalled(HeisdError):
    """A lockstep replay stopped: the node answers none of the steps (the message says why)."""


class Recorder:
    """Raw subscriptions on the node's outputs, written into one MCAP bag (executor thread only)."""

    def __init__(self, node: Any, out: Path) -> None:
        self.node = node
        self.writer = bags.BagWriter(out)
        self.subs: list = []
        self.lock = threading.Lock()
        self.on_stats: Callable[[StepRecord], None] | None = None
        self.run: MethodRun | None = None

    def record(self, topic: str, msgtype: str, bag_topic: str) -> None:
        from rclpy.qos import QoSProfile, ReliabilityPolicy

        self.writer.add(bag_topic, msgtype)
        cls = ros_class(msgtype)

        def on_raw(raw: bytes) -> None:
            now = self.node.get_clock().now().nanoseconds
            with self.lock:
                self.writer.write_raw(bag_topic, now, raw)
                run = self.run
            if run is not None:
                self._keep(run, msgtype, cls, raw, now * 1e-9)

        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.subs.append(self.node.create_subscription(cls, topic, on_raw, qos, raw=True))

    def _keep(self, run: MethodRun, msgtype: str, cls: Any, raw: bytes, t_s: float) -> None:
        from rclpy.serialization import deserialize_message

        if msgtype == bags.DECODE_STATS:
            m = deserialize_message(raw, cls)
            rec = StepRecord(_stamp_s(m), int(m.step_id), m.mode, float(m.total_ms), int(m.llm_forwards),
                             bool(m.skipped))  # fmt: skip
            run.stats.append((t_s, rec))
            if self.on_stats:
                self.on_stats(rec)
        elif msgtype == bags.ARM_COMMAND:
            m = deserialize_message(raw, cls)
            action = (*m.delta_position, *m.delta_rotation, m.gripper)
            run.commands.append((t_s, CommandRecord(_stamp_s(m), int(m.step_id), tuple(map(float, action)))))
        elif msgtype == OUTPUT_TYPES["/diagnostics"]:
            for st in deserialize_message(raw, cls).status:
                if st.name.endswith(": policy"):
                    run.diagnostic = {kv.key: kv.value for kv in st.values}
                    if st.level[0] >= 1 and st.message:
                        run.refusals[st.message] = run.refusals.get(st.message, 0) + 1

    def publishers_of(self, msgtypes: Iterable[str]) -> dict[str, int]:
        """Topic -> publisher count of the recorded topics of these types."""
        wanted = {ros_class(t) for t in msgtypes}
        return {s.topic_name: s.get_publisher_count() for s in self.subs if s.msg_type in wanted}

    def wait_matched(self, timeout_s: float) -> list[str]:
        """Wait until the command and stats topics have a publisher; the topics that still have none."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and 0 in self.publishers_of((bags.ARM_COMMAND, bags.DECODE_STATS)).values():
            time.sleep(0.02)
        return [t for t, n in self.publishers_of((bags.ARM_COMMAND, bags.DECODE_STATS)).items() if n == 0]

    def stop(self) -> None:
        for s in self.subs:
            self.node.destroy_subscription(s)
        self.subs = []

    def close(self) -> None:
        with self.lock:
            self.writer.close()


# ---------------------------------------------------------------------------------------------
# publishing


@dataclass(frozen=True)
class PlayConfig:
    """How the Player publishes."""

    fast: bool = False
    """Lockstep: after each synchronised set wait for the node's answer (or step_timeout_s)."""
    rate: float = 1.0
    """Paced: recorded pace times this."""
    restamp: bool = True
    """Move header stamps onto the replay clock (recorded stamps fail the node's staleness checks)."""
    step_timeout_s: float = 5.0
    max_silent_steps: int = 10
    """Lockstep: stop (ReplayStalled, with the node's refusal) after this many consecutive steps
    without DecodeStats, instead of waiting step_timeout_s for each of the bag's steps; 0 = never."""
    clock: bool = False
    """Paced, stamps kept: publish /clock from the bag's time (the node runs with use_sim_time)."""
    clock_hz: float = 100.0


class Player:
    """Publishes a bag's segments as raw CDR from the calling thread on the plan's input topics."""

    def __init__(self, node: Any, plan: RoutePlan, cfg: PlayConfig) -> None:
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

        self.node, self.plan, self.cfg = node, plan, cfg
        self.pubs: dict[str, Any] = {}
        self.kinds: dict[str, str] = {}
        for r in plan.routes.values():
            if r.kind == "instruction":  # latched, as the node subscribes
                qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                                 durability=DurabilityPolicy.TRANSIENT_LOCAL)
            else:
                qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
            self.pubs[r.topic] = node.create_publisher(ros_class(r.msgtype), r.topic, qos)
            self.kinds[r.topic] = r.kind
        self.clock_pub = None
        if cfg.clock:
            qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
            self.clock_pub = node.create_publisher(ros_class(CLOCK), "/clock", qos)
        self._t0: tuple[int, int, int] | None = None  # paced: (bag ns, monotonic ns, ROS clock ns) at the first message
        self._next_clock_ns = 0

    def unsubscribed(self, kinds: Iterable[str] | None = None) -> list[str]:
        wanted = set(kinds) if kinds is not None else None
        return [t for t, p in self.pubs.items()
                if (wanted is None or self.kinds[t] in wanted) and p.get_subscription_count() == 0]  # fmt: skip

    def wait_for_subscribers(self, timeout_s: float, kinds: Iterable[str]) -> list[str]:
        """Topics of these input kinds that still have no subscriber after timeout_s."""
        kinds = list(kinds)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self.unsubscribed(kinds):
            time.sleep(0.02)
        return self.unsubscribed(kinds)

    def play(self, segments: Iterable[Segment], run: MethodRun, got_step: Callable[[float], bool]) -> None:
        """Publish every segment; in lockstep call got_step(stamp_s) until it is True after each step."""
        self._t0 = None
        run.rss_mb = {"start": rss_mb()}
        peak = run.rss_mb["start"]
        for seg in segments:
            if self.cfg.fast:
                self._lockstep(seg, run, got_step)
            else:
                self._paced(seg, run)
            peak = max(peak, rss_mb())
        run.rss_mb.update(peak=peak, end=rss_mb())

    def settle(self, seconds: float) -> None:
        """Wait after the last message; with /clock the bag's time keeps running meanwhile."""
        self._wait_until(time.monotonic_ns() + int(seconds * 1e9))

    def _publish(self, m: BagMessage, offset_ns: int) -> None:
        raw = m.raw
        if offset_ns and m.stamp_ns is not None:
            raw = bags.restamp_cdr(m.raw, m.msgtype, m.stamp_ns + offset_ns)
        self.pubs[m.topic].publish(raw)

    def _lockstep(self, seg: Segment, run: MethodRun, got_step: Callable[[float], bool]) -> None:
        msgs = lockstep_order(seg)
        stamps = [m.stamp_ns for m in msgs if m.stamp_ns is not None]
        ref = seg.step_ns if seg.step_ns is not None else (stamps[0] if stamps else None)
        # one offset per step keeps the relative stamps of its views and pose
        offset = 0
        if self.cfg.restamp and ref is not None:
            offset = self.node.get_clock().now().nanoseconds - ref
        for m in msgs:
            self._publish(m, offset)
            if m.kind in EVENT_KINDS:
                time.sleep(EVENT_PAUSE_S)
        if seg.step_ns is None:
            return
        run.steps += 1
        run.step_map.append((seg.step_ns + offset, seg.step_ns))
        stamp_s = (seg.step_ns + offset) * 1e-9
        end = time.monotonic() + self.cfg.step_timeout_s
        while not got_step(stamp_s) and time.monotonic() < end:
            time.sleep(0.002)
        if got_step(stamp_s):
            run.silent_steps = 0
            run.refusals.clear()
            return
        run.timeouts += 1
        run.silent_steps += 1
        if self.cfg.max_silent_steps and run.silent_steps >= self.cfg.max_silent_steps:
            # the most frequent first: waiting out a step also makes its frames stale, a later reason
            seen = sorted(run.refusals.items(), key=lambda kv: -kv[1])[:2]
            why = "; ".join(f"{m} ({n}x)" for m, n in seen) or "none on /diagnostics (is it active, with an instruction?)"
            raise ReplayStalled(f"the node decoded none of the last {run.silent_steps} steps (no DecodeStats within "
                                f"{self.cfg.step_timeout_s:g} s each); its refusals: {why}")  # fmt: skip

    def _paced(self, seg: Segment, run: MethodRun) -> None:
        if self._t0 is None:
            self._t0 = (seg.messages[0].t_ns, time.monotonic_ns(), self.node.get_clock().now().nanoseconds)
            self._next_clock_ns = self._t0[1]
        t0_bag, t0_mono, _ = self._t0
        for m in seg.messages:
            self._wait_until(t0_mono + int((m.t_ns - t0_bag) / self.cfg.rate))
            self._publish(m, self._paced_shift(m.stamp_ns))
        if seg.step_ns is not None:
            run.steps += 1
            run.step_map.append((seg.step_ns + self._paced_shift(seg.step_ns), seg.step_ns))

    def _paced_shift(self, stamp_ns: int | None) -> int:
        """Paced: how far a recorded stamp moves, mapped onto the replay clock at the playback rate."""
        if not self.cfg.restamp or stamp_ns is None or self._t0 is None:
            return 0
        t0_bag, _, t0_ros = self._t0
        return t0_ros + int((stamp_ns - t0_bag) / self.cfg.rate) - stamp_ns

    def _bag_time_ns(self, mono_ns: int) -> int:
        t0_bag, t0_mono, _ = self._t0 or (0, mono_ns, 0)
        return t0_bag + int((mono_ns - t0_mono) * self.cfg.rate)

    def _wait_until(self, due_mono_ns: int) -> None:
        """Sleep until due; with /clock, publish the bag's time every 1/clock_hz meanwhile."""
        period = int(1e9 / self.cfg.clock_hz)
        while True:
            now = time.monotonic_ns()
            if self.clock_pub is not None and self._t0 is not None and now >= self._next_clock_ns:
                self._publish_clock(self._bag_time_ns(now))
                self._next_clock_ns = now + period
            if now >= due_mono_ns:
                return
            wake = min(due_mono_ns, self._next_clock_ns) if self.clock_pub is not None else due_mono_ns
            time.sleep(max(0.0, (wake - now) * 1e-9))

    def _publish_clock(self, t_ns: int) -> None:
        from builtin_interfaces.msg import Time

        msg = ros_class(CLOCK)()
        msg.clock = Time(sec=t_ns // bags.NS_PER_S, nanosec=t_ns % bags.NS_PER_S)
        self.clock_pub.publish(msg)
