"""heisd demo end to end: the real (tiny) policy behind the real node, replayed over ROS 2 topics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heisd_ros.core.errors import ConfigError
from heisd_ros.tools import cli
from heisd_ros.tools.demo import DemoConfig

pytestmark = pytest.mark.slow  # end to end: the demo pipeline end to end

pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")

DOMAIN_ID = 63
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small_tiny(tmp_path_factory):
    """A smaller build of the tiny policy than `model_dir: tiny` (same code, fewer training steps)."""
    import torch

    from heisd_ros.pipeline.tiny_artifacts import build_tiny_artifacts

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
    # each method's node is warmed up before its measured steps; no step waits for a timeout
    assert printed.count("warm-up: the bag's first 8 step(s) decoded unmeasured") == 2 and "within the step timeout" not in printed
    result = json.loads((tmp_path / "r.json").read_text())
    rows = result["methods"]
    for m in ("ar", "heisd"):
        assert rows[m]["bag_steps"] == 8 and rows[m]["decoded_steps"] == 8 and rows[m]["commands"] == 8
        assert rows[m]["timeouts"] == 0
    assert rows["ar"]["forwards_per_step"] == 7.0 and set(rows["ar"]["mode_mix"]) == {"ar"}
    assert rows["heisd"]["forwards_per_step"] < 7.0
    assert rows["heisd"]["speedup_vs_ar"] == pytest.approx(rows["ar"]["mean_step_ms"] / rows["heisd"]["mean_step_ms"])
    assert rows["heisd"]["speedup_vs_ar_ci95"] is None and "no interval (1 episode)" in printed  # a one-episode bag
    assert set(rows["heisd"]["mode_mix"]) <= {"drafter", "retrieval", "skip"}
    run_dir = Path(result["run_dir"])
    assert (run_dir / "input").is_dir() and (run_dir / "output").is_dir() and (run_dir / "result.json").is_file()
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == ["action_traces.png", "latency_histogram.png",
                                                                     "mode_timeline.png"]  # fmt: skip


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


def _replay_cfg(tmp_path, small_tiny, **kw):
    from heisd_ros.tools import replay as rp

    params = (f"model_dir:={small_tiny / 'model'}", f"drafter_dir:={small_tiny / 'drafter'}",
              f"db_path:={small_tiny / 'db'}", f"calibration_path:={small_tiny / 'calibration.json'}",
              "image_staleness_s:=5.0", "pose_staleness_s:=5.0", "diagnostics_period_s:=0.2")  # fmt: skip
    base = dict(fast=True, start_node=True, out=str(tmp_path / "out"), domain_id=DOMAIN_ID, quiet=True,
                params_file=str(REPO / "config" / "policy.yaml"), params=params, settle_s=0.5)  # fmt: skip
    base.update(kw)
    base["params"] = base["params"] + tuple(kw.get("extra", ()))
    base.pop("extra", None)
    return rp.ReplayConfig(**base)


def test_real_policy_unknown_task_gives_no_command_and_a_warning_diagnostic(small_tiny, tmp_path):
    """The real decoder's database lacks the task: the instruction is refused once (a warning naming
    the task), no step is decoded or commanded; the replay stops waiting after 3 silent steps."""
    from heisd_ros.tools import replay as rp
    from heisd_ros.tools.make_bag import MakeBagConfig, make_bag

    bag = tmp_path / "unknown"
    make_bag(bag, MakeBagConfig(steps=3, instruction="juggle three oranges"))
    cfg = _replay_cfg(tmp_path, small_tiny, step_timeout_s=0.6, extra=("decoder.method:=retrieval",))
    result = rp.replay(bag, cfg)
    row = result["methods"]["retrieval"]
    assert row["commands"] == 0 and row["decoded_steps"] == 0 and row["timeouts"] == 3
    assert "no_instruction:" in row["rejected"] and "unknown_task:" not in row["rejected"]
    got = _read(Path(cfg.out))
    levels = [(int(s.level), s.message) for _, d in got["/diagnostics"] for s in d.status if s.name.endswith(": policy")]
    assert any(lvl == 1 and "unknown task" in msg and "juggle three oranges" in msg for lvl, msg in levels), levels
    assert not any(lvl == 2 for lvl, _ in levels), levels


def test_real_policy_missing_database_fails_start_up_with_reason(small_tiny, tmp_path):
    from heisd_ros.core.errors import DatabaseError
    from heisd_ros.tools import replay as rp
    from heisd_ros.tools.make_bag import MakeBagConfig, make_bag

    bag = tmp_path / "bag"
    make_bag(bag, MakeBagConfig(steps=2))
    cfg = _replay_cfg(tmp_path, small_tiny, extra=(f"db_path:={tmp_path / 'no_db'}",))
    with pytest.raises(DatabaseError, match="no_db"):
        rp.replay(bag, cfg)


def _read(out: Path) -> dict[str, list]:
    from heisd_ros.pipeline.bags import read_messages

    got: dict[str, list] = {}
    for r in read_messages(out):
        got.setdefault(r.topic, []).append((r.msgtype, r.msg))
    return got
