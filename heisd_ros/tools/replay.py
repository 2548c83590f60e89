"""heisd replay: play a rosbag2 into the policy node over real topics and record what it publishes.

Usage:
    heisd replay BAG [--fast | --rate R] [--out OUT_BAG] [--start-node [--params-file config/policy.yaml]
                 [--method heisd --method ar ...] [-p NAME:=VALUE ...]] [--step-timeout-s 5]
                 [--remap FROM:=TO ...] [--keep-stamps] [--domain-id N] [--json FILE] [--quiet]

BAG is a rosbag2 directory (sqlite3 or MCAP) holding image, pose, instruction and episode-result
topics (e.g. from `python -m heisd_ros.tools.make_bag`). Its messages are published as raw CDR on
their topics (after --remap), either paced by their recorded times divided by R, or with --fast in
lockstep: every synchronised image set waits for the node's DecodeStats before the next one, so each
synchronised step is decoded exactly once. Header stamps are shifted to the replay clock (recorded
stamps would be stale for the node's staleness limits) unless --keep-stamps.

Without --start-node a policy node must already run (same ROS domain). With --start-node the node is
started in this process from the parameter file, once per --method, on the same bag. The node's
outputs (ArmCommand, DecodeStats, Twist/gripper, /diagnostics) go into a new MCAP bag at OUT_BAG,
under their own topic names for one method and under /<method>/... for several. A per-method summary
(steps, mode mix, median latencies, forwards per step) is printed and optionally written as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from heisd_ros.core.config import METHODS
from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.pipeline.outputs import git_revision

OUTPUT_TYPES = {
    "arm_command": "heisd_ros/msg/ArmCommand",
    "decode_stats": "heisd_ros/msg/DecodeStats",
    "cmd_twist": "geometry_msgs/msg/TwistStamped",
    "gripper_command": "std_msgs/msg/Float64",
    "/diagnostics": "diagnostic_msgs/msg/DiagnosticArray",
}
"""Default output topics of the node and their types."""
IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
INPUT_TYPES = IMAGE_TYPES + ("geometry_msgs/msg/PoseStamped", "sensor_msgs/msg/JointState", "std_msgs/msg/String",
                             "std_msgs/msg/Bool")


@dataclass(frozen=True)
class ReplayConfig:
    """How a bag is replayed."""

    rate: float = 1.0
    """Playback rate relative to the recording (ignored with fast)."""
    fast: bool = False
    """Lockstep: each synchronised image set waits for the node's DecodeStats (or step_timeout_s)."""
    out: str = ""
    """Output MCAP bag ('' = BAG + '_replay')."""
    methods: tuple[str, ...] = ()
    """With start_node: one replay per method ('' = the parameter file's decoder.method)."""
    start_node: bool = False
    """Start the policy node in this process instead of using a running one."""
    params_file: str = "config/policy.yaml"
    """Parameter file of the started node."""
    params: tuple[str, ...] = ()
    """NAME:=VALUE overrides for the started node."""
    step_timeout_s: float = 5.0
    """Lockstep: give up waiting for a step's output after this."""
    connect_timeout_s: float = 10.0
    """How long to wait for the node's subscriptions and publishers to appear."""
    slop_s: float = 0.05
    """Stamp spread that groups the bag's images into one synchronised step (lockstep only)."""
    settle_s: float = 1.0
    """Time to keep recording after the last message."""
    restamp: bool = True
    """Shift header stamps to the replay clock."""
    remap: tuple[str, ...] = ()
    """FROM:=TO topic renames applied to the bag's topics."""
    domain_id: int = -1
    """ROS domain (-1 = ROS_DOMAIN_ID from the environment)."""
    quiet: bool = False

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ConfigError("rate must be > 0")
        if self.step_timeout_s <= 0 or self.connect_timeout_s <= 0 or self.settle_s < 0 or self.slop_s < 0:
            raise ConfigError("step_timeout_s and connect_timeout_s must be > 0, settle_s and slop_s >= 0")
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ConfigError(f"unknown method(s) {bad}; choose from {METHODS}")
        if len(self.methods) > 1 and not self.start_node:
            raise ConfigError("several methods need --start-node (the decoder method of a running node is read-only)")
        for r in self.remap + self.params:
            if ":=" not in r:
                raise ConfigError(f"expected NAME:=VALUE, got {r!r}")


# ---------------------------------------------------------------------------------------------
# bag side (rosbags)


