"""Waypoint expert on synthetic poses: no LIBERO needed (a point-mass hand and a box that follows it)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heisd_ros.core.errors import ConfigError
from heisd_libero.sim.expert import (
    POS_UNIT_M, ROT_UNIT_RAD, ExpertConfig, Phase, WaypointExpert, deadband_rotation, down_rotation, finger_yaw, plan_grasp,
    rotation_error, wrap_half_turn,
)
from heisd_libero.sim.libero_env import Goal, ObjectPose, SimObservation, UnsupportedGoalError, parse_goal


def rz(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def box(center, half, yaw: float = 0.0) -> ObjectPose:
    center = np.asarray(center, dtype=float)
    rot = rz(yaw)
    return ObjectPose(pos=center.copy(), quat=np.array([0, 0, math.sin(yaw / 2), math.cos(yaw / 2)]),
                      rot=rot, center=center.copy(), half_extents=np.asarray(half, dtype=float))


def moved(obj: ObjectPose, delta: np.ndarray) -> ObjectPose:
    return ObjectPose(obj.pos + delta, obj.quat, obj.rot, obj.center + delta, obj.half_extents)


class PointMassScene:
    """Kinematic stand-in for LIBERO: the hand moves by half the commanded delta; a closed gripper
    near the object's grasp height carries it; an opened gripper drops it onto whatever is below."""

    def __init__(self, obj: ObjectPose, target: ObjectPose, yaw: float = math.pi / 2) -> None:
        self.ee = np.array([0.0, 0.0, 0.3])
        self.rot = down_rotation(yaw)
        self.obj, self.target = obj, target
        self.closed = False
        self.held_offset: np.ndarray | None = None

    def observe(self) -> SimObservation:
        return SimObservation(images={}, ee_pos=self.ee.copy(), ee_quat=np.array([1.0, 0, 0, 0]), ee_rot=self.rot.copy(),
                              gripper_qpos=np.array([0.0, 0.0] if self.closed else [0.04, -0.04]),
                              joint_pos=np.zeros(7), objects={"cream_cheese_1": self.obj, "basket_1_region": self.target},
                              instruction="put it in the basket")

    def step(self, action: np.ndarray) -> None:
        self.ee = self.ee + 0.5 * POS_UNIT_M * action[:3]
        self.rot = _rodrigues(0.5 * ROT_UNIT_RAD * action[3:6]) @ self.rot
        closing = action[6] > 0
        if closing and not self.closed:
            near = np.linalg.norm(self.ee[:2] - self.obj.center[:2]) < 0.02 and self.ee[2] < self.obj.top_z + 0.01
            self.held_offset = (self.obj.center - self.ee) if near else None
        if not closing and self.held_offset is not None:
            self.held_offset = None
            self.obj = moved(self.obj, np.array([0.0, 0.0, self.target.top_z - self.obj.bottom_z]))
        self.closed = closing
        if self.held_offset is not None:
            self.obj = moved(self.obj, self.ee + self.held_offset - self.obj.center)


def _rodrigues(v: np.ndarray) -> np.ndarray:
    angle = float(np.linalg.norm(v))
    if angle < 1e-12:
        return np.eye(3)
    k = v / angle
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + math.sin(angle) * K + (1 - math.cos(angle)) * K @ K


