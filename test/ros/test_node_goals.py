"""The ~/run_task contract as a client sees it, on the real node: EXECUTING from acceptance, a task
the database lacks rejected at goal time, a default timeout, a result for every goal on shutdown
(SIGINT with inputs streaming), a burst of goals survived, and lifecycle services answering while
the node configures from its executor.

The node runs either in this process (the rig's executor) or as `policy_node` in a subprocess with
the fake decoder, for what only the process's main loop does (signals, the executor it spins)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_decoder import UNKNOWN_TASK

msg_mod = pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")
from heisd_ros.action import RunTask  # noqa: E402

DOMAIN_ID = 96
TASK = "pick up the red bowl"
REPO = Path(__file__).resolve().parents[2]
STATUS = {"unknown": 0, "executing": 2, "succeeded": 4, "canceled": 5, "aborted": 6}  # action_msgs/GoalStatus


@pytest.fixture(scope="module")
def rig(node_rig):
    return node_rig


def _send(rig, policy, instruction=TASK, **goal):
    """A goal to the rig's policy node: (accepted goal handle or None, the result future or None)."""
    client = rig.clients["run_task"]
    assert client.wait_for_server(timeout_sec=5.0)
    sent = client.send_goal_async(RunTask.Goal(instruction=instruction, **goal))
    assert rig.wait(sent.done, 5.0), "no goal response"
    handle = sent.result()
    if not handle.accepted:
        return None, None
    return handle, handle.get_result_async()


def test_a_goal_is_executing_from_acceptance(rig):
    policy = rig.start()
    try:
        handle, result = _send(rig, policy)
        assert rig.wait(lambda: handle.status == STATUS["executing"], 2.0), f"status {handle.status}"
        assert rig.acted(rig.publish_set()) and handle.status == STATUS["executing"]
        rig.pub_result.publish(rig.Bool(data=True))
        assert rig.wait(result.done, 3.0)
        assert result.result().status == STATUS["succeeded"] and result.result().result.reason == "episode_result"
    finally:
        rig.stop()


def test_a_task_the_database_lacks_is_rejected_at_goal_time(rig):
    policy = rig.start()
    try:
        n_log = len(rig.logs)
        handle, _ = _send(rig, policy, instruction=UNKNOWN_TASK)
        assert handle is None, "a goal of an unknown task was accepted"
        mine = lambda: [l for l in rig.logs[n_log:] if l.name == policy.get_name()]  # noqa: E731
        assert rig.wait(lambda: any("goal refused" in l.msg and "no demonstrations" in l.msg for l in mine()), 2.0)
        rig.publish_set()
        time.sleep(0.3)
        assert not [l.msg for l in mine() if l.level >= 40], "an unknown task logged an error"
        assert policy.instruction is None
        # the same instruction on the topic is refused once, with a warning, and commands nothing
        n_cmd = len(rig.commands)
        rig.pub_instr.publish(rig.String(data=UNKNOWN_TASK))
        assert rig.wait(lambda: "unknown task" in policy.idle_reason, 2.0), policy.idle_reason
        rig.publish_set()
        time.sleep(0.3)
        assert len(rig.commands) == n_cmd and not [l.msg for l in mine() if l.level >= 40]
        handle, _ = _send(rig, policy)  # positive control: a known task runs on the same node
        assert handle is not None and rig.acted(rig.publish_set())
    finally:
        rig.stop()


def test_a_goal_over_the_models_token_limit_is_rejected_at_goal_time(rig):
    """Every input limit is checked when the goal arrives: one within max_instruction_bytes but over
    max_instruction_tokens (counted by the model's tokenizer) is rejected with the reason, never
    accepted and then refused at every tick until goal_timeout_s."""
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.engine import HybridDecoder
    from heisd_ros.models.loader import tiny_vla

    policy = rig.start(decoder=HybridDecoder(tiny_vla(seed=0), DecoderConfig(method="ar")),
                       **{"input_limits.max_instruction_tokens": 8})
    try:
        n_log = len(rig.logs)
        handle, _ = _send(rig, policy, instruction="pick up the " + "red " * 20 + "bowl")
        assert handle is None, "a goal over the token limit was accepted"
        mine = lambda: [l.msg for l in rig.logs[n_log:] if l.name == policy.get_name()]  # noqa: E731
        assert rig.wait(lambda: any("goal refused" in m and "tokens exceeds" in m for m in mine()), 2.0), mine()
        handle, _ = _send(rig, policy, instruction="pick up the bowl")  # positive control
        assert handle is not None
    finally:
        rig.stop()


