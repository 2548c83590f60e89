"""`heisd choose-point`: the operating point from a calibration run, by its fixed rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heisd_ros.core.config import DecoderConfig
from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.calibration import apply_calibration
from heisd_ros.tools.choose_point import PointRule, choose, main
from heisd_ros.pipeline.outputs import file_digest

VARIANTS = ["fast=heisd:verify_skip.min_similarity=0.9,verify_skip.max_consecutive_skips=6",
            "mid=heisd:verify_skip.min_similarity=0.97", "off=heisd:fused_metric.tau=0"]
EPISODES = 50
RULE = PointRule()


def _figures(steps: int, gripper: float, position_p95: float) -> dict:
    return {"steps": steps, "share_equal_to_ar": 0.5, "position_mean_bins": position_p95 / 3,
            "position_p95_bins": position_p95, "rotation_mean_bins": 1.0, "rotation_p95_bins": 4.0,
            "gripper_disagreement": gripper, "unshadowed_steps": 0}


def _row(success: float, mean_ms: float, *, gripper: float = 0.002, position_p95: float = 12.0,
         agree: int = 900, episodes: int = EPISODES, lossy: int = 400, skips: int = 300) -> dict:
    """A report row as eval-libero writes it: success paired against ar's 0.5 on the same episodes;
    `gripper` and `position_p95` are its skip steps' figures, its relaxed steps are further off."""
    by_class = {"relaxed": _figures(lossy - skips, 0.03, 55.0)}
    if skips:
        by_class["skip"] = _figures(skips, gripper, position_p95)
    return {"success_rate": success, "episodes": episodes, "mean_step_ms": mean_ms, "p95_step_ms": 2 * mean_ms,
            "speedup_vs_ar": 100.0 / mean_ms, "lossy_steps": lossy,
            "paired_vs_ar": {"pairs": episodes, "difference": success - 0.5, "difference_ci95": [-0.2, 0.2],
                             "mcnemar_p": 0.5},
            "strict_agreement": {"logged": True, "checked": 900, "agree": agree, "pairs": episodes,
                                 "same_start": episodes},
            "shadow": {"by_class": by_class, "lossy": _figures(lossy, 0.01, 40.0),
                       "all_steps_strict_as_zero": _figures(1000, 0.004, 9.0),
                       "unshadowed_lossy_steps": 0} if lossy else None}


def _report(calibration: Path, **rows) -> dict:
    return {"ar": {"success_rate": 0.5, "episodes": EPISODES, "mean_step_ms": 100.0}, **rows,
            "_meta": {"purpose": "calibration", "variants": VARIANTS, "git_rev": "abc1234", "tasks": [0],
                      "init_states": [20, 21], "model": {"calibration_digest": file_digest(str(calibration))}}}


@pytest.fixture()
def fitted(tmp_path: Path) -> Path:
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps({"fused_metric": {"tau": 0.08}, "verify_skip": {"enabled": True,
                                "min_similarity": 0.999, "max_distance_m": 0.02}, "meta": {"n_points": 5}}))
    return path


def test_fastest_candidate_within_the_success_margin_wins(fitted: Path, tmp_path: Path) -> None:
    # fast is fastest but loses 10 points; mid loses 4 (allowed) and beats plain heisd
    report = _report(fitted, heisd=_row(0.56, 60.0), fast=_row(0.40, 30.0), mid=_row(0.46, 40.0), off=_row(0.5, 50.0))
    name, rows = choose(report, RULE)
    assert name == "mid" and [r["eligible"] for r in rows] == [True, False, True, True]
    assert rows[1]["refused"] == ["success -10% against ar (paired)"]
    run = tmp_path / "run.json"
    run.write_text(json.dumps(report))
    out = tmp_path / "chosen.json"
    assert main(["--run", str(run), "--calibration", str(fitted), "--out", str(out)]) == 0
    chosen = json.loads(out.read_text())
    assert chosen["verify_skip"]["min_similarity"] == 0.97 and chosen["fused_metric"]["tau"] == 0.08
    info = chosen["meta"]["chosen_point"]
    assert info["chosen"] == "mid" and chosen["meta"]["n_points"] == 5 and info["bounds"]["max_position_p95_bins"] == 30
    cfg = apply_calibration(DecoderConfig(), out)
    assert cfg.verify_skip.min_similarity == 0.97 and cfg.fused_metric.tau == 0.08
    # no drop allowed at all leaves plain heisd (the fitted point, unchanged) or off
    assert choose(report, PointRule(max_success_drop=0.0))[0] == "off"


@pytest.mark.parametrize("fault, reason", [
    ({"gripper": 0.02}, "skip-step gripper disagreement 2.00%"),
    ({"gripper": 0.006}, "skip-step gripper disagreement 0.60%"),  # the bound is 0.5 % of skip steps
    ({"position_p95": 31.0}, "skip-step p95 position |delta bin| 31"),
    ({"agree": 899}, "strict-step agreement 899 / 900"),
    ({"episodes": 49}, "49 episodes < 50"),
])
def test_a_fast_candidate_out_of_bounds_loses_to_a_slower_one(fitted: Path, fault: dict, reason: str) -> None:
    report = _report(fitted, heisd=_row(0.5, 60.0), fast=_row(0.5, 30.0, **fault))
    name, rows = choose(report, RULE)
    assert name == "heisd" and reason in rows[1]["refused"][0]
    assert choose(_report(fitted, heisd=_row(0.5, 60.0), fast=_row(0.5, 30.0)), RULE)[0] == "fast"  # control


