"""heisd replay on recordings shaped like a robot's: topics routed by --map, topics the node does
not read left out, each step decoded with the pose recorded after its images, a node in a
namespace recorded, the started node warmed up outside the measured steps, and the figures."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import rclpy
from fake_decoder import FakeDecoder
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.bags import read_messages, read_topics
from heisd_ros.ros.node import PolicyNode
from heisd_ros.tools import replay as rp
from heisd_ros.tools.make_bag import MakeBagConfig, make_bag
from heisd_ros.tools.make_recording import POSE, RecordingConfig, make_recording

pytestmark = pytest.mark.slow  # end to end: bags replayed into started and running nodes

pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 82
REPO = Path(__file__).resolve().parents[2]
MAPS = ("/cam_high/image_raw=agentview,/cam_wrist/image_raw=wrist", "/ee=pose")


def factory(made: list):
    def build(cfg):
        made.append(FakeDecoder(cfg, modes=("retrieval", "drafter", "skip"), forwards=1, ms_per_forward=2.0,
                                action=lambda obs, n: np.full(7, 0.01 * n)))
        return made[-1]

    return build


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """2 s of a robot's recording: 60 steps at 30 Hz (80x60 frames), depth, description, diagnostics."""
    path = tmp_path_factory.mktemp("rec") / "robot"
    make_recording(path, RecordingConfig(seconds=2.0, width=80, height=60))
    return path


def _cfg(tmp_path, **kw):
    base = dict(fast=True, start_node=True, out=str(tmp_path / "out"), domain_id=DOMAIN_ID, quiet=True,
                params=("control_rate_hz:=100.0", "diagnostics_period_s:=0.2"),
                settle_s=0.3, maps=MAPS, params_file=str(REPO / "config" / "policy.yaml"))  # fmt: skip
    cfg = {**base, **kw}
    cfg["params"] = ("model_dir:=fake", *cfg["params"]) if cfg["start_node"] else cfg["params"]  # the node needs one
    return rp.ReplayConfig(**cfg)


def test_unmapped_topics_are_left_out_and_each_step_gets_its_own_pose(recording, tmp_path, capsys):
    made: list = []
    cfg = _cfg(tmp_path, quiet=False, warmup_steps=2)
    result = rp.replay(recording, cfg, decoder_factory=factory(made))
    row = result["methods"]["heisd"]
    assert row["bag_steps"] == row["decoded_steps"] == row["commands"] == 60 and row["timeouts"] == 0
    assert set(result["not_replayed"]) == {"/arm_command", "/cam_high/depth/image_raw", "/robot_description",
                                           "/diagnostics"}  # fmt: skip
    assert result["routes"] == {"/cam_high/image_raw": "/agentview/image_raw", "/cam_wrist/image_raw": "/wrist/image_raw",
                                "/ee": "/ee_pose", "/joint_states": "/joint_states", "/instruction": "/instruction"}  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.count("not replayed:") == 1 and "nothing subscribes to ['/joint_states']" in printed
    # warm-up: two unmeasured decodes, then a reset; the node resets again for its first episode
    decoder = made[0]
    assert len(decoder.positions) == 62 and decoder.reset_steps[:2] == [0, 2]
    ids = [m.step_id for _, m in read_topics(cfg.out)["/decode_stats"]]
    assert ids == list(range(1, 61))
    # the recorder wrote each pose after its step's images: every step still decodes its own pose
    poses = [np.array([m.pose.position.x, m.pose.position.y, m.pose.position.z]) for _, m in read_topics(recording, [POSE])[POSE]]
    np.testing.assert_allclose(np.stack(decoder.positions[2:]), np.stack(poses), atol=1e-9)


def test_unmapped_views_are_a_clear_error(recording, tmp_path):
    with pytest.raises(ConfigError, match=r"no topic feeds view\(s\) \['agentview', 'wrist'\].*--map"):
        rp.replay(recording, _cfg(tmp_path, maps=()), decoder_factory=factory([]))
    with pytest.raises(ConfigError, match="unknown input"):
        rp.replay(recording, _cfg(tmp_path, maps=("/ee=elbow",)), decoder_factory=factory([]))
    with pytest.raises(ConfigError, match="cannot feed input 'pose'"):
        rp.replay(recording, _cfg(tmp_path, maps=("/joint_states=pose",)), decoder_factory=factory([]))


