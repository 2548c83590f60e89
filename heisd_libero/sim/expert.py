"""Scripted pick-and-place expert driven by privileged object poses (docs/design.md §9).

Waypoints: above the grasp point -> descend -> close -> lift -> carry the object over the target
(the held offset is corrected by steering the *object's* xy onto the target's) -> lower -> open
-> retreat. Boxes are grasped across their short side (the gripper yaws to it); bowls are grasped at
the rim; everything else (cans, bottles, cartons) from above at its upper part.

Actions follow LIBERO's OSC convention: `[dx, dy, dz, drx, dry, drz]` in [-1, 1], one unit being
0.05 m / 0.5 rad of commanded motion (world frame), plus the gripper (-1 open, +1 close).
The expert reads only `SimObservation` fields, so it runs on synthetic poses in tests.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_libero.sim.libero_env import Goal, ObjectPose, SimObservation

POS_UNIT_M = 0.05
"""Metres of commanded motion per unit of a position action (robosuite OSC_POSE output_max)."""
ROT_UNIT_RAD = 0.5
"""Radians per unit of a rotation action."""
FINGER_AXIS_COLUMN = 0
"""Column of the grip-site rotation along which the Panda fingers close."""
GRIPPER_OPEN, GRIPPER_CLOSE = -1.0, 1.0


class Phase(enum.IntEnum):
    APPROACH = 0
    DESCEND = 1
    CLOSE = 2
    LIFT = 3
    TRANSPORT = 4
    LOWER = 5
    RELEASE = 6
    RETREAT = 7
    DONE = 8


@dataclass(frozen=True)
class ExpertConfig:
    """Gains, clearances and diversity options of the waypoint expert (lengths in metres)."""

    pos_gain: float = 1.5
    """Position action per POS_UNIT_M of error."""
    rot_gain: float = 1.0
    max_pos_action: float = 1.0
    slow_pos_action: float = 0.6
    """Cap on the position action while descending to grasp and lowering to place."""
    max_rot_action: float = 0.5
    tilt_deadband_rad: float = 0.08
    """Tilt (roll/pitch) error below which no tilt correction is commanded.

    Without it the hold-orientation loop emits noise-level rX/rY commands every step that no
    policy can predict from images and that make every retrieved draft miss on rotation."""
    yaw_deadband_rad: float = 0.03
    """Yaw error below which no yaw correction is commanded (below `yaw_tol_rad`, so alignment converges)."""
    reach_tol_m: float = 0.008
    yaw_tol_rad: float = 0.06
    hover_m: float = 0.07
    """Height of the approach waypoint above the object's top."""
    carry_clearance_m: float = 0.06
    """Object bottom above the target's top while carrying."""
    release_clearance_m: float = 0.02
    """Object bottom above the target's top when the gripper opens."""
    grasp_depth_m: float = 0.035
    """Grasp point below the top of tall objects."""
    tall_object_m: float = 0.07
    min_grasp_height_m: float = 0.015
    """Lowest grip-site height above the object's bottom (fingertips reach ~1 cm below the site)."""
    rim_inset_m: float = 0.012
    """Bowls: grasp this far inside the rim."""
    max_finger_gap_m: float = 0.07
    """Boxes narrower than this across their short side are yawed so the fingers close across it."""
    close_steps: int = 12
    """Longest grasp: the hand lifts after this many closing steps even if the fingers still move."""
    settle_gap_m: float = 0.0025
    """Closing ends at the first step (after `min_close_steps`) whose finger gap changed less than
    this: the fingers are stopping on the object (Panda's close ~8 mm a step, then 2 mm, then
    < 0.5 mm). A fixed dwell past that point is waiting a policy cannot see (hand, fingers and
    images no longer change), so a policy that copies it stalls with the object in a closed hand;
    ending a step early keeps the last wait 2 mm of gap away from the first lift. 0 keeps the
    fixed `close_steps` dwell."""
    min_close_steps: int = 3
    """Closing steps before the gap counts as settled (the fingers start moving a step late)."""
    release_steps: int = 10
    retreat_m: float = 0.08
    phase_timeout_steps: int = 80
    """A motion phase that has not converged after this many steps moves on (contact, stall)."""
    max_regrasps: int = 3
    stall_window_steps: int = 10
    """Descending hand that moved < 3 mm over this many steps while > 3 cm above the grasp point is blocked."""
    noise_std: float = 0.0
    """Gaussian noise on the six executed pose actions (diversity; see `explore`)."""
    rot_noise_std: float | None = None
    """Noise on the three rotation actions instead (None: `noise_std`). Translation-only noise
    (0.0) widens the visited positions without teaching rotation corrections, which the
    deadbands otherwise keep at exactly 0."""
    noise_corr: float = 0.0
    """Step-to-step correlation of that noise (AR(1) with the same stationary std; 0: independent).
    Independent noise is undone by the next step's correction, so the hand never leaves the clean
    path by more than a few millimetres; at 0.9 a push lasts ~10 steps and carries the hand
    centimetres off it, so the recorded (clean) labels show corrections from where a policy that
    drifted would be (DART)."""
    contact_noise_std: float | None = None
    """Translation noise while descending to grasp and lowering to place (None: `noise_std`).
    Pushes near the table knock the object away (the episode then records a chase across the
    table instead of a grasp), so wide correlated noise wants a small value here."""
    waypoint_jitter_m: float = 0.0
    """Uniform jitter of the grasp point's xy and of the carry height (diversity)."""
    resync: bool = False
    """Labelling mode: another controller (e.g. a policy) drives, so before every action the phase
    is re-derived from the scene where it no longer fits: an object that is held is carried on
    (from any pre-grasp phase), an object lost while carrying is approached again (any number of
    times). Off for demonstrations, whose expert drives itself."""
    held_lift_m: float = 0.015
    """An object counts as held when lifted this far above where it rested at reset..."""
    held_reach_m: float = 0.08
    """...and its centre is within this distance of the grip site."""

    def __post_init__(self) -> None:
        if self.held_lift_m <= 0 or self.held_reach_m <= 0:
            raise ConfigError("held_lift_m and held_reach_m must be > 0")
        if self.pos_gain <= 0 or self.rot_gain <= 0:
            raise ConfigError("expert gains must be > 0")
        if not 0 < self.slow_pos_action <= self.max_pos_action <= 1:
            raise ConfigError("need 0 < slow_pos_action <= max_pos_action <= 1")
        if not 0 < self.max_rot_action <= 1:
            raise ConfigError("max_rot_action must be in (0, 1]")
        if self.reach_tol_m <= 0 or self.yaw_tol_rad <= 0:
            raise ConfigError("tolerances must be > 0")
        if self.tilt_deadband_rad < 0 or not 0 <= self.yaw_deadband_rad < self.yaw_tol_rad:
            raise ConfigError("need tilt_deadband_rad >= 0 and 0 <= yaw_deadband_rad < yaw_tol_rad")
        if min(self.close_steps, self.release_steps, self.phase_timeout_steps, self.stall_window_steps) < 1:
            raise ConfigError("step counts must be >= 1")
        if self.settle_gap_m < 0 or not 1 <= self.min_close_steps <= self.close_steps:
            raise ConfigError("need settle_gap_m >= 0 and 1 <= min_close_steps <= close_steps")
        if self.noise_std < 0 or (self.rot_noise_std or 0) < 0 or self.waypoint_jitter_m < 0 or self.max_regrasps < 0:
            raise ConfigError("noise_std, rot_noise_std, waypoint_jitter_m and max_regrasps must be >= 0")
        if self.contact_noise_std is not None and self.contact_noise_std < 0:
            raise ConfigError("contact_noise_std must be >= 0")
        if not 0 <= self.noise_corr < 1:
            raise ConfigError("noise_corr must be in [0, 1)")


