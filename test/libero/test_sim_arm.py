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
            outcome = arm.run_episode()
        finally:
            arm.close()
            proc.send_signal(signal.SIGINT)
            out = proc.communicate(timeout=30)[0]
            rclpy.shutdown(context=ctx)
    finally:
        env.close()
    assert outcome.steps == STEPS and outcome.ended in ("max_steps", "success"), (outcome.ended, out[-3000:])
    for k, (got, want) in enumerate(zip(outcome.actions, expected)):
        np.testing.assert_allclose(got, want, atol=1e-9, err_msg=f"step {k}")
    assert proc.returncode == 0, out[-3000:]