def test_started_node_in_a_namespace_is_recorded(tmp_path):
    bag = tmp_path / "bag"
    make_bag(bag, MakeBagConfig(steps=6, seed=3))
    cfg = _cfg(tmp_path, maps=(), namespace="arm", params=("control_rate_hz:=100.0", "diagnostics_period_s:=0.2"))
    result = rp.replay(bag, cfg, decoder_factory=factory([]))
    assert result["routes"]["/agentview/image_raw"] == "/arm/agentview/image_raw"
    assert result["methods"]["heisd"]["commands"] == 6 and result["methods"]["heisd"]["timeouts"] == 0
    got = {r.topic for r in read_messages(cfg.out)}
    assert {"/arm/arm_command", "/arm/decode_stats", "/diagnostics"} <= got


def test_running_node_in_a_namespace_is_found(tmp_path):
    bag = tmp_path / "bag"
    make_bag(bag, MakeBagConfig(steps=5, seed=4))
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=DOMAIN_ID)
    node = PolicyNode(factory([]), namespace="/arm", context=ctx, parameter_overrides=[
        Parameter("model_dir", value="fake"), Parameter("control_rate_hz", value=100.0),
        Parameter("watchdog_factor", value=100.0), Parameter("input_limits.max_pose_jump_m", value=10.0),
        Parameter("command_enabled", value=True)])  # fmt: skip
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    th = threading.Thread(target=ex.spin, daemon=True)
    th.start()
    try:
        wrong = _cfg(tmp_path, maps=(), start_node=False, params=(), connect_timeout_s=1.0, out=str(tmp_path / "o1"))
        with pytest.raises(ConfigError, match=r"/arm/policy_node.*--namespace"):
            rp.replay(bag, wrong)
        cfg = _cfg(tmp_path, maps=(), start_node=False, params=(), namespace="/arm", out=str(tmp_path / "o2"))
        row = rp.replay(bag, cfg)["methods"]["node"]
        assert row["commands"] == row["decoded_steps"] == 5 and row["timeouts"] == 0
        assert "/arm/arm_command" in {r.topic for r in read_messages(cfg.out)}
    finally:
        ex.shutdown(timeout_sec=2.0)
        th.join(2.0)
        node.destroy_node()
        rclpy.shutdown(context=ctx)


def test_plots_are_written(recording, tmp_path):
    from PIL import Image

    plots = tmp_path / "plots"
    cfg = _cfg(tmp_path, methods=("ar", "heisd"), plots=str(plots))
    result = rp.replay(recording, cfg, decoder_factory=factory([]))
    names = sorted(Path(p).name for p in result["plots"])
    assert names == ["action_traces.png", "latency_histogram.png", "mode_timeline.png"]
    for p in result["plots"]:
        with Image.open(p) as im:
            assert im.format == "PNG" and im.width >= 600 and im.height >= 300
            assert len(np.unique(np.asarray(im.convert("L")))) > 8  # something was drawn
        assert Path(p).stat().st_size > 10_000


def test_inputs_resolve_against_the_node_topic_names():
    """--map and name matching use the node's fixed names (heisd_ros.ros.topics) in its namespace;
    a compressed view also matches a recording that carries it under the raw name."""
    from heisd_ros.replay.target import input_targets, load_node_config

    plain = input_targets(load_node_config(None), "policy_node", "/arm")
    assert plain["agentview"] == ("/arm/agentview/image_raw", "/agentview/image_raw")
    assert plain["pose"] == ("/arm/ee_pose", "/ee_pose") and plain["instruction"][0] == "/arm/instruction"
    packed = input_targets(load_node_config(None, {"compressed_images": True}), "policy_node", "/")
    assert packed["wrist"] == ("/wrist/image_raw/compressed", "/wrist/image_raw")
    with pytest.raises(ConfigError, match="-r ee_pose:=YOUR_TOPIC"):
        load_node_config(None, {"pose_topic": "/franka/ee_pose"})