def test_a_burst_of_requests_gets_an_answer_for_each(rig):
    """Bursts sent at once, each request answered (a goal accepted or rejected, a cancel, a reset,
    a lifecycle request with its response), none left waiting: 60 goals, 400 cancels of the running
    goal, 60 ~/reset calls, 100 get_state and 50 change_state requests the state refuses. The
    middleware's default depth of 10 left most of such bursts unanswered (10 of 60 goals, 17-28 of
    400 cancels, 30 of 150 lifecycle requests)."""
    from lifecycle_msgs.srv import ChangeState, GetState
    from std_srvs.srv import Trigger

    policy = rig.start()
    try:
        client = rig.clients["run_task"]
        assert client.wait_for_server(timeout_sec=5.0)
        goals = [client.send_goal_async(RunTask.Goal(instruction=TASK)) for _ in range(60)]
        assert rig.wait(lambda: all(g.done() for g in goals), 20.0), \
            f"{sum(g.done() for g in goals)} of 60 goals answered"  # fmt: skip
        assert all(g.result().accepted for g in goals)  # each preempts the one before
        cancels = [goals[-1].result().cancel_goal_async() for _ in range(400)]
        assert rig.wait(lambda: all(c.done() for c in cancels), 30.0), \
            f"{sum(c.done() for c in cancels)} of 400 cancels answered"  # fmt: skip
        reset = rig.clients["reset"]
        assert reset.wait_for_service(timeout_sec=5.0)
        calls = [reset.call_async(Trigger.Request()) for _ in range(60)]
        assert rig.wait(lambda: all(c.done() for c in calls), 20.0), \
            f"{sum(c.done() for c in calls)} of 60 resets answered"  # fmt: skip
        refused = ChangeState.Request()
        refused.transition.id = 1  # configure, while active
        lifecycle = [rig.clients["get_state"].call_async(GetState.Request()) for _ in range(100)]
        lifecycle += [rig.clients["change_state"].call_async(refused) for _ in range(50)]
        assert rig.wait(lambda: all(c.done() for c in lifecycle), 30.0), \
            f"{sum(c.done() for c in lifecycle)} of 150 lifecycle requests answered"  # fmt: skip
        assert {c.result().current_state.label for c in lifecycle[:100]} == {"active"}
        assert not any(c.result().success for c in lifecycle[100:])
    finally:
        rig.stop()


@pytest.mark.slow
def test_a_finished_goals_result_outlives_rclpys_ten_seconds(rig):
    """A client that asks for the result 12 s after the goal ended still gets it
    (goal_result_retention_s; rclpy's default forgets it after 10 s and answers UNKNOWN)."""
    policy = rig.start()
    try:
        handle, _ = _send(rig, policy)
        assert handle is not None
        from std_srvs.srv import Trigger

        assert rig.call("reset", Trigger.Request()).success  # ends the goal's episode
        assert rig.wait(lambda: handle.status in (STATUS["succeeded"], STATUS["aborted"], STATUS["canceled"]), 5.0)
        time.sleep(12.0)
        late = handle.get_result_async()
        assert rig.wait(late.done, 5.0)
        assert late.result().status != STATUS["unknown"], "the result was forgotten"
    finally:
        rig.stop()


def test_a_goal_without_timeout_ends_at_goal_timeout_s(rig):
    policy = rig.start(goal_timeout_s=0.5)
    try:
        t0 = time.monotonic()
        handle, result = _send(rig, policy)  # timeout_s 0: the node's default
        assert rig.wait(result.done, 5.0), "the goal never ended"
        assert result.result().status == STATUS["aborted"] and result.result().result.reason == "timeout"
        assert 0.4 < time.monotonic() - t0 < 3.0
    finally:
        rig.stop()


# ------------------------------------------------------------------------------------------
# policy_node in a subprocess (the fake decoder), for the main loop's part of the contract

FAKE_MAIN = f"""
import sys, time
sys.path.insert(0, {str(REPO / "test")!r})
from fake_decoder import FakeDecoder
from heisd_ros.ros import node
delay = float(sys.argv[1])
def slow_fake(cfg):
    time.sleep(delay)  # a model that takes a while to load
    return FakeDecoder(cfg)
node.load_node_policy = slow_fake
sys.exit(node.main(sys.argv[2:]))
"""


def _policy_process(load_delay_s: float = 0.0, *params: str) -> subprocess.Popen:
    env = {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN_ID + 1), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-c", FAKE_MAIN, str(load_delay_s), "--params-file", str(REPO / "config" / "policy.yaml"),
           "-p", "model_dir:=fake", "-p", "command_enabled:=true", "-p", "expected_image_height:=8",
           "-p", "expected_image_width:=8", "-p", "control_rate_hz:=20.0", "-p", "warmup_steps:=0"]
    for p in params:
        cmd += ["-p", p]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def remote(node_rig_on):
    """A NodeRig on the subprocesses' domain (its clients talk to /policy_node)."""
    r = node_rig_on(DOMAIN_ID + 1)
    r._make_clients("policy_node")
    return r


def _wait_active(rig, proc, timeout_s: float = 30.0) -> None:
    from lifecycle_msgs.srv import GetState

    client = rig.clients["get_state"]
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and proc.poll() is None:
        if client.wait_for_service(timeout_sec=0.2):
            state = rig.ask("get_state", GetState.Request(), 2.0)  # None: unanswered, ask again
            if state is not None and state.current_state.label == "active":
                break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the node never became active (exit {proc.poll()})")
    # active is not yet matched: a fresh process on a loaded machine can take seconds to discover the
    # rig's publishers, and inputs sent before that never reach it
    pubs = [*rig.pub_img.values(), rig.pub_pose]
    matched = rig.wait(lambda: all(p.get_subscription_count() > 0 for p in pubs), timeout_s)
    assert matched, f"the node never subscribed to the rig's inputs (exit {proc.poll()})"


