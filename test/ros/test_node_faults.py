"""A step can fail, the node cannot; and it stops cleanly on a signal.

The policy is the real (untrained, tiny) one loaded from files, behind the real node, over real
topics. Faults are injected *inside* its language model: a forward hook on the first decoder layer
misbehaves when the decoder runs a given instruction, so the failure rises from the middle of a
real forward exactly as an out-of-memory attention mask would. The shutdown tests run the
`policy_node` console script in a subprocess, stream inputs at it and signal it mid-run.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import rclpy
from node_rig import NodeRig
from rclpy.parameter import Parameter
from std_msgs.msg import String

from heisd_ros.ros.node import (
    PolicyNode,
    load_decoder,
)

pytestmark = pytest.mark.slow  # end to end: the real tiny policy in policy_node subprocesses

msg_mod = pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 71
REPO = Path(__file__).resolve().parents[2]
TASK = "pick up the red bowl"
OOM = "pick up the bowl that runs out of memory"
KILL = "pick up the bowl that ends the thread"
HANG = "pick up the bowl that hangs"
HANG_S = 2.5
ERROR = 2


class ThreadKiller(BaseException):
    """A BaseException that is no Exception: what no step containment catches (a bug's stand-in)."""


@pytest.fixture(scope="module")
def files(untrained_policy):
    return untrained_policy


def _params(root: Path, **over) -> dict:
    # commanding on; the rig's instruction publisher is latched (it publishes before the node starts)
    return {"model_dir": str(root / "model"), "drafter_dir": str(root / "drafter"), "db_path": str(root / "db"),
            "calibration_path": str(root / "calibration.json"), "command_enabled": True,
            "instruction_durability": "transient_local", **over}  # fmt: skip


def faulty_decoder(cfg):
    """The real decoder, its first decoder layer failing on the OOM and KILL instructions and stalling
    HANG_S once on the HANG instruction."""
    import torch

    decoder = load_decoder(cfg)
    hung = []  # the HANG instruction stalls one forward, once

    def hook(module, args):
        if decoder.instruction == OOM:
            torch.empty((1 << 62,), dtype=torch.uint8)  # a real allocator failure (RuntimeError)
        elif decoder.instruction == KILL:
            raise ThreadKiller("a bug beyond containment")
        elif decoder.instruction == HANG and not hung:
            hung.append(True)
            time.sleep(HANG_S)

    decoder.vla.language_model.model.layers[0].register_forward_pre_hook(hook)
    return decoder


_moves = itertools.count(1)
SWEEP = 1000
"""Sets per one-way sweep of the pose along x (1 m in 1 mm steps)."""


def make_rig(ctx) -> NodeRig:
    """The suite's rig beside the node: 64x64 frames, a latched instruction, on the module's context."""
    return NodeRig(ctx=ctx, image_size=(64, 64), latched_instruction=True, name="fault_rig")


def publish(rig: NodeRig) -> float:
    """One synchronised set, the pose 1 mm along x from the last one, sweeping 0..1 m back and forth:
    the module publishes thousands of sets (more the slower the machine: they stream while each
    policy_node starts), and a pose that kept going would leave the node's input workspace box
    (input_limits.workspace_max_m, 2 m), where every step is refused."""
    k = next(_moves) % (2 * SWEEP)
    return rig.publish_set(pos=(0.001 * min(k, 2 * SWEEP - k), 0.2, 0.1))


@pytest.fixture
def rig(ctx):
    r = make_rig(ctx)
    yield r
    r.close()


_started = 0


@pytest.fixture
def start(ctx, files, rig):
    """start(**params) -> a PolicyNode on the faulty real decoder, spun by the rig's executor."""
    nodes = []

    def _start(**params) -> PolicyNode:
        global _started
        _started += 1  # a unique name per node: rclpy drops /rosout of a re-created node of the same name
        # task: every instruction retrieves from TASK's demonstrations (the faulty ones have none)
        overrides = _params(files, task=TASK, control_rate_hz=10.0, diagnostics_period_s=0.2, image_staleness_s=1.0,
                            pose_staleness_s=1.0, **params)  # fmt: skip
        node = PolicyNode(faulty_decoder, node_name=f"faulty_{_started}", context=ctx,
                          parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])  # fmt: skip
        rig.executor.add_node(node)
        nodes.append(node)
        assert rig.wait(lambda: node._session.outputs.command.get_subscription_count() > 0, 5.0), "discovery timed out"
        return node

    yield _start
    for node in nodes:
        rig.executor.remove_node(node)
        node.destroy_node()