# ---------------------------------------------------------------------------------------------
# geometry helpers (pure)


def down_rotation(finger_yaw_rad: float) -> np.ndarray:
    """[3, 3] grip-site orientation pointing straight down with the finger axis at `finger_yaw_rad`."""
    c, s = math.cos(finger_yaw_rad), math.sin(finger_yaw_rad)
    return np.array([[c, s, 0.0], [s, -c, 0.0], [0.0, 0.0, -1.0]])


def rotation_error(r_des: np.ndarray, r_cur: np.ndarray) -> np.ndarray:
    """[3] world-frame axis-angle of `r_des @ r_cur.T` (the rotation still to apply), radians."""
    r = r_des @ r_cur.T
    cos = float(np.clip((np.trace(r) - 1.0) / 2.0, -1.0, 1.0))
    angle = math.acos(cos)
    if angle < 1e-8:
        return np.zeros(3)
    axis = np.array([r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1]])
    norm = np.linalg.norm(axis)
    if norm < 1e-8:  # angle ~ pi: axis from the symmetric part
        axis = np.sqrt(np.clip((np.diag(r) + 1.0) / 2.0, 0.0, None))
        k = int(np.argmax(axis))
        axis = r[:, k] + np.eye(3)[k]
        norm = np.linalg.norm(axis)
    return axis / norm * angle


