"""`heisd choose-point`: the operating point from a calibration run, by its fixed rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.calibration import apply_calibration
from heisd_ros.core.config import DecoderConfig
from heisd_ros.tools.choose_point import choose, main
from heisd_ros.tools.eval_policies import file_digest

VARIANTS = ["fast=heisd:verify_skip.min_similarity=0.9,verify_skip.max_consecutive_skips=6",
            "mid=heisd:verify_skip.min_similarity=0.97", "off=heisd:fused_metric.tau=0"]


def _row(success: float, mean_ms: float) -> dict:
    return {"success_rate": success, "episodes": 20, "mean_step_ms": mean_ms, "p95_step_ms": 2 * mean_ms,
            "speedup_vs_ar": 100.0 / mean_ms}


def _report(calibration: Path, **rows) -> dict:
    return {"ar": _row(0.5, 100.0), **rows,
            "_meta": {"purpose": "calibration", "variants": VARIANTS, "git_rev": "abc", "tasks": [0],
                      "init_states": [20, 21], "model": {"calibration_digest": file_digest(str(calibration))}}}


@pytest.fixture()
def fitted(tmp_path: Path) -> Path:
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps({"fused_metric": {"tau": 0.08}, "verify_skip": {"enabled": True,
                                "min_similarity": 0.999, "max_distance_m": 0.02}, "meta": {"n_points": 5}}))
    return path


def test_fastest_candidate_within_the_success_margin_wins(fitted: Path, tmp_path: Path) -> None:
    # fast is fastest but loses 10 points; mid loses 5 (allowed) and beats plain heisd
    report = _report(fitted, heisd=_row(0.55, 60.0), fast=_row(0.40, 30.0), mid=_row(0.45, 40.0), off=_row(0.5, 50.0))
    name, rows = choose(report, 5.0)
    assert name == "mid" and [r["eligible"] for r in rows] == [True, False, True, True]
    run = tmp_path / "run.json"
    run.write_text(json.dumps(report))
    out = tmp_path / "chosen.json"
    assert main(["--run", str(run), "--calibration", str(fitted), "--out", str(out)]) == 0
    chosen = json.loads(out.read_text())
    assert chosen["verify_skip"]["min_similarity"] == 0.97 and chosen["fused_metric"]["tau"] == 0.08
    assert chosen["meta"]["chosen_point"]["chosen"] == "mid" and chosen["meta"]["n_points"] == 5
    cfg = apply_calibration(DecoderConfig(), out)
    assert cfg.verify_skip.min_similarity == 0.97 and cfg.fused_metric.tau == 0.08
    # a stricter margin leaves plain heisd (the fitted point, unchanged) or off
    assert choose(report, 0.0)[0] == "off"


def test_refusals(fitted: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no candidate"):
        choose(_report(fitted, fast=_row(0.1, 30.0)), 5.0)
    not_calib = _report(fitted, heisd=_row(0.5, 50.0))
    not_calib["_meta"]["purpose"] = "evaluation"
    with pytest.raises(ConfigError, match="not a calibration run"):
        choose(not_calib, 5.0)
    bad = _report(fitted, odd=_row(0.5, 50.0))
    bad["_meta"]["variants"] = ["odd=heisd:gripper_hold_steps=3"]
    with pytest.raises(ConfigError, match="holds only"):
        choose(bad, 5.0)
    run = tmp_path / "run.json"
    run.write_text(json.dumps(_report(fitted, heisd=_row(0.5, 50.0))))
    other = tmp_path / "other.json"
    other.write_text("{}")
    assert main(["--run", str(run), "--calibration", str(other), "--out", str(tmp_path / "x.json")]) == 2