def run_expert(scene: PointMassScene, config: ExpertConfig, max_steps: int = 400) -> tuple[WaypointExpert, list[Phase]]:
    expert = WaypointExpert(config)
    expert.reset(Goal("in", "cream_cheese_1", "basket_1_region"), seed=3)
    phases = []
    for _ in range(max_steps):
        action = expert.act(scene.observe())
        assert action.shape == (7,) and np.all(np.abs(action) <= 1.0)
        phases.append(expert.phase)
        scene.step(expert.explore(action))
        if expert.done:
            break
    return expert, phases


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_expert_places_box_on_target(noise: float) -> None:
    obj = box([0.1, -0.2, 0.01], [0.04, 0.02, 0.01], yaw=0.5)
    target = box([0.0, 0.25, 0.07], [0.08, 0.08, 0.07])
    scene = PointMassScene(obj, target)
    expert, phases = run_expert(scene, ExpertConfig(noise_std=noise, waypoint_jitter_m=0.003 if noise else 0.0))
    assert expert.done
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert order == [Phase.APPROACH, Phase.DESCEND, Phase.CLOSE, Phase.LIFT, Phase.TRANSPORT, Phase.LOWER,
                     Phase.RELEASE, Phase.RETREAT, Phase.DONE][: len(order)]
    assert np.linalg.norm(scene.obj.center[:2] - target.pos[:2]) < 0.02
    assert abs(scene.obj.bottom_z - target.top_z) < 1e-9  # dropped onto the target
    # The fingers were turned across the box's short side (body y axis at yaw 0.5 + pi/2).
    assert abs(wrap_half_turn(finger_yaw(scene.rot) - (0.5 + math.pi / 2))) < 0.1


def test_expert_is_deterministic_per_seed() -> None:
    def actions() -> np.ndarray:
        scene = PointMassScene(box([0.1, -0.2, 0.01], [0.04, 0.02, 0.01]), box([0.0, 0.25, 0.07], [0.08, 0.08, 0.07]))
        expert = WaypointExpert(ExpertConfig(noise_std=0.05, waypoint_jitter_m=0.005))
        expert.reset(Goal("in", "cream_cheese_1", "basket_1_region"), seed=11)
        out = []
        for _ in range(30):
            a = expert.explore(expert.act(scene.observe()))
            scene.step(a)
            out.append(a)
        return np.stack(out)

    np.testing.assert_array_equal(actions(), actions())


def test_translation_only_noise_leaves_rotation_actions_clean() -> None:
    """--rot-noise-std 0: the executed rotation actions equal the recorded ones; translation gets
    the noise. Unset, rotation gets noise_std as before (older demo sets reproduce)."""
    def executed(cfg: ExpertConfig) -> tuple[np.ndarray, np.ndarray]:
        scene = PointMassScene(box([0.1, -0.2, 0.01], [0.04, 0.02, 0.01]), box([0.0, 0.25, 0.07], [0.08, 0.08, 0.07]))
        expert = WaypointExpert(cfg)
        expert.reset(Goal("in", "cream_cheese_1", "basket_1_region"), seed=3)
        clean, noisy = [], []
        for _ in range(25):
            a = expert.act(scene.observe())
            n = expert.explore(a)
            scene.step(n)
            clean.append(a)
            noisy.append(n)
        return np.stack(clean), np.stack(noisy)

    clean, noisy = executed(ExpertConfig(noise_std=0.3, rot_noise_std=0.0))
    np.testing.assert_array_equal(noisy[:, 3:], clean[:, 3:])
    assert np.abs(noisy[:, :3] - clean[:, :3]).mean() > 0.1
    clean, noisy = executed(ExpertConfig(noise_std=0.3))
    assert np.abs(noisy[:, 3:6] - clean[:, 3:6]).mean() > 0.1
    with pytest.raises(ConfigError):
        ExpertConfig(rot_noise_std=-0.1)


def test_grasp_heights_and_bowl_rim() -> None:
    cfg = ExpertConfig()
    ee, rot = np.array([0.0, 0.0, 0.3]), down_rotation(math.pi / 2)
    tall = box([0.0, 0.0, 0.07], [0.03, 0.03, 0.07])
    plan = plan_grasp("milk_1", tall, ee, rot, cfg)
    assert plan.height_above_bottom_m == pytest.approx(0.14 - cfg.grasp_depth_m)
    flat = box([0.0, 0.0, 0.009], [0.04, 0.02, 0.009])
    assert plan_grasp("butter_1", flat, ee, rot, cfg).height_above_bottom_m == pytest.approx(cfg.min_grasp_height_m)
    bowl = box([0.2, 0.1, 0.025], [0.06, 0.06, 0.025])
    rim = plan_grasp("akita_black_bowl_1", bowl, ee, rot, cfg)
    # On the rim, along the current finger axis (world y), on the side facing the hand.
    np.testing.assert_allclose(rim.offset_xy, [0.0, -(0.06 - cfg.rim_inset_m)], atol=1e-9)
    assert rim.finger_yaw_rad == pytest.approx(math.pi / 2)


