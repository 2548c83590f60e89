"""PolicyNode's parameters, parameter file, launch file and entry point, over real rclpy (one
process, its own ROS domain; the entry-point tests start policy_node subprocesses on the next one).

The decoder is the rig's scripted fake (conftest.py); what is checked is what the node does with its
parameters: invalid values and moved topic names fail start-up with the fix, updates are validated,
the shipped parameter file is complete and current, and the process exits cleanly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from launch_fakes import load_launch
from rclpy.parameter import Parameter
from std_msgs.msg import Bool, String

from heisd_ros.core.errors import (
    ConfigError,
    ModelLoadError,
)
from heisd_ros.ros import conversions as conv
from heisd_ros.ros.node import PolicyNode
from heisd_ros.ros.standalone_args import ros_args

pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 69
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rig(node_rig):
    return node_rig


@pytest.mark.parametrize(
    "params, words",
    [
        ({"control_rate_hz": -1.0}, "control_rate_hz"),
        ({"image_topics": ["only_one", "two"]}, r"image_topics.*-r <view>/image_raw:=YOUR_TOPIC"),
        ({"pose_topic": "/robot/pose"}, "no longer exist.*-r ee_pose:=YOUR_TOPIC"),
        ({"store.path": "/db"}, "store.path -> db_path"),  # one field names the database
        ({"model_dir": ""}, "model_dir is required"),
        ({"instruction_durability": "latched"}, "instruction_durability must be one of"),
        ({"after_episode": "repeat"}, "after_episode must be one of"),
        ({"warmup_steps": -1}, "warmup_steps must be"),
        ({"max_abs_action": [1.0, 1.0]}, "max_abs_action"),
        ({"decoder.method": "magic"}, "unknown method"),
        ({"sync_slop_s": 2.0}, "sync_slop_s"),
        ({"control_rate_hz": 10}, "must be of type float"),
        ({"action_limits": [0.5] * 7}, "must be finite, >= max_abs_action"),
        ({"action_limits": [1e300] * 7}, "<= 100.0 in every dimension"),  # finite, but checks nothing
        ({"command_frame_id": ""}, "command_frame_id must be a frame id"),
        ({"watchdog_factor": 0.5}, "watchdog_factor must be in"),
        ({"decoder.verify_skip.max_consecutive_skips": -1}, "max_consecutive_skips"),
        ({"decoder.views": ["agentview", "agentview"]}, "view names must be unique"),
        ({"store.backend": "cloud"}, "unknown store backend"),
        ({"store.backend": "remote"}, "needs a url"),
        ({"store.timeout_s": 0.0}, "timeout_s"),
        ({"store.backend": "remote", "store.url": "http://q:6333", "store.tls_ca_cert": "/ca.pem"}, "https"),
    ],
)
def test_invalid_parameters_fail_start_up_with_reason(rig, params, words):
    overrides = [Parameter(k, value=v) for k, v in {"model_dir": "fake", "warmup_steps": 0, **params}.items()]
    with pytest.raises(ConfigError, match=words):
        PolicyNode(lambda cfg: rig.fake(), context=rig.ctx, parameter_overrides=overrides)


def test_remapping_each_topic_is_all_it_takes(rig):
    """Every input and output moved with `--ros-args -r NAME:=TOPIC` alone: the node decodes what
    arrives on the new names and commands on the new name, and nothing stays on the old ones."""
    from geometry_msgs.msg import PoseStamped
    from heisd_ros.msg import ArmCommand, DecodeStats
    from sensor_msgs.msg import Image

    from heisd_ros.ros.qos import EVENT_QOS, SENSOR_QOS

    moved = {"agentview/image_raw": "/robot/front_cam/color", "wrist/image_raw": "/robot/wrist_cam/color",
             "ee_pose": "/franka/ee_pose", "instruction": "/planner/task", "episode_result": "/planner/outcome",
             "arm_command": "/franka/policy_command", "decode_stats": "/franka/policy_stats"}  # fmt: skip
    n = rig.node
    pubs = {name: n.create_publisher(Image, moved[f"{name}/image_raw"], SENSOR_QOS) for name in ("agentview", "wrist")}
    pose_pub = n.create_publisher(PoseStamped, moved["ee_pose"], SENSOR_QOS)
    task_pub = n.create_publisher(String, moved["instruction"], 10)
    result_pub = n.create_publisher(Bool, moved["episode_result"], EVENT_QOS)
    commands, stats = [], []
    subs = [n.create_subscription(ArmCommand, moved["arm_command"], commands.append, EVENT_QOS),
            n.create_subscription(DecodeStats, moved["decode_stats"], stats.append, EVENT_QOS)]  # fmt: skip
    policy = rig.start(remaps=moved)
    try:
        everything = [*pubs.values(), pose_pub, task_pub, result_pub]
        assert rig.wait(lambda: all(p.get_subscription_count() == 1 for p in everything)
                        and all(s.get_publisher_count() == 1 for s in subs), 5.0), "a remapped topic is not connected"
        assert all(p.get_subscription_count() == 0 for p in [*rig.pub_img.values(), rig.pub_pose, rig.pub_instr])
        n_old = len(rig.commands)
        task_pub.publish(String(data="pick up the red bowl"))
        assert rig.wait(lambda: policy.instruction == "pick up the red bowl", 2.0)
        t = rig.now()
        for view, pub in pubs.items():
            pub.publish(conv.rgb_to_image(np.zeros((8, 8, 3), np.uint8), t, view))  # the rig's size
        pose_pub.publish(conv.position_to_pose((0.1, 0.2, 0.3), t, "base_link"))
        assert rig.wait(lambda: any(abs(conv.stamp_to_s(c.header.stamp) - t) < 1e-6 for c in commands), 3.0)
        assert rig.wait(lambda: len(stats) >= 1, 2.0)
        assert len(rig.commands) == n_old, "a command went to the default name too"
        result_pub.publish(Bool(data=True))
        assert rig.wait(lambda: rig.decoder.feedback == [True], 2.0), "episode_result on its new name not heard"
    finally:
        rig.stop()
        rig.on_executor(lambda: [n.destroy_publisher(p) for p in everything] + [n.destroy_subscription(s) for s in subs])


def test_a_parameter_file_naming_a_topic_fails_with_the_remap_to_use(rig, tmp_path):
    params = tmp_path / "old_policy.yaml"
    params.write_text("/**:\n  ros__parameters:\n    model_dir: fake\n    pose_topic: /franka/ee_pose\n"
                      "    image_topics: [/cam_a/image_raw, /cam_b/image_raw]\n")
    with pytest.raises(ConfigError, match=r"pose_topic -> --ros-args -r ee_pose:=YOUR_TOPIC") as err:
        PolicyNode(lambda cfg: rig.fake(), context=rig.ctx, cli_args=["--ros-args", "--params-file", str(params)],
                   parameter_overrides=[Parameter("warmup_steps", value=0)])
    assert "image_topics -> --ros-args -r <view>/image_raw:=YOUR_TOPIC" in str(err.value)


def test_decoder_load_failure_fails_start_up(rig):
    def broken(cfg):
        raise ModelLoadError(f"no model in {cfg.node.model_dir}")

    with pytest.raises(ModelLoadError, match="no model in /missing"):
        PolicyNode(broken, context=rig.ctx, parameter_overrides=[Parameter("model_dir", value="/missing")])


@pytest.mark.parametrize(
    "updates, words",
    [
        ({"sync_slop_s": -0.1}, "sync_slop_s"),  # out of range
        ({"max_abs_action": [1.0, 2.0]}, "max_abs_action needs 7"),  # wrong length
        ({"image_staleness_s": 0.01}, "sync_slop_s must not exceed image_staleness_s"),  # inconsistent
        ({"max_abs_action": [3.0] * 7}, "must be finite, >= max_abs_action"),  # above action_limits
        ({"action_limits": [1e300] * 7}, "<= 100.0"),
        ({"command_frame_id": ""}, "command_frame_id"),
        ({"watchdog_factor": 0.0}, "watchdog_factor"),
        ({"expected_image_height": 0}, "set both"),  # the rig sets both to 8
        ({"image_staleness_s": 1}, "type"),  # an integer for a double
        ({"control_rate_hz": 5.0}, "read-only"),
        ({"decoder.method": "ar"}, "take effect at configure"),
        ({"store.path": "/tmp/other"}, "read-only"),
    ],
)
def test_invalid_parameter_updates_are_rejected_with_reason(rig, policy, updates, words):
    before = policy.cfg
    results = policy.set_parameters([Parameter(k, value=v) for k, v in updates.items()])
    assert not results[0].successful and words in results[0].reason, results[0].reason
    assert policy.cfg == before  # nothing of a rejected update is applied


def test_parameter_updates_are_validated(rig, policy):
    ro = policy.set_parameters([Parameter("control_rate_hz", value=5.0)])[0]
    assert not ro.successful and "read-only" in ro.reason
    ok = policy.set_parameters([Parameter("command_enabled", value=False), Parameter("sync_slop_s", value=0.1)])
    assert all(r.successful for r in ok)
    assert not policy.cfg.node.command_enabled and policy._session.sync.cfg.slop_s == 0.1
    desc = policy.describe_parameter("control_rate_hz")
    assert desc.read_only and "control timer" in desc.description


# --- entry point, launch file, parameter file ----------------------------------------------------


def test_standalone_args_translate_to_ros_args():
    args = ros_args(["policy_node", "--params-file", "a.yaml", "-p", "autostart:=false", "--ros-args", "-r",
                     "__ns:=/arm"])  # fmt: skip
    assert args == ["policy_node", "--ros-args", "-r", "__ns:=/arm", "--ros-args", "--params-file", "a.yaml",
                    "-p", "autostart:=false"]  # fmt: skip


def test_parameter_file_is_complete_and_valid(tmp_path):
    import yaml

    from heisd_ros.ros.params import build_config, param_specs

    data = yaml.safe_load((REPO / "config" / "policy.yaml").read_text())["/**"]["ros__parameters"]

    def flat(d, prefix=""):
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    values = dict(flat(data))
    text = (REPO / "config" / "policy.yaml").read_text()
    # decoder.* are comments (a value there would beat the operating-point file): each is listed, unset
    decoder = {s.name for s in param_specs() if s.group == "decoder."}
    assert not decoder & set(values), f"config/policy.yaml sets decoder.* values: {decoder & set(values)}"
    for s in param_specs():
        if s.group == "decoder.":
            assert f"# {s.path[-1]}: " in text, s.name
    values.update({s.name: list(s.default) if isinstance(s.default, tuple) else s.default
                   for s in param_specs() if s.group == "decoder."})  # fmt: skip
    names = {s.name for s in param_specs()}
    assert set(values) <= names, f"unknown parameters in config/policy.yaml: {set(values) - names}"
    assert names - set(values) == set(), f"parameters missing from config/policy.yaml: {names - set(values)}"
    for s in param_specs():  # doubles written as doubles (rcl rejects 1 for a double)
        if s.kind == "float":
            assert isinstance(values[s.name], float), s.name
    # safe by default: no model named, commanding off, the node brings itself up, a volatile instruction
    assert values["model_dir"] == "" and values["command_enabled"] is False and values["autostart"] is True
    assert values["instruction_durability"] == "volatile" and values["after_episode"] == "stop"
    with pytest.raises(ConfigError, match="model_dir is required"):
        build_config(values)
    build_config({**values, "model_dir": "/path/to/checkpoint"})
    # the file would silently pin an old default over a changed dataclass default
    stale = {s.name: (values[s.name], s.default) for s in param_specs()
             if values[s.name] != (list(s.default) if isinstance(s.default, tuple) else s.default)}
    assert not stale, f"config/policy.yaml differs from the defaults {stale}; regenerate it with " \
                      "`python -m heisd_ros.ros.param_file > config/policy.yaml`"
    assert text.count("\n    # ") + text.count("\n      # ") + text.count("\n        # ") >= len(names)


def test_parameter_file_comments_match_the_field_docs():
    """config/policy.yaml is exactly what the generator writes: its comments are the dataclass field docs."""
    from heisd_ros.ros.param_file import policy_yaml

    assert (REPO / "config" / "policy.yaml").read_text() == policy_yaml(), (
        "config/policy.yaml is out of date; regenerate it with `python -m heisd_ros.ros.param_file > config/policy.yaml`")


def _launch(monkeypatch, **given):
    """(declared argument -> default, the LifecycleNode built) of launch/policy.launch.py."""
    declared, (node,) = load_launch(REPO / "launch" / "policy.launch.py", monkeypatch, **given)
    return declared, node


def test_launch_file_builds_a_lifecycle_node_with_params_and_remappings(monkeypatch):
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.ros import topics

    declared, node = _launch(monkeypatch)
    assert type(node).__name__ == "LifecycleNode"
    assert node.kwargs["package"] == "heisd_ros" and node.kwargs["executable"] == "policy_node"
    assert node.kwargs["name"] == "policy_node" and node.kwargs["namespace"] == ""  # LifecycleNode requires both
    assert {"params_file", "namespace", "use_sim_time", "autostart", "model_dir", "drafter_dir", "db_path",
            "calibration_path", "method"} <= set(declared)  # fmt: skip
    assert declared["autostart"] == ""  # the parameter file's autostart (true by default) unless given
    remapped = {src for src, _ in node.kwargs["remappings"]}
    names = {topics.image_topic(v) for v in DecoderConfig().views} | {
        topics.POSE, topics.JOINT_STATES, topics.INSTRUCTION, topics.EPISODE_RESULT, topics.ARM_COMMAND,
        topics.DECODE_STATS, topics.SERVO_TWIST, topics.POSE_TARGET, topics.GRIPPER_TRAJECTORY,
        topics.GRIPPER_POSITIONS}  # fmt: skip
    assert names == remapped  # every name the node uses has a launch argument
    params_file, overrides = node.kwargs["parameters"]
    assert params_file == "share/heisd_ros/config/policy.yaml"
    # model_dir only when given: an empty one would override the parameter file's
    assert overrides == {"use_sim_time": False}
    _, node = _launch(monkeypatch, autostart="false", model_dir="/ckpt", use_sim_time="true", namespace="arm")
    assert node.kwargs["parameters"][1] == {"use_sim_time": True, "autostart": False, "model_dir": "/ckpt"}
    assert node.kwargs["namespace"] == "arm"
    # a checkpoint, a drafter and a database start without a parameter file's paths
    _, node = _launch(monkeypatch, model_dir="/ckpt", drafter_dir="/d", db_path="/db", calibration_path="/c.json",
                      method="specvla")  # fmt: skip
    assert node.kwargs["parameters"][1] == {"use_sim_time": False, "model_dir": "/ckpt", "drafter_dir": "/d",
                                            "db_path": "/db", "calibration_path": "/c.json",
                                            "decoder.method": "specvla"}  # fmt: skip


def test_launch_file_applies_a_parameter_overlay_over_the_parameter_file(monkeypatch):
    declared, node = _launch(monkeypatch, params_overlay="/site/sim.yaml")
    assert declared["params_overlay"] == ""
    assert node.kwargs["parameters"][:2] == ["share/heisd_ros/config/policy.yaml", "/site/sim.yaml"]


def test_launch_file_compiles():
    path = REPO / "launch" / "policy.launch.py"
    compile(path.read_text(), str(path), "exec")


FAKE_MAIN = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from fake_decoder import FakeDecoder
from heisd_ros.ros import node
node.load_node_policy = FakeDecoder
sys.exit(node.main(sys.argv[1:]))
"""


