"""The policy node: synchronised camera views + end-effector pose in, 7-DoF commands out.

Usage (standalone, from the venv; behaves like `ros2 run heisd_ros policy_node`):
    policy_node --params-file config/policy.yaml [--ros-args -p control_rate_hz:=5.0 -r __ns:=/arm]

Threads: subscriptions, the control timer and diagnostics run on the executor; decoding runs on
ONE worker thread (`worker.InferenceWorker`), so callbacks never block. Each control tick hands
the newest synchronised set to the worker; a tick that finds the worker busy is dropped and
counted (never queued), so inputs can arrive at any rate without building a backlog. Only the
worker touches the decoder (`step.StepRunner`).

Bad input (stale, missing, undecodable, NaN, unknown task, database fault) never produces a
command and never stops the node: it is logged (throttled per kind), reported on /diagnostics,
and the next valid input is acted on. Safety checks on the way out: a non-finite action, or one
beyond `action_limits`, is never published; a valid one is clipped to `max_abs_action`; a
watchdog withholds commands while inference overruns `watchdog_factor` control periods. A step
decoded without retrieval because the database is down is published (drafter mode) with a WARN.
Warnings of the decoding core (Python `logging` under `heisd_ros`) go to the node's ROS logger.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
import threading
from typing import Any, Callable

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from rcl_interfaces.msg import SetParametersResult
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Bool, String

from heisd_ros.core.errors import HeisdError, InvalidObservationError, ModelLoadError
from heisd_ros.core.gripper import finger_gap
from heisd_ros.ros import conversions as conv
from heisd_ros.ros.diagnostics import NodeState, diagnostics_message, horizon_s
from heisd_ros.ros.input_limits import check_instruction, quote
from heisd_ros.ros.log_bridge import GuardedLogger, RosLogBridge
from heisd_ros.ros.outputs import CommandOutputs
from heisd_ros.ros.params import PolicyNodeConfig, build_config, declare_all, validate_update
from heisd_ros.ros.qos import EVENT_QOS, LATCHED_QOS, SENSOR_QOS
from heisd_ros.ros.standalone_args import ros_args
from heisd_ros.ros.status import ERROR, WARN, NodeStatus
from heisd_ros.ros.step import Job, StepRunner
from heisd_ros.ros.transport import fastdds_reader_memory
from heisd_ros.ros.sync import ApproxTimeSync, SyncConfig
from heisd_ros.ros.watchdog import Watchdog
from heisd_ros.ros.worker import InferenceWorker

__all__ = ["EVENT_QOS", "LATCHED_QOS", "SENSOR_QOS", "PolicyNode", "load_decoder", "main"]


def load_decoder(cfg: PolicyNodeConfig) -> Any:
    """Build the HybridDecoder from the node's configuration (heisd_ros.policy.load_policy)."""
    try:
        from heisd_ros.policy import PolicyPaths, load_policy
    except ImportError as err:
        raise ModelLoadError(f"the policy loader is not available: {err}") from err
    n = cfg.node
    paths = PolicyPaths(model_dir=n.model_dir, drafter_dir=n.drafter_dir, db_path=n.db_path,
                        calibration_path=n.calibration_path)  # fmt: skip
    return load_policy(paths, cfg.decoder, cfg.store, torch_threads=n.torch_threads)