def test_shadow_required_of_lossy_candidates_only(fitted: Path) -> None:
    unshadowed = _row(0.5, 30.0)
    unshadowed["shadow"] = None
    name, rows = choose(_report(fitted, heisd=_row(0.5, 60.0), fast=unshadowed), RULE)
    assert name == "heisd" and "run with --shadow-ar" in rows[1]["refused"][0]
    # a candidate whose steps were all strict has nothing to shadow
    assert choose(_report(fitted, heisd=_row(0.5, 60.0), fast=_row(0.5, 30.0, lossy=0)), RULE)[0] == "fast"


def test_refusals(fitted: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no candidate meets the rule .fast: success -40%"):
        choose(_report(fitted, fast=_row(0.1, 30.0)), RULE)
    not_calib = _report(fitted, heisd=_row(0.5, 50.0))
    not_calib["_meta"]["purpose"] = "evaluation"
    with pytest.raises(ConfigError, match="not a calibration run"):
        choose(not_calib, RULE)
    bad = _report(fitted, odd=_row(0.5, 50.0))
    bad["_meta"]["variants"] = ["odd=heisd:vision_runtime=\"eager\""]  # how it runs, not the point
    with pytest.raises(ConfigError, match="holds only"):
        choose(bad, RULE)
    run = tmp_path / "run.json"
    run.write_text(json.dumps(_report(fitted, heisd=_row(0.5, 50.0))))
    other = tmp_path / "other.json"
    other.write_text("{}")
    assert main(["--run", str(run), "--calibration", str(other), "--out", str(tmp_path / "x.json")]) == 2
    dirty = _report(fitted, heisd=_row(0.5, 50.0))
    dirty["_meta"]["git_rev"] = "abc1234+dirty"
    run.write_text(json.dumps(dirty))
    assert main(["--run", str(run), "--calibration", str(fitted), "--out", str(tmp_path / "x.json")]) == 2
    assert not (tmp_path / "x.json").exists()


def test_the_bound_applies_to_skip_steps_alone_and_every_class_is_recorded(fitted: Path, tmp_path: Path) -> None:
    """The relaxed steps (55 bins p95, 3 % gripper) are reported, not gated; a candidate without
    skip steps passes the skip bound; each candidate's per-class figures land in meta.chosen_point."""
    report = _report(fitted, heisd=_row(0.5, 60.0), fast=_row(0.5, 30.0, skips=0), mid=_row(0.5, 40.0))
    name, rows = choose(report, RULE)
    assert name == "fast" and all(r["eligible"] for r in rows)
    assert rows[1]["skip_steps"] == 0 and rows[1]["skip_position_p95_bins"] is None
    run = tmp_path / "run.json"
    run.write_text(json.dumps(report))
    out = tmp_path / "chosen.json"
    assert main(["--run", str(run), "--calibration", str(fitted), "--out", str(out)]) == 0
    info = json.loads(out.read_text())["meta"]["chosen_point"]
    assert info["bounds"]["max_gripper_disagreement"] == 0.005 and "skip steps alone" in info["rule"]
    heisd = info["candidates"][0]
    assert (heisd["skip_steps"], heisd["skip_position_p95_bins"], heisd["skip_gripper_disagreement"]) == (300, 12.0, 0.002)
    assert heisd["shadow_by_class"]["relaxed"]["position_p95_bins"] == 55.0
    assert heisd["shadow_by_class"]["skip"]["steps"] == 300 and heisd["shadow_lossy"]["steps"] == 400
    assert set(info["candidates"][1]["shadow_by_class"]) == {"relaxed"}
    # a looser bound is an option of the command
    loose = _report(fitted, heisd=_row(0.5, 60.0), fast=_row(0.5, 30.0, gripper=0.008))
    assert choose(loose, RULE)[0] == "heisd" and choose(loose, PointRule(max_gripper_disagreement=0.01))[0] == "fast"


def test_a_report_without_per_class_figures_is_refused(fitted: Path) -> None:
    old = _row(0.5, 30.0)
    old["shadow"] = {"all": {"steps": 1000, "gripper_disagreement": 0.0, "position_p95_bins": 5.0},
                     "by_mode": {}, "unshadowed_lossy_steps": 0}
    name, rows = choose(_report(fitted, heisd=_row(0.5, 60.0), fast=old), RULE)
    assert name == "heisd" and "per-class shadow figures" in rows[1]["refused"][0]


def test_the_chosen_point_is_written_whole_from_the_run_it_was_measured_in(fitted: Path, tmp_path: Path) -> None:
    """Every setting of the run's decoder configuration, with the candidate's fields, lands in the
    file (retrieval, source choice, gripper hold...), with where it was chosen from."""
    from heisd_ros.core.config import DecoderConfig, RetrievalConfig, to_dict
    from heisd_ros.pipeline.calibration import POINT_VERSION, apply_calibration

    report = _report(fitted, heisd=_row(0.5, 60.0), fast=_row(0.5, 30.0))
    measured = DecoderConfig(retrieval=RetrievalConfig(position_pool=20, query_views=1), gripper_hold_steps=2)
    report["_meta"]["model"]["decoder_config"] = to_dict(measured)
    run = tmp_path / "run.json"
    run.write_text(json.dumps(report))
    out = tmp_path / "chosen.json"
    assert main(["--run", str(run), "--calibration", str(fitted), "--out", str(out)]) == 0
    point = json.loads(out.read_text())
    assert point["version"] == POINT_VERSION
    assert point["chosen_from"]["kind"] == "libero_run" and point["chosen_from"]["candidate"] == "fast"
    applied = apply_calibration(DecoderConfig(), out)
    assert applied.retrieval == measured.retrieval and applied.gripper_hold_steps == 2
    fast = next(v for v in report["_meta"]["variants"] if v.startswith("fast="))
    for path, value in (kv.split("=", 1) for kv in fast.split(":", 1)[1].split(",")):
        section, field = path.split(".")
        assert point[section][field] == json.loads(value)
