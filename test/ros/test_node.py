"""PolicyNode end to end over real rclpy pub/sub (one process, its own ROS domain).

The decoder is a scripted fake (the node's contract with it is reset/step/episode_feedback/
health); the real tiny model runs through the node in test_replay.py and test_demo.py.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
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

msg_mod = pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")
ArmCommand, DecodeStats = msg_mod.ArmCommand, msg_mod.DecodeStats

DOMAIN_ID = 61
REPO = Path(__file__).resolve().parents[2]
STALENESS_S = 0.6  # as the rig's (conftest.py)


@pytest.fixture(scope="module")
def rig(node_rig):
    return node_rig


@pytest.fixture
def policy(rig):
    node = rig.start()
    yield node
    rig.stop()


def _acted(rig, t_s: float, timeout_s: float = 2.0) -> bool:
    return rig.acted(t_s, timeout_s)


def test_commands_and_stats_with_stamps_and_frame(rig):
    rig.start(command_frame_id="tool_frame")
    try:
        rig.instruct("pick up the red bowl")
        n0, n_stats = len(rig.commands), len(rig.stats)
        stamps = []
        for k in range(4):
            t = rig.publish_set(pos=(0.01 * k, 0.2, 0.3), frame_id="tool_frame")  # commands are in the pose's frame
            stamps.append(t)
            assert _acted(rig, t), f"no command for set {k}"
        cmds = rig.commands[n0:]
        assert [conv.stamp_to_s(c.header.stamp) for c in cmds] == pytest.approx(stamps, abs=1e-6)
        assert all(c.header.frame_id == "tool_frame" for c in cmds)
        assert [c.step_id for c in cmds] == [1, 2, 3, 4]
        assert list(cmds[2].delta_position) == pytest.approx([0.02, 0.2, 0.3])
        assert cmds[0].gripper == 1.0 and cmds[0].decode_mode == "drafter" and cmds[0].method == "heisd"
        assert rig.wait(lambda: len(rig.stats) >= n_stats + 4, 2.0)
        stats = {conv.stamp_to_s(s.header.stamp): s for s in rig.stats}
        assert all(any(abs(s - t) < 1e-6 for s in stats) for t in stamps)
        assert rig.stats[-1].llm_forwards == 2 and list(rig.stats[-1].tokens_per_forward) == [4, 3]
        assert rig.decoder.resets == ["pick up the red bowl"]
    finally:
        rig.stop()


def test_action_clipped_and_repeat_set_not_reused(rig, policy):
    rig.instruct("pick up the red bowl")
    rig.decoder.big_action = True
    t = rig.publish_set()
    assert _acted(rig, t)
    cmd = next(c for c in rig.commands if abs(conv.stamp_to_s(c.header.stamp) - t) < 1e-6)
    assert cmd.delta_position[0] == 1.0  # max_abs_action default 1.0
    n = len(rig.commands)
    time.sleep(0.25)  # 5 ticks without new frames: the same set is never decoded twice
    assert len(rig.commands) == n and rig.decoder.steps == 1


def test_instruction_change_and_episode_result_reset(rig, policy):
    """A new instruction starts a new episode; after an episode result the node stops commanding
    (after_episode: stop) until an instruction arrives, even the same one, which starts a new episode."""
    rig.instruct("pick up the red bowl")
    assert _acted(rig, rig.publish_set())
    assert _acted(rig, rig.publish_set())
    rig.instruct("push the blue block to the left")
    t = rig.publish_set()
    assert _acted(rig, t)
    assert rig.decoder.resets == ["pick up the red bowl", "push the blue block to the left"]
    assert rig.commands[-1].step_id == 1
    rig.pub_result.publish(Bool(data=True))
    assert rig.wait(lambda: rig.decoder.feedback == [True] and policy.instruction is None, 2.0)
    n_cmd, n_diag = len(rig.commands), len(rig.diags)
    assert not _acted(rig, rig.publish_set(), 0.4)
    assert len(rig.commands) == n_cmd
    assert rig.wait(lambda: any("episode ended (episode_result)" in m for _, m in rig.diag_levels_since(n_diag)), 2.0)
    rig.instruct("push the blue block to the left")
    assert _acted(rig, rig.publish_set())
    # a new episode: its first command is step 1 (the set published while idle, if still fresh, or this one)
    assert len(rig.decoder.resets) == 3 and rig.commands[n_cmd].step_id == 1


def test_after_episode_continue_starts_the_next_episode_at_once(rig):
    policy = rig.start(after_episode="continue")
    try:
        rig.instruct("pick up the red bowl")
        assert _acted(rig, rig.publish_set()) and _acted(rig, rig.publish_set())
        rig.pub_result.publish(Bool(data=False))
        assert rig.wait(lambda: rig.decoder.feedback == [False], 2.0)
        assert _acted(rig, rig.publish_set())
        assert rig.decoder.resets == ["pick up the red bowl"] * 2 and rig.commands[-1].step_id == 1
        assert policy.instruction == "pick up the red bowl"
    finally:
        rig.stop()


def test_command_enabled_false_publishes_stats_but_no_actuator_message(rig):
    """command_enabled false (the default of config/policy.yaml): DecodeStats and diagnostics only,
    no ArmCommand, Servo twist or gripper positions; ~/enable switches commanding on and off at run time,
    and `ros2 param set` does the same."""
    from std_srvs.srv import SetBool

    policy = rig.start(command_enabled=False, **{"arm_outputs.publish_twist": True,
                                                      "arm_outputs.publish_gripper_positions": True})
    try:
        rig.instruct("pick up the red bowl")
        actuators = lambda: len(rig.commands) + len(rig.twists) + len(rig.grips)
        n_act, n_stats, n_diag = actuators(), len(rig.stats), len(rig.diags)
        for _ in range(3):
            assert rig.stats_for(rig.publish_set())
        time.sleep(0.1)
        assert actuators() == n_act and len(rig.stats) >= n_stats + 3
        # every step's thread CPU time beside its wall time (a contended step shows the difference)
        assert all(math.isfinite(m.cpu_ms) and 0 <= m.cpu_ms for m in rig.stats[n_stats:])
        assert rig.wait(lambda: any(kv.key == "commanding" and kv.value.startswith("dry run") for d in rig.diags[n_diag:]
                                    for st in d.status for kv in st.values), 2.0)  # fmt: skip
        reply = rig.call("enable", SetBool.Request(data=True))
        assert reply.success and reply.message == "commanding enabled" and policy.cfg.node.command_enabled
        assert policy.get_parameter("command_enabled").value is True
        assert _acted(rig, rig.publish_set()) and rig.wait(lambda: len(rig.twists) > 0 and len(rig.grips) > 0, 2.0)
        assert rig.call("enable", SetBool.Request(data=False)).success
        n_act = actuators()  # nothing after the service has answered
        t = rig.publish_set()
        assert rig.stats_for(t)
        time.sleep(0.1)
        assert actuators() == n_act
        assert policy.set_parameters([Parameter("command_enabled", value=True)])[0].successful
        assert _acted(rig, rig.publish_set())
    finally:
        rig.stop()


def test_per_dimension_action_clipping(rig, policy):
    """max_abs_action clips each dimension to its own bound (a per-step action limit); set at run time."""
    rig.instruct("pick up the red bowl")
    limits = [0.05, 0.5, 0.25, 0.15, 0.5, 0.5, 1.0]
    assert policy.set_parameters([Parameter("max_abs_action", value=limits)])[0].successful
    t = rig.publish_set(pos=(0.3, -0.9, 0.1))  # action = [0.3, -0.9, 0.1, 0.1, 0.2, 0.3, 1.0]
    assert _acted(rig, t)
    cmd = next(c for c in rig.commands if abs(conv.stamp_to_s(c.header.stamp) - t) < 1e-6)
    assert list(cmd.delta_position) == pytest.approx([0.05, -0.5, 0.1])
    assert list(cmd.delta_rotation) == pytest.approx([0.1, 0.2, 0.3]) and cmd.gripper == 1.0
    # counted on the inference thread after the command and its stats are published
    assert rig.wait(lambda: policy._status.counts()["clipped"] == 1, 2.0), policy._status.counts()


def test_database_fallback_publishes_the_command_with_a_warn_diagnostic(rig, policy):
    """A step the decoder had to decode without retrieval (database down) is still a valid command
    (drafter mode); the node says so on /diagnostics (WARN) and in the log, every time it happens."""
    rig.instruct("pick up the red bowl")
    assert _acted(rig, rig.publish_set())
    time.sleep(0.1)
    n_diag, n_log = len(rig.diags), len(rig.policy_logs(30))
    rig.decoder.fallback = "database fault: DatabaseUnavailableError: Qdrant at http://db:6333 is unreachable"
    assert _acted(rig, rig.publish_set())
    words = "decoded without retrieval: database fault"
    assert rig.wait(lambda: any(lvl == 1 and words in m for lvl, m in rig.diag_levels_since(n_diag)), 2.0)
    assert rig.wait(lambda: any(words in m for m in rig.policy_logs(30)[n_log:]), 2.0)
    assert rig.wait(lambda: any(kv.key == "fallback_steps" and kv.value == "1" for d in rig.diags[n_diag:]
                                for st in d.status for kv in st.values), 2.0)  # fmt: skip
    rig.decoder.fallback = ""


def test_watchdog_withholds_commands_while_inference_overruns_and_recovers(rig):
    """Inference over watchdog_factor control periods: no command and an ERROR until
    watchdog_recovery_steps steps in a row are back within the budget."""
    dec = rig.fake()
    policy = rig.start(dec, control_rate_hz=10.0, watchdog_factor=2.0, watchdog_recovery_steps=2,
                       image_staleness_s=1.0, pose_staleness_s=1.0)  # budget 200 ms  # fmt: skip
    try:
        rig.instruct("pick up the red bowl")
        assert _acted(rig, rig.publish_set())
        time.sleep(0.1)
        n_cmd, n_diag = len(rig.commands), len(rig.diags)
        dec.delay_s = 0.5
        t = rig.publish_set()
        # while the slow step runs, the tick already reports the overrun
        assert rig.wait(lambda: any(lvl == 2 and "inference running for" in m for lvl, m in rig.diag_levels_since(n_diag)), 2.0)
        assert rig.wait(lambda: dec.steps >= 2, 2.0) and not _acted(rig, t, 0.2)
        # the next diagnostics message (every 0.2 s) carries the finished step's overrun
        assert rig.wait(lambda: any(lvl == 2 and "inference took" in m for lvl, m in rig.diag_levels_since(n_diag)), 3.0)
        dec.delay_s = 0.0
        first = rig.publish_set()
        assert not _acted(rig, first, 0.5)  # 1/2 steps within budget: still withheld
        assert rig.wait(lambda: any("1/2 steps within" in m for _, m in rig.diag_levels_since(n_diag)), 2.0)
        assert _acted(rig, rig.publish_set())  # 2/2: commanding again
        assert len(rig.commands) == n_cmd + 1 and policy._session.watchdog.state.trips == 1
        assert rig.wait(lambda: any("watchdog cleared" in m for m in rig.policy_logs(30)), 2.0)
        k = len(rig.diags)
        assert rig.wait(lambda: any(kv.key == "watchdog" and kv.value == "ok" for d in rig.diags[k:]
                                    for st in d.status for kv in st.values), 2.0)  # fmt: skip
    finally:
        rig.stop()


def _truncate(msg):
    msg.data = bytes(msg.data)[:-5]


def _nan_pose(rig):
    p = conv.position_to_pose((0.1, 0.2, 0.3), rig.now())
    p.pose.position.y = math.nan
    return p


# name -> (how to publish the bad step, words expected in the diagnostic/warning, min level)
BAD_INPUTS = {
    "wrong encoding": (lambda r: r.publish_set(mutate=lambda m: setattr(m, "encoding", "16UC1")), "encoding", 1),
    "wrong size": (lambda r: r.publish_set(size=(6, 8)), "wrong image size", 1),
    "truncated data": (lambda r: r.publish_set(mutate=_truncate), "truncated", 1),
    "missing view": (lambda r: [r.publish_set(views=("agentview",)), time.sleep(STALENESS_S + 0.1),
                                r.publish_set(views=("agentview",))], "wrist", 1),
    "stale pose": (lambda r: [time.sleep(STALENESS_S + 0.05), r.publish_set(pose=False)], "stale pose", 1),
    "nan pose": (lambda r: r.publish_set(pose_msg=_nan_pose(r)), "not finite", 1),
    # refused at once as an instruction (a warning), not an error at every tick
    "unknown task": (lambda r: [r.instruct("an unknown task"), time.sleep(0.1), r.publish_set()], "unknown task", 1),
    "database missing": (lambda r: [setattr(r.decoder, "db_down", True), r.publish_set()], "database", 2),
    "action beyond action_limits": (lambda r: [setattr(r.decoder, "huge_action", True), r.publish_set()],
                                    "action out of range: dimension(s) [4] = [-7.5]", 2),
    "nan action": (lambda r: [setattr(r.decoder, "nan_action", True), r.publish_set()], "non-finite action", 1),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gives_no_command_a_warning_a_diagnostic_and_recovers(rig, policy, case):
    publish_bad, words, min_level = BAD_INPUTS[case]
    rig.instruct("pick up the red bowl")
    assert _acted(rig, rig.publish_set())
    time.sleep(0.1)
    n_cmd, n_diag, n_log = len(rig.commands), len(rig.diags), len(rig.policy_logs(30))
    publish_bad(rig)
    assert rig.wait(lambda: any(lvl >= min_level and words in msg for lvl, msg in rig.diag_levels_since(n_diag)), 3.0), \
        f"no diagnostic >= {min_level} mentioning {words!r}: {rig.diag_levels_since(n_diag)}"
    assert rig.wait(lambda: any(words in m for m in rig.policy_logs(30)[n_log:]), 2.0), rig.policy_logs(30)[n_log:]
    assert len(rig.commands) == n_cmd, "a command was published from bad input"
    # recovery: the node still runs and acts on the next valid input
    rig.decoder.db_down = rig.decoder.huge_action = rig.decoder.nan_action = False
    rig.instruct("pick up the red bowl")
    time.sleep(0.1)
    assert _acted(rig, rig.publish_set()), "no command for the valid input after the bad one"


def test_no_instruction_yet(rig):
    rig.start(remaps={"instruction": "instruction_not_sent_yet"})
    try:
        n_cmd, n_diag = len(rig.commands), len(rig.diags)
        rig.publish_set()
        assert rig.wait(lambda: any("no instruction" in m for lvl, m in rig.diag_levels_since(n_diag) if lvl >= 1), 3.0)
        assert rig.wait(lambda: any("no instruction" in m for m in rig.policy_logs(30)), 2.0)
        assert len(rig.commands) == n_cmd
        pub = rig.node.create_publisher(String, "instruction_not_sent_yet", 10)  # volatile, as planners publish
        assert rig.wait(lambda: pub.get_subscription_count() > 0, 5.0)
        pub.publish(String(data="pick up the red bowl"))
        assert rig.wait(lambda: rig.policy.instruction is not None, 2.0)
        assert _acted(rig, rig.publish_set())
        rig.on_executor(lambda: rig.node.destroy_publisher(pub))
    finally:
        rig.stop()


def _flood(rig, seconds: float, rate_hz: float):
    rig.instruct("pick up the red bowl")
    time.sleep(0.1)
    k0 = len(rig.received_at)
    end = time.monotonic() + seconds
    period = 1.0 / rate_hz
    nxt = time.monotonic()
    while time.monotonic() < end:
        rig.publish_set()
        nxt += period
        time.sleep(max(0.0, nxt - time.monotonic()))
    time.sleep(0.3)
    recv = rig.received_at[k0:]
    # latency of each command relative to the newest frame published when it arrived
    lat_stamp = np.array([t - conv.stamp_to_s(c.header.stamp) for t, c in recv]) * 1e3
    return recv, lat_stamp


@pytest.mark.parametrize("decode_ms", [20, 150])
def test_flooding_builds_no_backlog(rig, decode_ms):
    """Images at 10x the control rate: latency stays bounded, ticks are dropped not queued."""
    rate = 10.0
    rig.start(rig.fake(delay_s=decode_ms / 1000), control_rate_hz=rate, image_staleness_s=0.5,
              pose_staleness_s=0.5)  # fmt: skip
    try:
        seconds = 3.0
        recv, lat = _flood(rig, seconds, rate * 10)
        assert len(recv) >= 5
        first, last = lat[: len(lat) // 2], lat[len(lat) // 2 :]
        period_ms = 1000 / rate
        bound_ms = period_ms + decode_ms + 150
        print(f"\nflood decode={decode_ms} ms: {len(recv)} commands in {seconds:.0f} s at {rate:.0f} Hz control, "
              f"images at {rate * 10:.0f} Hz; command age vs its input frame: median {np.median(lat):.1f} ms, "
              f"p95 {np.percentile(lat, 95):.1f} ms, max {lat.max():.1f} ms; first half median "
              f"{np.median(first):.1f}, second half {np.median(last):.1f}; dropped ticks "
              f"{rig.policy._status.counts()['dropped_ticks']}")  # fmt: skip
        # a backlog would make the age grow without bound over the run; it stays within one
        # control period + one decode (+ scheduling slack of this 2-core, one-process harness);
        # the worst command may also carry one stall of a loaded machine, which builds no backlog
        assert np.percentile(lat, 95) < bound_ms and lat.max() < bound_ms + 400
        assert np.median(lat[-5:]) < bound_ms, "latency at the end of the flood: a backlog builds up"
        expected = seconds * min(rate, 1000 / decode_ms)
        assert len(recv) <= seconds * rate + 2
        assert len(recv) >= 0.5 * expected
        if decode_ms > period_ms:
            assert rig.policy._status.counts()["dropped_ticks"] > 0
    finally:
        rig.stop()


class SimClock:
    """Publishes /clock at 100 Hz: sim time = base + wall time elapsed; `jump(to)` moves it anywhere."""

    def __init__(self, rig, start_s: float) -> None:
        from rosgraph_msgs.msg import Clock

        self.pub = rig.node.create_publisher(Clock, "/clock", 10)
        self.msg = Clock
        self.base, self.wall0 = start_s, time.monotonic()
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def now(self) -> float:
        return self.base + time.monotonic() - self.wall0

    def jump(self, to_s: float) -> None:
        self.base, self.wall0 = to_s, time.monotonic()

    def _run(self) -> None:
        while self.running:
            self.pub.publish(self.msg(clock=conv.s_to_stamp(self.now())))
            time.sleep(0.01)

    def stop(self, rig) -> None:
        self.running = False
        self.thread.join(1.0)
        rig.on_executor(lambda: rig.node.destroy_publisher(self.pub))


def test_clock_jumps_under_sim_time_never_act_on_stale_data_and_recover(rig):
    """use_sim_time with a bag or simulator that restarts: /clock and the stamps jump back. The node
    must not crash, must not act on data of the old timeline, and must act on the new one."""
    clock = SimClock(rig, 1000.0)
    policy = rig.start(use_sim_time=True, control_rate_hz=20.0)
    try:
        assert rig.wait(lambda: abs(policy._now_s() - clock.now()) < 0.1, 3.0), "sim time not received"
        rig.instruct("pick up the red bowl")
        assert _acted(rig, rig.publish_set(t=clock.now()))
        time.sleep(0.1)
        n_diag = len(rig.diags)
        clock.jump(10.0)  # the bag loops / the simulator resets: time goes back by ~990 s
        time.sleep(0.1)
        n_cmd = len(rig.commands)
        old = rig.publish_set(t=1000.5)  # late data of the old timeline: "in the future" now
        assert not _acted(rig, old, 0.3)
        assert len(rig.commands) == n_cmd
        t = rig.publish_set(t=clock.now())  # the new timeline is acted on
        assert _acted(rig, t), rig.diag_levels_since(n_diag)
        assert rig.wait(lambda: any(lvl >= 1 and "clock jump" in m for lvl, m in rig.diag_levels_since(n_diag)), 2.0)
        assert policy._session.sync.clock_resets >= 1
        clock.jump(5000.0)  # forward: everything held is stale until fresh data arrives
        time.sleep(0.1)
        stale = rig.publish_set(t=clock.now() - 50.0)
        assert not _acted(rig, stale, 0.3)
        assert _acted(rig, rig.publish_set(t=clock.now()))
    finally:
        rig.stop()
        clock.stop(rig)


# --- parameters ---------------------------------------------------------------------------------


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