def test_rotation_helpers() -> None:
    r = down_rotation(0.3)
    assert np.allclose(r @ r.T, np.eye(3)) and np.linalg.det(r) == pytest.approx(1.0)
    assert np.allclose(r[:, 2], [0, 0, -1])
    err = rotation_error(rz(0.2) @ r, r)
    np.testing.assert_allclose(err, [0, 0, 0.2], atol=1e-9)
    np.testing.assert_allclose(rotation_error(rz(math.pi), np.eye(3)), [0, 0, math.pi], atol=1e-6)
    assert wrap_half_turn(math.pi * 0.75) == pytest.approx(-math.pi / 4)


def test_rotation_deadbands() -> None:
    cfg = ExpertConfig(tilt_deadband_rad=0.08, yaw_deadband_rad=0.03)
    # Small tilt and yaw: no command at all (the noise-level corrections the demos must not teach).
    np.testing.assert_array_equal(deadband_rotation(np.array([0.05, -0.05, 0.02]), cfg), [0, 0, 0])
    # Tilt beyond the band is corrected whole (both axes), yaw independently.
    np.testing.assert_allclose(deadband_rotation(np.array([0.07, 0.05, 0.02]), cfg), [0.07, 0.05, 0.0])
    np.testing.assert_allclose(deadband_rotation(np.array([0.01, 0.0, -0.2]), cfg), [0.0, 0.0, -0.2])
    with pytest.raises(ConfigError):
        ExpertConfig(yaw_deadband_rad=0.1, yaw_tol_rad=0.06)  # alignment could never converge


def test_parse_goal() -> None:
    assert parse_goal([["In", "soup_1", "basket_1_contain_region"]]) == Goal("in", "soup_1", "basket_1_contain_region")
    assert parse_goal([("on", "bowl_1", "plate_1")]).relation == "on"
    with pytest.raises(UnsupportedGoalError):
        parse_goal([["open", "drawer_1"]])
    with pytest.raises(UnsupportedGoalError):
        parse_goal([["on", "a", "b"], ["on", "c", "d"]])


def test_config_validation_and_act_before_reset() -> None:
    with pytest.raises(ConfigError):
        ExpertConfig(slow_pos_action=0.0)
    with pytest.raises(ConfigError):
        ExpertConfig(noise_std=-1.0)
    with pytest.raises(ConfigError):
        WaypointExpert().act(PointMassScene(box([0, 0, 0.01], [0.02] * 3), box([0, 0.2, 0.05], [0.05] * 3)).observe())


