"""benchmarks/grasp_timing.py: close / lift / re-open counts on a hand-made eval log."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "grasp_timing.py"
VOCAB = 1283
OPEN, CLOSE = VOCAB - 1, VOCAB - 256  # bin 1 (-1, open) and bin 256 (+1, close)


def _load():
    spec = importlib.util.spec_from_file_location("grasp_timing", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _episode(gripper: list[int], z: list[float], success: bool = False) -> dict:
    steps = [{"t": t, "tokens": [VOCAB - 128] * 6 + [g], "ee": [0.0, 0.0, h]}
             for t, (g, h) in enumerate(zip(gripper, z))]
    return {"kind": "episode", "method": "ar", "task": 0, "init_state": 40, "success": success, "steps": steps}


def test_counts_closes_lifts_and_reopens(tmp_path):
    gt = _load()
    lifts = _episode([OPEN] * 3 + [CLOSE] * 20, [0.05] * 3 + [0.05] * 12 + [0.07, 0.09, 0.11] + [0.12] * 5, True)
    freezes = _episode([OPEN] * 2 + [CLOSE] * 5 + [OPEN] + [CLOSE] * 10, [0.05] * 18)
    never = _episode([OPEN] * 10, [0.02] * 10)
    log = tmp_path / "screen.jsonl.gz"
    with gzip.open(log, "wt") as f:
        f.write(json.dumps({"kind": "run"}) + "\n")
        for ep in (lifts, freezes, never):
            f.write(json.dumps(ep) + "\n")
    m = gt.summarise([log], VOCAB, rise_m=0.03, window=40)["ar"]
    assert (m["episodes"], m["successes"], m["closed"], m["lifted"], m["reopened"]) == (3, 1, 2, 1, 1)
    assert m["delays"] == [13]  # first close at step 3; z 0.09 (> 0.05 + 0.03) at step 16
    assert gt.is_close(CLOSE, VOCAB) and not gt.is_close(OPEN, VOCAB)
    assert gt.main([str(log)]) == 0
