"""heisd demo end to end: the real (tiny) policy behind the real node, replayed over ROS 2 topics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heisd_ros.core.errors import ConfigError
from heisd_ros.tools import cli
from heisd_ros.tools.demo import DemoConfig

pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 63
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_tiny(tmp_path_factory):
    """A smaller build of the tiny policy than `model_dir: tiny` (same code, fewer training steps)."""
    import torch

    from heisd_ros.models.tiny_artifacts import build_tiny_artifacts

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_tiny_artifacts(tmp_path_factory.mktemp("tiny"), n_episodes=2, n_steps=16, vla_steps=40,
                                    drafter_steps=40)  # fmt: skip
    finally:
        torch.set_num_threads(threads)


def test_demo_runs_methods_side_by_side(small_tiny, tmp_path, capsys):
    out = tmp_path / "demo"
    argv = ["demo", "--model-dir", str(small_tiny / "model"), "--drafter-dir", str(small_tiny / "drafter"),
            "--db-path", str(small_tiny / "db"), "--calibration-path", str(small_tiny / "calibration.json"),
            "--methods", "ar,heisd", "--steps", "8", "--out", str(out), "--domain-id", str(DOMAIN_ID),
            "--params-file", str(REPO / "config" / "policy.yaml"), "--json", str(tmp_path / "r.json")]  # fmt: skip
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "[heisd] step    8/8" in printed and "speed-up over ar" in printed
    result = json.loads((tmp_path / "r.json").read_text())
    rows = result["methods"]
    for m in ("ar", "heisd"):
        assert rows[m]["bag_steps"] == 8 and rows[m]["decoded_steps"] == 8 and rows[m]["commands"] == 8
        assert rows[m]["timeouts"] == 0
    assert rows["ar"]["forwards_per_step"] == 7.0 and set(rows["ar"]["mode_mix"]) == {"ar"}
    assert rows["heisd"]["forwards_per_step"] < 7.0
    assert set(rows["heisd"]["mode_mix"]) <= {"drafter", "retrieval", "skip"}
    run_dir = Path(result["run_dir"])
    assert (run_dir / "input").is_dir() and (run_dir / "output").is_dir() and (run_dir / "result.json").is_file()


def test_demo_config_validation():
    with pytest.raises(ConfigError):
        DemoConfig(methods=("fast",))
    with pytest.raises(ConfigError):
        DemoConfig(steps=0)


def test_demo_reports_a_bad_model_dir(tmp_path, capsys):
    argv = ["--model-dir", str(tmp_path / "no_model"), "--methods", "ar", "--steps", "2", "--out", str(tmp_path),
            "--domain-id", str(DOMAIN_ID), "--params-file", str(REPO / "config" / "policy.yaml")]  # fmt: skip
    from heisd_ros.tools import demo

    assert demo.main(argv) == 2
    assert "no_model" in capsys.readouterr().err
