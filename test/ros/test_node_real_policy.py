"""The policy node with the real loading path (model, drafter, database, calibration from files):
start-up failures name the broken file, a bad calibration falls back to the defaults with a
warning in the node's log, and a database outage mid-run is ridden out in drafter mode.

The files are those of an *untrained* tiny policy (written in a second; loading is what is tested).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from node_rig import NodeRig
from rclpy.parameter import Parameter
from std_msgs.msg import String

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.errors import (
    CalibrationError,
    DatabaseError,
    DatabaseUnavailableError,
    ModelLoadError,
)
from heisd_ros.ros import conversions as conv
from heisd_ros.ros.node import SENSOR_QOS, PolicyNode
from heisd_ros.store.schema import DemoPoint

pytestmark = pytest.mark.slow  # end to end: the real tiny policy in the node and in subprocesses

msg_mod = pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 64
REPO = Path(__file__).resolve().parents[2]
TASK = "pick up the red bowl"


def _points(n: int, obs_dim: int, feat_dim: int, first_token: int):
    rng = np.random.default_rng(0)
    return [DemoPoint("unit", TASK, TASK, 0, k, rng.normal(size=obs_dim), rng.normal(size=feat_dim),
                      rng.normal(size=feat_dim), np.zeros(7), tuple(int(t) for t in rng.integers(first_token, first_token + 256, 7)),
                      rng.uniform(-0.1, 0.1, 3)) for k in range(n)]  # fmt: skip


@pytest.fixture(scope="module")
def files(untrained_policy):
    """The untrained tiny policy, plus a drafter of another size."""
    from heisd_ros.core.drafter import EagleDrafter
    from heisd_ros.models.loader import tiny_vla

    EagleDrafter(tiny_vla(hidden_size=64).language_model.config).save(untrained_policy / "drafter_small")
    return untrained_policy


def _params(root: Path, **over) -> dict:
    return {"model_dir": str(root / "model"), "drafter_dir": str(root / "drafter"), "db_path": str(root / "db"),
            "calibration_path": str(root / "calibration.json"), "control_rate_hz": 10.0,
            "diagnostics_period_s": 0.2, "warn_throttle_s": 0.0, "command_enabled": True,
            # the listener's instruction is latched and may be published before the node matched it
            "instruction_durability": "transient_local", **over}  # fmt: skip


def _copy(files: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "policy"
    subprocess.run(["cp", "-r", str(files), str(dst)], check=True)  # keeps the database's sparse files sparse
    return dst


def _start(ctx, name: str, **params) -> PolicyNode:
    return PolicyNode(context=ctx, node_name=name, parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])


def test_the_real_files_load(ctx, files):
    node = _start(ctx, "loads", **_params(files))
    try:
        assert node._session.decoder.cfg.fused_metric.tau == -1.0  # calibration applied
        assert node._session.decoder.health()[0]
        # one name per setting: decoder.* answers what runs
        assert node.get_parameter("decoder.fused_metric.tau").value == -1.0
        assert node.get_parameter("decoder.verify_skip.enabled").value is False
        assert node.get_parameter("decoder.verify_skip.min_similarity").value == \
            node._session.decoder.cfg.verify_skip.min_similarity
        refused = node.set_parameters([Parameter("decoder.fused_metric.tau", value=0.3)])[0]
        assert not refused.successful and "configure again" in refused.reason
        assert node.get_parameter("decoder.fused_metric.tau").value == -1.0
    finally:
        node.destroy_node()


def test_an_explicit_value_beats_the_point_file_and_is_logged_as_explicit(ctx, files):
    """-p decoder.fused_metric.tau:=0.3 with a point file that sets tau -1: 0.3 runs and is shown;
    the point file's other values run; configure's log names the explicit value."""
    from heisd_ros.ros import decoder_params

    node = _start(ctx, "explicit_wins", **_params(files), **{"decoder.fused_metric.tau": 0.3})
    try:
        assert node._session.decoder.cfg.fused_metric.tau == 0.3
        assert node.get_parameter("decoder.fused_metric.tau").value == 0.3
        assert node.get_parameter("decoder.verify_skip.enabled").value is False  # from the point file
        text = decoder_params.sources(node.cfg.decoder, node._explicit, node.cfg.node.calibration_path)
        assert "explicit (-p, launch or parameter file): fused_metric.tau=0.3" in text
        assert "verify_skip.enabled=False" in text.split("explicit")[1]  # from the point file
    finally:
        node.destroy_node()


def test_a_point_file_with_integer_floats_configures_again(ctx, files, tmp_path):
    """A point file writes `"tau": 0` (JSON has no float type): every configure shows it as the
    double 0.0 (the second configure once failed: rclpy refuses an int for a double parameter)."""
    from lifecycle_msgs.msg import Transition

    root = _copy(files, tmp_path)
    (root / "calibration.json").write_text('{"fused_metric": {"tau": 0, "r_p95_m": 10}, "verify_skip": {"enabled": false}}')
    node = _start(ctx, "int_floats", **_params(root))
    try:
        for _ in range(2):
            assert node.trigger_deactivate().value == Transition.TRANSITION_CALLBACK_SUCCESS
            assert node.trigger_cleanup().value == Transition.TRANSITION_CALLBACK_SUCCESS
            assert node.trigger_configure().value == Transition.TRANSITION_CALLBACK_SUCCESS, node.configure_error
            assert node.trigger_activate().value == Transition.TRANSITION_CALLBACK_SUCCESS
        assert node.get_parameter("decoder.fused_metric.tau").value == 0.0
        assert node.get_parameter("decoder.fused_metric.tau").type_ == Parameter.Type.DOUBLE
    finally:
        node.destroy_node()


def _corrupt(path: Path) -> None:
    path.write_bytes(b"\x00garbage" * 8)


# name -> (damage to a copy of the files, error class, words naming the file)
BROKEN = {
    "model weights corrupt": (lambda r: _corrupt(r / "model" / "model.safetensors"), ModelLoadError, "model.safetensors"),
    "model weights missing": (lambda r: (r / "model" / "model.safetensors").unlink(), ModelLoadError,
                              "missing weights file"),
    "model config corrupt": (lambda r: (r / "model" / "config.json").write_text("{"), ModelLoadError, "config.json"),
    "norm stats corrupt": (lambda r: (r / "model" / "dataset_statistics.json").write_text("[]"), ModelLoadError,
                           "dataset_statistics.json"),
    "drafter weights corrupt": (lambda r: _corrupt(r / "drafter" / "drafter.safetensors"), ModelLoadError,
                                "drafter.safetensors"),
    "drafter missing": (lambda r: subprocess.run(["rm", "-r", str(r / "drafter")], check=True), ModelLoadError,
                        "drafter.safetensors"),
    "drafter of another model": (lambda r: (r / "drafter" / "drafter.safetensors").write_bytes(
        (r / "drafter_small" / "drafter.safetensors").read_bytes()), ModelLoadError, "does not match the target"),
    "database missing": (lambda r: subprocess.run(["rm", "-r", str(r / "db")], check=True), DatabaseUnavailableError,
                         "no demonstration database"),
    "database metadata corrupt": (lambda r: (r / "db" / "heisd_demos" / "heisd_store.json").write_text("{"),
                                  DatabaseUnavailableError, "heisd_store.json"),
    "database engine files corrupt": (lambda r: (r / "db" / "heisd_demos" / "edge_config.json").write_text("x"),
                                      DatabaseUnavailableError, "heisd_demos"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_files_fail_start_up_naming_the_file(ctx, files, tmp_path, case):
    damage, error, words = BROKEN[case]
    root = _copy(files, tmp_path)
    damage(root)
    with pytest.raises(error, match=words) as info:
        _start(ctx, "broken", **_params(root))
    assert str(root) in str(info.value) or "does not match" in words


def test_database_with_other_dimensions_fails_start_up(ctx, files, tmp_path):
    """A database built for another model: refused at start-up (not at the first retrieval)."""
    from heisd_ros.store import make_store

    root = _copy(files, tmp_path)
    subprocess.run(["rm", "-r", str(root / "db")], check=True)
    with make_store(StoreConfig(backend="edge", path=str(root / "db")), 96, 128, create=True) as s:
        s.upsert(_points(2, 96, 128, 384))
    node = None
    try:
        with pytest.raises(DatabaseError, match="obs 96"):
            node = _start(ctx, "dims", **_params(root))
    finally:
        if node is not None:
            node.destroy_node()


@pytest.mark.parametrize("case", ["model weights corrupt", "database metadata corrupt"])
def test_policy_node_exits_1_with_the_reason(files, tmp_path, case):
    damage, error, words = BROKEN[case]
    root = _copy(files, tmp_path)
    damage(root)
    args = [f"{k}:={v}" for k, v in _params(root).items()]
    env = {**os.environ, "ROS_DOMAIN_ID": str(DOMAIN_ID + 1)}
    cmd = [sys.executable, "-m", "heisd_ros.ros.node", "--params-file", str(REPO / "config" / "policy.yaml")]
    for a in args:
        cmd += ["-p", a]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f"cannot start: {error.__name__}" in out and words in out and "Traceback" not in out


def publish_step(listener: NodeRig, k: int) -> float:
    """Step k of a curved path (the kinematic boundary sees motion): one synchronised set."""
    return listener.publish_set(pos=(0.01 * k, 0.002 * k * k, 0.1))


@pytest.fixture
def listener(ctx):
    """The suite's rig beside the node: 64x64 frames, a latched instruction, on the module's context."""
    lst = NodeRig(ctx=ctx, image_size=(64, 64), latched_instruction=True, name="listener")
    yield lst
    lst.close()


@pytest.mark.parametrize("calibration", ["missing", "corrupt", "refused"])
def test_bad_operating_point_fails_start_up_naming_the_file(ctx, files, tmp_path, calibration):
    """A named operating-point file the node cannot apply stops it with the path and the reason:
    the defaults would be a point nobody measured."""
    path = tmp_path / "calibration.json"
    if calibration == "corrupt":
        path.write_text('{"fused_metric": {"tau": "high"')
    if calibration == "refused":
        path.write_text('{"version": 2, "retrieval": {"query_views": 9}}')
    node = None
    try:
        with pytest.raises(CalibrationError, match="calibration.json unusable") as info:
            node = _start(ctx, f"calib_{calibration}", **_params(files, calibration_path=str(path)))
        assert str(path) in str(info.value)
    finally:
        if node is not None:
            node.destroy_node()


def test_database_outage_mid_run_keeps_commanding_in_drafter_mode_and_recovers(ctx, files, listener, qdrant_server):
    """Remote database (real qdrant-client path) stops answering while the node runs: commands keep
    coming (drafter mode, DecodeStats.fallback set, WARN diagnostic, database status ERROR); when
    the server answers again, retrieval resumes without a restart."""
    from heisd_ros.store import make_store

    cfg = StoreConfig(backend="remote", url=qdrant_server.url, timeout_s=0.2, reconnect_backoff_s=0.5,
                      reconnect_max_backoff_s=1.0, task_cache_ttl_s=0.0)  # fmt: skip
    with make_store(cfg, 128, 128, create=True) as s:
        s.upsert(_points(6, 128, 128, 384))
    store = {f"store.{k}": v for k, v in [("backend", "remote"), ("url", cfg.url), ("timeout_s", 0.2),
                                          ("reconnect_backoff_s", 0.5), ("reconnect_max_backoff_s", 1.0),
                                          ("task_cache_ttl_s", 0.0)]}  # fmt: skip
    # watchdog budget 1 s: a step that waits for one request timeout (0.2 s) is still commanded
    node = _start(ctx, "outage", **_params(files, db_path="", image_staleness_s=1.0, pose_staleness_s=1.0,
                                          watchdog_factor=10.0, **store))
    listener.executor.add_node(node)
    try:
        listener.pub_instr.publish(String(data=TASK))
        k = 0

        def run(n_steps: int) -> list:
            nonlocal k
            got = []
            for _ in range(n_steps):
                k += 1
                n0 = len(listener.stats)
                publish_step(listener, k)
                assert listener.wait(lambda n0=n0: len(listener.stats) > n0, 5.0), f"no step {k}"
                got.append(listener.stats[-1])
                time.sleep(0.12)
            return got

        assert [s.mode for s in run(4)][-1] == "retrieval"
        n_cmd, n_diag = len(listener.commands), len(listener.diags)
        qdrant_server.pause()
        during = run(4)
        assert all(s.mode == "drafter" and s.fallback.startswith("database fault") for s in during)
        assert listener.wait(lambda: len(listener.commands) == n_cmd + 4, 2.0)  # every step still commanded
        statuses = lambda: [(st.name, st.level[0], st.message) for d in listener.diags[n_diag:] for st in d.status]  # noqa: E731
        assert listener.wait(lambda: any(name.endswith(": policy") and lvl == 1 and "without retrieval" in m
                                         for name, lvl, m in statuses()), 3.0), statuses()  # fmt: skip
        assert listener.wait(lambda: any(st.name.endswith(": database") and st.level[0] == 2
                                         for d in listener.diags[n_diag:] for st in d.status), 3.0)  # fmt: skip
        qdrant_server.resume()
        time.sleep(1.2)  # > the longest backoff reached
        assert run(2)[-1].mode == "retrieval"
    finally:
        listener.executor.remove_node(node)
        node.destroy_node()


def test_a_model_that_reads_the_finger_gap_commands_only_with_fresh_joint_states(ctx, files, listener, tmp_path):
    """A state token with the finger gap: no joint_states (or only an arm's) -> no command and a
    warning that names the topic; the fingers on joint_states -> commands."""
    import dataclasses

    import torch
    from sensor_msgs.msg import JointState

    from heisd_ros.core.drafter import EagleDrafter
    from heisd_ros.models.loader import tiny_vla, tiny_vla_config

    root = _copy(files, tmp_path)
    cfg = dataclasses.replace(tiny_vla_config(), proprio_dim=3, proprio_mean=(0.0, 0.0, 0.1),
                              proprio_std=(0.1, 0.1, 0.1), proprio_gripper_gap=True)  # fmt: skip
    vla = tiny_vla(seed=0, cfg=cfg)
    vla.save_pretrained(root / "gap_model")
    torch.manual_seed(0)
    EagleDrafter(vla.language_model.config).save(root / "gap_drafter")
    node = _start(ctx, "gap", **_params(root, model_dir=str(root / "gap_model"), drafter_dir=str(root / "gap_drafter"),
                                        image_staleness_s=1.0, pose_staleness_s=1.0, watchdog_factor=10.0))  # fmt: skip
    pub_joints = listener.node.create_publisher(JointState, "joint_states", SENSOR_QOS)
    listener.executor.add_node(node)

    def joints(t: float, names: list[str]) -> JointState:
        msg = JointState(name=names, position=[0.03, -0.03][: len(names)] + [0.1] * (len(names) - 2))
        msg.header.stamp = conv.position_to_pose((0, 0, 0), t).header.stamp
        return msg

    try:
        assert node._session.reads_gap
        listener.pub_instr.publish(String(data=TASK))
        for k in range(6):  # the arm's joints only: still no finger gap
            t = publish_step(listener, k)
            pub_joints.publish(joints(t, [f"panda_joint{i}" for i in range(1, 8)]))
            time.sleep(0.12)
        assert not listener.commands
        assert listener.wait(lambda: any("finger gap" in l.msg and "joint_states" in l.msg and l.level == 30
                                         for l in listener.logs), 3.0), [l.msg for l in listener.logs]  # fmt: skip
        fingers = iter(range(6, 30))  # (the path stays inside the node's 2 m workspace box up to k 31)

        def with_fingers() -> None:
            if (k := next(fingers, None)) is not None:
                t = publish_step(listener, k)
                pub_joints.publish(joints(t, ["panda_finger_joint1", "panda_finger_joint2"]))

        assert listener.stream_until(lambda: len(listener.commands) >= 2, 10.0, publish=with_fingers, period_s=0.12)
        assert node._session.gap is not None and node._session.gap[1] == pytest.approx(0.06)
    finally:
        listener.executor.remove_node(node)
        node.destroy_node()
