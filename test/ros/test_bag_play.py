"""`ros2 bag play BAG --clock` against the policy node, as docs/node.md tells users to run it.

ros2 bag (rosbag2_py) cannot be installed in the test environment, so the bag is played the same
way by `heisd_ros.replay.playback.Player`: every message on its recorded topic with its recorded
stamps, at the recorded pace, and /clock (rosgraph_msgs/Clock) from the bag's time. The node runs
with use_sim_time:=true and its inputs remapped to the recording's topic names."""

from __future__ import annotations

import functools
import threading
import time

import numpy as np
import pytest
import rclpy
from fake_decoder import FakeDecoder
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter

from heisd_ros.pipeline.bags import read_topics, topic_types
from heisd_ros.replay.bag_stream import Route, RoutePlan, stream_segments
from heisd_ros.ros.node import PolicyNode
from heisd_ros.replay.playback import MethodRun, PlayConfig, Player
from heisd_ros.tools.make_recording import (
    CAMERAS,
    INSTRUCTION,
    POSE,
    RecordingConfig,
    make_recording,
)

pytestmark = pytest.mark.slow  # end to end: bag playback into nodes

msg_mod = pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 83
KINDS = {CAMERAS[0]: "agentview", CAMERAS[1]: "wrist", POSE: "pose", INSTRUCTION: "instruction"}
REMAPS = ["--ros-args", "-r", f"agentview/image_raw:={CAMERAS[0]}", "-r", f"wrist/image_raw:={CAMERAS[1]}",
          "-r", f"ee_pose:={POSE}"]  # fmt: skip


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    path = tmp_path_factory.mktemp("rec") / "robot"
    make_recording(path, RecordingConfig(seconds=2.0, width=80, height=60))
    return path


def bag_play(bag, sim_time: bool, rate: float = 1.0) -> tuple[list, list[int]]:
    """Play `bag` like `ros2 bag play BAG --clock --rate RATE` into a node (use_sim_time as given);
    returns the node's commands and the bag's synchronised step stamps (ns)."""
    types = topic_types(bag)
    # ros2 bag play publishes every topic under its own name; the node's remaps pick the inputs
    plan = RoutePlan({t: Route(t, types[t], kind, t) for t, kind in KINDS.items()},
                     {t: ty for t, ty in types.items() if t not in KINDS})  # fmt: skip
    node_ctx, play_ctx = rclpy.Context(), rclpy.Context()
    rclpy.init(context=node_ctx, domain_id=DOMAIN_ID)
    rclpy.init(context=play_ctx, domain_id=DOMAIN_ID)
    node = PolicyNode(functools.partial(FakeDecoder, forwards=1, ms_per_forward=1.0), context=node_ctx, cli_args=REMAPS, parameter_overrides=[
        Parameter("model_dir", value="fake"), Parameter("control_rate_hz", value=100.0),
        Parameter("use_sim_time", value=sim_time), Parameter("command_enabled", value=True)])  # fmt: skip
    player_node = rclpy.create_node("rosbag2_player", context=play_ctx)
    commands: list = []
    player_node.create_subscription(msg_mod.ArmCommand, "/arm_command", commands.append, 100)
    executors = [SingleThreadedExecutor(context=node_ctx), SingleThreadedExecutor(context=play_ctx)]
    executors[0].add_node(node)
    executors[1].add_node(player_node)
    threads = [threading.Thread(target=ex.spin, daemon=True) for ex in executors]
    for th in threads:
        th.start()
    run = MethodRun("node")
    try:
        player = Player(player_node, plan, PlayConfig(rate=rate, restamp=False, clock=True))
        assert player.wait_for_subscribers(10.0, ["agentview", "wrist", "pose", "instruction"]) == []
        player.play(stream_segments(bag, plan, 0.05), run, lambda stamp: True)
        player.settle(0.5)
        time.sleep(0.2)
    finally:
        for ex in executors:
            ex.shutdown(timeout_sec=2.0)
        for th in threads:
            th.join(2.0)
        node.destroy_node()
        player_node.destroy_node()
        rclpy.shutdown(context=node_ctx)
        rclpy.shutdown(context=play_ctx)
    return commands, [b for _, b in run.step_map]


def test_bag_play_with_clock_gives_one_command_per_step(recording):
    # at a quarter of the recorded pace (the node's timer and staleness run on the bag's /clock, so
    # nothing else changes): an executor stall over one 33 ms frame on a loaded machine would let a
    # newer set replace one before its step, and every set is to be commanded here
    commands, steps = bag_play(recording, sim_time=True, rate=0.25)
    assert len(steps) == 60
    stamps = [c.header.stamp.sec * 10**9 + c.header.stamp.nanosec for c in commands]
    # one command per synchronised step, stamped with the recorded stamps (the pose's, newest)
    poses = [m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for _, m in read_topics(recording, [POSE])[POSE]]
    assert len(stamps) == 60  # (the node carries stamps as float seconds: equal to a microsecond)
    np.testing.assert_allclose(np.array(stamps) - steps[0], np.maximum(steps, poses) - steps[0], atol=1000)
    assert [c.step_id for c in commands] == list(range(1, 61))


def test_recorded_stamps_without_sim_time_are_stale(recording):
    """Without --clock and use_sim_time the node compares 2023 stamps with today's clock."""
    commands, steps = bag_play(recording, sim_time=False)
    assert len(steps) == 60 and commands == []
