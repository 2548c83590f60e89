"""The policy node: synchronised camera views + end-effector pose in, 7-DoF commands out.

Usage (standalone, from the venv; behaves like `ros2 run heisd_ros policy_node`):
    policy_node --params-file config/policy.yaml -p model_dir:=/path/to/checkpoint \
        [--ros-args -p control_rate_hz:=5.0 -r __ns:=/arm]

A managed (lifecycle) node (heisd_ros/ros/lifecycle.py): configure loads the policy and warms it up,
activate starts decoding, deactivate stops it; with `autostart` (the default) the node configures
and activates itself. It commands nothing until `command_enabled` is true (~/enable,
std_srvs/SetBool): bring it up on an arm as configure -> dry run (watch DecodeStats) -> enable.
Episodes come from the ~/run_task action or the instruction topic and end with the stack's
episode_result, ~/reset (std_srvs/Trigger), a cancel or a limit (heisd_ros/ros/task_control.py).

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

import dataclasses
import functools
import logging
import sys
import threading
from typing import Any, Callable

from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import PoseStamped
from rcl_interfaces.msg import SetParametersResult
from rclpy.lifecycle import LifecycleNode
from rclpy.parameter import Parameter
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Bool, String
from std_srvs.srv import SetBool

from heisd_ros.core.errors import HeisdError, InvalidObservationError
from heisd_ros.core.gripper import finger_gap
from heisd_ros.core.model_api import Decoder
from heisd_ros.core.shadow import ShadowDecoder
from heisd_ros.ros import conversions as conv
from heisd_ros.ros import topics
from heisd_ros.ros.diagnostics import NodeState, diagnostics_message, horizon_s
from heisd_ros.ros import decoder_params
from heisd_ros.ros.input_limits import check_instruction, model_input
from heisd_ros.ros.lifecycle import ManagedPolicy, close_decoder, load_decoder, load_node_policy
from heisd_ros.ros.lifecycle_services import LifecycleInterface, LifecycleStates
from heisd_ros.ros.log_bridge import GuardedLogger, RosLogBridge
from heisd_ros.ros.node_main import run
from heisd_ros.ros.outputs import CommandOutputs
from heisd_ros.ros.params import (
    PolicyNodeConfig,
    build_config,
    declare_all,
    validate_update,
)
from heisd_ros.ros.param_services import ParameterServices
from heisd_ros.ros.qos import EVENT_QOS, LATCHED_QOS, SENSOR_QOS, instruction_qos, request_qos
from heisd_ros.ros.session import Session
from heisd_ros.ros.shadow import LoadedPolicy, ShadowRunner
from heisd_ros.ros.status import ERROR, WARN, NodeStatus
from heisd_ros.ros.step import Job, StepRunner
from heisd_ros.ros.sync import ApproxTimeSync, SyncConfig
from heisd_ros.ros.task_control import TaskControl
from heisd_ros.ros.worker import InferenceWorker

__all__ = ["EVENT_QOS", "LATCHED_QOS", "SENSOR_QOS", "PolicyNode", "load_decoder", "main"]


def _sync_config(cfg: PolicyNodeConfig) -> SyncConfig:
    n = cfg.node
    return SyncConfig(cfg.decoder.views, n.sync_slop_s, n.image_staleness_s, n.pose_staleness_s)


class PolicyNode(ManagedPolicy, LifecycleNode):
    """ROS 2 wrapper of the HybridDecoder (see the module docstring).

    decoder_factory: PolicyNodeConfig -> decoder (reset/step/episode_feedback/health), or a
    `LoadedPolicy` (the decoder and, in shadow mode, its shadow), called at configure; the default
    loads the configured model (`lifecycle.load_node_policy`). Raises ConfigError
    for invalid parameters and, with autostart, the configure failure (ModelLoadError,
    DatabaseError...), with the reason.
    """

    def __init__(self, decoder_factory: Callable[[PolicyNodeConfig], Decoder | LoadedPolicy] | None = None,
                 node_name: str = "policy_node", autostart_in_background: bool = False,
                 **node_kwargs: Any) -> None:  # fmt: skip
        # parameter and lifecycle services of our own, which answer requests rclpy's leave unanswered
        # (param_services, lifecycle_services)
        LifecycleNode.__init__(self, node_name, enable_communication_interface=False,
                               **{**node_kwargs, "start_parameter_services": False})
        self._parameter_services = ParameterServices(self)
        self.lifecycle_states = LifecycleStates()
        self._autostart_pending = False
        self._autostarting = threading.Event()  # set while an autostart runs beside the executor
        self._session: Session | None = None
        self._task: TaskControl | None = None
        self._writing_decoder = False  # the node writes decoder.* (decoder_params); nobody else does
        started = False
        self._guarded_log = GuardedLogger(self.get_logger(), self.context)  # quiet once the context is gone
        self._log_bridge = RosLogBridge(self._guarded_log)
        logging.getLogger("heisd_ros").addHandler(self._log_bridge)
        try:
            self._values, self._explicit = declare_all(self)
            self.cfg = build_config(self._values)
            try:  # what runs, shown before configure; configure reads the files again and fails on a bad one
                self._run_with(self._resolved(), log=False)
            except HeisdError:
                self._run_with(self.cfg, log=False)
            self._decoder_factory = decoder_factory or load_node_policy
            self._inputs_lock = threading.Lock()
            self._status = NodeStatus(self._guarded_log, lambda: self.cfg.node.warn_throttle_s)
            self._task = TaskControl(self, lambda: self.cfg.node, self._now_s, self._task_problem)
            requests = request_qos(self.cfg.node.request_queue_depth)
            self._enable_service = self.create_service(SetBool, "~/enable", self._on_enable, qos_profile=requests)
            self._lifecycle = LifecycleInterface(self, self.lifecycle_states, self._on_change_state, requests)
            self.add_on_set_parameters_callback(self._on_set_parameters)
            self._warn_store_timeout()
            if self.cfg.node.autostart and autostart_in_background:
                self._autostart_pending = True  # `autostart_in_background()` once the executor spins
            elif self.cfg.node.autostart:
                self.start()
            started = True
        finally:
            if not started:
                self.destroy_node()
        n = self.cfg.node
        state = ("unconfigured (autostart false): waiting for configure" if not n.autostart else
                 "configuring beside the executor" if self._autostart_pending else self._task.commanding)
        self.get_logger().info(
            f"policy node ready: method={self.cfg.decoder.method} views={list(self.cfg.decoder.views)} "
            f"rate={n.control_rate_hz} Hz model={n.model_dir!r} " + state
        )

    # ------------------------------------------------------------------ configure's resources
    def _open_session(self, decoder: Decoder, shadow: ShadowDecoder | None = None, shadow_s: float = 0.0) -> None:
        """Everything configure creates around the loaded decoder, as the node's Session; on a
        failure part way, what was made is released (the decoder too) and the error raised."""
        n = self.cfg.node
        session = Session(self, decoder, ApproxTimeSync(_sync_config(self.cfg)), self._inputs_lock)
        before = list(self.publishers)
        try:
            session.outputs = CommandOutputs(self, n)
            session.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", EVENT_QOS)
            session.publishers = [p for p in self.publishers if all(p is not b for b in before)]
            session.subscriptions = self._subscribe(session)
            if shadow is not None:
                session.shadow = ShadowRunner(shadow, session.outputs.publish_shadow, n.command_frame_id, n.shadow.when,
                                              estimate_s=shadow_s)  # fmt: skip
            session.runner = StepRunner(
                decoder, config=lambda: self.cfg, clock_s=self._now_s,
                finger_gap=self._finger_gap_for if session.reads_gap else None, watchdog=session.watchdog,
                outputs=session.outputs, gate=self._task, status=self._status, logger=self._guarded_log,
                shadow=session.shadow,
            )  # fmt: skip
            session.worker = InferenceWorker(session.runner, self._status, lambda: self.cfg.node.diagnostics_period_s)
            session.worker.start()
            session.diagnostics_timer = self.create_timer(n.diagnostics_period_s, self._publish_diagnostics)
        except BaseException:
            session.close(lambda unused: None)  # configure's failure path closes the decoder
            raise
        self._session = session

    def _subscribe(self, session: Session) -> list:
        n = self.cfg.node
        image_type = CompressedImage if n.compressed_images else Image
        # Fixed relative names (heisd_ros.ros.topics): users remap them, the ROS convention.
        subs = [self.create_subscription(image_type, topics.image_topic(view, n.compressed_images),
                                         functools.partial(self._on_image, view), SENSOR_QOS)
                for view in self.cfg.decoder.views]  # fmt: skip
        subs.append(self.create_subscription(PoseStamped, topics.POSE, self._on_pose, SENSOR_QOS))
        if session.reads_gap:
            subs.append(self.create_subscription(JointState, topics.JOINT_STATES, self._on_joint_states, SENSOR_QOS))
        # Before the instruction: the executor serves ready subscriptions in creation order, so an
        # episode result and the next episode's instruction taken together end the old episode first.
        subs.append(self.create_subscription(Bool, topics.EPISODE_RESULT, self._on_episode_result, EVENT_QOS))
        # raw: rclpy's conversion would cut the text at a NUL; the node reads and checks the bytes itself
        subs.append(self.create_subscription(String, topics.INSTRUCTION, self._on_instruction,
                                             instruction_qos(n.instruction_durability), raw=True))  # fmt: skip
        return subs

    def _close_session(self) -> None:
        """Release the Session (if any); the decoder's database is closed."""
        session, self._session = self._session, None
        if session is not None:
            session.close(self._release_decoder)

    def _release_decoder(self, decoder: Decoder) -> None:
        close_decoder(decoder, self.get_logger())

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
        session = self._session
        if session is not None:
            session.stop(timeout_s)

    def stop_commanding(self, reason: str) -> None:
        """Close the command gate and end the episode (a running goal is aborted with `reason`)."""
        self._task.deactivate(reason)

    def destroy_node(self) -> None:
        if self._task is not None:
            self._task.close()
        self._close_session()
        logging.getLogger("heisd_ros").removeHandler(self._log_bridge)
        super().destroy_node()

    # ------------------------------------------------------------------ state
    @property
    def instruction(self) -> str | None:
        """The running episode's instruction; None while idle."""
        running = self._task.current()
        return running[1] if running is not None else None

    @property
    def idle_reason(self) -> str:
        """Why no episode runs (the last one's end, a refused instruction, none received yet)."""
        return self._task.idle_reason

    # ------------------------------------------------------------------ executor callbacks
    def _now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _on_image(self, view: str, msg: Any) -> None:
        with self._inputs_lock:
            if self._session is not None:
                self._session.sync.add_frame(view, conv.stamp_to_s(msg.header.stamp), msg)

    def _on_pose(self, msg: PoseStamped) -> None:
        with self._inputs_lock:
            if self._session is not None:
                self._session.sync.add_pose(conv.stamp_to_s(msg.header.stamp), msg)

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
            if self._session is not None:
                self._session.gap = (conv.stamp_to_s(msg.header.stamp), gap)

    def _finger_gap_for(self, stamp_s: float) -> tuple[float | None, str]:
        """(gap, '') for a synchronised set stamped `stamp_s`, or (None, why not)."""
        n = self.cfg.node
        with self._inputs_lock:
            gap = self._session.gap if self._session is not None else None
        if gap is None:
            return None, (f"the model reads the finger gap, but nothing with joints {list(n.finger_joints)} "
                          f"has arrived on {self.resolve_topic_name(topics.JOINT_STATES)!r}")
        age = stamp_s - gap[0]
        if abs(age) > n.pose_staleness_s:
            return None, f"finger gap {age:.3f} s from the images' stamp > pose_staleness_s {n.pose_staleness_s:.3f}"
        return gap[1], ""

    def _task_problem(self, text: str) -> str:
        """Why the decoder cannot run an instruction ('' = it can, or nothing is loaded yet): the model's
        own limits (tokens, positions) and the task's database entries, checked when the goal or
        instruction arrives, so none is accepted and then refused at every tick."""
        session = self._session
        if session is None:
            return ""
        problem = model_input(session.decoder).instruction_problem(text, self.cfg.node.input_limits)
        return problem or session.decoder.task_problem(self.cfg.node.task or text)

    def _on_instruction(self, raw: bytes) -> None:
        limits = self.cfg.node.input_limits
        try:
            text = check_instruction(conv.string_from_cdr(raw, limits.max_instruction_bytes), limits)
            problem = self._task_problem(text) if text else ""
            if problem:  # refused once here, not an error at every tick
                raise InvalidObservationError(f"unknown task: {problem}")
        except InvalidObservationError as err:
            self._task.on_instruction_refused(str(err))
            self._status.report("instruction", WARN, f"instruction refused, no commands until a valid one: {err}")
            return
        self._task.on_instruction(text)

    def _on_episode_result(self, msg: Bool) -> None:
        success = bool(msg.data)
        self._task.on_episode_result(success)
        session = self._session  # None once cleanup has begun
        if session is not None:
            session.worker.episode_result(success)  # the decoder learns from every outcome

    def _revive_worker(self, worker: InferenceWorker) -> None:
        """Start a new inference thread if the running one died (a bug no step contained)."""
        cause = worker.revive()
        if cause is not None:
            self._status.report("worker", ERROR, f"inference thread died ({cause}); started a new one")

    def _on_tick(self) -> None:
        session = self._session  # None once cleanup has begun (from another thread)
        if session is None:
            return
        worker = session.worker
        self._task.tick()
        self._revive_worker(worker)
        now = self._now_s()
        if worker.shadowing:  # shadow mode: the last step's shadow takes the worker for a moment
            self._status.dropped_tick()
            return
        running_s = worker.running_s()
        if running_s is not None:
            self._status.dropped_tick()
            n = self.cfg.node
            # paced by the watchdog (every warn_throttle_s while the hang lasts); the step is counted when it ends
            if session.watchdog.running(running_s, n.watchdog_budget_s, n.warn_throttle_s):
                self._status.report("hang", ERROR, f"watchdog: inference running for {running_s * 1e3:.0f} ms "
                                    f"> budget {n.watchdog_budget_s * 1e3:.0f} ms; commands withheld",
                                    throttled=False)  # fmt: skip
            return
        job = self._next_job(session, now)
        if job is not None and not worker.submit(job):
            self._status.dropped_tick()

    def _next_job(self, session: Session, now: float) -> Job | None:
        """The newest synchronised set with the running episode, consumed; None (reported) when
        there is none or no episode runs."""
        with self._inputs_lock:
            sync = session.sync
            synced = sync.poll(now)
            events, sync.events = sync.events, []
            for why in events:
                self._status.report("clock", WARN, f"clock jump: {why}; synchroniser restarted")
            if synced is None:
                if sync.problem:
                    self._status.problem("input", WARN, sync.reason)
                elif not sync.heard:  # sources not up yet: shown, but not a rejected step
                    self._status.report("input", WARN, sync.reason)
                return None
            running = self._task.current()
            if running is None:  # kept unconsumed: acted on if still fresh when an episode starts
                self._status.problem("no_instruction", WARN, self._task.idle_reason)
                return None
            sync.consume(synced)
            return Job(synced, running[1], now, running[0])

    def _on_enable(self, request: Any, response: Any) -> Any:
        """~/enable (std_srvs/SetBool): the command_enabled parameter set from a service, validated
        like any update; the parameter callback opens or closes the gate (TaskControl.set_enabled)."""
        result = self.set_parameters([Parameter("command_enabled", value=bool(request.data))])[0]
        response.success = result.successful
        if not result.successful:
            response.message = result.reason
        elif request.data:
            response.message = "commanding enabled" + ("" if self._task.commanding == "commanding" else
                                                       " (takes effect when the node is active)")  # fmt: skip
        else:
            response.message = "commanding disabled: dry run, DecodeStats only"
        return response

    def _resolved(self) -> PolicyNodeConfig:
        """The configuration that runs: the parameters, with the operating-point file and the database
        manifest applied under the explicitly given decoder.* values (decoder_params). Raises what
        reading those files raises."""
        return decoder_params.resolve(build_config(self._values), self._explicit)

    def _run_with(self, cfg: PolicyNodeConfig, log: bool) -> None:
        """Make `cfg`'s decoder the one the node reports: the decoder.* parameters written back (and
        shown in /diagnostics), logged with each value's source at configure."""
        self._writing_decoder = True
        try:
            decoder_params.write_back(self, cfg.decoder)
        finally:
            self._writing_decoder = False
        self.cfg = dataclasses.replace(self.cfg, decoder=cfg.decoder)
        if log:
            self.get_logger().info("decoder settings (ros2 param get <node> decoder.<field>): "
                                   + decoder_params.sources(cfg.decoder, self._explicit, cfg.node.calibration_path))

    def _on_set_parameters(self, params: list) -> SetParametersResult:
        if any(p.name.startswith(decoder_params.DECODER_PREFIX) for p in params):
            ok = self._writing_decoder
            return SetParametersResult(successful=ok, reason="" if ok else decoder_params.OUTSIDE_CHANGE_REFUSED)
        new_cfg, reason = validate_update(self._values, {p.name: p.value for p in params})
        if new_cfg is None:
            return SetParametersResult(successful=False, reason=reason)
        self._values.update({p.name: p.value for p in params if p.name in self._values})
        self.cfg = dataclasses.replace(new_cfg, decoder=self.cfg.decoder)  # decoder.* change at configure only
        with self._inputs_lock:
            if self._session is not None:
                self._session.sync.reconfigure(_sync_config(new_cfg))
        self._task.set_enabled(new_cfg.node.command_enabled)
        return SetParametersResult(successful=True)

    def _publish_diagnostics(self) -> None:
        session = self._session
        if session is None:  # cleanup has begun (from another thread)
            return
        snap = self._status.snapshot(horizon_s(self.cfg))
        with self._inputs_lock:
            clock_resets, sync_refusals = session.sync.clock_resets, dict(session.sync.refusals)
        state = NodeState(instruction=self.instruction, watchdog_tripped=session.watchdog.tripped,
                          watchdog_trips=session.watchdog.state.trips, clock_resets=clock_resets,
                          sync_refusals=sync_refusals, skip_thresholds=_running_thresholds(session.decoder),
                          health=session.runner.health, worker_restarts=session.worker.restarts,
                          commanding=self._task.commanding,
                          shadow=session.shadow.diagnostics() if session.shadow is not None else {})  # fmt: skip
        msg = diagnostics_message(self.get_fully_qualified_name(), self.cfg, snap, state)
        msg.header.stamp = self.get_clock().now().to_msg()
        session.diagnostics_pub.publish(msg)


def _running_thresholds(decoder: Decoder) -> tuple[float, float]:
    """Verify-skip's thresholds as they run (read without a lock: two floats the worker replaces)."""
    return float(decoder.skip.min_similarity), float(decoder.skip.max_distance_m)


def main(argv: list[str] | None = None) -> int:
    """The `policy_node` process (heisd_ros.ros.node_main.run): exit 0 on SIGINT/SIGTERM, 1 with the
    reason when the node cannot start."""
    return run(lambda: PolicyNode(autostart_in_background=True), argv)


if __name__ == "__main__":
    sys.exit(main())
