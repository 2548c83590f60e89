"""LIBERO as a ROS 2 arm (heisd_libero/sim_arm.py): an episode in lockstep through `policy_node`
decodes what eval-libero decodes on the same scene, step by step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from libero_policy import require_libero

pytestmark = pytest.mark.slow  # LIBERO and a policy_node process

pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")
require_libero()

DOMAIN_ID = 58
REPO = Path(__file__).resolve().parents[2]
MINI = REPO / "models" / "mini_libero"
STEPS = 12
# A bound against a hang, not a speed target: a subprocess node imports torch and rclpy first, over
# 60 s on a CI machine busy with other tests.
NODE_START_S = 180.0


def _policy_node() -> subprocess.Popen:
    params = {"model_dir": MINI / "vla", "decoder.method": "ar", "use_sim_time": "true", "control_rate_hz": 20.0,
              "command_enabled": "true", "warmup_steps": 1}  # fmt: skip
    cmd = [sys.executable, "-m", "heisd_ros.ros.node", "--params-file", str(REPO / "config" / "policy.yaml")]
    for k, v in params.items():
        cmd += ["-p", f"{k}:={v}"]
    env = {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN_ID), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _eval_actions(env, init_state: int, steps: int) -> list[np.ndarray]:
    """ar's actions as eval-libero computes them: the decoder in process, the same observation."""
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.gripper import finger_gap
    from heisd_ros.core.types import Observation
    from heisd_ros.policy import PolicyPaths, build_policy

    decoder = build_policy(PolicyPaths(model_dir=str(MINI / "vla")), DecoderConfig(method="ar"))
    decoder.reset(env.instruction)
    obs = env.reset(init_state)
    actions = []
    for _ in range(steps):
        action, _ = decoder.step(Observation(obs.images, env.instruction, obs.ee_pos,
                                             gripper_gap=finger_gap(obs.gripper_qpos)))  # fmt: skip
        actions.append(np.asarray(action, dtype=np.float64))
        obs, _ = env.step(action)
    decoder.close()
    return actions


def test_a_lockstep_episode_through_the_node_decodes_what_eval_libero_decodes():
    import rclpy

    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig
    from heisd_libero.sim_arm import SimArm, SimArmConfig

    env = LiberoEnv(LiberoEnvConfig(suite="libero_object", task_index=0))
    try:
        expected = _eval_actions(env, 40, STEPS)
        ctx = rclpy.Context()
        rclpy.init(context=ctx, domain_id=DOMAIN_ID)
        proc = _policy_node()
        arm = SimArm(env, SimArmConfig(init_state=40, max_steps=STEPS), context=ctx)
        try:
            assert arm.wait_for_node(120.0), f"the policy node did not come up (exit {proc.poll()})"
            executed: list[float | None] = []
            outcome = arm.run_episode(on_step=lambda obs, t, stamp: executed.append(stamp))
        finally:
            arm.close()
            proc.send_signal(signal.SIGINT)
            out = proc.communicate(timeout=30)[0]
            rclpy.shutdown(context=ctx)
    finally:
        env.close()
    assert outcome.steps == STEPS and outcome.ended in ("max_steps", "success"), (outcome.ended, out[-3000:])
    assert outcome.held_steps == [1] * STEPS
    assert executed == [None, *outcome.frame_stamps_s]  # in lockstep a frame's command moves the arm at once
    for k, (got, want) in enumerate(zip(outcome.actions, expected)):
        np.testing.assert_allclose(got, want, atol=1e-9, err_msg=f"step {k}")
    assert proc.returncode == 0, out[-3000:]


FAKE_SLOW_NODE = f"""
import sys, time
sys.path.insert(0, {str(REPO / "test")!r})
from fake_decoder import FakeDecoder
from heisd_ros.ros import node
node.load_node_policy = lambda cfg: FakeDecoder(cfg, delay_s=float(sys.argv[1]), action=lambda obs, k: [0.0] * 6 + [-1.0])
sys.exit(node.main(sys.argv[2:]))
"""


