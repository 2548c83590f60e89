"""Outputs that standard arm stacks consume, built from one decoded action.

Pure functions from (action, current end-effector pose, `ArmOutputsConfig`) to messages, so each
output is testable without a node; `outputs.CommandOutputs` publishes them. Each output is off
until its parameter switches it on:

- `geometry_msgs/TwistStamped` for MoveIt Servo (`command_in_type: speed_units`): the step's
  motion spread over one control period, linear m/s and angular rad/s;
- `geometry_msgs/PoseStamped` absolute target for Cartesian motion / impedance controllers: the
  pose the step was decoded from, composed with the step's motion;
- `trajectory_msgs/JointTrajectory` (joint_trajectory_controller) and `std_msgs/Float64MultiArray`
  (forward_command_controller) finger positions, open or closed.

The step's motion. The action is a delta (dX, dY, dZ, drX, drY, drZ, G) in policy units, expressed
in the pose's frame. Translation t = a[0:3] * position_unit_m. Rotation: a[3:6] * rotation_unit_rad
read as an axis-angle vector (`axis_angle`, ArmCommand's and robosuite's convention) or as roll,
pitch, yaw about the fixed axes x, y, z (`rpy`: R = Rz(yaw) Ry(pitch) Rx(roll)), in both cases
turned into a rotation vector r. Each axis of t and of r is then clipped to its speed limit times
the control period (per axis: a saturated axis changes the direction of the step, it never scales
the others), and the translation is kept in the workspace box (below). Both motion outputs come
from this one limited step, so they agree.

Pose target: position p + t, orientation q' = q_delta * q (Hamilton product, quaternions in ROS's
x, y, z, w order, q_delta from r): the delta rotates the end effector about its own origin, about
axes of the pose's frame, as robosuite's OSC controller and MoveIt Servo (a twist in its planning
frame) apply it. The target follows the pose the policy saw, not an accumulated target, so a
lagging arm is never asked to catch up more than one step.

Twist: linear = t / T, angular = r / T (T the control period): held for one period it moves the
arm by exactly the step.

Workspace box (`workspace_min_m`, `workspace_max_m`, in the pose's frame) bounds the target
position. `clip`: the target is clamped to the box (and a pose already outside it is led back at
no more than the speed limits); `reject`: a step whose target leaves the box publishes neither the
twist nor the pose target (the gripper outputs and ArmCommand still go out), with a warning.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from heisd_ros.core.config import require
from heisd_ros.core.errors import InvalidObservationError
from heisd_ros.core.gripper import PANDA_FINGER_JOINTS
from heisd_ros.core.types import GRIPPER_INDEX, gripper_command
from heisd_ros.ros.conversions import check_action, header_msg

ROTATION_FORMATS = ("axis_angle", "rpy")
WORKSPACE_ACTIONS = ("clip", "reject")


def _finite_positive(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) and v > 0.0 for v in values)


@dataclass(frozen=True)
class ArmOutputsConfig:
    """Outputs for standard arm stacks, each off until switched on; all are stamped at publication
    time in command_frame_id (see docs/arm_stacks.md)."""

    publish_twist: bool = False
    """Publish geometry_msgs/TwistStamped velocities for MoveIt Servo (command_in_type: speed_units) on
    `delta_twist_cmds` (remap it to Servo's ~/delta_twist_cmds)."""
    publish_pose_target: bool = False
    """Publish a geometry_msgs/PoseStamped absolute target, the current pose composed with the step, on
    `target_pose` (remap it to the controller's target topic)."""
    publish_gripper_trajectory: bool = False
    """Publish trajectory_msgs/JointTrajectory finger positions (joint_trajectory_controller) on
    `gripper_trajectory` (remap it to <controller>/joint_trajectory)."""
    publish_gripper_positions: bool = False
    """Publish std_msgs/Float64MultiArray finger positions (forward_command_controller) on
    `gripper_positions` (remap it to <controller>/commands)."""
    position_unit_m: float = 1.0
    """Metres per unit of the position action: 1.0 for a policy in metres per step, 0.05 for
    LIBERO / robosuite OSC actions."""
    rotation_unit_rad: float = 1.0
    """Radians per unit of the rotation action: 1.0 for radians per step, 0.5 for LIBERO / robosuite OSC."""
    rotation_format: str = "axis_angle"
    """How drX, drY, drZ encode the rotation: axis_angle (a rotation vector) or rpy (roll, pitch,
    yaw about the fixed axes x, y, z)."""
    max_linear_speed_mps: tuple[float, float, float] = (0.1, 0.1, 0.1)
    """Per-axis speed limit of the motion outputs (x, y, z in the pose's frame), m/s: each axis of
    the step is clipped to this times the control period."""
    max_angular_speed_radps: tuple[float, float, float] = (0.5, 0.5, 0.5)
    """Per-axis limit of the rotation vector's rate (about x, y, z of the pose's frame), rad/s."""
    workspace_min_m: tuple[float, float, float] = (-1.0, -1.0, 0.0)
    """Lower corner of the box the target position must stay in (x, y, z in the pose's frame), m."""
    workspace_max_m: tuple[float, float, float] = (1.0, 1.0, 1.5)
    """Upper corner of that box, m."""
    out_of_workspace: str = "clip"
    """A target outside the box: clip (clamp it to the box) or reject (no twist and no pose target this step)."""
    gripper_joint_names: tuple[str, ...] = PANDA_FINGER_JOINTS
    """Finger joints of the gripper outputs, in the controller's order."""
    gripper_open_positions: tuple[float, ...] = (0.04, 0.04)
    """Joint positions of the open gripper, one per joint (m for prismatic fingers; a Franka hand
    open to 0.08 m is 0.04 per finger)."""
    gripper_closed_positions: tuple[float, ...] = (0.0, 0.0)
    """Joint positions of the closed gripper, one per joint."""
    gripper_motion_time_s: float = 0.5
    """time_from_start of the finger trajectory's single point, s."""

    def __post_init__(self) -> None:
        require(_finite_positive((self.position_unit_m, self.rotation_unit_rad)),
                "arm_outputs.position_unit_m and rotation_unit_rad must be finite and > 0")  # fmt: skip
        require(self.rotation_format in ROTATION_FORMATS, f"arm_outputs.rotation_format must be one of "
                f"{list(ROTATION_FORMATS)}, got {self.rotation_format!r}")  # fmt: skip
        for name in ("max_linear_speed_mps", "max_angular_speed_radps"):
            value = getattr(self, name)
            require(len(value) == 3 and _finite_positive(value),
                    f"arm_outputs.{name} needs 3 finite values > 0 (x, y, z), got {list(value)}")  # fmt: skip
        lo, hi = self.workspace_min_m, self.workspace_max_m
        require(len(lo) == 3 and len(hi) == 3 and all(math.isfinite(a) and math.isfinite(b) and a < b
                                                      for a, b in zip(lo, hi)),
                f"arm_outputs.workspace_min_m {list(lo)} must be finite and below workspace_max_m {list(hi)} "
                "in each of x, y, z")  # fmt: skip
        require(self.out_of_workspace in WORKSPACE_ACTIONS, f"arm_outputs.out_of_workspace must be one of "
                f"{list(WORKSPACE_ACTIONS)}, got {self.out_of_workspace!r}")  # fmt: skip
        joints = self.gripper_joint_names
        require(len(joints) >= 1 and all(joints) and len(set(joints)) == len(joints),
                f"arm_outputs.gripper_joint_names needs distinct, non-empty names, got {list(joints)}")  # fmt: skip
        for name in ("gripper_open_positions", "gripper_closed_positions"):
            value = getattr(self, name)
            require(len(value) == len(joints) and all(math.isfinite(v) for v in value),
                    f"arm_outputs.{name} needs one finite position per gripper joint ({len(joints)}), "
                    f"got {list(value)}")  # fmt: skip
        require(_finite_positive((self.gripper_motion_time_s,)),
                f"arm_outputs.gripper_motion_time_s must be finite and > 0, got {self.gripper_motion_time_s}")

    @property
    def any_motion(self) -> bool:
        """Whether an output needs the step's motion (and so the current pose)."""
        return self.publish_twist or self.publish_pose_target


ARM_OUTPUTS_DYNAMIC = frozenset({
    "position_unit_m", "rotation_unit_rad", "rotation_format", "max_linear_speed_mps", "max_angular_speed_radps",
    "workspace_min_m", "workspace_max_m", "out_of_workspace", "gripper_open_positions", "gripper_closed_positions",
    "gripper_motion_time_s",
})  # fmt: skip
"""ArmOutputsConfig fields that may change at run time (switches and joint names shape publishers)."""


# ---------------------------------------------------------------------------------------------
# quaternions: [x, y, z, w] as ROS orders them; Hamilton product, R(a * b) = R(a) R(b)


def quat_multiply(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """a * b: the rotation b followed by the rotation a (both about the same fixed axes)."""
    ax, ay, az, aw = (float(v) for v in a)
    bx, by, bz, bw = (float(v) for v in b)
    return np.array([aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw,
                     aw * bw - ax * bx - ay * by - az * bz])  # fmt: skip


def quat_from_rotvec(rotvec: Sequence[float]) -> np.ndarray:
    """Rotation vector [3] (axis times angle, rad) -> unit quaternion [4]."""
    r = np.asarray(rotvec, dtype=np.float64)
    angle = float(np.linalg.norm(r))
    # sin(angle/2)/angle by its series near 0, where the division loses every digit
    half_sinc = 0.5 - angle**2 / 48.0 if angle < 1e-6 else math.sin(angle / 2.0) / angle
    return np.array([*(r * half_sinc), math.cos(angle / 2.0)])


def rotvec_from_quat(quat: Sequence[float]) -> np.ndarray:
    """Quaternion [4] (any norm > 0) -> rotation vector [3] of the rotation, angle in [0, pi]."""
    q = unit_quat(quat)
    if q[3] < 0.0:  # q and -q are the same rotation; this one has the angle <= pi
        q = -q
    s = float(np.linalg.norm(q[:3]))
    angle = 2.0 * math.atan2(s, q[3])
    return q[:3] * (angle / s if s > 1e-12 else 2.0)


def quat_from_rpy(rpy: Sequence[float]) -> np.ndarray:
    """Roll, pitch, yaw (rad) about the fixed axes x, y, z -> unit quaternion of Rz(yaw) Ry(pitch) Rx(roll)."""
    roll, pitch, yaw = (float(v) for v in rpy)
    qx = [math.sin(roll / 2), 0.0, 0.0, math.cos(roll / 2)]
    qy = [0.0, math.sin(pitch / 2), 0.0, math.cos(pitch / 2)]
    qz = [0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)]
    return quat_multiply(qz, quat_multiply(qy, qx))


def unit_quat(quat: Sequence[float]) -> np.ndarray:
    """The quaternion scaled to norm 1; InvalidObservationError when it is not finite or near zero."""
    q = np.asarray(quat, dtype=np.float64).reshape(-1)
    norm = float(np.linalg.norm(q)) if q.shape == (4,) and np.all(np.isfinite(q)) else 0.0
    if not norm > 1e-6:
        raise InvalidObservationError(f"not a rotation quaternion: {q.tolist()}")
    return q / norm


# ---------------------------------------------------------------------------------------------
# the step's motion


@dataclass(frozen=True)
class Step:
    """The motion of one control step, after the speed limits and the workspace box."""

    translation_m: np.ndarray
    """[3] in the pose's frame, m."""
    rotvec_rad: np.ndarray
    """[3] rotation vector about the pose frame's axes, rad."""
    clipped: bool
    """A speed limit or the workspace box changed the step."""


def requested_motion(action: np.ndarray, cfg: ArmOutputsConfig) -> tuple[np.ndarray, np.ndarray]:
    """(translation [3] m, rotation vector [3] rad) the action asks for, before any limit."""
    a = check_action(action)
    translation = a[0:3] * cfg.position_unit_m
    rotation = a[3:6] * cfg.rotation_unit_rad
    if cfg.rotation_format == "rpy":
        rotation = rotvec_from_quat(quat_from_rpy(rotation))
    return translation, rotation


def limited_step(action: np.ndarray, position_m: Sequence[float], period_s: float,
                 cfg: ArmOutputsConfig) -> tuple[Step | None, str]:  # fmt: skip
    """(step, '') within the speed limits and the workspace box, or (None, why) when the box rejects
    it. `position_m` is the end effector's current position [3], `period_s` the control period."""
    translation, rotvec = requested_motion(action, cfg)
    max_t = np.asarray(cfg.max_linear_speed_mps) * period_s
    max_r = np.asarray(cfg.max_angular_speed_radps) * period_s
    t = np.clip(translation, -max_t, max_t)
    r = np.clip(rotvec, -max_r, max_r)
    p = np.asarray(position_m, dtype=np.float64)
    lo, hi = np.asarray(cfg.workspace_min_m), np.asarray(cfg.workspace_max_m)
    target = p + t
    if np.any(target < lo) or np.any(target > hi):
        where = f"target {np.round(target, 4).tolist()} m outside the workspace box {list(lo)}..{list(hi)}"
        if cfg.out_of_workspace == "reject":
            return None, f"{where}: no twist or pose target this step (arm_outputs.out_of_workspace: reject)"
        # clamped inside the box, and from a pose outside it no faster than the speed limits
        t = np.clip(np.clip(target, lo, hi) - p, -max_t, max_t)
    clipped = not (np.array_equal(t, translation) and np.array_equal(r, rotvec))
    return Step(t, r, clipped), ""


def target_pose(position_m: Sequence[float], quat: Sequence[float], step: Step) -> tuple[np.ndarray, np.ndarray]:
    """(position [3], unit quaternion [4] with w >= 0) of the current pose composed with the step:
    p + t and q_delta * q (the rotation about the end effector's origin, axes of the pose's frame)."""
    position = np.asarray(position_m, dtype=np.float64) + step.translation_m
    q = quat_multiply(quat_from_rotvec(step.rotvec_rad), unit_quat(quat))
    q = q / np.linalg.norm(q)
    return position, (q if q[3] >= 0.0 else -q)


def gripper_positions(action: np.ndarray, cfg: ArmOutputsConfig) -> tuple[float, ...]:
    """Finger joint positions for the action's gripper command (closed when a[6] > 0, else open)."""
    closed = gripper_command(float(np.asarray(action, dtype=np.float64).reshape(-1)[GRIPPER_INDEX])) > 0
    return tuple(float(v) for v in (cfg.gripper_closed_positions if closed else cfg.gripper_open_positions))


# ---------------------------------------------------------------------------------------------
# messages


def twist_message(step: Step, period_s: float, stamp_s: float, frame_id: str) -> Any:
    """TwistStamped moving the arm by `step` in one control period: linear = t / T, angular = r / T."""
    from geometry_msgs.msg import TwistStamped

    msg = TwistStamped(header=header_msg(stamp_s, frame_id))
    v, w = step.translation_m / period_s, step.rotvec_rad / period_s
    msg.twist.linear.x, msg.twist.linear.y, msg.twist.linear.z = (float(x) for x in v)
    msg.twist.angular.x, msg.twist.angular.y, msg.twist.angular.z = (float(x) for x in w)
    return msg


def pose_message(position_m: Sequence[float], quat: Sequence[float], stamp_s: float, frame_id: str) -> Any:
    """PoseStamped of a target position [3] and quaternion [4] (x, y, z, w)."""
    from geometry_msgs.msg import PoseStamped

    msg = PoseStamped(header=header_msg(stamp_s, frame_id))
    msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = (float(v) for v in position_m)
    o = msg.pose.orientation
    o.x, o.y, o.z, o.w = (float(v) for v in quat)
    return msg


def gripper_trajectory_message(positions: Sequence[float], stamp_s: float, frame_id: str,
                               cfg: ArmOutputsConfig) -> Any:  # fmt: skip
    """JointTrajectory with one point: the finger positions, reached `gripper_motion_time_s` after
    the stamp (joint_trajectory_controller starts a trajectory at its header stamp)."""
    from builtin_interfaces.msg import Duration
    from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

    ns = round(cfg.gripper_motion_time_s * 1e9)
    reach = Duration(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)
    point = JointTrajectoryPoint(positions=[float(v) for v in positions], time_from_start=reach)
    return JointTrajectory(header=header_msg(stamp_s, frame_id), joint_names=list(cfg.gripper_joint_names),
                           points=[point])  # fmt: skip


def gripper_array_message(positions: Sequence[float]) -> Any:
    """Float64MultiArray of the finger positions in gripper_joint_names order (the message has no header)."""
    from std_msgs.msg import Float64MultiArray

    return Float64MultiArray(data=[float(v) for v in positions])


def pose_of(msg: Any) -> tuple[np.ndarray, np.ndarray]:
    """(position [3], quaternion [4] x, y, z, w) of a geometry_msgs/PoseStamped or Pose."""
    pose = msg.pose if hasattr(msg, "pose") else msg
    p, q = pose.position, pose.orientation
    return np.array([p.x, p.y, p.z], dtype=np.float64), np.array([q.x, q.y, q.z, q.w], dtype=np.float64)


@dataclass(frozen=True)
class ArmMessages:
    """One step's messages for the switched-on outputs (None: off, or left out this step)."""

    twist: Any = None
    pose_target: Any = None
    gripper_trajectory: Any = None
    gripper_positions: Any = None
    clipped: bool = False
    """A speed limit or the workspace box limited the step."""
    note: str = ""
    """Why the motion outputs were left out ('' when they were not)."""


def arm_messages(action: np.ndarray, pose: Any, period_s: float, stamp_s: float, frame_id: str,
                 cfg: ArmOutputsConfig) -> ArmMessages:  # fmt: skip
    """The switched-on outputs for a checked action [7] decoded from `pose` (the end effector's
    PoseStamped, in `frame_id`), stamped `stamp_s` (the publication time) in `frame_id`."""
    twist = target = None
    clipped, note = False, ""
    if cfg.any_motion:
        position, quat = pose_of(pose)
        step, note = limited_step(action, position, period_s, cfg)
        if step is not None:
            clipped = step.clipped
            if cfg.publish_twist:
                twist = twist_message(step, period_s, stamp_s, frame_id)
            if cfg.publish_pose_target:
                target = pose_message(*target_pose(position, quat, step), stamp_s, frame_id)
    trajectory = array = None
    if cfg.publish_gripper_trajectory or cfg.publish_gripper_positions:
        fingers = gripper_positions(action, cfg)
        if cfg.publish_gripper_trajectory:
            trajectory = gripper_trajectory_message(fingers, stamp_s, frame_id, cfg)
        if cfg.publish_gripper_positions:
            array = gripper_array_message(fingers)
    return ArmMessages(twist, target, trajectory, array, clipped, note)
