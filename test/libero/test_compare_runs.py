"""benchmarks/compare_runs.py: crossing two runs' step-kind shares and relative costs recovers each run's
speedup and attributes a change to the part that moved."""

from __future__ import annotations

import importlib.util
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("compare_runs", ROOT / "benchmarks" / "compare_runs.py")
compare_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_runs)


def _step(mode: str, forwards: int, ms: float) -> dict:
    return {"mode": mode, "tpf": [7 // max(forwards, 1)] * forwards, "ms": {"total": ms}}


def _write_log(path: Path, ar_ms: float, heisd_steps: list[dict], init_state: int = 40) -> None:
    lines = [{"kind": "run", "key": {"max_steps": 5}}, {"kind": "session_start", "command": "heisd-libero eval-libero"},
             {"kind": "episode", "task": 0, "init_state": init_state, "method": "ar", "steps": [_step("ar", 7, ar_ms)] * 4},
             {"kind": "episode", "task": 0, "init_state": init_state, "method": "heisd", "steps": heisd_steps},
             # a calibration episode (init state below 40) that must not count
             {"kind": "episode", "task": 1, "init_state": 20, "method": "heisd", "steps": [_step("drafter", 2, 1000.0)]}]
    with lzma.open(path, "wt") as f:
        f.write("\n".join(json.dumps(x) for x in lines) + "\n")


def test_step_kinds_split_modes_by_forwards():
    assert compare_runs.step_kind(_step("skip", 0, 5)) == "skip"
    assert compare_runs.step_kind(_step("retrieval", 1, 5)) == "retrieval/1fwd"
    assert compare_runs.step_kind(_step("drafter", 2, 5)) == "drafter/2fwd"
    assert compare_runs.step_kind(_step("drafter", 4, 5)) == "drafter/3+fwd"


def test_crossing_attributes_a_slower_machine_to_costs_and_a_new_mix_to_shares(tmp_path):
    # run A: ar 60 ms; half skips at 6 ms, half one-forward retrieval steps at 30 ms -> mean 18 ms, 3.33x
    a_steps = [_step("skip", 0, 6.0), _step("retrieval", 1, 30.0)] * 5
    # run B: the same mix, every kind twice as dear relative to its ar (ar 30 ms), plus a new kind
    b_steps = [_step("skip", 0, 6.0), _step("retrieval", 1, 30.0)] * 4 + [_step("drafter", 2, 30.0)] * 2
    _write_log(tmp_path / "a.jsonl.xz", 60.0, a_steps)
    _write_log(tmp_path / "b.jsonl.xz", 30.0, b_steps)
    a = compare_runs.read_run(tmp_path / "a.jsonl.xz", "heisd", 40)
    b = compare_runs.read_run(tmp_path / "b.jsonl.xz", "heisd", 40)
    assert a["kinds"]["skip"]["share"] == pytest.approx(0.5)
    assert a["kinds"]["skip"]["relative_cost"] == pytest.approx(0.1)
    assert b["kinds"]["skip"]["relative_cost"] == pytest.approx(0.2)
    r = compare_runs.compare(a, b)
    assert r["a"] == pytest.approx(60.0 / 18.0)
    b_mean = (4 * 6.0 + 4 * 30.0 + 2 * 30.0) / 10
    assert r["b"] == pytest.approx(30.0 / b_mean)
    # A's mix at B's costs: each kind twice as dear -> half A's speedup
    assert r["shares_a_costs_b"] == pytest.approx(r["a"] / 2)
    # B's mix at A's costs: the drafter kind A never took keeps B's own cost (1.0)
    assert r["shares_b_costs_a"] == pytest.approx(1.0 / (0.4 * 0.1 + 0.4 * 0.5 + 0.2 * 1.0))


def test_the_command_prints_and_writes_the_crossing(tmp_path):
    steps = [_step("skip", 0, 6.0), _step("retrieval", 2, 40.0)]
    _write_log(tmp_path / "a.jsonl.xz", 50.0, steps)
    _write_log(tmp_path / "b.jsonl.xz", 50.0, steps)
    out = tmp_path / "c.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare_runs.py"), str(tmp_path / "a.jsonl.xz"),
                          str(tmp_path / "b.jsonl.xz"), "--json", str(out)],
                         check=False, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "retrieval/2fwd" in res.stdout
    report = json.loads(out.read_text())
    assert report["a"] == pytest.approx(50.0 / 23.0) and report["shares_a_costs_b"] == pytest.approx(report["a"])


def test_a_log_without_the_method_is_refused(tmp_path):
    _write_log(tmp_path / "a.jsonl.xz", 50.0, [], init_state=10)
    with pytest.raises(SystemExit, match="no ar or heisd"):
        compare_runs.read_run(tmp_path / "a.jsonl.xz", "heisd", 40)
