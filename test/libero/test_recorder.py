"""LIBERO-layout HDF5 writer/reader round trip and the rosbag2 (MCAP) export, read back with rosbags."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heisd_ros.pipeline.bags import BagTopics, read_topics
from heisd_libero.sim.expert import down_rotation
from heisd_libero.sim.recorder import (
    HDF5_VIEWS, Episode, EpisodeBuffer, Hdf5DemoWriter, axis_angle, export_mcap, read_hdf5_demos,
)
from heisd_libero.sim.libero_env import ObjectPose, SimObservation

h5py = pytest.importorskip("h5py")


def make_episode(T: int = 6, size: int = 8, seed: int = 0, init_state: int = 3, variant: int = 0) -> Episode:
    rng = np.random.default_rng(seed)
    buf = EpisodeBuffer()
    for t in range(T):
        obs = SimObservation(
            images={}, ee_pos=rng.normal(size=3), ee_quat=np.array([0.0, 0.0, 0.0, 1.0]),
            ee_rot=down_rotation(0.1 * t), gripper_qpos=rng.normal(size=2), joint_pos=rng.normal(size=7),
            objects={"a": ObjectPose(*(np.zeros(3), np.array([0, 0, 0, 1.0]), np.eye(3), np.zeros(3), np.ones(3)))},
            instruction="pick up the soup",
        )
        buf.append(obs, rng.uniform(-1, 1, size=7), rng.normal(size=12))
    assert len(buf) == T
    ep = buf.build(instruction="pick up the soup", success=True, init_state_index=init_state, variant=variant,
                   seed=seed, perturb_xy_m=0.01 * variant)
    ep.images = {v: rng.integers(0, 256, size=(T, size, size, 3), dtype=np.uint8) for v in ("agentview", "wrist")}
    return ep


def test_hdf5_round_trip_and_resume(tmp_path: Path) -> None:
    path = tmp_path / "task_demo.hdf5"
    attrs = {"problem_info": {"language_instruction": "pick up the soup"}, "instruction": "pick up the soup",
             "bddl_file_name": "x.bddl", "suite": "libero_object", "task_index": 0}
    eps = [make_episode(seed=0, init_state=3), make_episode(T=4, seed=1, init_state=5, variant=1)]
    with Hdf5DemoWriter(path, attrs) as w:
        assert [w.write(e) for e in eps] == ["demo_0", "demo_1"]
    with h5py.File(path, "r") as f:  # LIBERO's layout, as its loaders read it
        data = f["data"]
        assert data.attrs["num_demos"] == 2 and data.attrs["total"] == 10
        assert data.attrs["macros_image_convention"] == "opencv"
        assert '"language_instruction"' in data.attrs["problem_info"]
        g = data["demo_0"]
        assert g["actions"].shape == (6, 7) and g["dones"][()].tolist() == [0, 0, 0, 0, 0, 1]
        assert g.attrs["num_samples"] == 6
        for key, shape in {"agentview_rgb": (6, 8, 8, 3), "eye_in_hand_rgb": (6, 8, 8, 3), "ee_pos": (6, 3),
                           "ee_ori": (6, 3), "ee_states": (6, 6), "gripper_states": (6, 2), "joint_states": (6, 7)}.items():
            assert g[f"obs/{key}"].shape == shape, key
        assert g["obs/agentview_rgb"].dtype == np.uint8 and g["robot_states"].shape == (6, 9)
    file_attrs, back = read_hdf5_demos(path)
    assert file_attrs["suite"] == "libero_object"
    for a, b in zip(eps, back):
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.states, b.states)
        np.testing.assert_array_equal(a.ee_pos, b.ee_pos)
        np.testing.assert_allclose(a.ee_rot, b.ee_rot, atol=1e-9)
        for view in HDF5_VIEWS:
            np.testing.assert_array_equal(a.images[view], b.images[view])
        assert (b.init_state_index, b.variant, b.instruction, b.success) == (a.init_state_index, a.variant, "pick up the soup", True)
    with Hdf5DemoWriter(path, attrs) as w:  # reopening appends and reports what is there
        assert w.existing() == {(3, 0): ("demo_0", 6), (5, 1): ("demo_1", 4)}
        assert w.write(make_episode(seed=2, init_state=7)) == "demo_2"
    assert len(read_hdf5_demos(path, with_images=False)[1]) == 3


def test_axis_angle_matches_rotation() -> None:
    rots = np.stack([down_rotation(0.0), down_rotation(1.0)])
    aa = axis_angle(rots)
    assert np.linalg.norm(aa[0]) == pytest.approx(np.pi)  # pointing down = half a turn about x
    np.testing.assert_allclose(aa[0] / np.pi, [1, 0, 0], atol=1e-9)


def test_mcap_export_reads_back(tmp_path: Path) -> None:
    pytest.importorskip("rosbags")
    ep = make_episode(T=5, size=6)
    bag = tmp_path / "demo_0"
    n = export_mcap(ep, bag)
    assert n == 1 + 5 * 5 + 1
    assert list(bag.glob("*.mcap")) and (bag / "metadata.yaml").is_file()
    topics = BagTopics()
    msgs = read_topics(bag)
    assert set(msgs) == {t for _, t in topics.images} | {topics.ee_pose, topics.joint_states, topics.instruction,
                                                         topics.episode_result, topics.command}
    (_, instr), = msgs[topics.instruction]
    assert instr.data == "pick up the soup"
    stamps = [s for s, _ in msgs["/agentview/image_raw"]]
    assert np.allclose(np.diff(stamps), 50_000_000)  # 20 Hz
    for t, (_, img) in enumerate(msgs["/wrist/image_raw"]):
        assert (img.encoding, img.height, img.width, img.step) == ("rgb8", 6, 6, 18)
        np.testing.assert_array_equal(np.asarray(img.data).reshape(6, 6, 3), ep.images["wrist"][t])
    _, pose = msgs[topics.ee_pose][2]
    assert pose.header.frame_id == topics.frame_id
    assert [pose.pose.position.x, pose.pose.position.y, pose.pose.position.z] == pytest.approx(ep.ee_pos[2].tolist())
    _, fingers = msgs[topics.joint_states][3]
    assert list(fingers.name) == list(topics.finger_joints) and fingers.header.stamp == msgs[topics.ee_pose][3][1].header.stamp
    np.testing.assert_allclose(fingers.position, ep.gripper_qpos[3])
    _, cmd = msgs[topics.command][4]
    assert cmd.step_id == 4 and cmd.gripper == pytest.approx(ep.actions[4, 6])
    np.testing.assert_allclose(np.r_[cmd.delta_position, cmd.delta_rotation], ep.actions[4, :6])
    (_, result), = msgs[topics.episode_result]
    assert result.data is True


def test_mcap_topics_are_the_node_topics() -> None:
    """The export uses the node's own topic names (heisd_ros.ros.topics, relative -> absolute), so a
    recording replays into a node started without remaps."""
    from heisd_ros.ros import topics as node_topics

    topics = BagTopics()
    absolute = lambda name: "/" + name  # noqa: E731
    assert [t for _, t in topics.images] == [absolute(node_topics.image_topic(v)) for v, _ in topics.images]
    assert [v for v, _ in topics.images] == ["agentview", "wrist"]
    assert topics.ee_pose == absolute(node_topics.POSE)
    assert topics.joint_states == absolute(node_topics.JOINT_STATES)
    assert topics.instruction == absolute(node_topics.INSTRUCTION)
    assert topics.episode_result == absolute(node_topics.EPISODE_RESULT)
    assert topics.command == absolute(node_topics.ARM_COMMAND)


def test_partial_demo_from_a_killed_writer_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "t_demo.hdf5"
    with Hdf5DemoWriter(path, {"suite": "s"}) as w:
        w.write(make_episode(seed=0, init_state=1))
    with h5py.File(path, "a") as f:  # what a kill in the middle of write() leaves behind
        f["data"].create_group("_partial_demo").attrs.update(init_state_index=9, variant=0, num_samples=3)
    with Hdf5DemoWriter(path, {"suite": "s"}) as w:
        assert w.existing() == {(1, 0): ("demo_0", 6)}
        assert w.write(make_episode(seed=1, init_state=2)) == "demo_1"
    assert [e.init_state_index for e in read_hdf5_demos(path, with_images=False)[1]] == [1, 2]