def _fake_node(delay_s: float, *params: str) -> subprocess.Popen:
    """FAKE_SLOW_NODE as a process, in sim time, with `params` (name:=value) over config/policy.yaml."""
    cmd = [sys.executable, "-c", FAKE_SLOW_NODE, str(delay_s), "--params-file", str(REPO / "config" / "policy.yaml"),
           "-p", "model_dir:=fake", "-p", "use_sim_time:=true", "-p", "warmup_steps:=0"]  # fmt: skip
    for param in params:
        cmd += ["-p", param]
    return subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "ROS_DOMAIN_ID": str(DOMAIN_ID), "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _stop(arm, proc: subprocess.Popen, ctx, env) -> str:
    """Close the arm, interrupt the node and return its output, then the context and the env."""
    import rclpy

    try:
        arm.close()
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=30)[0]
    finally:
        rclpy.shutdown(context=ctx)
        env.close()


def test_in_arm_time_the_arm_moves_on_for_as_long_as_the_policy_thinks():
    """A policy that takes 0.12 s a step at 20 Hz: the arm executes the previous command for 3
    periods (4 when the node's own overhead passes 0.03 s) before the next frame, and the frames'
    simulation times are that many periods apart."""
    import rclpy

    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig
    from heisd_libero.sim_arm import SimArm, SimArmConfig

    env = LiberoEnv(LiberoEnvConfig(suite="libero_object", task_index=0))
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=DOMAIN_ID)
    proc = _fake_node(0.12, "control_rate_hz:=20.0", "command_enabled:=true", "watchdog_factor:=10.0")
    arm = SimArm(env, SimArmConfig(init_state=40, max_steps=24, time_mode="arm_time"), context=ctx)
    try:
        assert arm.wait_for_node(NODE_START_S), f"the policy node did not come up (exit {proc.poll()})"
        executed: list[float | None] = []  # per simulator step: the frame stamp of the command executed
        times: list[float] = []
        outcome = arm.run_episode(on_step=lambda obs, t, stamp: (executed.append(stamp), times.append(t)))
    finally:
        out = _stop(arm, proc, ctx, env)
    assert outcome.ended == "max_steps" and outcome.steps == 24, (outcome.ended, out[-3000:])
    # while frame k's command is computed the arm runs frame k-1's (nothing before the first)
    expected = [None] + [s for k, held in enumerate(outcome.held_steps)
                         for s in [outcome.frame_stamps_s[k - 1] if k else None] * held]  # fmt: skip
    assert executed == expected[: outcome.steps + 1]
    # simulation time per simulator step: a period each, and the periods the clock moved on for a missed tick
    assert times[0] == 1.0 and times[-1] == pytest.approx(1.0 + outcome.sim_time_s)
    assert all(lat >= 0.12 for lat in outcome.latencies_s), outcome.latencies_s
    assert set(outcome.held_steps[:-1]) <= {3, 4}, (outcome.held_steps, outcome.latencies_s)
    # frames are held_steps periods apart, plus the periods the clock moved on for a missed tick
    gaps = np.diff(outcome.frame_stamps_s)
    np.testing.assert_allclose(gaps, 0.05 * (np.array(outcome.held_steps[:-1]) + outcome.waits[:-1]), atol=1e-6)


def test_the_arm_waits_for_the_node_to_be_active_not_only_configured():
    """configure creates the node's subscriptions and activate opens its goal gate a moment later: a
    goal sent in between is refused, so the arm asks the node's lifecycle state before its first goal."""
    import rclpy
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState

    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig
    from heisd_libero.sim_arm import SimArm, SimArmConfig, _wait

    env = LiberoEnv(LiberoEnvConfig(suite="libero_object", task_index=0))
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=DOMAIN_ID)
    proc = _fake_node(0.0, "autostart:=false")
    arm = SimArm(env, SimArmConfig(init_state=40, max_steps=2), context=ctx)
    change = arm.node.create_client(ChangeState, "/policy_node/change_state")

    def transition(tid: int) -> None:
        assert change.wait_for_service(timeout_sec=NODE_START_S), f"no lifecycle service (exit {proc.poll()})"
        done = change.call_async(ChangeState.Request(transition=Transition(id=tid)))
        assert _wait(done.done, 30.0) and done.result().success, tid

    try:
        assert not arm.wait_for_node(2.0)  # unconfigured
        transition(Transition.TRANSITION_CONFIGURE)
        assert _wait(lambda: arm.action.server_is_ready() and all(p.get_subscription_count() for p in arm.pub_img.values()),
                     30.0), "the configured node's subscriptions never showed"
        assert not arm.wait_for_node(2.0)  # configured, inactive: a goal now would be refused
        transition(Transition.TRANSITION_ACTIVATE)
        assert arm.wait_for_node(30.0)
    finally:
        out = _stop(arm, proc, ctx, env)
    assert proc.returncode == 0, out[-3000:]
