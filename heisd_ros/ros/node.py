"""The policy node: synchronised camera views + end-effector pose in, 7-DoF commands out.

Usage (standalone, from the venv; behaves like `ros2 run heisd_ros policy_node`):
    policy_node --params-file config/policy.yaml [--ros-args -p control_rate_hz:=5.0 -r __ns:=/arm]

Threads: subscriptions, the control timer and diagnostics run on the executor; decoding runs on
ONE worker thread, so callbacks never block. Each control tick hands the newest synchronised set
to the worker; a tick that finds the worker busy is dropped and counted (never queued), so
inputs can arrive at any rate without building a backlog. Only the worker touches the decoder.

Bad input (stale, missing, undecodable, NaN, unknown task, database fault) never produces a
command and never stops the node: it is logged (throttled per kind), reported on /diagnostics,
and the next valid input is acted on. Safety checks on the way out: a non-finite action, or one
beyond `action_limits`, is never published; a valid one is clipped to `max_abs_action`; a
watchdog withholds commands while inference overruns `watchdog_factor` control periods. A step
decoded without retrieval because the database is down is published (drafter mode) with a WARN.
Warnings of the decoding core (Python `logging` under `heisd_ros`: calibration, verify-skip
state, database reconnection) are forwarded to the node's ROS logger.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import sys
import threading
import time
from collections import Counter, deque
from typing import Any, Callable

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped, TwistStamped
from rcl_interfaces.msg import SetParametersResult
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Bool, Float64, String

from heisd_ros.core.errors import (DatabaseError, HeisdError, InvalidObservationError, ModelLoadError,
                                   UnknownTaskError)  # fmt: skip
from heisd_ros.core.gripper import finger_gap
from heisd_ros.core.types import Observation
from heisd_ros.ros import conversions as conv
from heisd_ros.ros.params import PolicyNodeConfig, build_config, declare_all, validate_update
from heisd_ros.ros.sync import ApproxTimeSync, SyncConfig, SyncedSet
from heisd_ros.ros.watchdog import Watchdog

OK, WARN, ERROR = 0, 1, 2  # DiagnosticStatus levels (the message holds them as one byte)
SENSOR_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.BEST_EFFORT,
                        durability=DurabilityPolicy.VOLATILE)  # fmt: skip
"""Images and pose: best effort, depth 1 (always act on the newest frame)."""
LATCHED_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)  # fmt: skip
"""Instruction: a latched message published before the node started still arrives."""
EVENT_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
"""Outputs and episode results: reliable, every message matters to a recorder."""


def load_decoder(cfg: PolicyNodeConfig) -> Any:
    """Build the HybridDecoder from the node's configuration (heisd_ros.policy.load_policy)."""
    try:
        from heisd_ros.policy import PolicyPaths, load_policy
    except ImportError as err:
        raise ModelLoadError(f"the policy loader is not available: {err}") from err
    n = cfg.node
    paths = PolicyPaths(model_dir=n.model_dir, drafter_dir=n.drafter_dir, db_path=n.db_path,
                        calibration_path=n.calibration_path)  # fmt: skip
    return load_policy(paths, cfg.decoder, cfg.store)


@dataclasses.dataclass
class _Job:
    synced: SyncedSet
    instruction: str
    tick_s: float


@dataclasses.dataclass
class _Window:
    """Recent figures for /diagnostics (appended by the worker, read by the diagnostics timer)."""

    published: deque = dataclasses.field(default_factory=lambda: deque(maxlen=2000))
    """(publish time s, frame->command latency s, decode ms, mode)."""
    modes: Counter = dataclasses.field(default_factory=Counter)
    steps: int = 0
    rejected: Counter = dataclasses.field(default_factory=Counter)
    dropped_ticks: int = 0
    clipped: int = 0
    fallbacks: int = 0
    """Steps decoded without retrieval (database fault, task not in the database)."""


class _RosLogBridge(logging.Handler):
    """Forwards warnings of the `heisd_ros` Python loggers to the node's ROS logger (/rosout)."""

    def __init__(self, node: Node) -> None:
        super().__init__(level=logging.WARNING)
        self._logger = node.get_logger()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.name}: {record.getMessage()}"
        except (TypeError, ValueError):  # a malformed format string must not break the caller
            text = f"{record.name}: {record.msg!r}"
        if record.levelno >= logging.ERROR:
            self._logger.error(text)
        else:
            self._logger.warning(text)


