"""eval-libero's method variants, calibration runs and subset methods (no simulator, no model);
the variant specs themselves: test/pipeline/test_method_variants.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.method_variants import parse_variants

from heisd_libero.eval_libero import EvalLiberoConfig, main
from heisd_libero.eval_report import ResultLog


def test_calibration_runs_use_init_states_20_to_39_only() -> None:
    EvalLiberoConfig(init_states=(20, 39), purpose="calibration")
    for states, purpose in (((40,), "calibration"), ((19,), "calibration"), ((20,), "evaluation")):
        with pytest.raises(ConfigError, match="refused"):
            EvalLiberoConfig(init_states=states, purpose=purpose)
    with pytest.raises(ConfigError):
        EvalLiberoConfig(purpose="tuning")


def test_methods_may_name_variants_and_subsets_must_fit() -> None:
    variants = parse_variants("heisd_tau0=heisd:fused_metric.tau=0")
    cfg = EvalLiberoConfig(methods=("ar", "heisd"), variants=variants, subset_methods=("heisd_tau0",),
                           init_states=(40, 41), subset_init_states=(40,))
    assert cfg.methods_at(40) == ["ar", "heisd", "heisd_tau0"] and cfg.methods_at(41) == ["ar", "heisd"]
    assert len(cfg.triples()) == 10 * (2 * 2 + 1)  # 10 tasks
    with pytest.raises(ConfigError):  # a variant name that was not defined
        EvalLiberoConfig(methods=("ar", "heisd_tau0"))
    with pytest.raises(ConfigError):  # subset init states outside the run's
        EvalLiberoConfig(variants=variants, subset_methods=("heisd_tau0",), init_states=(40,),
                         subset_init_states=(41,))
    with pytest.raises(ConfigError):  # a method in both lists
        EvalLiberoConfig(methods=("ar", "heisd"), subset_methods=("heisd",), init_states=(40,),
                         subset_init_states=(40,))


def _step(ms: float, tokens=(1,) * 7) -> dict:
    return {"t": 0, "mode": "ar", "skipped": False, "forwards": 7, "tpf": [1] * 7, "ms": {"total": ms},
            "cpu_ms": ms, "sim_ms": 1.0, "F": 0.5, "score": 0.0, "ee": [0, 0, 0], "tokens": list(tokens)}


def test_subset_rows_are_compared_with_ar_on_their_own_episodes(tmp_path: Path) -> None:
    log_path = tmp_path / "run.jsonl"
    key = {"suite": "libero_object", "max_steps": 3, "camera_size_px": 64, "dtype": "float32", "seed": 0,
           "variants": ["fast=heisd:fused_metric.tau=0"]}
    log = ResultLog(log_path, key)
    # ar: 40 ms on init 40 and 100 ms on init 41; the subset variant ran init 40 only, at 20 ms
    for init, ar_ms in ((40, 40.0), (41, 100.0)):
        log.append({"kind": "episode", "task": 0, "init_state": init, "method": "ar", "instruction": "t",
                    "success": init == 40, "length": 2, "wall_s": 1.0, "steps": [_step(ar_ms)] * 2})
    log.append({"kind": "episode", "task": 0, "init_state": 40, "method": "fast", "instruction": "t",
                "success": True, "length": 2, "wall_s": 1.0, "steps": [_step(20.0)] * 2})
    out = tmp_path / "rep.json"
    # the variants come from the log's run key; the subset row pairs with ar on init 40 only
    assert main(["--report-from", str(log_path), "--tasks", "0", "--init-states", "40-41", "--methods", "ar",
                 "--subset-methods", "fast", "--subset-init-states", "40", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["fast"]["speedup_vs_ar"] == pytest.approx(2.0)  # 40 / 20, not 70 / 20
    same = rep["fast"]["ar_on_same_episodes"]
    assert same["episodes"] == 1 and same["mean_step_ms"] == pytest.approx(40.0) and same["success_rate"] == 1.0
    assert "ar_on_same_episodes" not in rep["ar"] and rep["_meta"]["subset"]["init_states"] == [40]
    md = out.with_suffix(".md").read_text()
    assert "fast (subset, 1 ep.)" in md and "ar on its 1 episodes" in md