def deadband_rotation(rot_err: np.ndarray, cfg: "ExpertConfig") -> np.ndarray:
    """`rot_err` with the tilt (x, y) and yaw (z) parts zeroed while they are inside their deadbands."""
    out = np.array(rot_err, dtype=np.float64)
    if np.linalg.norm(out[:2]) < cfg.tilt_deadband_rad:
        out[:2] = 0.0
    if abs(out[2]) < cfg.yaw_deadband_rad:
        out[2] = 0.0
    return out


def wrap_half_turn(angle: float) -> float:
    """Wrap to [-pi/2, pi/2): a finger axis and its opposite are the same grasp."""
    return (angle + math.pi / 2) % math.pi - math.pi / 2


def finger_yaw(ee_rot: np.ndarray) -> float:
    axis = ee_rot[:, FINGER_AXIS_COLUMN]
    return math.atan2(axis[1], axis[0])


def short_horizontal_axis(obj: ObjectPose) -> tuple[np.ndarray, float, float]:
    """Unit xy direction of the object's narrower horizontal body axis, its width and the other width."""
    horizontal = [i for i in range(3) if abs(obj.rot[2, i]) < 0.7]
    if len(horizontal) < 2:
        return np.array([1.0, 0.0]), float("inf"), float("inf")
    i, j = sorted(horizontal, key=lambda k: obj.half_extents[k])[:2]
    direction = obj.rot[:2, i] / max(np.linalg.norm(obj.rot[:2, i]), 1e-9)
    return direction, 2 * float(obj.half_extents[i]), 2 * float(obj.half_extents[j])


@dataclass(frozen=True)
class GraspPlan:
    offset_xy: np.ndarray  # [2] grasp point minus object centre, metres
    height_above_bottom_m: float
    finger_yaw_rad: float