RECOVERY_S = 3.0
"""Valid input to a command after a fault: a few steps of the real tiny policy on a loaded 2-core machine."""


def _stream(rig: NodeRig, done, timeout_s: float) -> bool:
    """The module's sweeping sets at 10 Hz until `done()` (NodeRig.stream_until)."""
    return rig.stream_until(done, timeout_s, publish=lambda: publish(rig), period_s=0.1)


def _commanded(rig: NodeRig, timeout_s: float) -> bool:
    """Whether fresh sets got a command within `timeout_s` (a single set could be lost to one slow step)."""
    n_cmd = len(rig.arrivals)
    return _stream(rig, lambda: len(rig.arrivals) > n_cmd, timeout_s)


def _quiet(rig: NodeRig, policy: PolicyNode, quiet_s: float = 1.3, timeout_s: float = 6.0) -> None:
    """Wait until no step is running and no command has arrived for `quiet_s` (over image_staleness_s,
    1 s: the node commands no set older than that): the sets `_commanded` sent after the first commanded
    one may still be acted on, and a test counting commands from here must not see them."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        n = len(rig.commands)
        time.sleep(quiet_s)
        if len(rig.commands) == n and policy._session.worker.running_s() is None:
            return
    raise AssertionError(f"commands kept arriving for {timeout_s} s without new input")


def _healthy(level: int, message: str) -> bool:
    """OK, or the one WARN a machine slower than the control period gives with no fault at all."""
    return level == 0 or (level == 1 and message.startswith("decoding takes") and "longer than the control period" in message)


def _recovers(rig: NodeRig, policy: PolicyNode) -> None:
    """Valid input is commanded again within RECOVERY_S, and /diagnostics leaves its ERROR for a healthy status."""
    assert rig.instruct(TASK, policy=policy), "instruction not delivered"
    assert _commanded(rig, RECOVERY_S), f"no command within {RECOVERY_S} s of valid input: {rig.policy_status(0)[-3:]}"
    n_diag = len(rig.diags)
    healthy = lambda: any(_healthy(lvl, m) for lvl, m, _ in rig.policy_status(n_diag))  # noqa: E731
    assert _stream(rig, healthy, 5.0), rig.policy_status(n_diag)[-3:]


def test_a_step_that_raises_costs_its_command_not_the_node(rig, start):
    """A RuntimeError (out of memory) from inside the language model: no command for that step, an
    ERROR diagnostic naming the cause, one log line per throttle period, the worker alive."""
    policy = start(warn_throttle_s=30.0, watchdog_factor=10.0)  # a slow step under load is no fault here
    assert rig.instruct(TASK, policy=policy), "instruction not delivered"
    assert _commanded(rig, 5.0), rig.policy_status(0)[-3:]
    _quiet(rig, policy)
    n_cmd, n_diag, n_log = len(rig.commands), len(rig.diags), len(rig.logs)
    assert rig.instruct(OOM, policy=policy), "instruction not delivered"
    failed = lambda: any("step_failed:" in v["rejected"] and int(v["rejected"].split("step_failed:")[1].split()[0]) >= 3
                         for _, _, v in rig.policy_status(n_diag))  # noqa: E731  # fmt: skip
    bad = []  # a newer set replaces one a slow step did not take: sets until three steps failed
    assert rig.stream_until(failed, 5.0, publish=lambda: bad.append(publish(rig)), period_s=0.15), rig.policy_status(n_diag)
    named = [m for lvl, m, _ in rig.policy_status(n_diag) if lvl == ERROR and "step failed: RuntimeError" in m]
    assert named and "allocate" in named[0], rig.policy_status(n_diag)
    assert not any(rig.acted(t, 0.0) for t in bad) and len(rig.commands) == n_cmd
    assert rig.wait(lambda: rig.errors_logged(policy, "step failed: RuntimeError", n_log), 2.0)
    assert len(rig.errors_logged(policy, "step failed", n_log)) == 1  # throttled: 3+ failures, one line
    assert policy._session.worker.alive and policy._session.worker.restarts == 0
    _recovers(rig, policy)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_inference_thread_is_restarted(rig, start):
    """A BaseException ends the inference thread: the control timer notices, starts a new one and
    says so (log + diagnostics); valid input is commanded again."""
    policy = start(warn_throttle_s=0.0, watchdog_factor=10.0)  # a slow step under load is no fault here
    assert rig.instruct(TASK, policy=policy), "instruction not delivered"
    assert _commanded(rig, 5.0), rig.policy_status(0)[-3:]
    _quiet(rig, policy)
    n_cmd, n_diag, n_log = len(rig.commands), len(rig.diags), len(rig.logs)
    assert rig.instruct(KILL, policy=policy), "instruction not delivered"
    publish(rig)
    assert rig.wait(lambda: rig.errors_logged(policy, "inference thread died", n_log), 3.0)
    line = rig.errors_logged(policy, "inference thread died", n_log)[0].msg
    assert "ThreadKiller: a bug beyond containment" in line and "started a new one" in line
    assert policy._session.worker.restarts == 1 and policy._session.worker.alive and len(rig.commands) == n_cmd
    assert rig.wait(lambda: any(v["worker_restarts"] == "1" for _, _, v in rig.policy_status(n_diag)), 2.0)
    _recovers(rig, policy)


def test_a_hang_is_reported_again_every_throttle_period(rig, start):
    """An inference stuck for HANG_S: the watchdog's ERROR is logged at once and then every
    warn_throttle_s for as long as it lasts; commands resume after it ends."""
    policy = start(warn_throttle_s=0.5)  # watchdog budget: 3 x 0.1 s
    assert rig.instruct(TASK, policy=policy), "instruction not delivered"
    assert _commanded(rig, 5.0), rig.policy_status(0)[-3:]
    _quiet(rig, policy)
    n_cmd, n_log = len(rig.commands), len(rig.logs)
    assert rig.instruct(HANG, policy=policy), "instruction not delivered"
    worker = policy._session.worker
    _stream(rig, lambda: worker.running_s() is not None, 5.0)  # fresh sets until the (hanging) step runs
    assert rig.wait(lambda: rig.errors_logged(policy, "inference running for", n_log), 4.0)
    assert rig.instruct(TASK, policy=policy), "instruction not delivered"  # the hung step still runs with HANG; the next ones will not
    assert rig.wait(lambda: policy._session.worker.running_s() is None, HANG_S + 2.0)
    hang = rig.errors_logged(policy, "inference running for", n_log)
    assert len(hang) >= 3, [l.msg for l in hang]  # at ~0.3, 0.8, 1.3, 1.8, 2.3 s of a 2.5 s hang
    gaps = np.diff([l.stamp.sec + l.stamp.nanosec * 1e-9 for l in hang])
    assert np.all(gaps > 0.4), gaps
    assert len(rig.commands) == n_cmd
    _recovers(rig, policy)


# --- clean shutdown of the policy_node executable ---------------------------------------------

SHUTDOWN_RUNS = {signal.SIGINT: 3, signal.SIGTERM: 2}


def _policy_node_exe() -> str:
    exe = Path(sys.executable).with_name("policy_node")
    found = str(exe) if exe.exists() else shutil.which("policy_node")
    if found is None:
        pytest.skip("the policy_node console script is not installed")
    return found


def _no_commands(proc: subprocess.Popen, rig: NodeRig, n0: int, n_diag: int) -> str:
    """Why a policy_node run gave too few commands: whether it had exited, the commands that came,
    the node's last diagnostics (its rejected steps by kind) and its output (terminated to get it)."""
    code = proc.poll()
    if code is None:
        proc.terminate()
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    exited = f"it had exited with code {code}" if code is not None else "it was still running (terminated)"
    commands = [(c.decode_mode, c.method, c.step_id) for c in rig.commands[n0:]]
    keys = ("commanding", "instruction", "steps", "rejected", "dropped_ticks", "decode_median_ms", "watchdog",
            "watchdog_trips", "last_error")  # fmt: skip
    status = [(lvl, msg, {k: v.get(k) for k in keys}) for lvl, msg, v in rig.policy_status(n_diag)[-2:]]
    return (f"{exited}; {len(commands)} command(s) (mode, method, step): {commands}\n"
            f"last diagnostics (level, message, values): {status}\n"
            f"stdout (tail):\n{out[-3000:]}\nstderr (tail):\n{err[-3000:]}")