@pytest.mark.slow  # a policy_node subprocess
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_clean_shutdown_on_signal(sig):
    env = {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN_ID + 1), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", FAKE_MAIN, "--params-file", str(REPO / "config" / "policy.yaml"),
                             "-p", "model_dir:=fake"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "policy node ready" in line or not line:
            break
    assert any("policy node ready" in l for l in lines), "".join(lines)
    time.sleep(0.3)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=15)
    text = "".join(lines) + out
    assert proc.returncode == 0, text
    assert "Traceback" not in text and "shutting down" in text


@pytest.mark.slow  # a policy_node subprocess
def test_invalid_parameter_file_exits_with_reason():
    env = {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN_ID + 1)}
    proc = subprocess.run([sys.executable, "-m", "heisd_ros.ros.node", "--params-file",
                           str(REPO / "config" / "policy.yaml"), "-p", "control_rate_hz:=-2.0"],
                          check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert proc.returncode == 1
    assert "control_rate_hz must be in (0, 1000]" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_decoder_parameters_answer_the_shipped_point_and_an_explicit_value_beats_it(rig):
    """One name per setting: with the shipped operating point, decoder.* answer the point's values
    (what the decoder was configured with); `-p decoder.fused_metric.tau:=0.3` beats the file."""
    import json

    from rclpy.parameter import Parameter

    point_path = REPO / "models" / "mini_libero" / "calibration.json"
    point = json.loads(point_path.read_text())
    policy = rig.start(decoder=None, calibration_path=str(point_path))
    try:
        for name, value in (("decoder.fused_metric.tau", point["fused_metric"]["tau"]),
                            ("decoder.verify_skip.min_similarity", point["verify_skip"]["min_similarity"]),
                            ("decoder.verify_skip.max_consecutive_skips", point["verify_skip"]["max_consecutive_skips"]),
                            ("decoder.retrieval.position_pool", point["retrieval"]["position_pool"])):  # fmt: skip
            got = policy.get_parameter(name).value
            assert got == value, (name, got, value)
        assert policy.cfg.decoder.fused_metric.tau == point["fused_metric"]["tau"]
    finally:
        rig.stop()
    policy = rig.start(decoder=None, calibration_path=str(point_path), **{"decoder.fused_metric.tau": 0.3})
    try:
        assert policy.get_parameter("decoder.fused_metric.tau").value == 0.3
        assert policy.cfg.decoder.fused_metric.tau == 0.3
        assert policy.get_parameter("decoder.verify_skip.min_similarity").value == point["verify_skip"]["min_similarity"]
        assert any("explicit" in line and "fused_metric.tau=0.3" in line for line in rig.policy_logs(20)), \
            "configure's log does not name the explicit value"  # fmt: skip
        refused = policy.set_parameters([Parameter("decoder.fused_metric.tau", value=0.5)])[0]
        assert not refused.successful and "configure" in refused.reason
    finally:
        rig.stop()


def test_diagnostics_show_the_running_verify_skip_thresholds(rig, policy):
    """Episode feedback moves verify-skip's thresholds away from decoder.verify_skip.*: /diagnostics
    shows the ones that run."""
    rig.decoder.skip.min_similarity, rig.decoder.skip.max_distance_m = 0.9123, 0.0151
    k0 = len(rig.diags)
    assert rig.wait(lambda: any(s.get("verify_skip_min_similarity_running") == "0.9123"
                                for _, _, s in rig.policy_status(k0)), 5.0)  # fmt: skip
    values = [s for _, _, s in rig.policy_status(k0) if "verify_skip_max_distance_m_running" in s][-1]
    assert values["verify_skip_max_distance_m_running"] == "0.0151"
