"""Two eval-libero runs of one operating point: how much of the change in a method's speedup is its mode mix
and how much its per-mode costs.

Usage (repository root):
    .venv/bin/python benchmarks/compare_runs.py RUN_A.jsonl.xz RUN_B.jsonl.xz [--method heisd]
        [--init-from 40] [--json FILE]

A method's mean step over `ar`'s mean step is the sum over its step kinds of (share of steps) x (the kind's
mean step / `ar`'s mean step). The kinds are a skip and each mode by its LLM forwards (1, 2, 3 or more), so
a kind's relative cost is fixed by the machine and the code, and its share by the episodes the policy ran.
Crossing one run's shares with the other's relative costs shows which of the two moved the speedup: on two
machines with the same point, the costs carry the machine; on one machine with two databases, the shares
carry the database. Each run's `ar` is its own baseline, so no step time is compared across machines.
The logs may be .jsonl, .jsonl.xz or .jsonl.gz; episodes at init states below `--init-from` are left out.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from heisd_libero.eval_report import ResultLog


def step_kind(step: dict[str, Any]) -> str:
    """'skip', or the step's mode and its LLM forwards: 'retrieval/1fwd', 'drafter/2fwd', '.../3+fwd'."""
    forwards = len(step.get("tpf", ()))
    if step["mode"] == "skip" or forwards == 0:
        return "skip"
    return f"{step['mode']}/{forwards if forwards < 3 else '3+'}fwd"


def read_run(path: str | Path, method: str, init_from: int) -> dict[str, Any]:
    """`ar`'s mean step and, per step kind of `method`, its share of steps and mean step relative to ar's."""
    times: dict[str, list[float]] = defaultdict(list)
    ar: list[float] = []
    for rec in ResultLog.read(path).episodes:
        if rec["init_state"] < init_from:
            continue
        if rec["method"] == "ar":
            ar += [s["ms"]["total"] for s in rec["steps"]]
        elif rec["method"] == method:
            for s in rec["steps"]:
                times[step_kind(s)].append(s["ms"]["total"])
    n = sum(len(v) for v in times.values())
    if not ar or not n:
        raise SystemExit(f"{path}: no ar or {method} episodes at init states >= {init_from}")
    ar_mean = float(np.mean(ar))
    kinds = {k: {"share": len(v) / n, "mean_ms": float(np.mean(v)), "relative_cost": float(np.mean(v)) / ar_mean}
             for k, v in sorted(times.items())}
    return {"ar_mean_ms": ar_mean, "steps": n, "kinds": kinds}


def speedup(shares_from: dict[str, Any], costs_from: dict[str, Any]) -> float:
    """1 / sum(share x relative cost), shares of one run and costs of another. A kind the cost run never
    took costs what it cost in the share run (so a kind present in one run only does not vanish)."""
    total = 0.0
    for kind, k in shares_from["kinds"].items():
        cost = costs_from["kinds"].get(kind, k)["relative_cost"]
        total += k["share"] * cost
    return 1.0 / total


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, float]:
    """The two runs' speedups and the two crossings."""
    return {"a": speedup(a, a), "b": speedup(b, b), "shares_a_costs_b": speedup(a, b), "shares_b_costs_a": speedup(b, a)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a")
    ap.add_argument("run_b")
    ap.add_argument("--method", default="heisd")
    ap.add_argument("--init-from", type=int, default=40, help="leave out episodes at lower init states (40: held out)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    a = read_run(args.run_a, args.method, args.init_from)
    b = read_run(args.run_b, args.method, args.init_from)
    result = compare(a, b)
    print(f"{args.method} speedup vs ar: A {result['a']:.2f}x, B {result['b']:.2f}x; "
          f"A's shares at B's costs {result['shares_a_costs_b']:.2f}x, B's shares at A's costs {result['shares_b_costs_a']:.2f}x")
    print(f"{'kind':16s} {'share A':>8s} {'share B':>8s} {'cost A':>7s} {'cost B':>7s}   (cost: mean step / ar's mean step)")
    for kind in sorted(set(a["kinds"]) | set(b["kinds"])):
        ka, kb = a["kinds"].get(kind), b["kinds"].get(kind)
        cells = [f"{k['share']:8.1%}" if k else f"{'-':>8s}" for k in (ka, kb)]
        cells += [f"{k['relative_cost']:7.3f}" if k else f"{'-':>7s}" for k in (ka, kb)]
        print(f"{kind:16s} " + " ".join(cells))
    if args.json:
        Path(args.json).write_text(json.dumps({"command": "benchmarks/compare_runs.py", "args": vars(args),
                                               "a": a, "b": b, **result}, indent=1))


if __name__ == "__main__":
    main()
