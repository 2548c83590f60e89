"""The evidence fields of an eval-libero report (tools/eval_evidence.py, eval_report, eval_markdown):
strict-step agreement, same start, contention, the shadow of ar, paired success, per-mode stages."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from heisd_ros.pipeline.figures import mcnemar_exact_p, paired_difference_interval
from heisd_ros.tools.eval_evidence import (
    contended,
    evidence,
    paired_success,
    shadow_deviation,
    strict_agreement,
)
from heisd_ros.tools.eval_markdown import markdown
from heisd_ros.tools.eval_report import build_report

AR_TOKENS = [1200, 1201, 1202, 1203, 1204, 1205, 1282]


def _step(t: int, digest: str, tokens: list[int], strict: bool = True, mode: str = "ar", wall: float = 10.0,
          cpu: float = 9.0, shadow: list[int] | None = None) -> dict:
    s = {"t": t, "mode": mode, "skipped": mode == "skip", "forwards": 0 if mode == "skip" else 1, "tpf": [7],
         "ms": {"total": wall, "vision": 2.0, "retrieval": 1.0}, "fwd_ms": [] if mode == "skip" else [5.0, 1.0],
         "cpu_ms": cpu, "sim_ms": 1.0, "F": 0.1, "score": 0.9, "ee": [0, 0, 0], "tokens": tokens,
         "strict": strict, "digest": digest}
    if shadow is not None:
        s["shadow"] = shadow
    return s


def _episode(method: str, task: int, init: int, steps: list[dict], success: bool) -> dict:
    return {"kind": "episode", "task": task, "init_state": init, "method": method, "instruction": f"task {task}",
            "success": success, "length": len(steps), "steps": steps}


def test_strict_agreement_counts_steps_on_ar_inputs_and_names_the_first_disagreement() -> None:
    ar = _episode("ar", 0, 40, [_step(0, "a0", AR_TOKENS), _step(1, "a1", AR_TOKENS)], True)
    other = list(AR_TOKENS)
    other[2] += 19
    heisd = _episode("heisd", 0, 40, [_step(0, "a0", other, mode="drafter"),  # strict, ar's input, other tokens
                                      _step(1, "zz", other, mode="drafter"),  # strict, an input ar never saw
                                      _step(2, "a1", other, strict=False, mode="skip")], True)  # lossy: not checked
    drafter = _episode("drafter", 0, 40, [_step(0, "a0", AR_TOKENS, mode="drafter"),
                                          _step(1, "a1", AR_TOKENS, mode="drafter")], True)
    rows = strict_agreement([ar, heisd, drafter], ["ar", "heisd", "drafter"])
    assert rows["drafter"] | {"first_disagreement": None} == {"logged": True, "checked": 2, "agree": 2, "pairs": 1,
                                                            "same_start": 1, "first_disagreement": None}
    h = rows["heisd"]
    assert (h["checked"], h["agree"], h["same_start"]) == (1, 0, 1)
    assert h["first_disagreement"] == {"task": 0, "init_state": 40, "t": 0, "mode": "drafter", "tokens": other,
                                       "ar_tokens": AR_TOKENS}
    verdict = evidence([ar, heisd, drafter], ["ar", "heisd", "drafter"])
    assert len(verdict["broken"]) == 1 and verdict["broken"][0].startswith("heisd: strict-step agreement with ar 0 / 1")


def test_a_different_first_observation_breaks_the_run_and_old_logs_are_not_logged() -> None:
    ar = _episode("ar", 0, 40, [_step(0, "a0", AR_TOKENS)], True)
    late = _episode("drafter", 0, 40, [_step(0, "b0", AR_TOKENS, mode="drafter")], True)
    assert evidence([ar, late], ["ar", "drafter"])["broken"] == ["drafter: first observation equals ar's in 0 / 1 pairs"]
    old = [{**s, "digest": None} for s in ar["steps"]]
    for s in old:
        del s["digest"]
    rows = strict_agreement([{**ar, "steps": old}, late], ["ar", "drafter"])
    assert rows["drafter"]["logged"] is False and evidence([{**ar, "steps": old}, late], ["ar", "drafter"])["broken"] == []


def test_contended_steps_and_the_quiet_flag() -> None:
    assert not contended(_step(0, "a", AR_TOKENS, wall=10.0, cpu=9.0))
    assert not contended(_step(0, "a", AR_TOKENS, wall=15.0, cpu=9.0))  # 15 <= 1.5 x 9 + 2
    assert contended(_step(0, "a", AR_TOKENS, wall=15.6, cpu=9.0))
    quiet = [_step(t, f"d{t}", AR_TOKENS) for t in range(100)]
    ev = evidence([_episode("ar", 0, 40, quiet, False)], ["ar"])
    assert ev["contended_steps"] == 0 and ev["quiet"]
    noisy = quiet[:97] + [_step(t, "x", AR_TOKENS, wall=500.0, cpu=9.0) for t in range(3)]
    ev = evidence([_episode("ar", 0, 40, noisy, False)], ["ar"])
    assert ev["contended_steps"] == 3 and ev["contended_share"] == pytest.approx(0.03) and not ev["quiet"]


def test_shadow_deviation_per_group_gripper_and_mode() -> None:
    relaxed = list(AR_TOKENS)
    relaxed[0] += 4
    relaxed[1] -= 6  # position group: 10 bins
    relaxed[4] += 2  # rotation group: 2 bins
    flipped = list(AR_TOKENS)
    flipped[6] = 1281
    steps = [_step(0, "a", AR_TOKENS, mode="drafter"),  # strict: 0 bins, equal
             _step(1, "b", relaxed, strict=False, mode="retrieval", shadow=AR_TOKENS),
             _step(2, "c", flipped, strict=False, mode="skip", shadow=AR_TOKENS),
             _step(3, "d", AR_TOKENS, strict=False, mode="skip", shadow=AR_TOKENS)]
    sh = shadow_deviation(steps)
    a = sh["all"]
    assert a["steps"] == 4 and a["share_equal_to_ar"] == 0.5
    assert a["position_mean_bins"] == pytest.approx(2.5) and a["rotation_mean_bins"] == pytest.approx(0.5)
    assert a["gripper_disagreement"] == 0.25
    assert sh["by_mode"]["skip"]["gripper_disagreement"] == 0.5 and sh["by_mode"]["retrieval"]["position_p95_bins"] == 10
    assert sh["unshadowed_lossy_steps"] == 0
    assert shadow_deviation([_step(0, "a", AR_TOKENS)]) is None  # a lossless method has nothing to shadow
    assert shadow_deviation([_step(0, "a", AR_TOKENS, strict=False, mode="skip")]) is None  # run without --shadow-ar


def test_mcnemar_and_the_paired_difference_interval() -> None:
    assert mcnemar_exact_p(28, 18) == pytest.approx(0.1839, abs=1e-4)  # the 490-episode run's heisd vs ar
    assert mcnemar_exact_p(0, 0) == 1.0 and mcnemar_exact_p(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact_p(5, 0) == mcnemar_exact_p(0, 5)
    lo, hi = paired_difference_interval(14, 18, 28, 40)
    assert lo < -0.10 < hi and -1 <= lo and hi <= 1
    lo2, hi2 = paired_difference_interval(140, 180, 280, 400)  # ten times the pairs: narrower
    assert lo < lo2 < -0.10 < hi2 < hi
    lo3, hi3 = paired_difference_interval(10, 7, 7, 10)
    assert lo3 == pytest.approx(-hi3)  # equal discordance: symmetric about 0
    assert all(math.isnan(x) for x in paired_difference_interval(0, 0, 0, 0))


def test_paired_success_table_and_speed_on_pairs_both_solved() -> None:
    ar, me = [], []
    outcomes = [(True, True), (True, False), (False, True), (False, False), (True, True)]
    for init, (mine, theirs) in enumerate(outcomes, start=40):
        ar.append(_episode("ar", 0, init, [_step(0, "a", AR_TOKENS, wall=60.0)], theirs))
        me.append(_episode("heisd", 0, init, [_step(0, "a", AR_TOKENS, wall=20.0)], mine))
    p = paired_success(me, ar)
    assert p["table"] == {"both": 2, "method_only": 1, "ar_only": 1, "neither": 1}
    assert p["difference"] == 0.0 and p["mcnemar_p"] == 1.0 and p["both_solved_pairs"] == 2
    assert p["speedup_vs_ar_both_solved"] == pytest.approx(3.0)


def test_report_and_markdown_carry_the_evidence_fields() -> None:
    ar = _episode("ar", 0, 40, [_step(0, "a0", AR_TOKENS), _step(1, "a1", AR_TOKENS)], True)
    heisd = _episode("heisd", 0, 40, [_step(0, "a0", AR_TOKENS, mode="drafter"),
                                      _step(1, "b1", AR_TOKENS, strict=False, mode="skip", wall=4.0, cpu=3.5,
                                            shadow=AR_TOKENS)], True)
    report = build_report([ar, heisd], ["ar", "heisd"], {"model": {}})
    h = report["heisd"]
    assert h["strict_agreement"]["agree"] == h["strict_agreement"]["checked"] == 1
    assert h["contended_share"] == 0.0 and h["shadow"]["all"]["share_equal_to_ar"] == 1.0
    assert h["paired_vs_ar"]["pairs"] == 1 and "speedup_vs_ar_cpu" in h
    skip = h["modes"]["skip"]["stage_mean_ms"]
    assert skip["vision"] == 2.0 and skip["retrieval"] == 1.0 and skip["first_forward"] == 0.0
    assert h["modes"]["drafter"]["stage_mean_ms"]["first_forward"] == 5.0
    assert h["modes"]["drafter"]["stage_mean_ms"]["completion_forwards"] == 1.0
    assert report["_meta"]["evidence"]["broken"] == [] and report["_meta"]["evidence"]["quiet"]
    text = markdown(report)
    for needle in ("strict-step agreement with ar: 1 / 1", "first observation equal to ar's in 1 / 1 pairs",
                   "quiet", "McNemar", "Shadow of ar", "| heisd | skip |", "Where the time goes"):
        assert needle in text, needle


def test_a_step_record_keeps_times_to_a_tenth_of_a_millisecond_and_the_shadow() -> None:
    from heisd_ros.core.types import StepStats
    from heisd_ros.tools.eval_episodes import step_record

    st = StepStats(mode="retrieval", llm_forwards=1, tokens_per_forward=[7], forward_ms=[16.5349],
                   latency_ms={"vision": 10.04, "total": 48.7462}, fused_metric=0.12345678, tokens=(1, 2, 3, 4, 5, 6, 7))
    rec = step_record(3, st, cpu_ms=34.8649, sim_ms=65.24, ee_pos=np.array([0.1, -0.2, 0.3]), digest="ab",
                      shadow=(1, 2, 3, 4, 5, 6, 9))
    assert rec["ms"] == {"vision": 10.0, "total": 48.7} and rec["fwd_ms"] == [16.5] and rec["cpu_ms"] == 34.9
    assert rec["F"] == 0.1235 and rec["tokens"] == [1, 2, 3, 4, 5, 6, 7] and rec["shadow"] == [1, 2, 3, 4, 5, 6, 9]
    assert rec["t"] == 3 and rec["sim_ms"] == 65.2
    assert "digest" not in rec  # a lossy step's input is compared with nothing: the log keeps no digest
    strict = step_record(3, dataclasses.replace(st, strict=True), 1.0, 1.0, np.zeros(3), digest="ab")
    first = step_record(0, st, 1.0, 1.0, np.zeros(3), digest="cd")
    assert strict["digest"] == "ab" and first["digest"] == "cd"  # strict steps and every first observation