def plan_grasp(obj_name: str, obj: ObjectPose, ee_pos: np.ndarray, ee_rot: np.ndarray, cfg: ExpertConfig,
               attempt: int = 0) -> GraspPlan:
    """Where and how to grasp `obj` from above; `attempt` > 0 picks another rim side for bowls."""
    height = obj.top_z - obj.bottom_z
    yaw_now = finger_yaw(ee_rot)
    if "bowl" in obj_name:
        # Attempt 0: the rim point on the current finger axis facing the hand (no turn needed);
        # 1: the perpendicular axis; 2: the far side of the first axis; 3: of the second.
        yaw = yaw_now + (math.pi / 2 if attempt % 2 else 0.0)
        radius = float(min(obj.world_half_extents[:2]))
        axis = np.array([math.cos(yaw), math.sin(yaw)])
        sign = 1.0 if float(axis @ (ee_pos[:2] - obj.center[:2])) >= 0 else -1.0
        if (attempt // 2) % 2:
            sign = -sign
        offset = sign * axis * max(radius - cfg.rim_inset_m, 0.0)
        return GraspPlan(offset, max(height - 0.02, cfg.min_grasp_height_m), yaw_now + wrap_half_turn(yaw - yaw_now))
    grasp_h = height - cfg.grasp_depth_m if height > cfg.tall_object_m else height / 2
    grasp_h = max(grasp_h, cfg.min_grasp_height_m)
    yaw = yaw_now
    direction, short_w, long_w = short_horizontal_axis(obj)
    if short_w < cfg.max_finger_gap_m and long_w > short_w * 1.3:
        target = math.atan2(direction[1], direction[0])
        yaw = yaw_now + wrap_half_turn(target - yaw_now)
    return GraspPlan(np.zeros(2), grasp_h, yaw)


# ---------------------------------------------------------------------------------------------
# the state machine


class WaypointExpert:
    """Closed-loop waypoint policy for one episode; call `reset(goal, seed)` then `act(obs)` per step."""

    def __init__(self, config: ExpertConfig | None = None) -> None:
        self.config = config or ExpertConfig()
        self.goal: Goal | None = None
        self.phase = Phase.APPROACH
        self._rng = np.random.default_rng(0)
        self._noise = np.zeros(6)

    def reset(self, goal: Goal, seed: int = 0) -> None:
        self.goal = goal
        self._rng = np.random.default_rng(seed)
        jitter = self.config.waypoint_jitter_m
        self._jitter_xy = self._rng.uniform(-jitter, jitter, size=2)
        self._jitter_z = float(self._rng.uniform(0.0, jitter))
        self._noise = np.zeros(6)
        self._regrasps = 0
        self._plan: GraspPlan | None = None
        self._r_des: np.ndarray | None = None
        self._rest_bottom_z: float | None = None
        self._enter(Phase.APPROACH)

    @property
    def done(self) -> bool:
        return self.phase == Phase.DONE

    def _enter(self, phase: Phase) -> None:
        self.phase = phase
        self._steps_in_phase = 0
        self._trail: list[np.ndarray] = []
        self._last_gap: float | None = None

    def act(self, obs: SimObservation) -> np.ndarray:
        """[7] action for the current observation (advances the phase when a waypoint is reached)."""
        if self.goal is None:
            raise ConfigError("WaypointExpert.reset(goal) must be called before act()")
        obj, target = obs.objects[self.goal.obj], obs.objects[self.goal.target]
        if self._rest_bottom_z is None:
            self._rest_bottom_z = obj.bottom_z
        if self.config.resync:
            self._resync(obs, obj)
        if self._plan is None:
            self._new_plan(obs, obj)
        pos_target, gripper, cap = self._waypoint(obs, obj, target)
        self._steps_in_phase += 1
        action = np.zeros(7)
        cfg = self.config
        action[:3] = np.clip(cfg.pos_gain * (pos_target - obs.ee_pos) / POS_UNIT_M, -cap, cap)
        assert self._r_des is not None
        rot_err = deadband_rotation(rotation_error(self._r_des, obs.ee_rot), cfg)
        action[3:6] = np.clip(cfg.rot_gain * rot_err / ROT_UNIT_RAD, -cfg.max_rot_action, cfg.max_rot_action)
        action[6] = gripper
        return action

    def _new_plan(self, obs: SimObservation, obj: ObjectPose) -> None:
        assert self.goal is not None
        self._plan = plan_grasp(self.goal.obj, obj, obs.ee_pos, obs.ee_rot, self.config, self._regrasps)
        self._r_des = down_rotation(self._plan.finger_yaw_rad)
        self._grasp_bottom_z = obj.bottom_z

    def holds(self, obs: SimObservation, obj: ObjectPose) -> bool:
        """Whether `obj` is in the hand: lifted off where it rested, near the grip site, fingers closing."""
        cfg = self.config
        assert self._rest_bottom_z is not None
        lifted = obj.bottom_z - self._rest_bottom_z > cfg.held_lift_m
        near = float(np.linalg.norm(obj.center - obs.ee_pos)) < cfg.held_reach_m
        closing = float(abs(obs.gripper_qpos[0] - obs.gripper_qpos[1])) < 0.075  # Panda fully open: ~0.08 m
        return lifted and near and closing

    def _resync(self, obs: SimObservation, obj: ObjectPose) -> None:
        """Re-derive the phase from the scene where another controller moved it out of step (resync mode)."""
        held = self.holds(obs, obj)
        if held and self.phase in (Phase.APPROACH, Phase.DESCEND, Phase.CLOSE):
            if self._plan is None:
                self._new_plan(obs, obj)
            assert self._rest_bottom_z is not None
            self._grasp_bottom_z = self._rest_bottom_z  # lifted from where it rested, not from here
            self._ee_minus_bottom = float(obs.ee_pos[2] - obj.bottom_z)
            self._enter(Phase.LIFT)
        elif not held and self.phase in (Phase.TRANSPORT, Phase.LOWER) and \
                float(np.linalg.norm(obj.center - obs.ee_pos)) > self.config.held_reach_m:
            self._rest_bottom_z = obj.bottom_z  # where it fell is where it rests now
            self._regrasps += 1
            self._plan = None
            self._enter(Phase.APPROACH)

    def explore(self, action: np.ndarray) -> np.ndarray:
        """The action to *execute*: `action` plus seeded Gaussian noise on the pose part.

        The clean action is what gets recorded (DART-style): the demos then show recoveries from
        small deviations without teaching the noise itself.
        """
        noisy = np.array(action, dtype=np.float64)
        cfg = self.config
        rot = cfg.noise_std if cfg.rot_noise_std is None else cfg.rot_noise_std
        if (cfg.noise_std > 0 or rot > 0) and self.phase not in (Phase.CLOSE, Phase.RELEASE):
            std = np.array([cfg.noise_std] * 3 + [rot] * 3)
            fresh = self._rng.normal(0.0, 1.0, size=6) * std
            rho = cfg.noise_corr
            self._noise = rho * self._noise + math.sqrt(1.0 - rho * rho) * fresh if rho else fresh
            noise = self._noise
            if cfg.contact_noise_std is not None and self.phase in (Phase.DESCEND, Phase.LOWER):
                # the same process, scaled down: the hand stays near the clean path by the object
                scale = cfg.contact_noise_std / cfg.noise_std if cfg.noise_std > 0 else 0.0
                noise = np.concatenate([noise[:3] * scale, noise[3:]])
            noisy[:6] = np.clip(noisy[:6] + noise, -1.0, 1.0)
        return noisy

    def _grasp_point(self, obj: ObjectPose) -> np.ndarray:
        assert self._plan is not None
        xy = obj.center[:2] + self._plan.offset_xy + self._jitter_xy
        return np.array([xy[0], xy[1], obj.bottom_z + self._plan.height_above_bottom_m])

    def _timed_out(self) -> bool:
        return self._steps_in_phase >= self.config.phase_timeout_steps

    def _waypoint(self, obs: SimObservation, obj: ObjectPose, target: ObjectPose) -> tuple[np.ndarray, float, float]:
        """(ee position target [3], gripper command, position action cap) for this step."""
        cfg, ee = self.config, obs.ee_pos
        phase = self.phase
        if phase == Phase.APPROACH:
            grasp = self._grasp_point(obj)
            hover = np.array([grasp[0], grasp[1], obj.top_z + cfg.hover_m])
            yaw_err = abs(wrap_half_turn(finger_yaw(obs.ee_rot) - self._plan.finger_yaw_rad))  # type: ignore[union-attr]
            if (np.linalg.norm(hover - ee) < 2 * cfg.reach_tol_m and yaw_err < cfg.yaw_tol_rad) or self._timed_out():
                self._enter(Phase.DESCEND)
            return hover, GRIPPER_OPEN, cfg.max_pos_action
        if phase == Phase.DESCEND:
            grasp = self._grasp_point(obj)
            self._trail.append(ee.copy())
            blocked = (
                len(self._trail) > cfg.stall_window_steps
                and np.linalg.norm(self._trail[-1] - self._trail[-1 - cfg.stall_window_steps]) < 0.003
                and ee[2] - grasp[2] > 0.03
            )
            if blocked and self._regrasps < cfg.max_regrasps:  # e.g. a finger on a drawer wall
                self._regrasps += 1
                self._plan = None
                self._enter(Phase.APPROACH)
                return np.array([ee[0], ee[1], ee[2] + 0.05]), GRIPPER_OPEN, cfg.max_pos_action
            if np.linalg.norm(grasp - ee) < cfg.reach_tol_m or self._timed_out():
                self._grasp_bottom_z = obj.bottom_z
                self._enter(Phase.CLOSE)
            return grasp, GRIPPER_OPEN, cfg.slow_pos_action
        if phase == Phase.CLOSE:
            gap = float(abs(obs.gripper_qpos[0] - obs.gripper_qpos[1]))
            settled = (
                cfg.settle_gap_m > 0 and self._last_gap is not None
                and self._steps_in_phase >= cfg.min_close_steps and abs(gap - self._last_gap) < cfg.settle_gap_m
            )
            self._last_gap = gap
            if settled or self._steps_in_phase >= cfg.close_steps:
                self._ee_minus_bottom = float(ee[2] - obj.bottom_z)
                self._enter(Phase.LIFT)
                return self._waypoint(obs, obj, target)  # this state's label is the lift, not a wait
            return ee.copy(), GRIPPER_CLOSE, cfg.slow_pos_action
        if phase == Phase.LIFT:
            carry_z = self._carry_z(target)
            lifted = obj.bottom_z - self._grasp_bottom_z
            if abs(carry_z - ee[2]) < 2 * cfg.reach_tol_m or self._timed_out():
                if lifted < 0.02 and self._regrasps < cfg.max_regrasps:
                    self._regrasps += 1
                    self._plan = None  # replan from the object's new pose
                    self._enter(Phase.APPROACH)
                else:
                    self._enter(Phase.TRANSPORT)
            return np.array([ee[0], ee[1], carry_z]), GRIPPER_CLOSE, cfg.max_pos_action
        if phase == Phase.TRANSPORT:
            # Steer the held object's centre (not the hand) onto the target: corrects the grasp offset.
            err_xy = target.pos[:2] - obj.center[:2]
            if np.linalg.norm(err_xy) < cfg.reach_tol_m or self._timed_out():
                self._enter(Phase.LOWER)
            goal = np.array([ee[0] + err_xy[0], ee[1] + err_xy[1], self._carry_z(target)])
            return goal, GRIPPER_CLOSE, cfg.max_pos_action
        if phase == Phase.LOWER:
            err_xy = target.pos[:2] - obj.center[:2]
            drop = obj.bottom_z - (target.top_z + cfg.release_clearance_m)
            if drop < 0.005 or self._timed_out():
                self._enter(Phase.RELEASE)
            goal = np.array([ee[0] + err_xy[0], ee[1] + err_xy[1], ee[2] - drop])
            return goal, GRIPPER_CLOSE, cfg.slow_pos_action
        if phase == Phase.RELEASE:
            if self._steps_in_phase >= cfg.release_steps:
                self._retreat_z = float(ee[2] + cfg.retreat_m)
                self._enter(Phase.RETREAT)
            return ee.copy(), GRIPPER_OPEN, cfg.slow_pos_action
        if phase == Phase.RETREAT:
            goal = np.array([ee[0], ee[1], self._retreat_z])
            if abs(goal[2] - ee[2]) < 2 * cfg.reach_tol_m or self._timed_out():
                self._enter(Phase.DONE)
            return goal, GRIPPER_OPEN, cfg.max_pos_action
        return ee.copy(), GRIPPER_OPEN, cfg.max_pos_action

    def _carry_z(self, target: ObjectPose) -> float:
        cfg = self.config
        z = target.top_z + cfg.carry_clearance_m + self._jitter_z + self._ee_minus_bottom
        return max(z, self._grasp_bottom_z + self._ee_minus_bottom + 0.08)
