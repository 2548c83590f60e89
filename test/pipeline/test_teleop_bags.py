"""rosbag2 recordings read with a topic map: message types, pairing, the gripper hold, the errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heisd_ros.pipeline.action_convention import ActionConvention, DemoDataError
from heisd_ros.pipeline.bags import BagWriter, arm_command_msg, compressed_image_msg, header, pose_msg, read_messages
from heisd_ros.pipeline.teleop_bags import BagReading, TopicMap, episode_number, load_bag_episode, scan_bags

import recordings  # noqa: E402  test/pipeline/recordings.py (pytest.ini: pythonpath)
T = 6
TELEOP_MAP = ("/cam_high/image_raw=agentview,/cam_wrist/image_raw=wrist,/ee_pose=pose,/joint_states=fingers,"
              "/teleop/cmd=action,/gripper=gripper")
TELEOP = BagReading(TopicMap.parse(TELEOP_MAP), instruction="stack the blocks", twist_linear_scale=10.0,
                    twist_angular_scale=10.0, convention=ActionConvention(True, (0.0, 1.0)))


def test_topic_map_parses_roles_and_refuses_bad_maps() -> None:
    m = TopicMap.parse(TELEOP_MAP)
    assert m.views == (("agentview", "/cam_high/image_raw"), ("wrist", "/cam_wrist/image_raw"))
    assert (m.pose, m.action, m.gripper, m.fingers, m.instruction) == ("/ee_pose", "/teleop/cmd", "/gripper",
                                                                      "/joint_states", "")
    for bad, match in (("/a=agentview,/p=pose,/c=action,/x=camera", "ROLE one of"),
                       ("/a=agentview,/b=agentview,/p=pose,/c=action", "mapped twice"),
                       ("/w=wrist,/p=pose,/c=action", "primary view"),
                       ("/a=agentview,/p=pose", "TOPIC=action")):
        with pytest.raises(DemoDataError, match=match):
            TopicMap.parse(bad)


def test_twist_recording_gives_the_policys_actions(tmp_path) -> None:
    rec = recordings
    demo = rec.make_demo(5, T)
    rec.write_teleop_bag(tmp_path / "task" / "take_1", demo)
    ep = load_bag_episode(tmp_path / "task" / "take_1", "d", TELEOP)
    np.testing.assert_allclose(ep.actions, demo.actions, atol=1e-12)  # twist / 10 Hz, gripper 1 open -> -1
    np.testing.assert_allclose(ep.ee_pos, demo.ee_pos)
    np.testing.assert_array_equal(ep.images["agentview"], demo.frames["agentview"])
    np.testing.assert_array_equal(ep.images["wrist"], demo.frames["wrist"])  # recorded as bgr8
    np.testing.assert_allclose(ep.gripper_qpos, demo.fingers)
    assert ep.instruction == "stack the blocks" and ep.success
    no_pixels = load_bag_episode(tmp_path / "task" / "take_1", "d", TELEOP, with_images=False)
    assert no_pixels.images == {} and np.array_equal(no_pixels.actions, ep.actions)


def _arm_bag(path: Path, gripper_from: int = 0, drop_image: int = -1) -> np.ndarray:
    """ArmCommand + CompressedImage (png) + instruction and result topics; returns the actions."""
    rng = np.random.default_rng(1)
    actions = np.concatenate([0.01 * rng.normal(size=(T, 6)), np.where(np.arange(T) < 3, -1.0, 1.0)[:, None]], 1)
    with BagWriter(path) as bag:
        Ty = bag.ts.types
        bag.add("/cam/compressed", "sensor_msgs/msg/CompressedImage")
        bag.add("/pose", "geometry_msgs/msg/PoseStamped")
        bag.add("/cmd", "heisd_ros/msg/ArmCommand")
        bag.add("/task", "std_msgs/msg/String")
        bag.add("/done", "std_msgs/msg/Bool")
        bag.write("/task", 0, Ty["std_msgs/msg/String"](data="wipe the table"))
        for t in range(T):
            s = 1_000_000_000 + t * 50_000_000
            if t != drop_image:
                frame = np.full((8, 8, 3), 10 * t, np.uint8)
                bag.write("/cam/compressed", s, compressed_image_msg(header(s, "c"), frame, "png"))
            bag.write("/pose", s, pose_msg(header(s, "b"), [0.4, 0.0, 0.2 + 0.01 * t]))
            bag.write("/cmd", s, arm_command_msg(header(s, "b"), t, actions[t], "teleop", "teleop"))
        bag.write("/done", 2_000_000_000, Ty["std_msgs/msg/Bool"](data=False))
    return actions


ARM = BagReading(TopicMap.parse("/cam/compressed=agentview,/pose=pose,/cmd=action,/task=instruction,/done=result"))


def test_arm_command_recording_with_compressed_images_instruction_and_result(tmp_path) -> None:
    actions = _arm_bag(tmp_path / "ep")
    ep = load_bag_episode(tmp_path / "ep", "d", ARM)
    np.testing.assert_allclose(ep.actions, actions)
    assert ep.images["agentview"][:, 0, 0, 0].tolist() == [10 * t for t in range(T)]
    assert (ep.instruction, ep.success, ep.gripper_qpos) == ("wipe the table", False, None)
    with pytest.raises(DemoDataError, match=r"no \['wrist'\] view .*--query-views 1"):
        ep.views(0)


def test_a_step_without_its_image_is_dropped(tmp_path) -> None:
    actions = _arm_bag(tmp_path / "ep", drop_image=2)
    ep = load_bag_episode(tmp_path / "ep", "d", ARM)
    assert ep.length == T - 1
    np.testing.assert_allclose(ep.actions, np.delete(actions, 2, axis=0))


def test_the_gripper_is_held_between_its_messages_and_steps_before_it_are_dropped(tmp_path) -> None:
    rec = recordings
    demo = rec.make_demo(7, T)
    rec.write_teleop_bag(tmp_path / "late", demo, start_ns=2_000_000_000)
    with BagWriter(tmp_path / "held") as bag:  # the same recording, its first gripper message 0.15 s late
        for r in read_messages(tmp_path / "late"):
            bag.add(r.topic, r.msgtype)
            if r.topic != "/gripper" or r.t_ns > 2_000_000_000:
                bag.write_raw(r.topic, r.t_ns, r.raw)
        bag.write("/gripper", 2_150_000_000, bag.ts.types["std_msgs/msg/Float64"](data=1.0))
    ep = load_bag_episode(tmp_path / "held", "d", TELEOP)
    assert ep.length == T - 2  # steps at 0 and 0.1 s came before any gripper value
    np.testing.assert_allclose(ep.actions, demo.actions[2:], atol=1e-12)


@pytest.mark.parametrize("mapping, match", [
    ("/cam/compressed=agentview,/pose=pose,/nope=action", r"no topic /nope \(action\); the recording has"),
    ("/cam/compressed=agentview,/cmd=pose,/pose=action", r"/cmd \(pose\) carries heisd_ros/msg/ArmCommand"),
    ("/cam/compressed=agentview,/pose=pose,/cmd=action,/task=gripper", "carries std_msgs/msg/String"),
    ("/cam/compressed=agentview,/pose=pose,/cmd=action", r"no message on /instruction|--instruction TEXT"),
])
def test_map_errors_name_the_topic_and_the_fix(tmp_path, mapping, match) -> None:
    _arm_bag(tmp_path / "ep")
    with pytest.raises(DemoDataError, match=match):
        load_bag_episode(tmp_path / "ep", "d", BagReading(TopicMap.parse(mapping)))


def test_scan_numbers_episodes_stably_and_keys_caches_by_the_reading(tmp_path) -> None:
    for name in ("demo_3", "rosbag2_2026_01_01-10_00_00", "rosbag2_2026_01_01-11_00_00"):
        _arm_bag(tmp_path / "wipe" / name)
    refs = scan_bags(tmp_path, "d", ARM)
    numbers = {Path(r.path).name: r.episode for r in refs}
    assert numbers["demo_3"] % 1000 == 3  # the gen-demos numbering
    assert len(set(numbers.values())) == 3  # names that end alike do not collide
    assert numbers == {Path(r.path).name: episode_number(Path(r.path), tmp_path) for r in refs}
    assert all(r.key.endswith(ARM.digest()) for r in refs)
    assert not scan_bags(tmp_path, "d")[0].key.endswith(ARM.digest())  # the defaults keep the old key