def _sync_config(cfg: PolicyNodeConfig) -> SyncConfig:
    n = cfg.node
    return SyncConfig(cfg.decoder.views, n.sync_slop_s, n.image_staleness_s, n.pose_staleness_s)


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
        self._guarded_log = GuardedLogger(self.get_logger(), self.context)  # quiet once the context is gone
        self._log_bridge = RosLogBridge(self._guarded_log)
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
        n = self.cfg.node
        # the inputs: synchroniser, newest finger gap and instruction, shared with the control timer
        self._inputs_lock = threading.Lock()
        self._sync = ApproxTimeSync(_sync_config(self.cfg))
        self._gap: tuple[float, float] | None = None  # (header stamp s, finger gap m) of the newest joint_states
        self._instruction: str | None = None
        self._instruction_refused: str | None = None  # why the newest instruction was refused
        self._reads_gap = bool(getattr(self._decoder, "reads_finger_gap", False))
        self._status = NodeStatus(self._guarded_log, lambda: self.cfg.node.warn_throttle_s)
        self._subscribe()
        self._watchdog = Watchdog()
        self._outputs = CommandOutputs(self, n)
        self._pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", EVENT_QOS)
        self._runner = StepRunner(
            self._decoder, config=lambda: self.cfg, clock_s=self._now_s,
            finger_gap=self._finger_gap_for if self._reads_gap else None, watchdog=self._watchdog,
            outputs=self._outputs, status=self._status, logger=self._guarded_log,
        )  # fmt: skip
        self._worker = InferenceWorker(self._runner, self._status, lambda: self.cfg.node.diagnostics_period_s)
        self._worker.start()
        self._timer = self.create_timer(n.control_period_s, self._on_tick)
        self._diag_timer = self.create_timer(n.diagnostics_period_s, self._publish_diagnostics)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self._warn_store_timeout()
        self.get_logger().info(
            f"policy node ready: method={self.cfg.decoder.method} views={list(self.cfg.decoder.views)} "
            f"rate={n.control_rate_hz} Hz model={n.model_dir!r} dry_run={n.dry_run}"
        )

    def _subscribe(self) -> None:
        n = self.cfg.node
        image_type = CompressedImage if n.compressed_images else Image
        for view, topic in zip(self.cfg.decoder.views, n.image_topics):
            self.create_subscription(image_type, topic, functools.partial(self._on_image, view), SENSOR_QOS)
        self.create_subscription(PoseStamped, n.pose_topic, self._on_pose, SENSOR_QOS)
        if self._reads_gap:
            self.create_subscription(JointState, n.joint_states_topic, self._on_joint_states, SENSOR_QOS)
        # raw: rclpy's conversion would cut the text at a NUL; the node reads and checks the bytes itself
        self.create_subscription(String, n.instruction_topic, self._on_instruction, LATCHED_QOS, raw=True)
        self.create_subscription(Bool, n.episode_result_topic, self._on_episode_result, EVENT_QOS)

    def _warn_store_timeout(self) -> None:
        n, store = self.cfg.node, self.cfg.store
        spare_s = n.watchdog_budget_s - n.control_period_s
        if store is not None and store.backend == "remote" and store.timeout_s > spare_s:
            self.get_logger().warning(
                f"store.timeout_s {store.timeout_s:g} s exceeds the watchdog budget minus one control period "
                f"({spare_s:g} s): the first step of a database outage will trip the watchdog"
            )

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop commanding and stop the worker (the step in progress finishes without publishing),
        joining it. Idempotent; the context stays valid, so nothing in flight fails."""
        outputs, worker = self.__dict__.get("_outputs"), self.__dict__.get("_worker")
        if outputs is not None:
            outputs.close()
        if worker is not None:
            worker.stop(timeout_s)

    def destroy_node(self) -> None:
        self.close()
        self._close_decoder()
        logging.getLogger("heisd_ros").removeHandler(self._log_bridge)
        super().destroy_node()

    def _close_decoder(self) -> None:
        """Release the decoder's resources (the embedded database holds a file lock)."""
        decoder = self.__dict__.pop("_decoder", None)
        worker = self.__dict__.get("_worker")
        if decoder is None or (worker is not None and worker.alive):
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
        with self._inputs_lock:
            self._sync.add_frame(view, conv.stamp_to_s(msg.header.stamp), msg)

    def _on_pose(self, msg: PoseStamped) -> None:
        with self._inputs_lock:
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
            self._status.report("invalid_input", WARN, f"joint_states: no finger gap from {list(fingers)}: {err}")
            return
        with self._inputs_lock:
            self._gap = (conv.stamp_to_s(msg.header.stamp), gap)

    def _finger_gap_for(self, stamp_s: float) -> tuple[float | None, str]:
        """(gap, '') for a synchronised set stamped `stamp_s`, or (None, why not)."""
        n = self.cfg.node
        with self._inputs_lock:
            gap = self._gap
        if gap is None:
            return None, (f"the model reads the finger gap, but nothing with joints {list(n.finger_joints)} "
                          f"has arrived on {n.joint_states_topic!r}")
        age = stamp_s - gap[0]
        if abs(age) > n.pose_staleness_s:
            return None, f"finger gap {age:.3f} s from the images' stamp > pose_staleness_s {n.pose_staleness_s:.3f}"
        return gap[1], ""

    def _on_instruction(self, raw: bytes) -> None:
        limits = self.cfg.node.input_limits
        try:
            text = check_instruction(conv.string_from_cdr(raw, limits.max_instruction_bytes), limits)
        except InvalidObservationError as err:
            # The user asked for something other than the running task: stop commanding it (docs/node.md).
            with self._inputs_lock:
                self._instruction, self._instruction_refused = None, str(err)
            self._status.report("instruction", WARN, f"instruction refused, no commands until a valid one: {err}")
            return
        with self._inputs_lock:
            if text != self._instruction:
                self.get_logger().info(f"instruction: {quote(text)}" if text else "instruction cleared")
            self._instruction, self._instruction_refused = text or None, None

    def _on_episode_result(self, msg: Bool) -> None:
        self._worker.episode_result(bool(msg.data))

    def _revive_worker(self) -> None:
        """Start a new inference thread if the running one died (a bug no step contained)."""
        cause = self._worker.revive()
        if cause is not None:
            self._status.report("worker", ERROR, f"inference thread died ({cause}); started a new one")

    def _on_tick(self) -> None:
        self._revive_worker()
        now = self._now_s()
        running_s = self._worker.running_s()
        if running_s is not None:
            self._status.dropped_tick()
            n = self.cfg.node
            # paced by the watchdog (every warn_throttle_s while the hang lasts); the step is counted when it ends
            if self._watchdog.running(running_s, n.watchdog_budget_s, n.warn_throttle_s):
                self._status.report("hang", ERROR, f"watchdog: inference running for {running_s * 1e3:.0f} ms "
                                    f"> budget {n.watchdog_budget_s * 1e3:.0f} ms; commands withheld",
                                    throttled=False)  # fmt: skip
            return
        job = self._next_job(now)
        if job is not None:
            self._worker.submit(job)

    def _next_job(self, now: float) -> Job | None:
        """The newest synchronised set with the instruction, consumed; None (reported) when there is none."""
        with self._inputs_lock:
            synced = self._sync.poll(now)
            events, self._sync.events = self._sync.events, []
            for why in events:
                self._status.report("clock", WARN, f"clock jump: {why}; synchroniser restarted")
            if synced is None:
                if self._sync.problem:
                    self._status.problem("input", WARN, self._sync.reason)
                return None
            if self._instruction is None:  # kept unconsumed: acted on if still fresh when one arrives
                why = (f"instruction refused: {self._instruction_refused}" if self._instruction_refused
                       else f"no instruction received yet on {self.cfg.node.instruction_topic!r}")  # fmt: skip
                self._status.problem("no_instruction", WARN, why)
                return None
            self._sync.consume(synced)
            return Job(synced, self._instruction, now)

    def _on_set_parameters(self, params: list) -> SetParametersResult:
        new_cfg, reason = validate_update(self._values, {p.name: p.value for p in params})
        if new_cfg is None:
            return SetParametersResult(successful=False, reason=reason)
        self._values.update({p.name: p.value for p in params if p.name in self._values})
        self.cfg = new_cfg
        with self._inputs_lock:
            self._sync.reconfigure(_sync_config(new_cfg))
        return SetParametersResult(successful=True)

    def _publish_diagnostics(self) -> None:
        snap = self._status.snapshot(horizon_s(self.cfg))
        with self._inputs_lock:
            instruction, clock_resets = self._instruction, self._sync.clock_resets
        state = NodeState(instruction=instruction, watchdog_tripped=self._watchdog.tripped,
                          watchdog_trips=self._watchdog.state.trips, clock_resets=clock_resets,
                          health=self._runner.health, worker_restarts=self._worker.restarts)  # fmt: skip
        msg = diagnostics_message(self.get_fully_qualified_name(), self.cfg, snap, state)
        msg.header.stamp = self.get_clock().now().to_msg()
        self._pub_diag.publish(msg)


