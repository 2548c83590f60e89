"""What makes an `heisd eval-libero` run evidence about the methods, computed from its log: strict
steps agree with `ar`, episodes start on identical observations, time is not contended, the lossy
steps' distance from greedy `ar` (the shadow), and success paired against `ar`.

Pure data handling over logged episodes (no simulator, no torch). Definitions:
- A step is *strict* when every token passed a lossless rule (`StepStats.strict`). Its `digest`
  covers everything the decoder read (pixels of every view, pose, finger gap, instruction). Within a
  (task, init state) pair, a strict step of any method whose digest equals one of `ar`'s steps must
  carry that step's tokens: *strict-step agreement*.
- *Same start*: a method's first observation of a pair has `ar`'s digest (each episode of a pair
  begins on identical inputs, whatever the env ran before).
- A step is *contended* when its wall time exceeds 1.5 x its thread CPU time + 2 ms: it waited for
  a core (another process, swapping), so its wall time says nothing about the method.
- *Shadow*: on each lossy step (`--shadow-ar`), the tokens greedy `ar` decodes on the same
  observation. |delta bin| of a group is the sum over its tokens of |token - ar token| (the unit of
  the sequence-wise bound, 30 bins a group); a strict step deviates by 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np

from heisd_ros.core.types import GRIPPER_INDEX
from heisd_ros.pipeline.figures import (
    mcnemar_exact_p,
    paired_difference_interval,
    speedup_figures,
)

CONTENDED_CPU_FACTOR = 1.5
CONTENDED_SLACK_MS = 2.0
CONTENDED_SHARE_LIMIT = 0.02
"""A run with more contended steps than this (of any method) is flagged: its wall times are not quiet."""
GROUP_SLICES = {"position": slice(0, 3), "rotation": slice(3, 6)}


def contended(step: dict[str, Any]) -> bool:
    """Whether the step's wall time exceeds what its own CPU time explains."""
    return step["ms"]["total"] > CONTENDED_CPU_FACTOR * step["cpu_ms"] + CONTENDED_SLACK_MS


