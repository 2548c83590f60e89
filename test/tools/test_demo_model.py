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
    (bag / "metadata.yaml").write_text(
        "rosbag2_bagfile_information:\n  topics_with_message_count:\n"
        "    - topic_metadata: {name: /ee_pose}\n      message_count: 117\n"
        "    - topic_metadata: {name: /instruction}\n      message_count: 1\n")
    path, steps = libero_bag(DemoConfig(libero_init_state=40), say=lambda m: None)
    assert path == demo.DEMO_BAGS / "libero_object_task0_init41" and steps == 117