class PolicyNode(Node):
    """ROS 2 wrapper of the HybridDecoder (see the module docstring).

    decoder_factory: PolicyNodeConfig -> decoder (reset/step/episode_feedback/health); the default
    loads the configured model. Raises HeisdError (ConfigError, ModelLoadError, DatabaseError...)
    when the node cannot start, with the reason.
    """

    def __init__(self, decoder_factory: Callable[[PolicyNodeConfig], Any] | None = None,
                 node_name: str = "policy_node", **node_kwargs: Any) -> None:  # fmt: skip
        super().__init__(node_name, **node_kwargs)
        started = False
        self._log_bridge = _RosLogBridge(self)
        logging.getLogger("heisd_ros").addHandler(self._log_bridge)
        try:
            self._values = declare_all(self)
            self.cfg = build_config(self._values)
            self._decoder = (decoder_factory or load_decoder)(self.cfg)
            self._setup()
            started = True
        finally:
            if not started:
                self.destroy_node()

    # ------------------------------------------------------------------ setup / teardown
    def _setup(self) -> None:
        n, views = self.cfg.node, self.cfg.decoder.views
        self._sync_lock = threading.Lock()
        self._sync = ApproxTimeSync(SyncConfig(views, n.sync_slop_s, n.image_staleness_s, n.pose_staleness_s))
        self._cv = threading.Condition()
        self._job: _Job | None = None
        self._busy = False
        self._job_started = 0.0  # monotonic time the worker took the current job
        self._watchdog = Watchdog()
        self._stop = False
        self._feedback: list[bool] = []
        self._instruction: str | None = None
        self._episode_instruction: str | None = None  # what the decoder was last reset with
        self._needs_reset = True
        self._step_id = 0
        self._win = _Window()
        self._problems: list[tuple[int, str]] = []  # since the last diagnostics message
        self._last_error = ("", 0.0)
        self._warned: dict[str, float] = {}
        self._health = (True, "not checked yet")
        self._health_t = -1e9

        image_type = CompressedImage if n.compressed_images else Image
        for view, topic in zip(views, n.image_topics):
            self.create_subscription(image_type, topic, functools.partial(self._on_image, view), SENSOR_QOS)
        self.create_subscription(PoseStamped, n.pose_topic, self._on_pose, SENSOR_QOS)
        self._reads_gap = bool(getattr(self._decoder, "reads_finger_gap", False))
        self._gap: tuple[float, float] | None = None  # (header stamp s, finger gap m) of the newest joint_states
        if self._reads_gap:
            self.create_subscription(JointState, n.joint_states_topic, self._on_joint_states, SENSOR_QOS)
        self.create_subscription(String, n.instruction_topic, self._on_instruction, LATCHED_QOS)
        self.create_subscription(Bool, n.episode_result_topic, self._on_episode_result, EVENT_QOS)
        from heisd_ros.msg import ArmCommand, DecodeStats

        self._pub_cmd = self.create_publisher(ArmCommand, n.command_topic, EVENT_QOS)
        self._pub_stats = self.create_publisher(DecodeStats, n.stats_topic, EVENT_QOS)
        self._pub_twist = self._pub_grip = None
        if n.publish_twist:
            self._pub_twist = self.create_publisher(TwistStamped, n.twist_topic, EVENT_QOS)
            self._pub_grip = self.create_publisher(Float64, n.gripper_topic, EVENT_QOS)
        self._pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", EVENT_QOS)

        self._worker = threading.Thread(target=self._work, name="heisd-inference", daemon=True)
        self._worker.start()
        self._timer = self.create_timer(n.control_period_s, self._on_tick)
        self._diag_timer = self.create_timer(n.diagnostics_period_s, self._publish_diagnostics)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        store = self.cfg.store
        spare_s = self._watchdog_budget_s() - n.control_period_s
        if store is not None and store.backend == "remote" and store.timeout_s > spare_s:
            self.get_logger().warning(
                f"store.timeout_s {store.timeout_s:g} s exceeds the watchdog budget minus one control period "
                f"({spare_s:g} s): the first step of a database outage will trip the watchdog"
            )
        self.get_logger().info(
            f"policy node ready: method={self.cfg.decoder.method} views={list(views)} "
            f"rate={n.control_rate_hz} Hz model={n.model_dir!r} dry_run={n.dry_run}"
        )

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the worker (finishing the step in progress) and join it. Idempotent."""
        if not hasattr(self, "_cv"):
            return
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._worker.is_alive() and self._worker is not threading.current_thread():
            self._worker.join(timeout_s)

    def destroy_node(self) -> None:
        self.close()
        self._close_decoder()
        logging.getLogger("heisd_ros").removeHandler(self._log_bridge)
        super().destroy_node()

    def _close_decoder(self) -> None:
        """Release the decoder's resources (the embedded database holds a file lock)."""
        decoder = self.__dict__.pop("_decoder", None)
        if decoder is None or (hasattr(self, "_worker") and self._worker.is_alive()):
            return
        # HybridDecoder.close() when it has one; otherwise close its (public) store
        close = getattr(decoder, "close", None) or getattr(getattr(decoder, "store", None), "close", None)
        if close is not None:
            try:
                close()
            except HeisdError as err:
                self.get_logger().warning(f"closing the decoder: {err}")

    # ------------------------------------------------------------------ executor callbacks
    def _now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_image(self, view: str, msg: Any) -> None:
        with self._sync_lock:
            self._sync.add_frame(view, conv.stamp_to_s(msg.header.stamp), msg)

    def _on_pose(self, msg: PoseStamped) -> None:
        with self._sync_lock:
            self._sync.add_pose(conv.stamp_to_s(msg.header.stamp), msg)

    def _on_joint_states(self, msg: JointState) -> None:
        """Keep the newest finger gap; a message without both finger joints (e.g. an arm-only
        joint_states publisher on the same topic) is ignored, one that is malformed is reported."""
        names = list(msg.name)
        fingers = self.cfg.node.finger_joints
        if not all(f in names for f in fingers):
            return
        try:
            gap = finger_gap([msg.position[names.index(f)] for f in fingers])
        except (ValueError, IndexError) as err:
            self._report("invalid_input", WARN, f"joint_states: no finger gap from {list(fingers)}: {err}", rejected=False)
            return
        with self._sync_lock:
            self._gap = (conv.stamp_to_s(msg.header.stamp), gap)

    def _finger_gap_for(self, stamp_s: float) -> tuple[float | None, str]:
        """(gap, '') for a synchronised set stamped `stamp_s`, or (None, why not)."""
        n = self.cfg.node
        with self._sync_lock:
            gap = self._gap
        if gap is None:
            return None, f"the model reads the finger gap, but nothing with joints {list(n.finger_joints)} " \
                         f"has arrived on {n.joint_states_topic!r}"
        age = stamp_s - gap[0]
        if abs(age) > n.pose_staleness_s:
            return None, f"finger gap {age:.3f} s from the images' stamp > pose_staleness_s {n.pose_staleness_s:.3f}"
        return gap[1], ""

    def _on_instruction(self, msg: String) -> None:
        text = msg.data.strip()
        with self._cv:
            if text != self._instruction:
                self.get_logger().info(f"instruction: {text!r}" if text else "instruction cleared")
            self._instruction = text or None

    def _on_episode_result(self, msg: Bool) -> None:
        with self._cv:
            self._feedback.append(bool(msg.data))
            self._cv.notify_all()

    def _on_tick(self) -> None:
        now = self._now_s()
        with self._cv:
            busy, instruction = self._busy, self._instruction
            if busy:
                self._win.dropped_ticks += 1
                running_s = time.monotonic() - self._job_started
        if busy:
            hung = self._watchdog.running(running_s, self._watchdog_budget_s())
            if hung:
                self._problem("watchdog", ERROR, f"watchdog: inference running for {running_s * 1e3:.0f} ms "
                              f"> budget {self._watchdog_budget_s() * 1e3:.0f} ms; commands withheld")  # fmt: skip
            return
        with self._sync_lock:
            synced = self._sync.poll(now)
            events, self._sync.events = self._sync.events, []
            for why in events:
                self._report("clock", WARN, f"clock jump: {why}; synchroniser restarted", rejected=False)
            if synced is None:
                if self._sync.problem:
                    self._problem("input", WARN, self._sync.reason)
                return
            if instruction is None:  # kept unconsumed: acted on if still fresh when one arrives
                self._problem("no_instruction", WARN,
                              f"no instruction received yet on {self.cfg.node.instruction_topic!r}")  # fmt: skip
                return
            self._sync.consume(synced)
        with self._cv:
            self._job = _Job(synced, instruction, now)
            self._busy = True
            self._job_started = time.monotonic()  # the worker restarts it on pickup
            self._cv.notify_all()

    def _on_set_parameters(self, params: list) -> SetParametersResult:
        new_cfg, reason = validate_update(self._values, {p.name: p.value for p in params})
        if new_cfg is None:
            return SetParametersResult(successful=False, reason=reason)
        self._values.update({p.name: p.value for p in params if p.name in self._values})
        self.cfg = new_cfg
        n = new_cfg.node
        with self._sync_lock:
            self._sync.reconfigure(SyncConfig(new_cfg.decoder.views, n.sync_slop_s, n.image_staleness_s,
                                              n.pose_staleness_s))  # fmt: skip
        return SetParametersResult(successful=True)

    # ------------------------------------------------------------------ problems and logging
    def _problem(self, kind: str, level: int, message: str) -> None:
        """Record a step that produced no command: throttled warning + diagnostic."""
        self._report(kind, level, message, rejected=True)

    def _report(self, kind: str, level: int, message: str, rejected: bool) -> None:
        """Throttled log + diagnostic; `rejected` counts it as a step without a command."""
        now = time.monotonic()
        with self._cv:
            if rejected:
                self._win.rejected[kind] += 1
            self._problems.append((level, message))
            self._last_error = (message, now)
            last = self._warned.get(kind, -1e9)
            log = now - last >= self.cfg.node.warn_throttle_s
            if log:
                self._warned[kind] = now
        text = f"no command: {message}" if rejected else message
        # rclpy pins one severity per call site, hence two calls
        if log and level == ERROR:
            self.get_logger().error(text)
        elif log:
            self.get_logger().warning(text)

    def _watchdog_budget_s(self) -> float:
        return self.cfg.node.watchdog_factor * self.cfg.node.control_period_s

    # ------------------------------------------------------------------ worker thread
    def _work(self) -> None:
        while True:
            with self._cv:
                period = self.cfg.node.diagnostics_period_s
                self._cv.wait_for(lambda: self._stop or self._job is not None or bool(self._feedback), period)
                if self._stop:
                    return
                job, self._job = self._job, None
                feedback, self._feedback = self._feedback, []
                self._job_started = time.monotonic()
            try:
                for success in feedback:
                    self._decoder.episode_feedback(success)
                    self._needs_reset = True
                    self.get_logger().info(f"episode result: {'success' if success else 'failure'}")
                if job is not None:
                    self._run_step(job)
            except HeisdError as err:
                # episode_feedback/reset failures (e.g. persisting thresholds): report, keep going
                self._problem("decoder", ERROR, f"{type(err).__name__}: {err}")
            finally:
                if job is not None:
                    self._watchdog.finished()
                    with self._cv:
                        self._busy = False
            if time.monotonic() - self._health_t >= period:
                self._refresh_health()

    def _refresh_health(self) -> None:
        self._health_t = time.monotonic()
        try:
            ok, text = self._decoder.health()
        except HeisdError as err:
            ok, text = False, f"{type(err).__name__}: {err}"
        self._health = (bool(ok), str(text))

    def _run_step(self, job: _Job) -> None:
        n = self.cfg.node
        if self._needs_reset or job.instruction != self._episode_instruction:
            self._decoder.reset(job.instruction)
            self._episode_instruction, self._needs_reset, self._step_id = job.instruction, False, 0
        started = time.monotonic()
        gap = None
        if self._reads_gap:
            gap, why = self._finger_gap_for(job.synced.stamp_s)
            if gap is None:
                return self._problem("invalid_input", WARN, f"invalid input: {why}")
        try:
            images = {v: conv.msg_to_rgb(f.data, n.expected_hw) for v, f in job.synced.frames.items()}
            ee_pos = conv.pose_to_position(job.synced.pose.data, n.quat_norm_tol)
            obs = Observation(images=images, instruction=job.instruction, ee_pos=ee_pos,
                              task=n.task or None, stamp_s=job.synced.stamp_s, gripper_gap=gap)  # fmt: skip
            action, stats = self._decoder.step(obs)
            action = conv.check_action(action)
        except InvalidObservationError as err:
            return self._problem("invalid_input", WARN, f"invalid input: {err}")
        except UnknownTaskError as err:
            return self._problem("unknown_task", ERROR, f"unknown task: {err}")
        except DatabaseError as err:
            self._health_t = -1e9  # re-check the database at once
            return self._problem("database", ERROR, f"database: {type(err).__name__}: {err}")
        except HeisdError as err:
            return self._problem("decoder", ERROR, f"{type(err).__name__}: {err}")
        was_tripped = self._watchdog.tripped
        ok, why = self._watchdog.step(time.monotonic() - started, self._watchdog_budget_s(), n.watchdog_recovery_steps)
        if not ok:
            return self._problem("watchdog", ERROR, why)
        if was_tripped:
            self.get_logger().warning(f"watchdog cleared: {n.watchdog_recovery_steps} steps within budget, "
                                      "commanding again")  # fmt: skip
        now = self._now_s()
        age = now - job.synced.image_stamp_s
        if age > n.image_staleness_s:
            return self._problem("slow", WARN, f"result stale: inputs {age:.3f} s old at publication "
                                 f"> image_staleness_s {n.image_staleness_s:.3f} (decoding too slow?)")  # fmt: skip
        if age < -n.image_staleness_s:
            return self._problem("clock", WARN, f"clock jumped back during decoding: inputs stamped {-age:.3f} s "
                                 "in the future at publication")  # fmt: skip
        beyond = np.flatnonzero(np.abs(action) > np.asarray(n.action_limits))
        if beyond.size:
            return self._problem("out_of_range", ERROR, f"action out of range: dimension(s) {beyond.tolist()} = "
                                 f"{action[beyond].round(4).tolist()} beyond action_limits "
                                 f"{[n.action_limits[i] for i in beyond]}")  # fmt: skip
        if stats.fallback:  # decoded (drafter mode), but the operator must know retrieval is off
            with self._cv:
                self._win.fallbacks += 1
            self._report("fallback", WARN, f"decoded without retrieval: {stats.fallback}", rejected=False)
        clipped = conv.clip_action(action, n.max_abs_action)
        stamp, frame = job.synced.stamp_s, n.command_frame_id
        self._step_id += 1
        if not n.dry_run:
            self._pub_cmd.publish(conv.to_arm_command(clipped, stats, stamp, frame, self._step_id))
            if self._pub_twist is not None:
                self._pub_twist.publish(conv.to_twist(clipped, stamp, frame, n.twist_linear_scale,
                                                      n.twist_angular_scale))  # fmt: skip
                self._pub_grip.publish(conv.to_gripper(clipped))
        self._pub_stats.publish(conv.to_decode_stats(stats, stamp, frame, self._step_id))
        latency = self._now_s() - job.synced.image_stamp_s
        with self._cv:
            self._win.steps += 1
            self._win.modes[stats.mode] += 1
            self._win.clipped += int(not np.array_equal(clipped, action))
            self._win.published.append((time.monotonic(), latency, float(stats.latency_ms.get("total", 0.0)),
                                        stats.mode))  # fmt: skip

    # ------------------------------------------------------------------ diagnostics
    def _publish_diagnostics(self) -> None:
        n = self.cfg.node
        now = time.monotonic()
        horizon = max(5.0, 5 * n.diagnostics_period_s)
        with self._cv:
            recent = [p for p in self._win.published if now - p[0] <= horizon]
            problems, self._problems = self._problems, []
            modes, rejected = dict(self._win.modes), dict(self._win.rejected)
            steps, dropped, clipped = self._win.steps, self._win.dropped_ticks, self._win.clipped
            fallbacks = self._win.fallbacks
            last_error, last_error_t = self._last_error
            instruction = self._instruction
        trips, tripped = self._watchdog.state.trips, self._watchdog.tripped
        health_ok, health_text = self._health
        lat = np.array([p[1] for p in recent]) * 1e3
        dec = np.array([p[2] for p in recent])
        rate = (len(recent) - 1) / (recent[-1][0] - recent[0][0]) if len(recent) > 1 and recent[-1][0] > recent[0][0] else 0.0
        period_ms = n.control_period_s * 1e3

        level = max([lvl for lvl, _ in problems], default=OK)
        message = problems[-1][1] if problems else "running"
        if tripped:  # withholding commands is an ERROR for as long as it lasts
            level, message = ERROR, next((m for _, m in reversed(problems) if m.startswith("watchdog")),
                                         "watchdog tripped: commands withheld")  # fmt: skip
        if len(dec) and np.median(dec) > period_ms and level == OK:
            level, message = WARN, f"decoding takes {np.median(dec):.0f} ms, longer than the control period {period_ms:.0f} ms"
        if instruction is None and level == OK:
            level, message = WARN, "waiting for an instruction"
        med = lambda a: f"{np.median(a):.1f}" if len(a) else "nan"  # noqa: E731
        p95 = lambda a: f"{np.percentile(a, 95):.1f}" if len(a) else "nan"  # noqa: E731
        values = {
            "method": self.cfg.decoder.method, "dry_run": str(n.dry_run), "instruction": instruction or "",
            "target_rate_hz": f"{n.control_rate_hz:.2f}", "command_rate_hz": f"{rate:.2f}",
            "control_period_ms": f"{period_ms:.1f}", "latency_median_ms": med(lat), "latency_p95_ms": p95(lat),
            "decode_median_ms": med(dec), "steps": str(steps), "dropped_ticks": str(dropped),
            "clipped_commands": str(clipped), "fallback_steps": str(fallbacks),
            "watchdog": "tripped" if tripped else "ok", "watchdog_trips": str(trips),
            "clock_resets": str(self._sync.clock_resets),
            "mode_mix": " ".join(f"{k}:{v}" for k, v in sorted(modes.items())) or "-",
            "rejected": " ".join(f"{k}:{v}" for k, v in sorted(rejected.items())) or "-",
            "last_error": last_error, "last_error_age_s": f"{now - last_error_t:.1f}" if last_error else "",
            "database_healthy": str(health_ok), "database_status": health_text,
        }  # fmt: skip
        name = self.get_fully_qualified_name()
        main = DiagnosticStatus(level=bytes([level]), name=f"{name}: policy", hardware_id=name, message=message,
                                values=[KeyValue(key=k, value=v) for k, v in values.items()])  # fmt: skip
        db = DiagnosticStatus(level=bytes([OK if health_ok else ERROR]), name=f"{name}: database",
                              hardware_id=name, message=health_text)  # fmt: skip
        arr = DiagnosticArray(status=[main, db])
        arr.header.stamp = self.get_clock().now().to_msg()
        self._pub_diag.publish(arr)


