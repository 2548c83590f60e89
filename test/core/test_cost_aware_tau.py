"""Cost-aware tau (`calibrate(tau_rule="cost")`): the boundary with the least expected step time."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from heisd_ros.pipeline.calibration import StepCosts, cheapest_threshold, expected_step_ms
from heisd_ros.core.errors import ConfigError

COSTS = StepCosts(drafter_ms=60.0, retrieval_pass_ms=40.0, retrieval_fail_ms=90.0)
# break-even pass rate: p * 40 + (1 - p) * 90 = 60  ->  p = 0.6


def test_expected_step_time_counts_each_mode():
    f = np.array([0.1, 0.5, 0.9])
    ok = np.array([False, True, False])
    assert expected_step_ms(f, ok, 0.95, COSTS) == pytest.approx(60.0)  # all drafter
    assert expected_step_ms(f, ok, 0.0, COSTS) == pytest.approx((90 + 40 + 90) / 3)  # all retrieval
    assert expected_step_ms(f, ok, 0.5, COSTS) == pytest.approx((60 + 40 + 90) / 3)


def test_retrieval_everywhere_when_drafts_pass_often_enough_even_if_f_does_not_separate():
    rng = np.random.default_rng(0)
    f = rng.uniform(0, 1, 4000)
    ok = rng.uniform(size=f.size) < 0.75  # independent of F, above the 0.6 break-even
    assert cheapest_threshold(f, ok, COSTS, default=0.5) == 0.0


def test_no_retrieval_when_drafts_rarely_pass():
    rng = np.random.default_rng(1)
    f = rng.uniform(0, 1, 4000)
    ok = rng.uniform(size=f.size) < 0.3
    assert cheapest_threshold(f, ok, COSTS, default=0.5) > f.max()


def test_planted_boundary_is_found():
    """Drafts pass 95 % above F = 0.6 and 20 % below: the cheapest tau sits at the boundary."""
    rng = np.random.default_rng(2)
    f = rng.uniform(0, 1, 8000)
    ok = rng.uniform(size=f.size) < np.where(f >= 0.6, 0.95, 0.2)
    tau = cheapest_threshold(f, ok, COSTS, default=0.5)
    assert 0.55 <= tau <= 0.65
    assert expected_step_ms(f, ok, tau, COSTS) < min(expected_step_ms(f, ok, t, COSTS) for t in (0.0, 0.3, 0.8, 1.1))


def test_bad_costs_are_refused():
    with pytest.raises(ConfigError):
        StepCosts(0.0, 40.0, 90.0)
    with pytest.raises(ConfigError):
        StepCosts(60.0, float("nan"), 90.0)


def _step(mode: str, forwards: int, total: float) -> dict:
    return {"mode": mode, "forwards": forwards, "ms": {"total": total}}


def test_step_costs_are_measured_from_an_eval_log(tmp_path):
    from heisd_ros.pipeline.libero_runs import step_costs

    steps = [_step("drafter", 3, 60.0), _step("drafter", 2, 70.0), _step("drafter", 2, 65.0),
             _step("retrieval", 1, 40.0), _step("retrieval", 1, 44.0), _step("retrieval", 3, 90.0),
             _step("skip", 0, 20.0)]
    records = [{"kind": "run", "key": {}},
               {"kind": "episode", "method": "heisd", "steps": steps},
               {"kind": "episode", "method": "ar", "steps": [_step("ar", 7, 500.0)]}]
    path = tmp_path / "log.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    assert step_costs(path) == StepCosts(65.0, 42.0, 90.0)
    with pytest.raises(ConfigError, match="no ar steps"):
        step_costs(path, method="ar")
    (tmp_path / "bad.jsonl").write_text("not json\n")
    with pytest.raises(ConfigError, match="not a readable"):
        step_costs(tmp_path / "bad.jsonl")


def test_calibrate_cli_needs_costs_for_the_cost_rule():
    from heisd_ros.tools.calibrate import CalibrateConfig

    with pytest.raises(ConfigError, match="step-costs"):
        CalibrateConfig(tau_rule="cost")
    with pytest.raises(ConfigError, match="three values"):
        CalibrateConfig(tau_rule="cost", step_costs_ms=(1.0, 2.0))
    assert CalibrateConfig(tau_rule="cost", step_costs_ms=(60.0, 40.0, 90.0)).costs() == COSTS


def test_calibrate_refuses_the_cost_rule_without_costs_and_unknown_rules():
    from heisd_ros.pipeline.calibration import calibrate
    from heisd_ros.core.config import FusedMetricConfig

    with pytest.raises(ConfigError, match="step_costs"):
        calibrate([], FusedMetricConfig(), tau_rule="cost")
    with pytest.raises(ConfigError, match="tau_rule"):
        calibrate([], FusedMetricConfig(), tau_rule="fastest")
