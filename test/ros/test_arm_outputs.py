"""The arm-stack outputs as pure functions: each message's content against the decoded action, the
quaternion math against scipy's Rotation, and the speed limits and workspace box."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heisd_ros.core.errors import ConfigError, InvalidObservationError
from heisd_ros.ros import arm_outputs as ao
from heisd_ros.ros import conversions as conv

Rotation = pytest.importorskip("scipy.spatial.transform").Rotation

PERIOD_S = 0.1
RNG = np.random.default_rng(0)
FREE = {"max_linear_speed_mps": (100.0,) * 3, "max_angular_speed_radps": (100.0,) * 3,
        "workspace_min_m": (-10.0,) * 3, "workspace_max_m": (10.0,) * 3}
"""Limits that never bind, for checking the plain conversion."""
ALL_ON = {"publish_twist": True, "publish_pose_target": True, "publish_gripper_trajectory": True,
          "publish_gripper_positions": True}


def _cfg(**kw) -> ao.ArmOutputsConfig:
    return ao.ArmOutputsConfig(**{**ALL_ON, **kw})


def _pose(position, quat, frame="base_link"):
    msg = conv.position_to_pose(position, 1.0, frame)
    o = msg.pose.orientation
    o.x, o.y, o.z, o.w = (float(v) for v in quat)
    return msg


def _same_rotation(q_a, q_b, tol=1e-9) -> bool:
    return (Rotation.from_quat(q_a).inv() * Rotation.from_quat(q_b)).magnitude() < tol


# --- configuration ------------------------------------------------------------------------------


def test_defaults_are_off_and_valid():
    cfg = ao.ArmOutputsConfig()
    assert not (cfg.publish_twist or cfg.publish_pose_target or cfg.publish_gripper_trajectory
                or cfg.publish_gripper_positions)  # fmt: skip
    assert ao.ARM_OUTPUTS_DYNAMIC <= {f for f in ao.ArmOutputsConfig.__dataclass_fields__}


@pytest.mark.parametrize("bad", [
    {"position_unit_m": 0.0}, {"rotation_unit_rad": math.nan},
    {"rotation_format": "euler"}, {"max_linear_speed_mps": (0.1, 0.1)}, {"max_angular_speed_radps": (0.1, -1, 0.1)},
    {"workspace_min_m": (0.0, 0.0, 2.0)}, {"out_of_workspace": "ignore"}, {"gripper_joint_names": ("a", "a")},
    {"gripper_open_positions": (0.04,)}, {"gripper_closed_positions": (0.0, math.inf)}, {"gripper_motion_time_s": 0.0},
])  # fmt: skip
def test_invalid_config_is_refused(bad):
    with pytest.raises(ConfigError, match="arm_outputs"):
        ao.ArmOutputsConfig(**bad)


def test_registered_as_node_parameters():
    from heisd_ros.ros.params import (
        build_config,
        config_to_values,
        param_specs,
        validate_update,
    )

    specs = {s.name: s for s in param_specs() if s.name.startswith("arm_outputs.")}
    assert len(specs) == len(ao.ArmOutputsConfig.__dataclass_fields__)
    assert specs["arm_outputs.publish_twist"].read_only and specs["arm_outputs.gripper_joint_names"].read_only
    assert not specs["arm_outputs.max_linear_speed_mps"].read_only
    assert specs["arm_outputs.max_linear_speed_mps"].kind == "float_array"
    values = config_to_values(build_config({"model_dir": "m"}))
    cfg, _ = validate_update(values, {"arm_outputs.max_linear_speed_mps": [0.2, 0.2, 0.3]})
    assert cfg.node.arm_outputs.max_linear_speed_mps == (0.2, 0.2, 0.3)
    cfg, why = validate_update(values, {"arm_outputs.gripper_closed_positions": [0.0]})
    assert cfg is None and "gripper_closed_positions" in why


# --- quaternion math against scipy ----------------------------------------------------------------


def _rotvecs(n: int) -> np.ndarray:
    """Random rotation vectors, plus tiny ones and angles near pi."""
    axes = RNG.normal(size=(n, 3))
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    angles = np.concatenate([RNG.uniform(0, math.pi, n - 4), [1e-9, 1e-5, math.pi - 1e-6, math.pi]])
    return axes * angles[:, None]


def test_quaternion_helpers_match_scipy():
    for r in _rotvecs(200):
        q = ao.quat_from_rotvec(r)
        assert np.linalg.norm(q) == pytest.approx(1.0, abs=1e-12)
        assert _same_rotation(q, Rotation.from_rotvec(r).as_quat())
        back = ao.rotvec_from_quat(q)
        assert _same_rotation(ao.quat_from_rotvec(back), q)
        assert np.linalg.norm(back) <= math.pi + 1e-9
    for _ in range(200):
        a, b = Rotation.random(random_state=RNG), Rotation.random(random_state=RNG)
        assert _same_rotation(ao.quat_multiply(a.as_quat(), b.as_quat()), (a * b).as_quat())
        rpy = RNG.uniform(-math.pi, math.pi, 3)
        assert _same_rotation(ao.quat_from_rpy(rpy), Rotation.from_euler("xyz", rpy).as_quat())


def test_rotvec_of_small_rotations_keeps_its_digits():
    r = np.array([1e-9, -2e-9, 3e-9])
    np.testing.assert_allclose(ao.rotvec_from_quat(ao.quat_from_rotvec(r)), r, rtol=1e-6)


def test_degenerate_quaternion_is_refused():
    for q in ([0, 0, 0, 0], [0, 0, math.nan, 1], [0, 0, 1]):
        with pytest.raises(InvalidObservationError, match="quaternion"):
            ao.unit_quat(q)


# --- twist = delta / period -----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["axis_angle", "rpy"])
def test_twist_is_the_delta_over_the_control_period(fmt):
    cfg = _cfg(position_unit_m=0.05, rotation_unit_rad=0.5, rotation_format=fmt, **FREE)
    a = np.array([0.4, -0.2, 0.6, 0.3, -0.5, 0.2, 1.0])
    msgs = ao.arm_messages(a, _pose((0.3, 0.0, 0.5), [0, 0, 0, 1]), PERIOD_S, 12.5, "panda_link0", cfg)
    tw = msgs.twist
    assert tw.header.frame_id == "panda_link0" and conv.stamp_to_s(tw.header.stamp) == pytest.approx(12.5)
    lin = [tw.twist.linear.x, tw.twist.linear.y, tw.twist.linear.z]
    ang = [tw.twist.angular.x, tw.twist.angular.y, tw.twist.angular.z]
    np.testing.assert_allclose(lin, a[0:3] * 0.05 / PERIOD_S, atol=1e-12)
    rot = a[3:6] * 0.5
    expected = Rotation.from_rotvec(rot) if fmt == "axis_angle" else Rotation.from_euler("xyz", rot)
    np.testing.assert_allclose(ang, expected.as_rotvec() / PERIOD_S, atol=1e-9)
    assert not msgs.clipped and msgs.note == ""


# --- pose target = pose (+) delta ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["axis_angle", "rpy"])
def test_pose_target_composes_the_rotation(fmt):
    cfg = _cfg(rotation_format=fmt, **FREE)
    for _ in range(50):
        current = Rotation.random(random_state=RNG)
        p = RNG.uniform(-0.5, 0.5, 3)
        a = np.concatenate([RNG.uniform(-0.05, 0.05, 3), RNG.uniform(-0.8, 0.8, 3), [-1.0]])
        msgs = ao.arm_messages(a, _pose(p, current.as_quat()), PERIOD_S, 3.0, "base_link", cfg)
        pose = msgs.pose_target.pose
        got_p = [pose.position.x, pose.position.y, pose.position.z]
        got_q = [pose.orientation.x, pose.orientation.y, pose.orientation.z, pose.orientation.w]
        np.testing.assert_allclose(got_p, p + a[0:3], atol=1e-12)
        delta = Rotation.from_rotvec(a[3:6]) if fmt == "axis_angle" else Rotation.from_euler("xyz", a[3:6])
        assert _same_rotation(got_q, (delta * current).as_quat())  # the delta about the pose frame's axes
        assert np.linalg.norm(got_q) == pytest.approx(1.0, abs=1e-12) and got_q[3] >= 0.0
        # holding the twist for one period reaches the same pose
        tw = msgs.twist.twist
        moved = Rotation.from_rotvec(np.array([tw.angular.x, tw.angular.y, tw.angular.z]) * PERIOD_S) * current
        assert _same_rotation(got_q, moved.as_quat(), 1e-8)
        np.testing.assert_allclose(p + np.array([tw.linear.x, tw.linear.y, tw.linear.z]) * PERIOD_S, got_p, atol=1e-12)


def test_rotation_is_composed_not_added():
    """From a rotated pose, adding roll/pitch/yaw angles gives another orientation than composing."""
    cfg = _cfg(rotation_format="rpy", **FREE)
    current = Rotation.from_euler("xyz", [0.3, -0.6, 1.2])
    a = np.array([0, 0, 0, 0.4, 0.3, -0.2, 0.0])
    pose = ao.arm_messages(a, _pose((0, 0, 0.5), current.as_quat()), PERIOD_S, 0.0, "b", cfg).pose_target.pose
    got = [pose.orientation.x, pose.orientation.y, pose.orientation.z, pose.orientation.w]
    added = Rotation.from_euler("xyz", [0.3 + 0.4, -0.6 + 0.3, 1.2 - 0.2])
    assert _same_rotation(got, (Rotation.from_euler("xyz", a[3:6]) * current).as_quat())
    assert not _same_rotation(got, added.as_quat(), 1e-3)


# --- speed limits and the workspace box ------------------------------------------------------------


def test_speed_limits_clip_each_axis():
    cfg = _cfg(max_linear_speed_mps=(0.1, 0.2, 0.3), max_angular_speed_radps=(0.5, 1.0, 1.0),
               workspace_min_m=(-10,) * 3, workspace_max_m=(10,) * 3)  # fmt: skip
    a = np.array([0.5, -0.01, -0.5, 0.2, 0.01, -0.3, 1.0])  # x, z and drX, drZ beyond their limits
    msgs = ao.arm_messages(a, _pose((0, 0, 0.5), [0, 0, 0, 1]), PERIOD_S, 0.0, "b", cfg)
    tw = msgs.twist.twist
    np.testing.assert_allclose([tw.linear.x, tw.linear.y, tw.linear.z], [0.1, -0.1, -0.3], atol=1e-12)
    np.testing.assert_allclose([tw.angular.x, tw.angular.y, tw.angular.z], [0.5, 0.1, -1.0], atol=1e-12)
    p = msgs.pose_target.pose.position
    np.testing.assert_allclose([p.x, p.y, p.z], [0.01, -0.01, 0.47], atol=1e-12)
    assert msgs.clipped and msgs.note == ""


def test_workspace_clip_clamps_the_target_and_the_twist_agrees():
    cfg = _cfg(workspace_min_m=(-0.5, -0.5, 0.1), workspace_max_m=(0.5, 0.5, 1.0), max_linear_speed_mps=(1.0,) * 3)
    msgs = ao.arm_messages(np.array([0.08, 0.0, -0.05, 0, 0, 0, -1.0]), _pose((0.45, 0.0, 0.12), [0, 0, 0, 1]),
                           PERIOD_S, 0.0, "b", cfg)  # fmt: skip
    p = msgs.pose_target.pose.position
    np.testing.assert_allclose([p.x, p.y, p.z], [0.5, 0.0, 0.1], atol=1e-12)
    tw = msgs.twist.twist
    np.testing.assert_allclose([tw.linear.x, tw.linear.y, tw.linear.z], [0.5, 0.0, -0.2], atol=1e-12)
    assert msgs.clipped and msgs.note == ""


def test_pose_outside_the_box_is_led_back_at_the_speed_limit():
    cfg = _cfg(workspace_min_m=(-0.5, -0.5, 0.1), workspace_max_m=(0.5, 0.5, 1.0))
    msgs = ao.arm_messages(np.zeros(7), _pose((0.9, 0.0, 0.5), [0, 0, 0, 1]), PERIOD_S, 0.0, "b", cfg)
    p = msgs.pose_target.pose.position
    np.testing.assert_allclose([p.x, p.y, p.z], [0.89, 0.0, 0.5], atol=1e-12)  # 0.1 m/s for 0.1 s


def test_workspace_reject_leaves_the_motion_out():
    cfg = _cfg(out_of_workspace="reject", workspace_min_m=(-0.5, -0.5, 0.1), workspace_max_m=(0.5, 0.5, 1.0),
               max_linear_speed_mps=(1.0,) * 3)  # fmt: skip
    a = np.array([0.08, 0.0, 0.0, 0, 0, 0, 1.0])
    msgs = ao.arm_messages(a, _pose((0.45, 0.0, 0.5), [0, 0, 0, 1]), PERIOD_S, 0.0, "b", cfg)
    assert msgs.twist is None and msgs.pose_target is None
    assert "outside the workspace box" in msgs.note and "reject" in msgs.note
    assert msgs.gripper_trajectory is not None and msgs.gripper_positions is not None
    inside = ao.arm_messages(a * 0.1, _pose((0.45, 0.0, 0.5), [0, 0, 0, 1]), PERIOD_S, 0.0, "b", cfg)
    assert inside.twist is not None and inside.pose_target is not None and inside.note == ""


# --- gripper -------------------------------------------------------------------------------------


def test_gripper_messages_open_and_closed():
    cfg = _cfg(gripper_joint_names=("left", "right"), gripper_open_positions=(0.035, -0.035),
               gripper_closed_positions=(0.001, -0.001), gripper_motion_time_s=1.25)  # fmt: skip
    pose = _pose((0, 0, 0.5), [0, 0, 0, 1])
    closed, opened = [0.001, -0.001], [0.035, -0.035]
    for g, expected in ((1.0, closed), (0.2, closed), (-1.0, opened), (0.0, opened)):
        msgs = ao.arm_messages(np.array([0, 0, 0, 0, 0, 0, g]), pose, PERIOD_S, 7.25, "base_link", cfg)
        traj = msgs.gripper_trajectory
        assert traj.joint_names == ["left", "right"] and len(traj.points) == 1
        assert list(traj.points[0].positions) == expected
        assert (traj.points[0].time_from_start.sec, traj.points[0].time_from_start.nanosec) == (1, 250_000_000)
        assert conv.stamp_to_s(traj.header.stamp) == pytest.approx(7.25) and traj.header.frame_id == "base_link"
        assert list(msgs.gripper_positions.data) == expected


def test_only_switched_on_outputs_are_built():
    cfg = ao.ArmOutputsConfig(publish_gripper_positions=True)
    msgs = ao.arm_messages(np.zeros(7), None, PERIOD_S, 0.0, "b", cfg)  # no motion output: the pose is not read
    assert msgs.twist is None and msgs.pose_target is None and msgs.gripper_trajectory is None
    assert list(msgs.gripper_positions.data) == [0.04, 0.04]


def test_non_finite_action_is_refused():
    with pytest.raises(InvalidObservationError, match="finite action"):
        ao.arm_messages(np.array([0, 0, math.nan, 0, 0, 0, 1.0]), _pose((0, 0, 0.5), [0, 0, 0, 1]), PERIOD_S, 0.0,
                        "b", _cfg())  # fmt: skip