def test_sim_modules_import_without_heavy_dependencies() -> None:
    """LIBERO/MuJoCo/h5py/rosbags load only when an env is built or a file written."""
    import subprocess
    import sys

    code = (
        "import sys, heisd_libero.sim.libero_env, heisd_libero.sim.expert, heisd_libero.sim.recorder, heisd_libero.gen_demos\n"
        "print(sorted(m for m in ('libero', 'mujoco', 'robosuite', 'h5py', 'rosbags', 'rclpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _drive_until(scene: PointMassScene, expert: WaypointExpert, phase: Phase, max_steps: int = 400) -> None:
    for _ in range(max_steps):
        if expert.phase == phase:
            return
        scene.step(expert.act(scene.observe()))
    raise AssertionError(f"expert never reached {phase.name}")


def test_resync_carries_on_with_an_object_someone_else_grasped() -> None:
    """DAgger labelling: the scene was driven to a held, lifted object by another controller; a
    resync expert that just started labels 'keep it closed, carry it', a plain one 'open, approach'."""
    obj, target = box([0.1, -0.2, 0.01], [0.04, 0.02, 0.01], yaw=0.5), box([0.0, 0.25, 0.07], [0.08, 0.08, 0.07])
    goal = Goal("in", "cream_cheese_1", "basket_1_region")
    start = PointMassScene(obj, target).observe()  # where the object rests at reset
    scene = PointMassScene(obj, target)
    driver = WaypointExpert(ExpertConfig())
    driver.reset(goal)
    _drive_until(scene, driver, Phase.TRANSPORT)
    held = scene.observe()
    assert held.objects["cream_cheese_1"].bottom_z > obj.bottom_z + 0.03

    labels = {}
    for resync in (False, True):
        expert = WaypointExpert(ExpertConfig(resync=resync))
        expert.reset(goal)
        expert.act(start)  # the labeller saw the episode start
        labels[resync] = (expert.act(held), expert.phase)
    plain, (action, phase) = labels[False], labels[True]
    assert plain[1] == Phase.APPROACH and plain[0][6] < 0  # would drop the object
    assert phase in (Phase.LIFT, Phase.TRANSPORT) and action[6] > 0


def test_resync_approaches_again_after_a_drop_and_finishes() -> None:
    obj, target = box([0.1, -0.2, 0.01], [0.04, 0.02, 0.01], yaw=0.5), box([0.0, 0.25, 0.07], [0.08, 0.08, 0.07])
    scene = PointMassScene(obj, target)
    expert = WaypointExpert(ExpertConfig(resync=True))
    expert.reset(Goal("in", "cream_cheese_1", "basket_1_region"))
    _drive_until(scene, expert, Phase.TRANSPORT)
    for _ in range(3):  # carry a little, then the object slips out onto the table
        scene.step(expert.act(scene.observe()))
    scene.held_offset = None
    scene.obj = moved(scene.obj, np.array([0.05, 0.0, obj.bottom_z - scene.obj.bottom_z]))
    scene.step(np.array([0, 0, 1.0, 0, 0, 0, 1.0]))  # the hand moves on, away from it
    action = expert.act(scene.observe())
    assert expert.phase == Phase.APPROACH and action[6] < 0
    for _ in range(600):
        scene.step(expert.act(scene.observe()))
        if expert.done:
            break
    assert expert.done
    assert np.linalg.norm(scene.obj.center[:2] - target.pos[:2]) < 0.02


def test_plain_expert_unchanged_by_resync_when_it_drives_itself() -> None:
    """Driving its own episode, a resync expert emits exactly the plain expert's actions."""
    def actions(resync: bool) -> np.ndarray:
        scene = PointMassScene(box([0.1, -0.2, 0.01], [0.04, 0.02, 0.01]), box([0.0, 0.25, 0.07], [0.08, 0.08, 0.07]))
        expert = WaypointExpert(ExpertConfig(resync=resync))
        expert.reset(Goal("in", "cream_cheese_1", "basket_1_region"), seed=5)
        out = []
        for _ in range(400):
            a = expert.act(scene.observe())
            scene.step(a)
            out.append(a)
            if expert.done:
                break
        return np.stack(out)

    np.testing.assert_array_equal(actions(True), actions(False))


def _executed_noise(cfg: ExpertConfig, phase: Phase, steps: int = 4000) -> np.ndarray:
    """The translation noise `explore` adds to a zero action in `phase` [steps, 3]."""
    expert = WaypointExpert(cfg)
    expert.reset(Goal("in", "cream_cheese_1", "basket_1_region"), seed=5)
    expert.phase = phase
    return np.stack([expert.explore(np.zeros(7))[:3] for _ in range(steps)])


def test_correlated_noise_keeps_its_std_and_lasts() -> None:
    """--noise-corr 0.9: the executed noise has the same spread as independent noise of that std,
    but one step predicts the next (lag-1 autocorrelation ~0.9), so pushes last; 0 stays independent."""
    def lag1(n: np.ndarray) -> float:
        return float(np.mean([np.corrcoef(n[:-1, i], n[1:, i])[0, 1] for i in range(3)]))

    iid = _executed_noise(ExpertConfig(noise_std=0.2), Phase.APPROACH)
    ar1 = _executed_noise(ExpertConfig(noise_std=0.2, noise_corr=0.9), Phase.APPROACH)
    assert abs(lag1(iid)) < 0.1
    assert lag1(ar1) > 0.8
    assert ar1.std() == pytest.approx(0.2, rel=0.25)
    assert iid.std() == pytest.approx(0.2, rel=0.1)
    with pytest.raises(ConfigError):
        ExpertConfig(noise_corr=1.0)


def test_contact_noise_scales_the_pushes_near_the_object() -> None:
    """--contact-noise-std: descending to grasp (and lowering to place) gets the small std; free
    motion keeps the wide one; unset, every moving phase gets noise_std as before."""
    cfg = ExpertConfig(noise_std=0.4, noise_corr=0.9, contact_noise_std=0.04)
    assert _executed_noise(cfg, Phase.DESCEND).std() < 0.06
    assert _executed_noise(cfg, Phase.LOWER).std() < 0.06
    assert _executed_noise(cfg, Phase.APPROACH).std() > 0.25
    assert _executed_noise(ExpertConfig(noise_std=0.4, noise_corr=0.9), Phase.DESCEND).std() > 0.25
    with pytest.raises(ConfigError):
        ExpertConfig(contact_noise_std=-0.1)


class ClosingFingersScene(PointMassScene):
    """The fingers close over several steps, as Panda's do (0.08 m open -> 0.04 m on the box)."""

    GAPS = [0.08, 0.079, 0.074, 0.066, 0.055, 0.045, 0.0402, 0.0401]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.closing_steps = 0

    def observe(self) -> SimObservation:
        obs = super().observe()
        if self.closed:
            gap = self.GAPS[min(self.closing_steps, len(self.GAPS) - 1)]
            obs = SimObservation(**{**obs.__dict__, "gripper_qpos": np.array([gap / 2, -gap / 2])})
        return obs

    def step(self, action: np.ndarray) -> None:
        super().step(action)
        self.closing_steps = self.closing_steps + 1 if self.closed else 0


@pytest.mark.parametrize("settle_gap_m", [0.0005, 0.0])
def test_closing_ends_when_the_fingers_stop(settle_gap_m: float) -> None:
    scene = ClosingFingersScene(box([0.1, -0.2, 0.01], [0.04, 0.02, 0.01]), box([0.0, 0.25, 0.07], [0.08, 0.08, 0.07]))
    expert = WaypointExpert(ExpertConfig(settle_gap_m=settle_gap_m))
    expert.reset(Goal("in", "cream_cheese_1", "basket_1_region"), seed=3)
    labels = []  # (finger gap seen, z action) from the first closing step to the first lift
    for _ in range(200):
        obs = scene.observe()
        was_closing = expert.phase == Phase.CLOSE
        action = expert.act(obs)
        if was_closing or expert.phase == Phase.CLOSE:
            labels.append((float(obs.gripper_qpos[0] - obs.gripper_qpos[1]), float(action[2])))
            if action[2] > 0.5:
                break
        scene.step(action)
    waits = [gap for gap, z in labels if abs(z) < 1e-9]
    lift_gap = labels[-1][0]
    assert labels[-1][1] > 0.5, "the grasp ends in a lift"
    if settle_gap_m:
        # every wait was at a gap still changing; the first settled gap (0.0401 after 0.0402) is labelled lift
        assert lift_gap == pytest.approx(0.0401) and all(gap > 0.0401 + 1e-6 for gap in waits)
        assert len(waits) == len(ClosingFingersScene.GAPS) - 1
    else:  # the fixed dwell: waits at the settled gap a policy cannot tell from the lift's
        assert len(waits) >= ExpertConfig().close_steps - 1 and waits.count(lift_gap) >= 4
