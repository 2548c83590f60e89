"""`heisd bench` end to end on a small tiny-policy build (speed is measured by the bench, not asserted here)."""

from __future__ import annotations

import json

import pytest
import torch

from heisd_ros.pipeline.tiny_artifacts import build_tiny_artifacts
from heisd_ros.tools.bench import main

pytestmark = pytest.mark.slow  # end to end: the benchmark over every method

SMALL = dict(n_episodes=2, n_steps=20, vla_steps=40, drafter_steps=30)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    torch.set_num_threads(1)
    return build_tiny_artifacts(tmp_path_factory.mktemp("tiny"), **SMALL)


def test_bench_reports_every_method_and_strict_methods_match_ar(tiny_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["--model", "tiny", "--tiny-dir", str(tiny_dir), "--episodes", "1", "--steps", "12",
                 "--warmup", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    for method in ("ar", "drafter", "specvla", "retrieval", "heisd"):
        r = report[method]
        for key in ("mean_step_ms", "median_step_ms", "p95_step_ms", "p99_step_ms", "forwards_per_step",
                    "accept_length", "tokens_per_forward_verified", "speedup_vs_ar", "speedup_vs_ar_ci95",
                    "median_speedup_vs_ar", "tokens_identical_to_ar"):
            assert key in r, (method, key)
        assert r["steps"] == 24
        assert r["speedup_vs_ar"] == pytest.approx(report["ar"]["mean_step_ms"] / r["mean_step_ms"])
        lo, hi = r["speedup_vs_ar_ci95"]  # two input episodes (one per tiny task)
        assert lo <= hi
    assert report["ar"]["forwards_per_step"] == 7.0 and report["ar"]["accept_length"] == 1.0
    assert report["ar"]["tokens_per_forward_verified"] == 1.0 and report["ar"]["speedup_vs_ar_ci95"] == [1.0, 1.0]
    assert report["_meta"]["bootstrap"]["episodes"] == 2
    for strict in ("drafter", "retrieval"):
        assert report[strict]["tokens_identical_to_ar"] is True
    assert report["drafter"]["forwards_per_step"] < 7.0
    assert report["_meta"]["threads"] == 1 and report["_meta"]["seed"] == 0
    assert "heisd" in capsys.readouterr().out


def test_build_is_cached(tiny_dir):
    manifest = (tiny_dir / "manifest.json").stat().st_mtime
    build_tiny_artifacts(tiny_dir, **SMALL)
    assert (tiny_dir / "manifest.json").stat().st_mtime == manifest


def test_unknown_method_is_rejected(tiny_dir):
    with pytest.raises(SystemExit, match="unknown methods"):
        main(["--model", "tiny", "--tiny-dir", str(tiny_dir), "--methods", "beam"])


def test_pace_hz_starts_the_steps_on_control_ticks(tiny_dir, tmp_path):
    out = tmp_path / "paced.json"
    hz = 40.0
    assert main(["--model", "tiny", "--tiny-dir", str(tiny_dir), "--methods", "ar,heisd", "--episodes", "1",
                 "--steps", "5", "--warmup", "1", "--pace-hz", str(hz), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    meta = report["_meta"]
    assert meta["pace_hz"] == hz and meta["threads"] == 1
    n = report["ar"]["steps"] + report["heisd"]["steps"]  # every decoder step is paced, in turn
    assert n == 20
    assert meta["steps_wall_s"] >= (n - 1) / hz - 1e-3
    heisd = report["heisd"]["mode_stage_mean_ms"]
    assert sum(m["steps"] for m in heisd.values()) == report["heisd"]["steps"] - 1  # warm-up left out
    assert all(set(m) >= {"vision", "verify", "total"} for m in heisd.values())


def test_pacer_sleeps_to_the_next_tick_and_skips_ticks_an_overrun_covered():
    from heisd_ros.tools.bench import Pacer

    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(round(s, 6))
        now[0] += s

    pacer = Pacer(10.0, clock=lambda: now[0], sleep=sleep)
    pacer.wait()  # the first tick: no wait
    now[0] += 0.03  # a 30 ms step
    pacer.wait()
    assert slept == [0.07] and now[0] == pytest.approx(0.1)
    now[0] += 0.25  # a step of 250 ms covers the ticks at 0.2 and 0.3
    pacer.wait()
    assert now[0] == pytest.approx(0.4) and pacer.skipped_ticks == 2
    unpaced = Pacer(None, clock=lambda: now[0], sleep=sleep)
    unpaced.wait()
    unpaced.wait()
    assert len(slept) == 2


@pytest.mark.parametrize("flag", [["--pace-hz", "0"], ["--pace-hz", "nan"], ["--threads", "0"]])
def test_invalid_pace_or_threads_are_refused(flag):
    with pytest.raises(SystemExit):
        main(["--model", "tiny", *flag])


def test_profile_splits_the_llm_cost_into_prefill_and_decodes():
    """The first forward of a step is its prefill, the rest its decodes; the LLM share is their sum
    over the mean step."""
    from heisd_ros.core.types import StepStats
    from heisd_ros.tools.bench import profile

    steps = [StepStats(mode="ar", llm_forwards=7, latency_ms={"total": 100.0 + i, "vision": 20.0},
                       forward_ms=[30.0 + i] + [6.0] * 6) for i in range(2)]
    ar = profile(steps)["modes"]["ar"]
    assert ar["prefill_mean_ms"] == pytest.approx(30.5)
    assert ar["decodes_mean_ms"] == pytest.approx(36.0)
    assert ar["llm_share"] == pytest.approx(66.5 / 100.5)
