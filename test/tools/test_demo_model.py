"""heisd demo's choice of policy and input bag (`--model auto`, `--scene`), without running the node."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from heisd_ros.core.errors import ConfigError
from heisd_ros.tools import demo
from heisd_ros.tools.demo import MINI_ARTIFACTS, DemoConfig, libero_bag, resolve


def _fake_mini(root: Path) -> None:
    for key, rel in MINI_ARTIFACTS.items():
        p = root / rel
        if key == "calibration_path":
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("{}")
        else:
            p.mkdir(parents=True)
    (root / MINI_ARTIFACTS["model_dir"] / "config.json").write_text("{}")


def test_auto_uses_tiny_without_mini_artifacts(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = resolve(DemoConfig())
    assert (cfg.model_dir, cfg.scene, cfg.db_path) == ("tiny", "synthetic", "")


def test_auto_uses_mini_artifacts_and_a_libero_bag(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _fake_mini(tmp_path)
    cfg = resolve(DemoConfig())
    assert cfg.scene == "libero"
    assert {k: getattr(cfg, k) for k in MINI_ARTIFACTS} == MINI_ARTIFACTS
    # explicit choices win
    assert resolve(DemoConfig(scene="synthetic")).scene == "synthetic"
    assert resolve(DemoConfig(model_dir="tiny")).model_dir == "tiny"
    assert resolve(DemoConfig(db_path="other_db")).db_path == "other_db"
    # a partial pipeline (no database yet) falls back to tiny
    (tmp_path / MINI_ARTIFACTS["db_path"]).rmdir()
    assert resolve(DemoConfig()).model_dir == "tiny"


def test_model_flag_and_validation() -> None:
    p = demo._parser()
    assert p.parse_args(["--model", "tiny"]).model_dir == "tiny"
    assert p.parse_args(["--model-dir", "d"]).model_dir == "d"
    assert p.parse_args([]).model_dir == "auto"
    with pytest.raises(ConfigError):
        DemoConfig(scene="kitchen")
    with pytest.raises(ConfigError):
        DemoConfig(libero_init_state=3)  # demonstration init states are not used for the demo


def test_libero_bag_is_reused(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    bag = tmp_path / demo.DEMO_BAGS / "libero_object_task0_init41"
    bag.mkdir(parents=True)
    meta = ("rosbag2_bagfile_information:\n  topics_with_message_count:\n"
            "    - topic_metadata: {name: /ee_pose}\n      message_count: 117\n"
            "    - topic_metadata: {name: /instruction}\n      message_count: 1\n")
    (bag / "metadata.yaml").write_text(meta + "    - topic_metadata: {name: /joint_states}\n      message_count: 117\n")
    path, steps = libero_bag(DemoConfig(libero_init_state=40), say=lambda m: None)
    assert path == demo.DEMO_BAGS / "libero_object_task0_init41" and steps == 117


def test_a_cached_bag_without_the_finger_joints_is_recorded_again(tmp_path, monkeypatch) -> None:
    """Bags cached before the export carried /joint_states would starve a model that reads the gap."""
    libero_env = pytest.importorskip("heisd_libero.sim.libero_env", reason="records with the LIBERO workbench")

    class Recording(Exception):
        pass

    def no_sim(*args, **kwargs):
        raise Recording

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(libero_env, "LiberoEnv", no_sim)
    bag = tmp_path / demo.DEMO_BAGS / "libero_object_task0_init40"
    bag.mkdir(parents=True)
    (bag / "metadata.yaml").write_text(
        "rosbag2_bagfile_information:\n  topics_with_message_count:\n"
        "    - topic_metadata: {name: /ee_pose}\n      message_count: 117\n")
    said = []
    with pytest.raises(Recording):
        libero_bag(DemoConfig(libero_init_state=40), say=said.append)
    assert not bag.exists() and any("/joint_states" in m for m in said)


def test_without_the_workbench_auto_skips_the_committed_policy_and_libero_says_what_to_install(
        tmp_path, monkeypatch) -> None:
    """A node-only install: `--model auto` runs the tiny policy on a synthetic bag (the committed
    mini policy's database and bag are recorded in LIBERO), and an explicit LIBERO scene names the
    workbench's install command."""
    from heisd_ros.core.errors import MissingDependencyError
    from heisd_ros.pipeline import optional

    monkeypatch.chdir(tmp_path)
    _fake_published(tmp_path)
    monkeypatch.setattr(demo, "installed", lambda module: module != "heisd_libero")
    for name in [m for m in sys.modules if m.split(".")[0] == "heisd_libero"] + ["heisd_libero"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it fails, as when it is not installed
    for name in ("MUJOCO_GL", "PYOPENGL_PLATFORM"):  # libero_bag sets them for the simulator
        monkeypatch.delenv(name, raising=False)
    cfg = resolve(DemoConfig())
    assert (cfg.model_dir, cfg.scene) == ("tiny", "synthetic")
    with pytest.raises(MissingDependencyError, match="heisd_libero") as err:
        libero_bag(DemoConfig(), say=lambda m: None)
    assert optional.WORKBENCH_INSTALL in str(err.value)


def _fake_published(root: Path) -> None:
    from heisd_ros.pipeline.libero_runs import published_paths

    p = published_paths(root / "models" / "mini_libero")
    p["model_dir"].mkdir(parents=True)
    (p["model_dir"] / "config.json").write_text("{}")
    p["drafter_dir"].mkdir(parents=True)
    (p["drafter_dir"] / "drafter.safetensors").write_bytes(b"")
    p["calibration_path"].write_text("{}")


def test_auto_uses_the_committed_mini_policy_with_a_task_database(tmp_path, monkeypatch) -> None:
    pytest.importorskip("heisd_libero", reason="the committed policy's database is built with the LIBERO workbench")
    monkeypatch.chdir(tmp_path)
    _fake_published(tmp_path)
    cfg = resolve(DemoConfig(libero_task=3))
    assert cfg.model_dir == "models/mini_libero/vla" and cfg.drafter_dir == "models/mini_libero/drafter"
    assert cfg.calibration_path == "models/mini_libero/calibration.json"
    assert cfg.db_path == str(demo.PUBLISHED_DB / "libero_object_task3") and cfg.scene == "libero"
    # the pipeline's own artifacts win over the committed copy
    _fake_mini(tmp_path)
    assert resolve(DemoConfig()).model_dir == MINI_ARTIFACTS["model_dir"]


REPO = Path(__file__).resolve().parents[2]


def test_committed_mini_policy_matches_its_manifest_and_decodes() -> None:
    """models/mini_libero (what `make demo` runs on a fresh clone): every file has the digest its
    manifest records, its config loads with the state prior, and the policy decodes a step of
    real-shaped input without a database. (Older checkpoints' retired keys: test_loader.py.)"""
    import hashlib
    import json

    import numpy as np
    import torch

    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.drafter import load_drafter
    from heisd_ros.core.engine import HybridDecoder
    from heisd_ros.core.types import Observation
    from heisd_ros.models.loader import load_policy_model
    from heisd_ros.policy import PolicyPaths, load_policy
    from heisd_ros.pipeline.libero_runs import PUBLISHED_DIR, published_paths, published_present

    root = REPO / PUBLISHED_DIR
    if not published_present(root):
        pytest.skip("models/mini_libero not committed in this checkout")
    manifest = json.loads((root / "manifest.json").read_text())
    for rel, digest in manifest["files"].items():
        assert hashlib.sha256((root / rel).read_bytes()).hexdigest() == digest, rel
    torch.set_num_threads(1)
    paths = published_paths(root)
    vla, prior = load_policy_model(paths["model_dir"])
    assert prior is not None and not vla.reads_gripper_gap
    drafter = load_drafter(paths["drafter_dir"], vla.language_model.config)
    rng = np.random.default_rng(0)
    obs = Observation({v: rng.integers(0, 255, (128, 128, 3), dtype=np.uint8) for v in ("agentview", "wrist")},
                      "pick up the alphabet soup and place it in the basket", np.array([-0.1, 0.0, 0.25]),
                      gripper_gap=0.04)  # the shipped policy's state prior reads the finger gap
    ar = HybridDecoder(vla, DecoderConfig(method="ar"), state_prior=prior)
    dec = HybridDecoder(vla, DecoderConfig(method="drafter"), drafter=drafter, state_prior=prior)
    action, st = ar.step(obs)
    assert st.llm_forwards == 7 and action.shape == (7,) and np.all(np.isfinite(action))
    assert dec.step(obs)[1].tokens == st.tokens  # strict drafter SD is lossless on the real weights
    # the node's loader hands the prior to the decoder: the same tokens as above
    policy = load_policy(PolicyPaths(str(paths["model_dir"]), str(paths["drafter_dir"])), DecoderConfig(method="drafter"))
    assert policy.state_prior is not None and policy.reads_finger_gap
    assert policy.step(obs)[1].tokens == st.tokens
