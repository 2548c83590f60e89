"""`heisd bench` end to end on a small tiny-policy build (speed is measured by the bench, not asserted here)."""

from __future__ import annotations

import json

import pytest
import torch

from heisd_ros.pipeline.tiny_artifacts import build_tiny_artifacts
from heisd_ros.tools.bench import main

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
