"""heisd_ros.pipeline.bags: one typestore, writer and reader for sqlite3 and MCAP bags, without ROS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rosbags")

from heisd_ros.core.errors import ConfigError, DataFileError  # noqa: E402
from heisd_ros.pipeline import bags  # noqa: E402

RGB = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)


def _write_all(path: Path, storage: str) -> None:
    """One message of every type the callers build, on the node's default topics."""
    topics = bags.BagTopics()
    with bags.BagWriter(path, storage) as bag:
        T = bag.ts.types
        bag.add(topics.instruction, bags.STRING, latched=True)
        bag.add(topics.images[0][1], bags.IMAGE)
        bag.add(topics.images[1][1], bags.COMPRESSED_IMAGE)
        bag.add(topics.ee_pose, bags.POSE)
        bag.add(topics.joint_states, bags.JOINT_STATE)
        bag.add(topics.command, bags.ARM_COMMAND)
        bag.add(topics.episode_result, bags.BOOL)
        hdr = bags.header(2 * bags.NS_PER_S + 5, "base_link")
        bag.write(topics.instruction, 1, T[bags.STRING](data="pick up the soup"))
        bag.write(topics.images[0][1], 2, bags.image_msg(hdr, RGB, "bgra8"))
        bag.write(topics.images[1][1], 3, bags.compressed_image_msg(hdr, RGB, "png"))
        bag.write(topics.ee_pose, 4, bags.pose_msg(hdr, [0.1, 0.2, 0.3], [0.0, 0.0, 1.0, 0.0]))
        bag.write(topics.joint_states, 5, bags.joint_state_msg(hdr, topics.finger_joints, [0.04, -0.04]))
        bag.write(topics.command, 6, bags.arm_command_msg(hdr, 7, np.arange(7) / 10, "drafter", "heisd"))
        bag.write(topics.episode_result, 7, T[bags.BOOL](data=True))
        assert sum(bag.counts.values()) == 7


@pytest.mark.parametrize("storage", bags.STORAGES)
def test_every_message_round_trips(tmp_path: Path, storage: str) -> None:
    pytest.importorskip("PIL")
    path = tmp_path / storage
    _write_all(path, storage)
    records = list(bags.read_messages(path))
    assert [r.t_ns for r in records] == list(range(1, 8))
    by_topic = {r.topic: r for r in records}
    topics = bags.BagTopics()
    assert by_topic[topics.instruction].msg.data == "pick up the soup"
    assert by_topic[topics.instruction].stamp_ns is None and by_topic[topics.episode_result].msg.data is True
    for _, topic in topics.images:  # raw bgra8 and png both come back as the same RGB
        np.testing.assert_array_equal(bags.image_rgb(by_topic[topic].msg), RGB)
    pose = by_topic[topics.ee_pose]
    assert pose.stamp_ns == 2 * bags.NS_PER_S + 5 and pose.msg.header.frame_id == "base_link"
    assert [pose.msg.pose.position.x, pose.msg.pose.orientation.z] == pytest.approx([0.1, 1.0])
    assert list(by_topic[topics.joint_states].msg.name) == list(topics.finger_joints)
    cmd = by_topic[topics.command].msg
    assert (cmd.step_id, cmd.decode_mode, cmd.method) == (7, "drafter", "heisd")
    np.testing.assert_allclose(np.r_[cmd.delta_position, cmd.delta_rotation, cmd.gripper], np.arange(7) / 10)
    assert by_topic[topics.command].msgtype == bags.ARM_COMMAND
    assert bags.topic_counts(path) == {r.topic: 1 for r in records}
    assert set(bags.read_topics(path, [topics.ee_pose])) == {topics.ee_pose}
    assert list(bags.read_messages(path, msgtypes=[bags.DECODE_STATS])) == []  # no such connection: nothing


def test_latched_instruction_and_restamp(tmp_path: Path) -> None:
    path = tmp_path / "bag"
    topics = bags.BagTopics()
    with bags.BagWriter(path) as bag:
        bag.add(topics.instruction, bags.STRING, latched=True)
        bag.add(topics.ee_pose, bags.POSE)
        bag.write(topics.instruction, 1, bag.ts.types[bags.STRING](data="x"))
        bag.write(topics.ee_pose, 2, bags.pose_msg(bags.header(5, "base_link"), [1.0, 2.0, 3.0]))
    yaml = pytest.importorskip("yaml")
    meta = yaml.safe_load((path / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    qos = {t["topic_metadata"]["name"]: t["topic_metadata"]["offered_qos_profiles"]
           for t in meta["topics_with_message_count"]}  # fmt: skip
    assert [q["durability"] for q in qos[topics.instruction]] == ["transient_local"] and qos[topics.ee_pose] == []
    pose = next(r for r in bags.read_messages(path) if r.topic == topics.ee_pose)
    moved = bags.typestore().deserialize_cdr(bags.restamp_cdr(pose.raw, bags.POSE, 3 * bags.NS_PER_S + 7), bags.POSE)
    assert (moved.header.stamp.sec, moved.header.stamp.nanosec) == (3, 7)
    assert moved.pose.position.z == 3.0


def test_typestore_has_our_messages() -> None:
    ts = bags.typestore()
    assert bags.ARM_COMMAND in ts.types and bags.DECODE_STATS in ts.types
    assert (bags.msg_dir() / "DecodeStats.msg").is_file()


def test_damaged_or_missing_bags_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(bags.BagError, match="not found"):
        list(bags.read_messages(tmp_path / "missing"))
    path = tmp_path / "bag"
    with bags.BagWriter(path) as bag:
        bag.add("/ee_pose", bags.POSE)
        bag.write("/ee_pose", 1, bags.pose_msg(bags.header(1, "f"), [0, 0, 0]))
    (path / "metadata.yaml").write_text("rosbag2_bagfile_information: [")
    with pytest.raises(DataFileError, match=str(path)):
        list(bags.read_messages(path))
    with pytest.raises(bags.BagError, match="exists"):
        bags.BagWriter(path)
    with pytest.raises(ConfigError):
        bags.BagWriter(tmp_path / "other", storage="rosbag1")
    with pytest.raises(bags.BagError, match="unsupported image encoding"):
        bags.image_rgb(bag.ts.types[bags.IMAGE](header=bags.header(0, ""), height=1, width=1, encoding="yuv422",
                                                is_bigendian=0, step=2, data=np.zeros(2, np.uint8)))  # fmt: skip


def test_importing_the_module_leaves_ros_out() -> None:
    code = ("import sys; import heisd_ros.pipeline.bags as b; b.typestore(); "
            "bad = [m for m in ('rclpy', 'rosidl_runtime_py', 'sensor_msgs') if m in sys.modules]; "
            "assert not bad, bad")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)