def _on_stop_signals(handler: Callable[[int, Any], None]) -> None:
    if threading.current_thread() is threading.main_thread():  # Python allows handlers only there
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the policy node until SIGINT/SIGTERM (exit 0); exit 1 with the reason when it cannot start.

    rclpy's own signal handlers are off: they shut the context down at once, under the step in
    flight and the log lines still to come. Here a signal only ends the spin loop; the node then
    stops its worker, is destroyed, and only then is the context shut down."""
    argv = list(sys.argv if argv is None else ["policy_node", *argv])
    fastdds_reader_memory()  # received frames must not pin memory (heisd_ros/ros/transport.py)
    rclpy.init(args=ros_args(argv), signal_handler_options=SignalHandlerOptions.NO)
    _on_stop_signals(_interrupt)  # a signal while loading ends start-up at once
    try:
        node = PolicyNode()
    except HeisdError as err:
        rclpy.logging.get_logger("policy_node").fatal(f"cannot start: {type(err).__name__}: {err}")
        rclpy.try_shutdown()
        return 1
    except KeyboardInterrupt:
        rclpy.logging.get_logger("policy_node").info("interrupted while starting")
        rclpy.try_shutdown()
        return 0
    stop = threading.Event()
    _on_stop_signals(lambda signum, frame: stop.set())
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    try:
        while not stop.is_set() and rclpy.ok():
            executor.spin_once(timeout_sec=0.1)  # the signal handler runs between two waits
    except ExternalShutdownException:
        pass
    finally:
        node.get_logger().info("shutting down")
        node.close()
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
