"""The GPU projection script runs on CPU at a tiny shape (CI), producing the fields the report needs,
on the native OpenVLA model with its padded vocabulary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end to end: the projection benchmark at tiny shape, in a subprocess

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_projection_runs_at_tiny_shape_on_cpu(tmp_path):
    traces = {"heisd": {"mode_mix": {"skip": 0.4, "retrieval": 0.3, "drafter": 0.3},
                        "profile": {"modes": {"retrieval": {"forwards_per_step": 1.2}, "drafter": {"forwards_per_step": 2.3}},
                                    "stage_median_ms": {"retrieval": 0.5}}}}
    (tmp_path / "t.json").write_text(json.dumps(traces))
    out = tmp_path / "p.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_projection.py"), "--shape", "tiny", "--device", "cpu",
                          "--dtype", "float32", "--repeat", "2", "--traces", str(tmp_path / "t.json"), "--out", str(out)],
                         check=False, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(out.read_text())
    costs = report["costs_ms"]
    for key in ("vision_1view_ms", "vision_2views_ms", "projector_ms", "prefill_ms", "decode_ms", "fused_prefill_tree_ms",
                "verify_drafter_tree_ms", "drafter_extend_prompt_ms", "drafter_call_ms"):
        assert costs[key] > 0, key
    model = report["model"]
    # The action ids come from the action tokenizer: the last 256 of the unpadded 32000, not of the 32064 rows.
    assert model["embedding_rows"] == 32064 and model["action_token_ids"] == [31744, 31999]
    assert model["class"].startswith("heisd_ros.models.openvla.OpenVLAModel")
    assert report["prompt_tokens"] == 1 + model["patch_tokens"] + 16
    proj = report["projection"]
    assert proj["ar_step_ms"] > proj["heisd_mode_step_ms"]["skip"]
    assert proj["projected_speedup_mean"] > 0
    assert report["_meta"]["device"] == "cpu"


def test_eval_libero_reports_give_the_per_mode_forwards():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_projection", ROOT / "benchmarks" / "gpu_projection.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    project = module.project

    costs = dict.fromkeys(("vision_1view_ms", "vision_2views_ms", "projector_ms", "prefill_ms", "decode_ms",
                           "fused_prefill_tree_ms", "verify_drafter_tree_ms", "drafter_extend_prompt_ms",
                           "drafter_call_ms"), 1.0)
    bench = {"heisd": {"mode_mix": {"drafter": 1.0}, "profile": {"modes": {"drafter": {"forwards_per_step": 4.0}}}}}
    libero = {"heisd": {"mode_mix": {"drafter": 1.0}, "modes": {"drafter": {"forwards_per_step": 4.0}}}}
    assert project(costs, bench, 1.0, 6) == project(costs, libero, 1.0, 6)
    assert project(costs, libero, 1.0, 6)["heisd_mode_step_ms"]["drafter"] == 4.0 + 3 * (1.0 + 6)