def _pairs(episodes: Sequence[dict[str, Any]]) -> dict[tuple[int, int], dict[str, dict[str, Any]]]:
    out: dict[tuple[int, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for e in episodes:
        out[(e["task"], e["init_state"])][e["method"]] = e
    return out


def strict_agreement(episodes: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per method: strict steps checked against `ar` (same digest in the same pair), how many carry
    ar's tokens, the first such disagreement, and in how many pairs its first input equals ar's.
    Methods of logs without digests get `{"logged": False}`."""
    out: dict[str, dict[str, Any]] = {}
    pairs = _pairs(episodes)
    for m in methods:
        if m == "ar":
            continue
        row = {"logged": True, "checked": 0, "agree": 0, "pairs": 0, "same_start": 0, "first_disagreement": None}
        for key, by_method in sorted(pairs.items()):
            e, ar = by_method.get(m), by_method.get("ar")
            if e is None or ar is None:
                continue
            if not e["steps"] or "digest" not in e["steps"][0] or "digest" not in ar["steps"][0]:
                row["logged"] = False
                continue
            row["pairs"] += 1
            row["same_start"] += int(e["steps"][0]["digest"] == ar["steps"][0]["digest"])
            ar_tokens = {s["digest"]: s["tokens"] for s in ar["steps"]}
            for s in e["steps"]:
                if not s.get("strict") or s["digest"] not in ar_tokens:
                    continue
                row["checked"] += 1
                if s["tokens"] == ar_tokens[s["digest"]]:
                    row["agree"] += 1
                elif row["first_disagreement"] is None:
                    row["first_disagreement"] = {"task": key[0], "init_state": key[1], "t": s["t"], "mode": s["mode"],
                                                 "tokens": s["tokens"], "ar_tokens": ar_tokens[s["digest"]]}
        out[m] = row
    return out


def contention(steps: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Contended steps of a method and their share."""
    n = sum(contended(s) for s in steps)
    return {"contended_steps": n, "contended_share": n / len(steps) if steps else math.nan}


def _deviation(step: dict[str, Any]) -> dict[str, float] | None:
    """|delta bin| per group and gripper disagreement of one step against greedy ar (None: unknown)."""
    if step.get("strict"):
        return {"position": 0.0, "rotation": 0.0, "gripper": 0.0, "equal": 1.0}
    shadow = step.get("shadow")
    if shadow is None:
        return None
    tokens, ar = np.asarray(step["tokens"]), np.asarray(shadow)
    d = np.abs(tokens - ar)
    return {**{g: float(d[sl].sum()) for g, sl in GROUP_SLICES.items()},
            "gripper": float(tokens[GRIPPER_INDEX] != ar[GRIPPER_INDEX]), "equal": float(np.array_equal(tokens, ar))}


def equal_to_ar(step: dict[str, Any]) -> bool | None:
    """Whether a step output greedy ar's tokens on its observation (strict steps do; None: a relaxed
    step without ar's shadow)."""
    d = _deviation(step)
    return None if d is None else bool(d["equal"])


def _deviation_figures(devs: list[dict[str, float]]) -> dict[str, float]:
    if not devs:
        return {"steps": 0}
    out: dict[str, float] = {"steps": len(devs), "share_equal_to_ar": float(np.mean([d["equal"] for d in devs]))}
    for g in GROUP_SLICES:
        v = np.array([d[g] for d in devs])
        out[f"{g}_mean_bins"], out[f"{g}_p95_bins"] = float(v.mean()), float(np.percentile(v, 95))
    out["gripper_disagreement"] = float(np.mean([d["gripper"] for d in devs]))
    return out


def shadow_deviation(steps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The method's deviation from greedy ar over all its steps and by mode (None: no lossy step of
    it was shadowed, e.g. a lossless method, or a log without --shadow-ar)."""
    devs = [(s["mode"], d) for s in steps if (d := _deviation(s)) is not None]
    lossy = [s for s in steps if not s.get("strict")]
    if not lossy or not any("shadow" in s for s in lossy):
        return None
    return {"all": _deviation_figures([d for _, d in devs]),
            "unshadowed_lossy_steps": sum(1 for s in lossy if "shadow" not in s),
            "by_mode": {m: _deviation_figures([d for mode, d in devs if mode == m])
                        for m in sorted({mode for mode, _ in devs})}}


def pairs_with_ar(episodes: Sequence[dict[str, Any]],
                  ar_episodes: Sequence[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(episode, ar's episode) for each (task, init state) both ran."""
    ar = {(e["task"], e["init_state"]): e for e in ar_episodes}
    return [(e, ar[k]) for e in episodes if (k := (e["task"], e["init_state"])) in ar]


def paired_success(episodes: Sequence[dict[str, Any]], ar_episodes: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Success of a method against `ar` on the pairs both ran: the 2x2 table, the paired difference
    (method - ar) with its 95 % interval (Newcombe's hybrid score), the exact McNemar p, and the speedup
    on the pairs both solved (a ratio of means, under its own name)."""
    both = pairs_with_ar(episodes, ar_episodes)
    if not both:
        return None
    table = {"both": 0, "method_only": 0, "ar_only": 0, "neither": 0}
    for e, a in both:
        table[{(True, True): "both", (True, False): "method_only", (False, True): "ar_only",
               (False, False): "neither"}[(bool(e["success"]), bool(a["success"]))]] += 1
    n = len(both)
    solved = [(e, a) for e, a in both if e["success"] and a["success"]]
    speed = speedup_figures([[s["ms"]["total"] for s in a["steps"]] for _, a in solved],
                            [[s["ms"]["total"] for s in e["steps"]] for e, _ in solved], paired=True)
    return {"pairs": n, "table": table,
            "difference": (table["method_only"] - table["ar_only"]) / n,
            "difference_ci95": list(paired_difference_interval(table["both"], table["method_only"],
                                                               table["ar_only"], table["neither"])),
            "mcnemar_p": mcnemar_exact_p(table["method_only"], table["ar_only"]),
            "both_solved_pairs": len(solved),
            "speedup_vs_ar_both_solved": speed["speedup_vs_ar"],
            "speedup_vs_ar_both_solved_ci95": speed["speedup_vs_ar_ci95"]}


def evidence(episodes: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """The run-level verdict: agreement per method, contended share of the run, and what breaks it."""
    agreement = strict_agreement(episodes, methods)
    steps = [s for e in episodes for s in e["steps"]]
    run = contention(steps)
    broken = []
    for m, row in agreement.items():
        if row["logged"] and row["agree"] != row["checked"]:
            broken.append(f"{m}: strict-step agreement with ar {row['agree']} / {row['checked']} "
                          f"(first: {row['first_disagreement']})")
        if row["logged"] and row["same_start"] != row["pairs"]:
            broken.append(f"{m}: first observation equals ar's in {row['same_start']} / {row['pairs']} pairs")
    quiet = not (run["contended_share"] > CONTENDED_SHARE_LIMIT)
    return {"strict_agreement": agreement, **run, "contended_share_limit": CONTENDED_SHARE_LIMIT,
            "quiet": quiet, "broken": broken,
            "definition": (f"contended: wall > {CONTENDED_CPU_FACTOR} x thread CPU + {CONTENDED_SLACK_MS} ms; "
                           "strict-step agreement: strict steps with an input digest of ar's (same pair) carry ar's tokens")}
