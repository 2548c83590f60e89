"""What makes an `heisd-libero eval-libero` run evidence about the methods, computed from its log: strict
steps agree with `ar`, episodes start on identical observations, time is not contended, the lossy
steps' distance from greedy `ar` (the shadow), and success and time per task paired against `ar`.

Pure data handling over logged episodes (no simulator, no torch). Definitions:
- A step is *strict* when every token passed a lossless rule (`StepStats.strict`). Its `digest`
  covers everything the decoder read (pixels of every view, pose, finger gap, instruction). A strict
  step must carry greedy `ar`'s tokens on its input: *strict-step agreement*, checked two ways. By
  digest: within a (task, init state) pair, a strict step whose digest equals one of `ar`'s steps
  carries that step's tokens (only where the method's path still is `ar`'s). By shadow: a strict
  step that carries a shadow (`--shadow-strict-every`) carries the shadow's tokens (anywhere along
  the method's own path).
- *Same start*: a method's first observation of a pair has `ar`'s digest (each episode of a pair
  begins on identical inputs, whatever the env ran before).
- A step is *contended* when its wall time exceeds 1.5 x its thread CPU time + 2 ms: it waited for
  a core (another process, swapping), so its wall time says nothing about the method.
- *Shadow*: on each lossy step (`--shadow-ar`), the tokens greedy `ar` decodes on the same
  observation. |delta bin| of a group is the sum over its tokens of |token - ar token| (the unit of
  the sequence-wise bound, 30 bins a group). The deviation is given per lossy class (LOSSY_CLASSES)
  over that class's shadowed steps alone, and over all lossy steps; a strict step deviates by 0 by
  definition and enters only `all_steps_strict_as_zero` (its shadow, if any, is an agreement check).
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
    ratio_of_sums,
    speedup_figures,
)
from heisd_ros.pipeline.libero_runs import LOSSY_CLASSES

CONTENDED_CPU_FACTOR = 1.5
CONTENDED_SLACK_MS = 2.0
CONTENDED_SHARE_LIMIT = 0.02
"""A run with more contended steps than this (of any method) is flagged: its wall times are not quiet."""
GROUP_SLICES = {"position": slice(0, 3), "rotation": slice(3, 6)}


def lossy_class(step: dict[str, Any]) -> str:
    """'strict', or the step's class in LOSSY_CLASSES (a log without `strict` has no strict step)."""
    if step.get("strict"):
        return "strict"
    if step.get("skipped") or step["mode"] == "skip":
        return "skip"
    return "relaxed" if step["mode"] == "retrieval" else "token_relaxed"


def contended(step: dict[str, Any]) -> bool:
    """Whether the step's wall time exceeds what its own CPU time explains."""
    return step["ms"]["total"] > CONTENDED_CPU_FACTOR * step["cpu_ms"] + CONTENDED_SLACK_MS