def msg_dir() -> Path:
    """Where heisd_ros's .msg files are: the source tree, or an installed share/heisd_ros/msg."""
    candidates = [Path(__file__).resolve().parents[2] / "msg", Path(sys.prefix) / "share" / "heisd_ros" / "msg"]
    candidates += [Path(p) / "share" / "heisd_ros" / "msg" for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    for c in candidates:
        if (c / "ArmCommand.msg").is_file():
            return c
    raise ConfigError(f"cannot find heisd_ros/msg/*.msg (looked in {[str(c) for c in candidates]})")


def typestore() -> Any:
    """The Kilted typestore plus heisd_ros's message types (from their .msg text)."""
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    ts = get_typestore(Stores.ROS2_KILTED)
    types: dict = {}
    for f in sorted(msg_dir().glob("*.msg")):
        types.update(get_types_from_msg(f.read_text(), f"heisd_ros/msg/{f.stem}"))
    ts.register(types)
    return ts


@dataclass
class BagMessage:
    topic: str
    msgtype: str
    t_ns: int
    """Recorded (log) time."""
    raw: bytes
    stamp_ns: int | None
    """Header stamp, None for messages without a header."""
    step_end: bool = False
    """The last image of a synchronised set: lockstep waits after publishing it."""


def _bag_errors() -> tuple[type[BaseException], ...]:
    """What rosbags raises for a damaged bag. It has no common base: besides its own errors, corrupt
    metadata, storage or CDR surface as decoding, lookup, struct and SQLite errors."""
    import sqlite3
    import struct

    from rosbags.highlevel import AnyReaderError
    from rosbags.rosbag2 import ReaderError
    from rosbags.serde import SerdeError

    errors: list[type[BaseException]] = [AnyReaderError, ReaderError, SerdeError, OSError, ValueError, KeyError,
                                         IndexError, TypeError, struct.error, sqlite3.Error]  # fmt: skip
    try:
        import apsw  # rosbags' SQLite binding

        errors.append(apsw.Error)
    except ImportError:
        pass
    return tuple(errors)


def read_bag(path: str | Path, remap: dict[str, str], slop_s: float) -> tuple[list[BagMessage], int]:
    """The bag's input messages in recorded order, with synchronised steps marked; and the step count.

    A bag is untrusted input: every message is deserialised here, before anything is published (a
    malformed message must fail the replay with the reason, never reach the node), and any damage to
    the metadata, the storage file or a message raises ConfigError naming the bag.
    """
    from rosbags.highlevel import AnyReader

    from heisd_ros.ros.sync import ApproxTimeSync, SyncConfig

    ts = typestore()
    out: list[BagMessage] = []
    if not Path(path).is_dir():
        raise ConfigError(f"bag {path} not found (a rosbag2 directory)")
    try:
        with AnyReader([Path(path)], default_typestore=ts) as reader:
            conns = [c for c in reader.connections if c.msgtype in INPUT_TYPES]
            if not conns:
                raise ConfigError(f"{path}: no image/pose/instruction/episode-result topics ({INPUT_TYPES})")
            for conn, t_ns, raw in reader.messages(connections=conns):
                msg = reader.deserialize(raw, conn.msgtype)
                stamp = None
                if conn.msgtype not in ("std_msgs/msg/String", "std_msgs/msg/Bool"):
                    h = msg.header.stamp
                    if not 0 <= h.nanosec < 1_000_000_000:
                        raise ConfigError(f"bag {path}: {conn.topic} has a header stamp with nanosec {h.nanosec}")
                    stamp = h.sec * 1_000_000_000 + h.nanosec
                out.append(BagMessage(remap.get(conn.topic, conn.topic), conn.msgtype, t_ns, bytes(raw), stamp))
    except ConfigError:
        raise
    except _bag_errors() as err:
        raise ConfigError(f"cannot read bag {path}: {type(err).__name__}: {err}") from err
    views = tuple(sorted({m.topic for m in out if m.msgtype in IMAGE_TYPES}))
    steps = 0
    if views:
        sync = ApproxTimeSync(SyncConfig(views, slop_s, 1e12, 1e12))
        sync.add_pose(0.0, None)  # grouping only needs the images
        for m in out:
            if m.msgtype in IMAGE_TYPES:
                sync.add_frame(m.topic, m.stamp_ns * 1e-9, m)
                synced = sync.poll(m.stamp_ns * 1e-9)
                if synced is not None:
                    sync.consume(synced)
                    m.step_end = True
                    steps += 1
    return out, steps


def restamp(ts: Any, m: BagMessage, offset_ns: int) -> bytes:
    """The message's CDR with its header stamp shifted by offset_ns."""
    if m.stamp_ns is None or offset_ns == 0:
        return m.raw
    msg = ts.deserialize_cdr(m.raw, m.msgtype)
    ns = max(0, m.stamp_ns + offset_ns)
    msg.header.stamp = ts.types["builtin_interfaces/msg/Time"](sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)
    return bytes(ts.serialize_cdr(msg, m.msgtype))


# ---------------------------------------------------------------------------------------------
# ROS side


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

    def __init__(self, node: Any, out: Path, ts: Any) -> None:
        from rosbags.rosbag2 import StoragePlugin, Writer

        self.node, self.ts = node, ts
        self.writer = Writer(out, version=9, storage_plugin=StoragePlugin.MCAP)
        self.writer.open()
        self.conns: dict[str, Any] = {}
        self.subs: list = []
        self.lock = threading.Lock()
        self.on_stats: Callable[[Any], None] | None = None
        self.run: MethodRun | None = None

    def record(self, topic: str, msgtype: str, bag_topic: str) -> None:
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from rclpy.serialization import deserialize_message

        cls = _ros_class(msgtype)
        if bag_topic not in self.conns:
            self.conns[bag_topic] = self.writer.add_connection(bag_topic, msgtype, typestore=self.ts)
        conn = self.conns[bag_topic]

        def on_raw(raw: bytes) -> None:
            now = self.node.get_clock().now().nanoseconds
            with self.lock:
                self.writer.write(conn, now, raw)
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
    """Publishes the bag's messages as raw CDR from the calling thread."""

    def __init__(self, node: Any, messages: list[BagMessage], ts: Any, cfg: ReplayConfig) -> None:
        from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

        self.node, self.messages, self.ts, self.cfg = node, messages, ts, cfg
        self.pubs: dict[str, Any] = {}
        for m in messages:
            if m.topic in self.pubs:
                continue
            if m.msgtype == "std_msgs/msg/String":  # the instruction is latched
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
        cfg = self.cfg
        t0_bag = self.messages[0].t_ns
        t0_wall = self.now_ns()
        offset = None
        for m in self.messages:
            if cfg.fast:
                if offset is None:  # one offset per step keeps the views' relative stamps
                    offset = self.now_ns() - (m.stamp_ns if m.stamp_ns is not None else m.t_ns)
            else:
                due = t0_wall + int((m.t_ns - t0_bag) / cfg.rate)
                delay = (due - self.now_ns()) * 1e-9
                if delay > 0:
                    time.sleep(delay)
                # recorded stamps are mapped onto the replay clock at the playback rate
                offset = None if m.stamp_ns is None else t0_wall + int((m.stamp_ns - t0_bag) / cfg.rate) - m.stamp_ns
            shift = (offset or 0) if cfg.restamp else 0
            self.pubs[m.topic].publish(restamp(self.ts, m, shift))
            if cfg.fast and m.msgtype in ("std_msgs/msg/String", "std_msgs/msg/Bool"):
                time.sleep(0.05)  # let the node take the instruction/result before the next images
                offset = None
            if cfg.fast and m.step_end:
                stamp_s = (m.stamp_ns + shift) * 1e-9
                end = time.monotonic() + cfg.step_timeout_s
                while not got_step(stamp_s) and time.monotonic() < end:
                    time.sleep(0.002)
                if not got_step(stamp_s):
                    run.timeouts += 1
                offset = None


# ---------------------------------------------------------------------------------------------
# running and summarising


def _stamp_s(msg: Any) -> float:
    return msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec


def summarise(run: MethodRun, bag_steps: int) -> dict:
    stats = [s for _, s in run.stats]
    n = len(stats)
    modes: dict[str, int] = {}
    for s in stats:
        modes[s.mode] = modes.get(s.mode, 0) + 1
    total = np.array([s.total_ms for s in stats], dtype=float)
    e2e = np.array([(t - _stamp_s(c)) * 1e3 for t, c in run.commands], dtype=float)
    cycles = sum(s.llm_forwards + int(s.skipped) for s in stats)
    diag = {}
    if run.diagnostics:
        for st in run.diagnostics[-1].status:
            if st.name.endswith(": policy"):
                diag = {kv.key: kv.value for kv in st.values}
    med = lambda a: float(np.median(a)) if len(a) else float("nan")  # noqa: E731
    return {
        "method": run.method,
        "bag_steps": bag_steps,
        "decoded_steps": n,
        "commands": len(run.commands),
        "timeouts": run.timeouts,
        "mode_mix": dict(sorted(modes.items())),
        "median_decode_ms": med(total),
        "p90_decode_ms": float(np.percentile(total, 90)) if n else float("nan"),
        "median_command_latency_ms": med(e2e),
        "forwards_per_step": sum(s.llm_forwards for s in stats) / n if n else float("nan"),
        "accept_length": 7 * n / cycles if cycles else float("nan"),
        "dropped_ticks": int(diag.get("dropped_ticks", 0) or 0),
        "rejected": diag.get("rejected", ""),
        "wall_s": run.wall_s,
    }


def format_summary(rows: list[dict]) -> str:
    head = f"{'method':<10} {'steps':>11} {'cmds':>5} {'decode ms':>10} {'cmd lat ms':>10} {'fwd/step':>8} {'acc len':>7}  mode mix"
    lines = [head, "-" * len(head)]
    for r in rows:
        mix = " ".join(f"{k}:{v}" for k, v in r["mode_mix"].items()) or "-"
        lines.append(f"{r['method']:<10} {r['decoded_steps']:>5}/{r['bag_steps']:<5} {r['commands']:>5} "
                     f"{r['median_decode_ms']:>10.1f} {r['median_command_latency_ms']:>10.1f} "
                     f"{r['forwards_per_step']:>8.2f} {r['accept_length']:>7.2f}  {mix}")  # fmt: skip
    return "\n".join(lines)


def _param_overrides(pairs: tuple[str, ...]) -> list:
    import yaml
    from rclpy.parameter import Parameter

    out = []
    for pair in pairs:
        name, _, text = pair.partition(":=")
        out.append(Parameter(name, value=yaml.safe_load(text)))
    return out


def replay(bag: str | Path, cfg: ReplayConfig, decoder_factory: Callable | None = None,
           progress: Callable[[str], None] | None = None) -> dict:  # fmt: skip
    """Replay `bag` once per method; returns the JSON-ready result (also written into cfg.out)."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    say = progress or (lambda s: None if cfg.quiet else print(s, flush=True))
    out = Path(cfg.out or f"{Path(bag).as_posix().rstrip('/')}_replay")
    if out.exists():
        raise ConfigError(f"output bag {out} exists; choose another --out")
    if cfg.start_node and not Path(cfg.params_file).is_file():
        raise ConfigError(f"parameter file {cfg.params_file} not found")
    remap = dict(r.split(":=", 1) for r in cfg.remap)
    messages, bag_steps = read_bag(bag, remap, cfg.slop_s)
    ts = typestore()
    say(f"replay {bag}: {len(messages)} messages, {bag_steps} synchronised steps -> {out}")

    args = ["heisd-replay"]
    if cfg.start_node:
        args += ["--ros-args", "--params-file", cfg.params_file]
    ctx = rclpy.Context()
    rclpy.init(args=args, context=ctx, domain_id=None if cfg.domain_id < 0 else cfg.domain_id)
    node = rclpy.create_node("heisd_replay", context=ctx)
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    recorder = Recorder(node, out, ts)
    runs: list[MethodRun] = []
    try:
        player = Player(node, messages, ts, cfg)
        for method in cfg.methods or ("",):
            runs.append(_run_method(method, cfg, node, ctx, executor, player, recorder, decoder_factory, bag_steps, say))
    finally:
        recorder.stop()
        executor.shutdown(timeout_sec=2.0)
        spinner.join(2.0)
        recorder.close()
        node.destroy_node()
        rclpy.try_shutdown(context=ctx)
    rows = [summarise(r, bag_steps) for r in runs]
    say("\n" + format_summary(rows))
    return {"bag": str(bag), "out": str(out), "config": dataclasses.asdict(cfg), "git_rev": git_revision(),
            "methods": {r["method"]: r for r in rows}}  # fmt: skip


def _run_method(method, cfg, node, ctx, executor, player, recorder, decoder_factory, bag_steps, say) -> MethodRun:
    from rclpy.parameter import Parameter

    from heisd_ros.ros.node import PolicyNode

    policy = None
    prefix = ""
    outputs = dict(OUTPUT_TYPES)
    if cfg.start_node:
        overrides = _param_overrides(cfg.params)
        if cfg.fast and not any(o.name == "watchdog_factor" for o in overrides):
            # Lockstep publishes the next inputs only after the node answered the last ones, so a slow
            # step (first-call warm-up, a loaded machine) builds no backlog; the real-time watchdog
            # would only withhold the next commands and make the replay wait step_timeout_s for each.
            # The largest budget (100 control periods) unless the user sets one.
            overrides.append(Parameter("watchdog_factor", value=100.0))
        if method:
            overrides.append(Parameter("decoder.method", value=method))
        policy = PolicyNode(decoder_factory, context=ctx, parameter_overrides=overrides)
        method = policy.cfg.decoder.method
        n = policy.cfg.node
        outputs = {n.command_topic: OUTPUT_TYPES["arm_command"], n.stats_topic: OUTPUT_TYPES["decode_stats"],
                   "/diagnostics": OUTPUT_TYPES["/diagnostics"]}  # fmt: skip
        if n.publish_twist:
            outputs.update({n.twist_topic: OUTPUT_TYPES["cmd_twist"], n.gripper_topic: OUTPUT_TYPES["gripper_command"]})
        executor.add_node(policy)
    if len(cfg.methods) > 1:
        prefix = f"/{method}"
    run = MethodRun(method or "node")
    try:
        for topic, msgtype in outputs.items():
            recorder.record(topic, msgtype, prefix + (topic if topic.startswith("/") else "/" + topic))
        missing = player.wait_for_subscribers(cfg.connect_timeout_s)
        if missing:
            raise ConfigError(f"no subscriber on {missing}: is the policy node running (or use --start-node)?")
        unmatched = recorder.wait_matched(cfg.connect_timeout_s)
        if unmatched:
            say(f"warning: nothing publishes {unmatched} yet; recording them anyway")
        seen: list[float] = []

        def on_stats(msg: Any) -> None:
            seen.append(_stamp_s(msg))
            k = len(seen)
            say(f"[{run.method}] step {k:>4}/{bag_steps} mode={msg.mode:<9} forwards={msg.llm_forwards} "
                f"decode={msg.total_ms:7.1f} ms")  # fmt: skip

        recorder.on_stats, recorder.run = on_stats, run
        t0 = time.monotonic()
        player.play(run, lambda stamp: any(s >= stamp - 1e-6 for s in seen[-3:]))
        time.sleep(cfg.settle_s)
        run.wall_s = time.monotonic() - t0
    finally:
        recorder.run = None
        recorder.stop()
        if policy is not None:
            executor.remove_node(policy)
            policy.destroy_node()
    return run


# ---------------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="heisd replay", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    p.add_argument("bag", help="rosbag2 directory (sqlite3 or MCAP)")
    d = ReplayConfig()
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--rate", type=float, default=d.rate, help="playback rate (default 1.0)")
    mode.add_argument("--fast", action="store_true", help="lockstep: one decoded step per synchronised set")
    p.add_argument("--out", default=d.out, help="output MCAP bag (default BAG_replay)")
    p.add_argument("--method", dest="methods", action="append", default=[], choices=METHODS,
                   help="with --start-node: one replay per method (repeatable)")  # fmt: skip
    p.add_argument("--start-node", action="store_true", help="start the policy node in this process")
    p.add_argument("--params-file", default=d.params_file, help="parameter file of the started node")
    p.add_argument("-p", "--param", dest="params", action="append", default=[], metavar="NAME:=VALUE",
                   help="parameter override for the started node (repeatable)")  # fmt: skip
    p.add_argument("--step-timeout-s", type=float, default=d.step_timeout_s)
    p.add_argument("--connect-timeout-s", type=float, default=d.connect_timeout_s)
    p.add_argument("--slop-s", type=float, default=d.slop_s)
    p.add_argument("--settle-s", type=float, default=d.settle_s)
    p.add_argument("--keep-stamps", action="store_true", help="publish the recorded header stamps unchanged")
    p.add_argument("--remap", action="append", default=[], metavar="FROM:=TO")
    p.add_argument("--domain-id", type=int, default=d.domain_id)
    p.add_argument("--json", default="", help="write the result as JSON here")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = ReplayConfig(rate=args.rate, fast=args.fast, out=args.out, methods=tuple(args.methods),
                           start_node=args.start_node, params_file=args.params_file, params=tuple(args.params),
                           step_timeout_s=args.step_timeout_s, connect_timeout_s=args.connect_timeout_s,
                           slop_s=args.slop_s, settle_s=args.settle_s,
                           restamp=not args.keep_stamps, remap=tuple(args.remap), domain_id=args.domain_id,
                           quiet=args.quiet)  # fmt: skip
        result = replay(args.bag, cfg)
    except HeisdError as err:
        print(f"heisd replay: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