@pytest.mark.parametrize("sig", list(SHUTDOWN_RUNS), ids=lambda s: signal.Signals(s).name)
def test_signal_mid_run_exits_0_without_traceback_or_rosout_errors(files, sig):
    """policy_node decoding a stream at 30 Hz, signalled at a random moment (a step is often in
    flight): exit 0, "shutting down", no traceback, no failed /rosout publication. Several runs."""
    exe = _policy_node_exe()
    c = rclpy.Context()
    rclpy.init(context=c, domain_id=DOMAIN_ID + 1)
    rig = make_rig(c)
    rng = np.random.default_rng(int(sig))
    try:
        rig.pub_instr.publish(String(data=TASK))
        # 30 Hz keeps a step in flight most of the time; the watchdog's budget would withhold the
        # commands this waits for on a slow machine (steps of 1-2 s seen in CI under load), and speed
        # is not the subject: the largest factor allowed, 100 periods (3.3 s)
        cmd = [exe, "--params-file", str(REPO / "config" / "policy.yaml"), "-p", "control_rate_hz:=30.0",
               "-p", "watchdog_factor:=100.0"]
        for k, v in _params(files).items():
            cmd += ["-p", f"{k}:={v}"]
        env = {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN_ID + 1), "PYTHONUNBUFFERED": "1"}
        outcomes = []
        for run in range(SHUTDOWN_RUNS[sig]):
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                n0, n_diag, deadline = len(rig.commands), len(rig.diags), time.monotonic() + 60.0
                while len(rig.commands) < n0 + 5 and time.monotonic() < deadline and proc.poll() is None:
                    publish(rig)
                    time.sleep(1 / 30)
                if len(rig.commands) < n0 + 5:
                    pytest.fail(f"run {run}: fewer than 5 commands\n{_no_commands(proc, rig, n0, n_diag)}")
                signal_at = time.monotonic() + rng.uniform(0.0, 0.5)
                while time.monotonic() < signal_at:
                    publish(rig)
                    time.sleep(1 / 30)
                proc.send_signal(sig)
                sent = time.monotonic()
                while proc.poll() is None and time.monotonic() - sent < 1.0:  # inputs keep coming meanwhile
                    publish(rig)
                    time.sleep(1 / 30)
                out, err = proc.communicate(timeout=20)
            finally:
                if proc.poll() is None:
                    proc.kill()
            text = out + err
            outcomes.append((proc.returncode, round(time.monotonic() - sent, 2)))
            assert proc.returncode == 0, f"run {run}: exit {proc.returncode}\n{text[-3000:]}"
            assert "Traceback" not in text and "Failed to publish" not in text, f"run {run}:\n{text[-3000:]}"
            assert "shutting down" in text
        print(f"\n{signal.Signals(sig).name}: {len(outcomes)} runs, (exit code, seconds to exit): {outcomes}")
    finally:
        rig.close()
        rclpy.shutdown(context=c)
