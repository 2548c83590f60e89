"""heisd-libero skip-checks: the agreement checks chosen from a shadowed run's skip steps, by a fixed rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heisd_ros.core.config import DecoderConfig
from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.calibration import apply_calibration, complete_point
from heisd_ros.pipeline.outputs import file_digest
from heisd_libero.skip_checks import candidates, choose, main, skip_steps


def _skip(position_off: int, spread: float | None, verified: float | None, gripper_differs: bool = False) -> dict:
    tokens = [100, 100, 100, 120, 120, 120, 255]
    shadow = [100 + position_off, 100, 100, 120, 120, 120, 31 if gripper_differs else 255]
    step = {"t": 5, "mode": "skip", "skipped": True, "strict": False, "tokens": tokens, "shadow": shadow}
    if spread is not None:
        step["skip_spread"] = spread
    if verified is not None:
        step["skip_from_verified"] = verified
    return step


def _episodes() -> list[dict]:
    """40 skips near ar whose measures are small, 10 far from ar that only the from-verified check
    sees (their hits agree with each other), and a strict step that is no skip."""
    near = [_skip(2, 4.0, 5.0) for _ in range(40)]
    far = [_skip(90, 4.0, 60.0) for _ in range(10)]
    strict = {"t": 0, "mode": "drafter", "skipped": False, "strict": True, "tokens": [0] * 7}
    return [{"method": "heisd", "steps": near + far + [strict]}, {"method": "ar", "steps": [_skip(200, 1, 1)]}]


def test_the_check_that_separates_far_skips_wins_and_keeps_the_most():
    steps = skip_steps(_episodes(), "heisd")
    assert len(steps) == 50
    rows = candidates(steps, (0, 8, 30), max_p95=24, max_gripper=0.005)
    off = next(r for r in rows if r["max_hit_spread_bins"] == 0 and r["max_bins_from_verified"] == 0)
    assert not off["eligible"] and off["position_p95_bins"] == pytest.approx(90)
    best = choose(rows)
    # spread alone keeps the far skips; from-verified 8 and 30 both drop them: the looser (30) wins the tie
    assert (best["max_hit_spread_bins"], best["max_bins_from_verified"], best["kept_skips"]) == (0, 30, 40)
    assert best["position_p95_bins"] == pytest.approx(2)


def test_a_missing_measure_refuses_and_no_eligible_pair_is_an_error():
    steps = skip_steps([{"method": "heisd", "steps": [_skip(90, None, None)] * 5}], "heisd")
    rows = candidates(steps, (0, 8), max_p95=24, max_gripper=0.005)
    assert all(r["kept_skips"] == 0 for r in rows if r["max_bins_from_verified"] or r["max_hit_spread_bins"])
    with pytest.raises(ConfigError, match="no pair"):
        choose(rows)


def test_cli_writes_the_whole_point_with_the_chosen_checks(tmp_path: Path):
    point = tmp_path / "point.json"
    point.write_text(json.dumps(complete_point({}, DecoderConfig())))
    log = tmp_path / "run.jsonl"
    key = {"kind": "run", "key": {"purpose": "calibration", "calibration_digest": file_digest(str(point)),
                                  "git_rev": "abc1234"}}
    lines = [key] + [{"kind": "episode", "task": 0, "init_state": 20, **e} for e in _episodes()]
    log.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = tmp_path / "chosen.json"
    assert main(["--log", str(log), "--point", str(point), "--out", str(out), "--grid", "0,8,30"]) == 0
    cfg = apply_calibration(DecoderConfig(), out)
    assert (cfg.verify_skip.max_hit_spread_bins, cfg.verify_skip.max_bins_from_verified) == (0, 30)
    written = json.loads(out.read_text())
    assert written["chosen_from"]["run_git_rev"] == "abc1234" and written["meta"]["skip_checks"]["skip_steps"] == 50
    assert written["meta"]["skip_checks"]["command"].startswith("heisd-libero skip-checks --log")
    # a point other than the run's is refused
    other = tmp_path / "other.json"
    other.write_text(json.dumps(complete_point({"fused_metric": {"tau": 0.3}}, DecoderConfig())))
    assert main(["--log", str(log), "--point", str(other), "--out", str(out)]) == 2
