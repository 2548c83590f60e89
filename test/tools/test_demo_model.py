"""heisd demo's choice of policy and input bag (`--model auto`, `--scene`), without running the node."""

from __future__ import annotations

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
    import heisd_ros.sim.libero_env as libero_env

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


def _fake_published(root: Path) -> None:
    from heisd_ros.pipeline.libero_runs import published_paths

    p = published_paths(root / "models" / "mini_libero")
    p["model_dir"].mkdir(parents=True)
    (p["model_dir"] / "config.json").write_text("{}")
    p["drafter_dir"].mkdir(parents=True)
    (p["drafter_dir"] / "drafter.safetensors").write_bytes(b"")
    p["calibration_path"].write_text("{}")


def test_auto_uses_the_committed_mini_policy_with_a_task_database(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    _fake_published(tmp_path)
    cfg = resolve(DemoConfig(libero_task=3))
    assert cfg.model_dir == "models/mini_libero/vla" and cfg.drafter_dir == "models/mini_libero/drafter"
    assert cfg.calibration_path == "models/mini_libero/calibration.json"
    assert cfg.db_path == str(demo.PUBLISHED_DB / "libero_object_task3") and cfg.scene == "libero"
    # the pipeline's own artifacts win over the committed copy
    _fake_mini(tmp_path)
    assert resolve(DemoConfig()).model_dir == MINI_ARTIFACTS["model_dir"]


def test_publish_mini_round_trip(tmp_path) -> None:
    """publish-mini writes bf16 weights that load and decode like the source (same greedy tokens
    on most inputs: rounding to bf16 may move a near-tie), plus a manifest of digests."""
    import json

    import numpy as np
    import torch

    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.drafter import EagleDrafter, load_drafter
    from heisd_ros.core.engine import HybridDecoder
    from heisd_ros.models.loader import load_vla, tiny_vla
    from heisd_ros.pipeline.synthetic_demos import random_observation
    from heisd_ros.pipeline.libero_runs import published_paths, published_present
    from heisd_ros.tools.publish_mini import PublishConfig, publish

    torch.set_num_threads(1)
    vla = tiny_vla(seed=2)
    vla.save_pretrained(tmp_path / "vla")
    EagleDrafter(vla.language_model.config).save(tmp_path / "drafter")
    from heisd_ros.pipeline.calibration import complete_point

    def point(tau: float) -> str:  # a complete operating point at this tau
        return json.dumps(complete_point({"fused_metric": {"tau": tau}}, DecoderConfig()))

    (tmp_path / "cal.json").write_text(point(0.5))
    out = tmp_path / "pub"
    manifest = publish(PublishConfig(str(tmp_path / "vla"), str(tmp_path / "drafter"), str(tmp_path / "cal.json"), str(out)))
    assert published_present(out) and (out / "manifest.json").is_file()
    assert set(manifest["files"]) >= {"vla/model.safetensors", "drafter/drafter.safetensors", "calibration.json"}
    paths = published_paths(out)
    back = load_vla(paths["model_dir"])
    assert all(p.dtype == torch.float32 for p in back.parameters())  # loaded into the asked dtype
    load_drafter(paths["drafter_dir"], back.language_model.config)
    same = 0
    a, b = HybridDecoder(vla, DecoderConfig(method="ar")), HybridDecoder(back, DecoderConfig(method="ar"))
    for seed in range(6):
        obs = random_observation(seed)
        same += a.step(obs)[1].tokens == b.step(obs)[1].tokens
    assert same >= 4
    (tmp_path / "partial.json").write_text(json.dumps({"fused_metric": {"tau": 0.5}, "verify_skip": {}}))
    with pytest.raises(ConfigError, match="not a complete operating point"):
        publish(PublishConfig(str(tmp_path / "vla"), str(tmp_path / "drafter"), str(tmp_path / "partial.json"), str(out)))
    with pytest.raises(ConfigError, match="complete operating point"):
        (tmp_path / "bad.json").write_text("[]")
        publish(PublishConfig(str(tmp_path / "vla"), str(tmp_path / "drafter"), str(tmp_path / "bad.json"), str(out)))
    assert published_present(out)  # a refused publish leaves the old copy
    np.testing.assert_equal(json.loads((out / "calibration.json").read_text())["fused_metric"]["tau"], 0.5)

    # --calibration-only: the new point replaces the old, the weights keep their bytes, the manifest follows
    import hashlib

    from heisd_ros.tools.publish_mini import main as publish_main
    (tmp_path / "point.json").write_text(point(0.02))
    assert publish_main(["--calibration-only", "--calibration", str(tmp_path / "point.json"), "--out", str(out)]) == 0
    after = json.loads((out / "manifest.json").read_text())
    assert json.loads((out / "calibration.json").read_text())["fused_metric"]["tau"] == 0.02
    assert after["files"]["vla/model.safetensors"] == manifest["files"]["vla/model.safetensors"]
    assert after["files"]["calibration.json"] != manifest["files"]["calibration.json"]
    for rel, digest in after["files"].items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest, rel
    assert "--calibration-only" in after["calibration_update"]["command"]
    assert publish_main(["--calibration-only", "--calibration", str(tmp_path / "bad.json"), "--out", str(out)]) == 2
    assert publish_main(["--calibration-only", "--calibration", str(tmp_path / "point.json"),
                         "--out", str(tmp_path / "nothing")]) == 2
    assert json.loads((out / "calibration.json").read_text())["fused_metric"]["tau"] == 0.02


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