def _stop(proc: subprocess.Popen, signalled: bool = False) -> str:
    """SIGINT the node and return its output once it has exited; a node `signalled` already is
    given 15 s to finish its shutdown before a second SIGINT (a loaded machine can take seconds)."""
    if signalled:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


@pytest.mark.slow
def test_get_state_answers_configuring_while_the_model_loads(remote):
    from lifecycle_msgs.srv import GetState

    proc = _policy_process(4.0)  # a 4 s load: a blocked service would answer only after it
    try:
        assert remote.clients["get_state"].wait_for_service(timeout_sec=15.0), "no lifecycle services"
        seen, unanswered = [], 0
        end = time.monotonic() + 20.0
        while time.monotonic() < end and (not seen or seen[-1] != "active"):
            state = remote.ask("get_state", GetState.Request(), 2.0)
            if state is not None:
                seen.append(state.current_state.label)
            else:  # a first call can go unanswered while discovery settles; one blocked by configure stays so
                unanswered += 1
            time.sleep(0.05)
        # a service blocked by the 4 s load would answer only once it ended: "configuring" is never its answer
        assert "configuring" in seen and seen[-1] == "active", (seen, unanswered)
    finally:
        out = _stop(proc)
    assert proc.returncode == 0, out[-2000:]


@pytest.mark.slow
def test_sigint_with_a_running_goal_and_streaming_inputs_always_delivers_the_result(remote):
    """20 runs: a goal executing, two cameras and the pose streaming at 30 Hz, SIGINT; the client
    gets ABORTED "shutdown" every time and the node exits 0."""
    outcomes = []
    for run in range(20):
        proc = _policy_process(0.0)
        try:
            _wait_active(remote, proc)
            client = remote.clients["run_task"]
            assert client.wait_for_server(timeout_sec=5.0)
            sent = client.send_goal_async(RunTask.Goal(instruction=TASK))
            assert remote.wait(sent.done, 5.0)
            handle = sent.result()
            result = handle.get_result_async()
            n_cmd = len(remote.commands)
            commanded = remote.stream_until(lambda: len(remote.commands) >= n_cmd + 3, 10.0)
            assert commanded and proc.poll() is None, f"run {run}: no commands (exit {proc.poll()})"
            proc.send_signal(signal.SIGINT)
            sent_at = time.monotonic()
            while proc.poll() is None and time.monotonic() - sent_at < 2.0:  # the inputs keep coming
                remote.publish_set()
                time.sleep(1 / 30)
            assert remote.wait(result.done, 3.0), f"run {run}: no result after SIGINT"
            outcomes.append((result.result().status, result.result().result.reason))
        finally:
            out = _stop(proc, signalled=True)
        assert proc.returncode == 0 and "Traceback" not in out, f"run {run}:\n{out[-2000:]}"
    assert outcomes == [(STATUS["aborted"], "shutdown")] * 20, outcomes


@pytest.mark.slow
def test_a_burst_of_goals_never_ends_the_node_and_the_last_one_runs(remote):
    proc = _policy_process(0.0)
    try:
        _wait_active(remote, proc)
        client = remote.clients["run_task"]
        assert client.wait_for_server(timeout_sec=5.0)
        sent = []
        t0 = time.monotonic()
        for k in range(200):  # 200 goals in about 2 s, half of them cancelled at once
            sent.append(client.send_goal_async(RunTask.Goal(instruction=f"{TASK} {k % 3}")))
            if k % 2 and sent[-2].done() and sent[-2].result().accepted:
                sent[-2].result().cancel_goal_async()
            time.sleep(max(0.0, t0 + 0.01 * (k + 1) - time.monotonic()))
        # in full-suite runs on a loaded machine this client got some of the 200 responses only late or
        # not at all; what the node promises is that it lives and serves the goal that follows
        remote.wait(lambda: all(s.done() for s in sent), 30.0)
        assert proc.poll() is None, "the node died under the burst"
        final = client.send_goal_async(RunTask.Goal(instruction=TASK))
        assert remote.wait(final.done, 10.0), "no response to the goal after the burst"
        last = final.result()
        assert last.accepted
        executing = remote.wait(lambda: last.status == STATUS["executing"], 5.0)
        # Fresh sets at the camera's rate until one is commanded: a node still working off the burst can
        # take longer than the staleness limit for the first, and rightly refuses it once it is stale.
        n_cmd = len(remote.commands)
        commands = remote.stream_until(lambda: len(remote.commands) > n_cmd, 10.0)
        still_last = last.status == STATUS["executing"]  # the commands were the last goal's, not a late burst goal's
    finally:
        out = _stop(proc)
    assert executing and commands and still_last, f"last goal status {last.status}, commanded {commands}:\n{out[-3000:]}"
    assert proc.returncode == 0, out[-2000:]
