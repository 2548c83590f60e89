"""The GPU projection script runs on CPU at a tiny shape (CI), producing the fields the report needs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_projection_runs_at_tiny_shape_on_cpu(tmp_path):
    traces = {"heisd": {"mode_mix": {"skip": 0.4, "retrieval": 0.3, "drafter": 0.3},
                        "profile": {"modes": {"retrieval": {"forwards_per_step": 1.2}, "drafter": {"forwards_per_step": 2.3}},
                                    "stage_median_ms": {"retrieval": 0.5}}}}
    (tmp_path / "t.json").write_text(json.dumps(traces))
    out = tmp_path / "p.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_projection.py"), "--shape", "tiny", "--device", "cpu",
                          "--dtype", "float32", "--repeat", "2", "--traces", str(tmp_path / "t.json"), "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(out.read_text())
    costs = report["costs_ms"]
    for key in ("vision_1view_ms", "prefill_ms", "decode_ms", "fused_prefill_tree_ms", "verify_drafter_tree_ms", "drafter_call_ms"):
        assert costs[key] > 0
    proj = report["projection"]
    assert proj["ar_step_ms"] > proj["heisd_mode_step_ms"]["skip"]
    assert proj["projected_speedup_mean"] > 0
    assert report["_meta"]["device"] == "cpu"
