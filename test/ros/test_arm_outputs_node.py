"""The arm-stack outputs through a running PolicyNode over real rclpy pub/sub: each switched-on output
is published, stamped at publication time in command_frame_id, with the content the decoded action
asks for; a pose in another frame gets no command at all.

The node runs on the shared rig (test/node_rig.py, fixture `node_rig`), as in test_node.py, with a scripted
decoder that returns one fixed action."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fake_decoder import FakeDecoder
from geometry_msgs.msg import PoseStamped, TwistStamped
from std_msgs.msg import Float64MultiArray

from heisd_ros.ros import conversions as conv
from heisd_ros.ros.qos import EVENT_QOS

msg_mod = pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")
JointTrajectory = pytest.importorskip("trajectory_msgs.msg").JointTrajectory
Rotation = pytest.importorskip("scipy.spatial.transform").Rotation

DOMAIN_ID = 93
TASK = "pick up the red bowl"
RATE_HZ = 20.0
FRAME = "panda_link0"
ACTION = np.array([0.004, -0.002, 0.003, 0.02, -0.03, 0.01, 1.0])
"""The fake policy's action: metres and radians per step, gripper closed."""
INPUT_AGE_S = 0.2
"""How old the inputs are when published: the arm outputs must carry a later stamp."""
ORIENTATION = Rotation.from_euler("xyz", [3.0, 0.2, -0.7])
ARM_ON = {"arm_outputs.publish_twist": True, "arm_outputs.publish_pose_target": True,
          "arm_outputs.publish_gripper_trajectory": True, "arm_outputs.publish_gripper_positions": True,
          "arm_outputs.max_linear_speed_mps": [1.0, 1.0, 1.0],
          "arm_outputs.max_angular_speed_radps": [2.0, 2.0, 2.0]}  # fmt: skip
OUTPUTS = {"twists": (TwistStamped, "delta_twist_cmds"), "targets": (PoseStamped, "target_pose"),
           "trajectories": (JointTrajectory, "gripper_trajectory"),
           "positions": (Float64MultiArray, "gripper_positions")}  # fmt: skip
"""Recorded arm-stack outputs: name -> (type, default topic)."""


@pytest.fixture(scope="module")
def rig(node_rig):
    """The shared rig, also recording each arm-stack output with the rig's clock at arrival."""
    node_rig.arm = {name: [] for name in OUTPUTS}
    for name, (kind, topic) in OUTPUTS.items():
        record = node_rig.arm[name].append
        node_rig.node.create_subscription(kind, topic, lambda m, record=record: record((node_rig.now(), m)), EVENT_QOS)
    return node_rig


def _start(rig, **params):
    node = rig.start(FakeDecoder(forwards=1, ms_per_forward=1.0, action=lambda obs, n: ACTION), control_rate_hz=RATE_HZ, command_frame_id=FRAME, **params)
    out = node._session.outputs
    pubs = [p for p in (out.servo_twist, out.pose_target, out.gripper_trajectory, out.gripper_positions) if p]
    assert rig.wait(lambda: all(p.get_subscription_count() > 0 for p in pubs), 5.0), "discovery timed out"
    rig.instruct(TASK)
    return node


def _pose(t: float, position, frame: str = FRAME) -> PoseStamped:
    pose = conv.position_to_pose(position, t, frame)
    o = pose.pose.orientation
    o.x, o.y, o.z, o.w = (float(v) for v in ORIENTATION.as_quat())
    return pose


def _xyz(v) -> np.ndarray:
    return np.array([v.x, v.y, v.z])


def test_each_output_published_at_publication_time_in_the_command_frame(rig):
    _start(rig, **ARM_ON)
    try:
        position = np.array([0.3, -0.1, 0.5])
        sent_s = rig.now()
        t_in = rig.publish_set(t=sent_s - INPUT_AGE_S, pose_msg=_pose(sent_s - INPUT_AGE_S, position))
        assert rig.acted(t_in), "no command"
        assert rig.wait(lambda: all(rig.arm[name] for name in OUTPUTS), 2.0), {k: len(v) for k, v in rig.arm.items()}
        period = 1.0 / RATE_HZ
        for name in ("twists", "targets", "trajectories"):
            arrived, msg = rig.arm[name][0]
            stamp = conv.stamp_to_s(msg.header.stamp)
            assert sent_s <= stamp <= arrived, f"{name}: stamp {stamp} not in [sending {sent_s}, arrival {arrived}]"
            assert msg.header.frame_id == FRAME, name
        twist = rig.arm["twists"][0][1].twist
        np.testing.assert_allclose(_xyz(twist.linear), ACTION[0:3] / period, atol=1e-9)
        np.testing.assert_allclose(_xyz(twist.angular), ACTION[3:6] / period, atol=1e-9)
        target = rig.arm["targets"][0][1].pose
        np.testing.assert_allclose(_xyz(target.position), position + ACTION[0:3], atol=1e-9)
        q = [target.orientation.x, target.orientation.y, target.orientation.z, target.orientation.w]
        expected = Rotation.from_rotvec(ACTION[3:6]) * ORIENTATION
        assert (Rotation.from_quat(q).inv() * expected).magnitude() < 1e-9
        traj = rig.arm["trajectories"][0][1]
        assert traj.joint_names == ["panda_finger_joint1", "panda_finger_joint2"]
        assert list(traj.points[0].positions) == [0.0, 0.0]  # ACTION closes the gripper
        assert list(rig.arm["positions"][0][1].data) == [0.0, 0.0]
        cmd = next(c for c in rig.commands if abs(conv.stamp_to_s(c.header.stamp) - t_in) < 1e-6)
        assert cmd.header.frame_id == FRAME  # the complete record keeps its inputs' stamp
    finally:
        rig.stop()


def test_pose_in_another_frame_gets_no_command(rig):
    _start(rig, **ARM_ON)
    try:
        counts = len(rig.commands), {k: len(v) for k, v in rig.arm.items()}
        n_log = len(rig.logs)
        t_wrong = rig.now()
        rig.publish_set(t=t_wrong, pose_msg=_pose(t_wrong, (0.3, 0.0, 0.5), frame="world"))
        assert not rig.acted(t_wrong, 0.5), "commanded from a pose in another frame"
        assert (len(rig.commands), {k: len(v) for k, v in rig.arm.items()}) == counts
        warned = lambda: [m for m in rig.policy_logs(30)[-20:] if "frame 'world'" in m and FRAME in m]
        assert rig.wait(warned, 2.0), rig.policy_logs(30)[-5:]
        assert len(rig.logs) > n_log
        t_right = rig.now()
        rig.publish_set(t=t_right, pose_msg=_pose(t_right, (0.3, 0.0, 0.5)))
        assert rig.acted(t_right), "no command once the pose is in the command frame"
    finally:
        rig.stop()


def test_outputs_off_by_default(rig):
    node = _start(rig)
    try:
        out = node._session.outputs
        assert (out.servo_twist, out.pose_target, out.gripper_trajectory, out.gripper_positions) == (None,) * 4
        counts = {k: len(v) for k, v in rig.arm.items()}
        t = rig.now()
        rig.publish_set(t=t, pose_msg=_pose(t, (0.3, 0.0, 0.5)))
        assert rig.acted(t)
        time.sleep(0.1)
        assert {k: len(v) for k, v in rig.arm.items()} == counts
    finally:
        rig.stop()
