"""LIBERO as a ROS 2 arm: the simulator on the graph, driven by the policy node as a user's stack would.

`SimArm` holds a `LiberoEnv` and an rclpy node. It publishes what an arm publishes, stamped with
simulation time: the views (`<view>/image_raw`, rgb8), `ee_pose` (PoseStamped in `base_link`),
`joint_states` (the two finger joints) and `/clock` (the policy node runs with use_sim_time). It
runs an episode through the policy node's `~/run_task` action, executes the ArmCommand computed
from each frame, and ends the episode with `episode_result`.

Two time modes (`time_mode`):
- lockstep: the simulator advances one control period when the command computed from its newest
  frame arrives, so a method decodes the same observations in the same order as `heisd-libero
  eval-libero` (same scene, same tokens for ar);
- arm_time: as a real arm, the arm keeps executing the previous command while the policy thinks.
  The frame-to-command latency L (wall time, times `latency_scale` to emulate a larger model) is
  turned into simulation time: the arm executes the previous command for n = max(1, ceil(K L / T))
  control periods T, and the next frame is the one at the end of them, decoded while the new
  command runs. Simulation time, so a slow simulator does not distort what the arm feels.

Per decoded frame: the frame is
published stamped t, then `/clock` is set to t, which fires the node's control tick at t. The
frame and the clock travel on different topics and DDS orders neither, so a tick can miss its
frame; then, after `retick_s` of waiting, the clock moves on one control period and the node's
next tick takes the same frame (it is not stale until `image_staleness_s`): the arm waited, nothing
else changes. Each command is matched to its frame by the header stamp the node copies.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_ros.core.gripper import PANDA_FINGER_JOINTS

TIME_MODES = ("lockstep", "arm_time")
HOLD = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])
"""What the arm executes before its first command: stay, gripper open."""


@dataclass(frozen=True)
class SimArmConfig:
    """An episode of the simulated arm."""

    init_state: int = 0
    scene_shift_m: float = 0.0
    """Objects shifted by a seeded U(-d, d) in x and y (eval-libero's --scene-shift-m)."""
    scene_seed: int = 0
    """The perturbed reset's seed itself (sim_episodes derives it as eval-libero does: scene_shift_seed)."""
    control_rate_hz: float = 20.0
    """LIBERO's control rate; the policy node's control_rate_hz must be the same."""
    max_steps: int = 300
    policy_node: str = "/policy_node"
    command_timeout_s: float = 30.0
    """Wall time to wait for one command before the episode is abandoned (the node is down)."""
    retick_s: float = 0.3
    """Wall time without the frame's command after which the clock moves on one period (see module doc)."""
    time_mode: str = "lockstep"
    """'lockstep' or 'arm_time' (module doc)."""
    latency_scale: float = 1.0
    """arm_time: the measured latency is multiplied by this (OpenVLA-7B's step is ~174 ms on an A100)."""
    frame_id: str = "base_link"

    def __post_init__(self) -> None:
        if not (self.control_rate_hz > 0 and self.max_steps > 0 and self.command_timeout_s > 0 and self.retick_s > 0
                and self.latency_scale > 0):
            raise ConfigError("control_rate_hz, max_steps, command_timeout_s, retick_s and latency_scale must be > 0")
        if self.time_mode not in TIME_MODES:
            raise ConfigError(f"time_mode must be one of {TIME_MODES}, got {self.time_mode!r}")

    @property
    def period_s(self) -> float:
        return 1.0 / self.control_rate_hz


@dataclass
class EpisodeOutcome:
    """What one episode through the node did."""

    success: bool
    steps: int
    """Simulator steps (control periods) executed."""
    sim_time_s: float
    actions: list[np.ndarray] = field(default_factory=list)
    """Every command received, in order (one per decoded frame)."""
    latencies_s: list[float] = field(default_factory=list)
    """Wall time from the clock that fired each decoding tick to its command's arrival."""
    held_steps: list[int] = field(default_factory=list)
    """Periods the arm executed before each next frame (lockstep: 1)."""
    frame_stamps_s: list[float] = field(default_factory=list)
    """Simulation time of every decoded frame (its command carries the same stamp)."""
    waits: list[int] = field(default_factory=list)
    """Per decoded frame: periods the clock moved on because a tick missed it (the arm waited)."""
    ended: str = ""
    """Why the episode ended: 'success', 'max_steps' or 'no command' (the node did not answer)."""


def _stamp(msg: Any, t_s: float) -> None:
    ns = int(round(t_s * 1e9))
    msg.header.stamp.sec, msg.header.stamp.nanosec = ns // 1_000_000_000, ns % 1_000_000_000


class SimArm:
    """The simulated arm's rclpy node, spun on its own thread; `run_episode` drives one episode."""

    _made = 0

    def __init__(self, env: Any, cfg: SimArmConfig, context: Any = None, record_stats: bool = False,
                 node: Any = None) -> None:
        """`record_stats`: keep (total_ms, mode, cpu_ms) of every DecodeStats the node publishes (`take_stats`).
        `node`: the rclpy node to publish on (the sim-arm executable's, with its parameters); by
        default one of its own. `env` and the episode fields of `cfg` may be replaced between episodes."""
        import rclpy
        from geometry_msgs.msg import PoseStamped
        from heisd_ros.action import RunTask
        from heisd_ros.msg import ArmCommand, DecodeStats
        from lifecycle_msgs.srv import GetState
        from rclpy.action import ActionClient
        from rclpy.executors import SingleThreadedExecutor
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Bool

        from heisd_ros.ros.qos import EVENT_QOS, SENSOR_QOS
        from heisd_ros.ros.topics import image_topic

        self.env, self.cfg = env, cfg
        SimArm._made += 1  # a node name per arm: rclpy keeps one /rosout publisher per name in a process
        self.node = node or rclpy.create_node(f"sim_arm_{SimArm._made}", context=context)
        n = self.node
        self._types = {"Image": Image, "PoseStamped": PoseStamped, "JointState": JointState, "Clock": Clock, "Bool": Bool}
        self.pub_img = {v: n.create_publisher(Image, image_topic(v, False), SENSOR_QOS) for v in env.config.views}
        self.pub_pose = n.create_publisher(PoseStamped, "ee_pose", SENSOR_QOS)
        self.pub_joints = n.create_publisher(JointState, "joint_states", SENSOR_QOS)
        self.pub_clock = n.create_publisher(Clock, "/clock", 10)
        self.pub_result = n.create_publisher(Bool, "episode_result", EVENT_QOS)
        self.action = ActionClient(n, RunTask, f"{cfg.policy_node}/run_task")
        self.RunTask = RunTask
        self._get_state = n.create_client(GetState, f"{cfg.policy_node}/get_state")
        self._commands: dict[int, np.ndarray] = {}  # command header stamp (ns) -> action
        self._arrived = threading.Condition()
        n.create_subscription(ArmCommand, "arm_command", self._on_command, EVENT_QOS)
        self._stats: dict[float, tuple[float, str, float]] = {}  # header stamp (s) -> (total_ms, mode, cpu_ms)
        if record_stats:
            n.create_subscription(DecodeStats, "decode_stats", self._on_stats, EVENT_QOS)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(n)
        self._spin = threading.Thread(target=self.executor.spin, name="sim-arm", daemon=True)
        self._spin.start()

    # ------------------------------------------------------------------ graph
    def _on_command(self, msg: Any) -> None:
        stamp_ns = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        with self._arrived:
            self._commands[stamp_ns] = np.array([*msg.delta_position, *msg.delta_rotation, msg.gripper])
            self._arrived.notify_all()

    def _on_stats(self, msg: Any) -> None:
        stamp_s = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
        self._stats[round(stamp_s, 6)] = (float(msg.total_ms), msg.mode, float(msg.cpu_ms))

    def _clock(self, t_s: float) -> None:
        msg = self._types["Clock"]()
        ns = int(round(t_s * 1e9))
        msg.clock.sec, msg.clock.nanosec = ns // 1_000_000_000, ns % 1_000_000_000
        self.pub_clock.publish(msg)

    def publish_observation(self, obs: Any, t_s: float) -> None:
        """The frame of every view, the end-effector pose and the finger joints, stamped `t_s`."""
        for view, img in obs.images.items():
            if view not in self.pub_img:
                continue
            msg = self._types["Image"](height=img.shape[0], width=img.shape[1], encoding="rgb8",
                                       step=img.shape[1] * 3, data=np.ascontiguousarray(img).tobytes())  # fmt: skip
            _stamp(msg, t_s)
            msg.header.frame_id = view
            self.pub_img[view].publish(msg)
        pose = self._types["PoseStamped"]()
        _stamp(pose, t_s)
        pose.header.frame_id = self.cfg.frame_id
        pose.pose.position.x, pose.pose.position.y, pose.pose.position.z = (float(v) for v in obs.ee_pos)
        qx, qy, qz, qw = (float(v) for v in obs.ee_quat)
        pose.pose.orientation.x, pose.pose.orientation.y, pose.pose.orientation.z, pose.pose.orientation.w = qx, qy, qz, qw
        self.pub_pose.publish(pose)
        joints = self._types["JointState"](name=list(PANDA_FINGER_JOINTS),
                                           position=[float(q) for q in obs.gripper_qpos])  # fmt: skip
        _stamp(joints, t_s)
        self.pub_joints.publish(joints)

    def wait_for_node(self, timeout_s: float = 120.0) -> bool:
        """Whether the policy node is active, with its action server and input subscriptions up. The
        lifecycle state is asked, not inferred: configure creates the subscriptions and activate opens
        the goal gate a moment later, and a goal sent in between is refused."""
        from lifecycle_msgs.msg import State

        end, asked, asked_at = time.monotonic() + timeout_s, None, 0.0
        while time.monotonic() < end:
            if asked is not None and asked.done():
                reply, asked = asked.result(), None
                if reply is not None and reply.current_state.id == State.PRIMARY_STATE_ACTIVE:
                    return True
            elif asked is not None and time.monotonic() - asked_at > 1.0:
                # a request sent before the server has matched the client's reply reader gets no
                # reply (the middleware drops it): ask again
                self._get_state.remove_pending_request(asked)
                asked = None
            if (asked is None and self.action.server_is_ready() and self._get_state.service_is_ready()
                    and all(p.get_subscription_count() for p in self.pub_img.values())):
                asked, asked_at = self._get_state.call_async(self._get_state.srv_type.Request()), time.monotonic()
            time.sleep(0.1)
        return False

    # ------------------------------------------------------------------ an episode
    def _command_for(self, t_s: float) -> tuple[np.ndarray | None, int, float]:
        """The command computed from the frame stamped `t_s` (None after command_timeout_s), how
        often the clock had to move on because a tick missed the frame, and the wall time from the
        clock that fired the answered tick to the command."""
        key = int(round(t_s * 1e9))
        clock, waits = t_s, 0
        self._clock(clock)
        fired = time.monotonic()
        end = fired + self.cfg.command_timeout_s
        with self._arrived:
            while key not in self._commands:
                left = end - time.monotonic()
                if left <= 0:
                    return None, waits, 0.0
                if not self._arrived.wait(min(self.cfg.retick_s, left)) and key not in self._commands:
                    clock += self.cfg.period_s  # the tick missed the frame: the next one takes it
                    waits += 1
                    self._clock(clock)
                    fired = time.monotonic()
            return self._commands.pop(key), waits, time.monotonic() - fired

    def run_episode(self, instruction: str | None = None,
                    on_step: Callable[[Any, float, float | None], None] | None = None) -> EpisodeOutcome:
        """One episode from `cfg.init_state` through the policy node's ~/run_task, in `cfg.time_mode`.
        `on_step(obs, t, stamp)` sees the first observation and the one after every simulator step,
        with its simulation time and the frame stamp of the command the arm executed to reach it
        (None: nothing commanded yet)."""
        cfg = self.cfg
        obs = self.env.reset(cfg.init_state, perturb_xy_m=cfg.scene_shift_m, seed=cfg.scene_seed)
        instruction = instruction or self.env.instruction
        t = 1.0  # sim time starts at 1 s: a zero stamp reads as "never stamped"
        self._clock(t)
        with self._arrived:
            self._commands.clear()
        sent = self.action.send_goal_async(self.RunTask.Goal(instruction=instruction, max_steps=cfg.max_steps + 1))
        if not _wait(sent.done, 10.0) or not sent.result().accepted:
            raise RuntimeError(f"the policy node refused the episode's goal ({instruction!r})")
        outcome = EpisodeOutcome(success=False, steps=0, sim_time_s=0.0)
        start, executing, executing_stamp = t, HOLD, None
        if on_step:
            on_step(obs, t, None)
        while outcome.steps < cfg.max_steps and not outcome.ended:
            self.publish_observation(obs, t)
            time.sleep(0.005)  # the frame ahead of the clock that fires the tick for it (module doc)
            action, waits, latency_s = self._command_for(t)
            outcome.waits.append(waits)
            if action is None:
                outcome.ended = "no command"
                break
            outcome.actions.append(action)
            outcome.latencies_s.append(latency_s)
            outcome.frame_stamps_s.append(t)
            t += cfg.period_s * waits  # the arm waited for a missed tick (no motion)
            if cfg.time_mode == "lockstep":
                held, executing, executing_stamp = 1, action, outcome.frame_stamps_s[-1]
            else:  # the previous command runs while this one was computed; this one runs next
                held = max(1, math.ceil(cfg.latency_scale * latency_s / cfg.period_s - 1e-9))
            outcome.held_steps.append(held)
            for _ in range(held):
                obs, _ = self.env.step(executing)
                outcome.steps += 1
                t += cfg.period_s
                if on_step:
                    on_step(obs, t, executing_stamp)
                if self.env.success():
                    outcome.success, outcome.ended = True, "success"
                    break
                if outcome.steps >= cfg.max_steps:
                    break
            if cfg.time_mode == "arm_time":
                executing, executing_stamp = action, outcome.frame_stamps_s[-1]
        outcome.ended = outcome.ended or "max_steps"
        outcome.sim_time_s = t - start
        self.pub_result.publish(self._types["Bool"](data=outcome.success))
        return outcome

    def take_stats(self, expect: int = 0, timeout_s: float = 2.0) -> dict[float, tuple[float, str, float]]:
        """Frame stamp (s, rounded to 1 us) -> (decode ms, mode, its CPU ms) of the steps the node decoded since
        the last call (the node stamps DecodeStats like the frame it decoded). Waits up to `timeout_s`
        for `expect` of them: the node publishes a step's DecodeStats after its command."""
        end = time.monotonic() + timeout_s
        while len(self._stats) < expect and time.monotonic() < end:
            time.sleep(0.01)
        stats, self._stats = self._stats, {}
        return stats

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=5.0)
        self._spin.join(timeout=5.0)  # the spin thread out of rcl before the node's handles go
        self.node.destroy_node()


def _wait(done: Any, timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not done():
        time.sleep(0.01)
    return bool(done())