def _pairs(episodes: Sequence[dict[str, Any]]) -> dict[tuple[int, int], dict[str, dict[str, Any]]]:
    out: dict[tuple[int, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for e in episodes:
        out[(e["task"], e["init_state"])][e["method"]] = e
    return out


def strict_references(step: dict[str, Any], ar_tokens: dict[str, list[int]]) -> list[tuple[str, list[int]]]:
    """What a strict step is checked against: ('digest', tokens of ar's step with its input digest in
    the same pair) and/or ('shadow', greedy ar's tokens decoded beside it); empty for a lossy step
    or a strict step neither reaches (off ar's path, not shadowed)."""
    if not step.get("strict"):
        return []
    refs = []
    if (ref := ar_tokens.get(step.get("digest", ""))) is not None:
        refs.append(("digest", ref))
    if step.get("shadow") is not None:
        refs.append(("shadow", step["shadow"]))
    return refs


def _digests_logged(e: dict[str, Any], ar: dict[str, Any]) -> bool:
    return bool(e["steps"]) and bool(ar["steps"]) and "digest" in e["steps"][0] and "digest" in ar["steps"][0]


def strict_agreement(episodes: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per method: strict steps checked against ar (`strict_references`; a step with both a digest
    match and a shadow counts once, under `checked_by_digest`, and must agree with both), how many
    carry ar's tokens, the first disagreement, and in how many pairs its first input equals ar's.
    `logged` is False where a pair's steps carry no input digests (logs older than them)."""
    out: dict[str, dict[str, Any]] = {}
    pairs = _pairs(episodes)
    for m in methods:
        if m == "ar":
            continue
        row = {"logged": True, "checked": 0, "agree": 0, "checked_by_digest": 0, "checked_by_shadow": 0,
               "pairs": 0, "same_start": 0, "first_disagreement": None}
        for key, by_method in sorted(pairs.items()):
            e, ar = by_method.get(m), by_method.get("ar")
            if e is None:
                continue
            ar_tokens: dict[str, list[int]] = {}
            if ar is not None and _digests_logged(e, ar):
                row["pairs"] += 1
                row["same_start"] += int(e["steps"][0]["digest"] == ar["steps"][0]["digest"])
                ar_tokens = {s["digest"]: s["tokens"] for s in ar["steps"] if "digest" in s}
            elif ar is not None:
                row["logged"] = False
            for s in e["steps"]:
                refs = strict_references(s, ar_tokens)
                if not refs:
                    continue
                row["checked"] += 1
                row[f"checked_by_{refs[0][0]}"] += 1
                wrong = [(how, ref) for how, ref in refs if s["tokens"] != ref]
                if not wrong:
                    row["agree"] += 1
                elif row["first_disagreement"] is None:
                    row["first_disagreement"] = {"task": key[0], "init_state": key[1], "t": s["t"], "mode": s["mode"],
                                                 "tokens": s["tokens"], "ar_tokens": wrong[0][1], "by": wrong[0][0]}
        out[m] = row
    return out


def contention(steps: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Contended steps of a method and their share."""
    n = sum(contended(s) for s in steps)
    return {"contended_steps": n, "contended_share": n / len(steps) if steps else math.nan}


def _shadow_deviation(step: dict[str, Any]) -> dict[str, float] | None:
    """|delta bin| per group, gripper disagreement and equality of a step's tokens against its shadow
    (None: no shadow)."""
    shadow = step.get("shadow")
    if shadow is None:
        return None
    tokens, ar = np.asarray(step["tokens"]), np.asarray(shadow)
    d = np.abs(tokens - ar)
    return {**{g: float(d[sl].sum()) for g, sl in GROUP_SLICES.items()},
            "gripper": float(tokens[GRIPPER_INDEX] != ar[GRIPPER_INDEX]), "equal": float(np.array_equal(tokens, ar))}


def _deviation(step: dict[str, Any]) -> dict[str, float] | None:
    """A step's deviation from greedy ar: 0 for a strict step (equal by definition, whatever its
    shadow says: a disagreeing shadow there is an agreement failure), else against its shadow
    (None: a lossy step without one)."""
    if step.get("strict"):
        return {"position": 0.0, "rotation": 0.0, "gripper": 0.0, "equal": 1.0}
    return _shadow_deviation(step)


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


def _lossy_figures(lossy: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Deviation figures over the shadowed ones of some lossy steps (`steps`: how many), and how
    many had no shadow."""
    devs = [d for s in lossy if (d := _shadow_deviation(s)) is not None]
    return {**_deviation_figures(devs), "unshadowed_steps": len(lossy) - len(devs)}


def shadow_deviation(steps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The method's deviation from greedy ar: per lossy class over that class's shadowed steps
    (`by_class`, only the classes it has), over all its lossy steps (`lossy`), and over all its steps
    with strict ones as 0 (`all_steps_strict_as_zero`, diluted by the strict share). None when no
    lossy step of it was shadowed (a lossless method, or a log without --shadow-ar)."""
    lossy = [s for s in steps if lossy_class(s) != "strict"]
    if not any("shadow" in s for s in lossy):
        return None
    by_class = {c: [s for s in lossy if lossy_class(s) == c] for c in LOSSY_CLASSES}
    return {"by_class": {c: _lossy_figures(sel) for c, sel in by_class.items() if sel},
            "lossy": _lossy_figures(lossy),
            "all_steps_strict_as_zero": _deviation_figures([d for s in steps if (d := _deviation(s)) is not None]),
            "strict_steps": len(steps) - len(lossy),
            "unshadowed_lossy_steps": sum(1 for s in lossy if "shadow" not in s)}


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


def episode_time_ratio(episodes: Sequence[dict[str, Any]], ar_episodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Time per task against `ar`: over the (task, init state) pairs both ran, the sum of ar's episode
    decode times (each the sum of its steps' wall time) over the sum of the method's, with its 95 %
    bootstrap interval over the pairs; the same on thread CPU time. Unlike the mean-step speedup it
    counts the steps each method needed: a method whose episodes run longer pays for them here."""
    both = pairs_with_ar(episodes, ar_episodes)

    def total(e: dict[str, Any], field: str) -> float:
        return float(sum(s["ms"]["total"] if field == "total" else s[field] for s in e["steps"]))

    wall = ratio_of_sums([total(a, "total") for _, a in both], [total(e, "total") for e, _ in both])
    cpu = ratio_of_sums([total(a, "cpu_ms") for _, a in both], [total(e, "cpu_ms") for e, _ in both])
    return {"episode_time_ratio": wall[0], "episode_time_ratio_ci95": wall[1], "episode_time_ratio_cpu": cpu[0],
            "episode_time_ratio_cpu_ci95": cpu[1], "episode_time_ratio_pairs": len(both)}


def evidence(episodes: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, Any]:
    """The run-level verdict: agreement per method, contended share of the run, and what breaks it."""
    agreement = strict_agreement(episodes, methods)
    steps = [s for e in episodes for s in e["steps"]]
    run = contention(steps)
    broken = []
    for m, row in agreement.items():
        if row["agree"] != row["checked"]:
            broken.append(f"{m}: strict-step agreement with ar {row['agree']} / {row['checked']}: "
                          f"{row['checked'] - row['agree']} strict step(s) carry other tokens than greedy ar "
                          f"({row['checked_by_digest']} checked by input digest, {row['checked_by_shadow']} by "
                          f"shadow; first: {row['first_disagreement']})")
        if row["same_start"] != row["pairs"]:
            broken.append(f"{m}: first observation equals ar's in {row['same_start']} / {row['pairs']} pairs")
    quiet = not (run["contended_share"] > CONTENDED_SHARE_LIMIT)
    return {"strict_agreement": agreement, **run, "contended_share_limit": CONTENDED_SHARE_LIMIT,
            "quiet": quiet, "broken": broken,
            "definition": (f"contended: wall > {CONTENDED_CPU_FACTOR} x thread CPU + {CONTENDED_SLACK_MS} ms; "
                           "strict-step agreement: strict steps with an input digest of ar's (same pair) carry "
                           "that step's tokens, and strict steps with a shadow carry the shadow's")}