# ---------------------------------------------------------------------------------------------
# entry point


def _split_ros_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(own arguments, the `--ros-args ... [--]` sections verbatim) of argv[1:]."""
    own: list[str] = []
    ros: list[str] = []
    inside = False
    for a in argv[1:]:
        if a == "--ros-args":
            inside = True
            ros.append(a)
        elif inside and a == "--":
            inside = False
            ros.append(a)
        else:
            (ros if inside else own).append(a)
    return own, ros


def _ros_args(argv: list[str]) -> list[str]:
    """Translate the standalone flags into ROS arguments; `--ros-args ...` is passed through."""
    parser = argparse.ArgumentParser(prog="policy_node", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params-file", action="append", default=[], help="ROS 2 parameter YAML (repeatable)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                        help="override one parameter (repeatable)")  # fmt: skip
    parser.add_argument("--log-level", default=None, help="debug, info, warn, error")
    own, ros = _split_ros_args(argv)
    opts = parser.parse_args(own)
    extra: list[str] = []
    for f in opts.params_file:
        extra += ["--params-file", f]
    for p in opts.param:
        extra += ["-p", p]
    if opts.log_level:
        extra += ["--log-level", opts.log_level]
    return [argv[0], *ros] + (["--ros-args", *extra] if extra else [])


def main(argv: list[str] | None = None) -> int:
    """Run the policy node until SIGINT/SIGTERM; exit 1 with the reason when it cannot start."""
    argv = list(sys.argv if argv is None else ["policy_node", *argv])
    rclpy.init(args=_ros_args(argv))
    try:
        node = PolicyNode()
    except HeisdError as err:
        rclpy.logging.get_logger("policy_node").fatal(f"cannot start: {type(err).__name__}: {err}")
        rclpy.try_shutdown()
        return 1
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.get_logger().info("shutting down")
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
