"""heisd_libero/launch/sim.launch.py: the simulated arm and the policy node (policy.launch.py
included) as launch_ros would start them, and `heisd-libero sim-arm` running an episode so started."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from launch_fakes import load_launch, node_argv

from heisd_libero.sim_arm_node import PARAMETERS, parse_episodes
from heisd_ros.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SIM_LAUNCH = REPO / "heisd_libero" / "launch" / "sim.launch.py"
DOMAIN_ID = 61


def _plan(monkeypatch, **given):
    """(the policy node launch_ros would start, the arm node, the exit handler) of the sim launch."""
    _, (include, arm, done) = load_launch(SIM_LAUNCH, monkeypatch, **given)
    (path,) = include.args[0].args
    (share, *rest) = path.args[0]
    assert type(share).__name__ == "FindPackageShare" and share.args == ("heisd_ros",)
    policy_launch = REPO.joinpath(*rest)  # the installed share/heisd_ros/launch is the repository's launch/
    given = {"params_file": str(REPO / "config" / "policy.yaml"), **dict(include.kwargs["launch_arguments"])}
    _, (policy,) = load_launch(policy_launch, monkeypatch, **given)
    return policy, arm, done


def test_sim_launch_starts_the_users_policy_launch_in_sim_time_and_the_arm(monkeypatch):
    policy, arm, done = _plan(monkeypatch)
    assert type(policy).__name__ == "LifecycleNode" and policy.kwargs["executable"] == "policy_node"
    params_file, overlay, overrides = policy.kwargs["parameters"]
    assert Path(overlay) == REPO / "heisd_libero" / "config" / "sim_policy.yaml"
    assert overrides["use_sim_time"] is True and overrides["decoder.method"] == "heisd"
    for name in ("model_dir", "drafter_dir", "calibration_path"):  # the checkout's shipped mini policy
        assert Path(overrides[name]).exists(), overrides[name]
    assert arm.kwargs["executable"] == "heisd-libero" and arm.kwargs["arguments"] == ["sim-arm"]
    (params,) = arm.kwargs["parameters"]
    assert set(params) <= set(PARAMETERS)
    for name, value in params.items():  # what the node declares, typed as it declares it
        assert type(value) is type(PARAMETERS[name]), name
    assert params["episodes"] == ["0:40"] and params["exit_when_done"] is True
    (shutdown,) = done.args[0].kwargs["on_exit"]  # either process ending (the arm's last episode) ends the launch
    assert "target_action" not in done.args[0].kwargs and type(shutdown.kwargs["event"]).__name__ == "Shutdown"
    _, arm, _ = _plan(monkeypatch, episodes="['3:41', '4:40']", time_mode="lockstep", latency_scale="4.7")
    (params,) = arm.kwargs["parameters"]
    assert params["episodes"] == ["3:41", "4:40"] and params["time_mode"] == "lockstep"
    assert params["latency_scale"] == 4.7


def test_the_arm_reads_its_episode_list_and_refuses_a_malformed_one():
    assert parse_episodes(["0:40", " 3 : 41 ", ""]) == [(0, 40), (3, 41)]
    for bad in (["0-40"], ["a:1"], ["1:"]):
        with pytest.raises(ConfigError, match="task:init_state"):
            parse_episodes(bad)


@pytest.mark.slow  # LIBERO and two node processes
def test_what_the_sim_launch_starts_runs_an_episode_and_reports_it(monkeypatch, tmp_path):
    from libero_policy import require_libero

    require_libero()
    pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")
    policy, arm, _ = _plan(monkeypatch, method="ar", db_path="", time_mode="lockstep", max_steps="6")
    env = {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN_ID), "PYTHONUNBUFFERED": "1"}
    node = subprocess.Popen(node_argv(policy, [sys.executable, "-m", "heisd_ros.ros.node"]), cwd=REPO, env=env,
                            stdout=(tmp_path / "node.log").open("w"), stderr=subprocess.STDOUT)  # fmt: skip
    try:
        done = subprocess.run(node_argv(arm, [sys.executable, "-m", "heisd_libero"]), cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
    finally:
        node.send_signal(signal.SIGINT)
        node.wait(timeout=30)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:] + (tmp_path / "node.log").read_text()[-3000:]
    assert "task 0 init state 40: max_steps in 6 steps" in out, out[-3000:]
