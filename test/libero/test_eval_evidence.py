"""The evidence fields of an eval-libero report (heisd_libero/eval_evidence.py, eval_report, eval_markdown):
strict-step agreement, same start, contention, the shadow of ar, paired success, per-mode stages."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from heisd_ros.pipeline.figures import mcnemar_exact_p, paired_difference_interval, ratio_of_sums
from heisd_libero.eval_evidence import (
    contended,
    episode_time_ratio,
    evidence,
    lossy_class,
    paired_success,
    shadow_deviation,
    strict_agreement,
)
from heisd_libero.eval_markdown import markdown
from heisd_libero.eval_report import build_report

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
                                                            "same_start": 1, "first_disagreement": None,
                                                            "checked_by_digest": 2, "checked_by_shadow": 0}
    h = rows["heisd"]
    assert (h["checked"], h["agree"], h["same_start"]) == (1, 0, 1)
    assert h["first_disagreement"] == {"task": 0, "init_state": 40, "t": 0, "mode": "drafter", "tokens": other,
                                       "ar_tokens": AR_TOKENS, "by": "digest"}
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


def _lossy_mix() -> list[dict]:
    """Two strict steps (one in retrieval mode), a relaxed retrieval step 10 position bins and 2
    rotation bins off ar, two skips (one with the other gripper token), a token-relaxed drafter step."""
    relaxed = list(AR_TOKENS)
    relaxed[0] += 4
    relaxed[1] -= 6  # position group: 10 bins
    relaxed[4] += 2  # rotation group: 2 bins
    flipped = list(AR_TOKENS)
    flipped[6] = 1281
    token = list(AR_TOKENS)
    token[2] += 3
    return [_step(0, "a", AR_TOKENS, mode="drafter"),  # strict: 0 bins, equal
            _step(1, "r", AR_TOKENS, mode="retrieval"),  # strict retrieval step: not a relaxed one
            _step(2, "b", relaxed, strict=False, mode="retrieval", shadow=AR_TOKENS),
            _step(3, "c", flipped, strict=False, mode="skip", shadow=AR_TOKENS),
            _step(4, "d", AR_TOKENS, strict=False, mode="skip", shadow=AR_TOKENS),
            _step(5, "e", token, strict=False, mode="drafter", shadow=AR_TOKENS)]


def test_lossy_classes_of_steps() -> None:
    assert [lossy_class(s) for s in _lossy_mix()] == ["strict", "strict", "relaxed", "skip", "skip", "token_relaxed"]
    assert lossy_class({"mode": "retrieval", "skipped": True}) == "skip"  # a log without `strict`: lossy


def test_shadow_deviation_per_lossy_class_is_not_diluted_by_strict_steps() -> None:
    sh = shadow_deviation(_lossy_mix())
    c = sh["by_class"]
    assert set(c) == {"skip", "relaxed", "token_relaxed"}
    assert c["skip"]["steps"] == 2 and c["skip"]["gripper_disagreement"] == 0.5 and c["skip"]["share_equal_to_ar"] == 0.5
    # the strict retrieval step does not land among the relaxed ones (a mode key would halve the mean)
    assert c["relaxed"]["steps"] == 1 and c["relaxed"]["position_p95_bins"] == 10
    assert c["relaxed"]["position_mean_bins"] == 10 and c["relaxed"]["rotation_mean_bins"] == 2
    assert c["token_relaxed"]["steps"] == 1 and c["token_relaxed"]["position_mean_bins"] == 3
    lossy = sh["lossy"]
    assert lossy["steps"] == 4 and lossy["gripper_disagreement"] == 0.25 and lossy["share_equal_to_ar"] == 0.25
    assert lossy["position_mean_bins"] == pytest.approx(13 / 4)
    every = sh["all_steps_strict_as_zero"]  # the diluted figure, under its own name
    assert every["steps"] == 6 and every["gripper_disagreement"] == pytest.approx(1 / 6)
    assert every["share_equal_to_ar"] == pytest.approx(3 / 6)
    assert sh["strict_steps"] == 2 and sh["unshadowed_lossy_steps"] == 0 and "all" not in sh
    assert shadow_deviation([_step(0, "a", AR_TOKENS)]) is None  # a lossless method has nothing to shadow
    assert shadow_deviation([_step(0, "a", AR_TOKENS, strict=False, mode="skip")]) is None  # run without --shadow-ar
    half = shadow_deviation(_lossy_mix() + [_step(6, "f", AR_TOKENS, strict=False, mode="skip")])
    assert half["by_class"]["skip"] == c["skip"] | {"unshadowed_steps": 1} and half["unshadowed_lossy_steps"] == 1


def test_a_strict_steps_shadow_checks_agreement_and_leaves_the_deviation_alone() -> None:
    off = list(AR_TOKENS)
    off[0] += 40
    shadowed = _lossy_mix()
    shadowed[0]["shadow"] = off  # a strict step whose shadow disagrees: an agreement failure, not a deviation
    shadowed[1]["shadow"] = AR_TOKENS
    assert shadow_deviation(shadowed) == shadow_deviation(_lossy_mix())
    ar = _episode("ar", 0, 40, [_step(0, "a", AR_TOKENS), _step(1, "x", AR_TOKENS)], True)
    row = strict_agreement([ar, _episode("heisd", 0, 40, shadowed, True)], ["ar", "heisd"])["heisd"]
    # step 0 has ar's input digest and a shadow: counted once, by digest, and must agree with both
    assert (row["checked"], row["agree"], row["checked_by_digest"], row["checked_by_shadow"]) == (2, 1, 1, 1)
    assert row["first_disagreement"]["by"] == "shadow" and row["first_disagreement"]["ar_tokens"] == off
    broken = evidence([ar, _episode("heisd", 0, 40, shadowed, True)], ["ar", "heisd"])["broken"]
    assert broken and broken[0].startswith("heisd: strict-step agreement with ar 1 / 2: 1 strict step(s) carry "
                                           "other tokens than greedy ar (1 checked by input digest, 1 by shadow")


def test_strict_steps_off_ars_path_are_checked_by_their_shadow_even_without_ar_in_the_pair() -> None:
    steps = [_step(0, "zz", AR_TOKENS, mode="drafter", shadow=AR_TOKENS),  # an input ar never saw
             _step(1, "yy", AR_TOKENS, mode="drafter")]  # not shadowed (--shadow-strict-every 2): unchecked
    rows = strict_agreement([_episode("drafter", 3, 41, steps, True)], ["ar", "drafter"])
    assert rows["drafter"] | {"first_disagreement": None} == {
        "logged": True, "checked": 1, "agree": 1, "checked_by_digest": 0, "checked_by_shadow": 1, "pairs": 0,
        "same_start": 0, "first_disagreement": None}


def test_episode_time_ratio_is_a_ratio_of_sums_over_the_pairs_both_ran() -> None:
    """heisd: 10 steps of 10 ms on pair 40 (ar: 2 of 40 ms), 2 of 10 ms on pair 41 (ar: 2 of 40 ms).
    Its mean step is 4x ar's, but its time per task only 160 / 120 ms: the long episode costs."""
    ar = [_episode("ar", 0, k, [_step(t, "a", AR_TOKENS, wall=40.0, cpu=30.0) for t in range(2)], True)
          for k in (40, 41)]
    heisd = [_episode("heisd", 0, 40, [_step(t, "a", AR_TOKENS, wall=10.0, cpu=5.0) for t in range(10)], False),
             _episode("heisd", 0, 41, [_step(t, "a", AR_TOKENS, wall=10.0, cpu=5.0) for t in range(2)], True),
             _episode("heisd", 0, 42, [_step(0, "a", AR_TOKENS, wall=1.0, cpu=1.0)], True)]  # ar did not run it
    r = episode_time_ratio(heisd, ar)
    assert r["episode_time_ratio"] == pytest.approx(160 / 120) and r["episode_time_ratio_pairs"] == 2
    assert r["episode_time_ratio_cpu"] == pytest.approx(120 / 60)
    # the paired bootstrap over two pairs: both draws pair 40 (160 / 200), both pair 41 (160 / 40)
    assert r["episode_time_ratio_ci95"] == pytest.approx([0.8, 4.0])
    report = build_report([*ar, *heisd[:2]], ["ar", "heisd"], {"model": {}})
    h = report["heisd"]
    assert h["speedup_vs_ar"] == pytest.approx(4.0) and h["episode_time_ratio"] == pytest.approx(4 / 3)
    assert report["ar"]["episode_time_ratio"] == 1.0
    acc = report["_meta"]["acceptance"]
    assert acc["heisd_episode_time_ratio"] == pytest.approx(4 / 3) and acc["heisd_episode_time_ratio_ci95"]
    text = markdown(report)
    assert "| 6.00x | 1.33x ([0.80, 4.00]) |" in text  # CPU speedup (30 / 5 ms), then time per task
    assert "time per task (ar's episode decode time / heisd's, same pairs; reported, not a target): 1.33x" in text
    assert math.isnan(episode_time_ratio(heisd, [])["episode_time_ratio"])


def test_ratio_of_sums_and_its_bootstrap() -> None:
    ratio, ci = ratio_of_sums([3.0, 5.0, 4.0], [1.0, 2.0, 2.0])
    assert ratio == pytest.approx(12 / 5) and ci[0] <= ratio <= ci[1]
    assert ratio_of_sums([3.0, 5.0, 4.0], [1.0, 2.0, 2.0]) == (ratio, ci)  # seeded
    assert ratio_of_sums([3.0], [1.0]) == (3.0, None)  # one unit gives no interval
    nan, none = ratio_of_sums([], [])
    assert math.isnan(nan) and none is None
    with pytest.raises(ValueError):
        ratio_of_sums([1.0, 2.0], [1.0])


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
    assert h["contended_share"] == 0.0 and h["shadow"]["by_class"]["skip"]["share_equal_to_ar"] == 1.0
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
    from heisd_libero.eval_episodes import step_record

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


def test_the_skip_step_bound_reads_the_skip_steps_alone() -> None:
    """One skip step 40 position bins off ar among 30 strict steps: diluted over all steps its p95 is
    0, over the skip steps alone 40, above the bound of 30."""
    far = list(AR_TOKENS)
    far[0] += 40
    steps = [_step(t, f"a{t}", AR_TOKENS, mode="drafter") for t in range(30)]
    steps.append(_step(30, "s", far, strict=False, mode="skip", shadow=AR_TOKENS))
    ar = _episode("ar", 0, 40, [_step(t, f"a{t}", AR_TOKENS) for t in range(31)], True)
    report = build_report([ar, _episode("heisd", 0, 40, steps, True)], ["ar", "heisd"], {"model": {}})
    assert report["heisd"]["shadow"]["all_steps_strict_as_zero"]["position_p95_bins"] == 0
    acc = report["_meta"]["acceptance"]
    assert acc["heisd_skip_position_p95_bins"] == 40 and acc["skip_position_p95_within_30_bins"] is False
    assert acc["skip_gripper_disagreement_within_0.5%"] is True and acc["heisd_skip_steps_shadowed"] == 1
    text = markdown(report)
    assert ("- skip steps against greedy ar: position p95 |delta bin| <= 30: missed; gripper disagreement <= 0.5 %: "
            "met (p95 40 bins, gripper 0.00% of 1 shadowed skip steps)") in text
    assert "| heisd | skip | 1 | 0.0% | 40.0 / 40 |" in text and "| heisd | all steps (strict as 0) | 31 |" in text


def test_skip_bound_verdicts() -> None:
    from heisd_libero.eval_targets import skip_bound

    def row(skip: dict | None, skip_rate: float = 0.5) -> dict:
        relaxed = {"steps": 50, "position_p95_bins": 70.0, "gripper_disagreement": 0.2}
        shadow = {"by_class": {"relaxed": relaxed, **({"skip": skip} if skip else {})}}
        return {"shadow": shadow, "skip_rate": skip_rate}

    within = skip_bound(row({"steps": 1000, "position_p95_bins": 30.0, "gripper_disagreement": 0.005}))
    assert within["skip_position_p95_within_30_bins"] and within["skip_gripper_disagreement_within_0.5%"]
    assert within["heisd_relaxed_position_p95_bins"] == 70.0  # reported, not gated
    grip = skip_bound(row({"steps": 1000, "position_p95_bins": 12.0, "gripper_disagreement": 0.006}))
    assert grip["skip_position_p95_within_30_bins"] and grip["skip_gripper_disagreement_within_0.5%"] is False
    none = skip_bound(row(None, skip_rate=0.0))  # nothing executed unverified: nothing to bound
    assert none["skip_position_p95_within_30_bins"] is True and none["heisd_skip_position_p95_bins"] is None
    unshadowed = skip_bound({"shadow": None, "skip_rate": 0.3})  # skips ran, none shadowed: not measured
    assert unshadowed["skip_position_p95_within_30_bins"] is None
    assert unshadowed["skip_gripper_disagreement_within_0.5%"] is None


@pytest.mark.parametrize("shadow_off_by, status", [(0, 0), (1, 3)])
def test_eval_libero_exits_3_when_a_strict_step_disagrees_with_its_shadow(tmp_path, capsys, shadow_off_by: int,
                                                                          status: int) -> None:
    import json

    from heisd_libero.eval_libero import main
    from heisd_libero.eval_report import ResultLog

    key = {"suite": "libero_object", "max_steps": 7, "camera_size_px": 64, "dtype": "float32", "seed": 0}
    shadow = list(AR_TOKENS)
    shadow[3] += shadow_off_by
    log = ResultLog(tmp_path / "run.jsonl", key)
    log.append(_episode("ar", 0, 40, [_step(0, "a0", AR_TOKENS)], True))
    log.append(_episode("drafter", 0, 40, [_step(0, "a0", AR_TOKENS, mode="drafter"),
                                           _step(1, "off-path", AR_TOKENS, mode="drafter", shadow=shadow)], True))
    out = tmp_path / "r.json"
    assert main(["--report-from", str(tmp_path / "run.jsonl"), "--tasks", "0", "--init-states", "40",
                 "--methods", "ar,drafter", "--out", str(out)]) == status
    row = json.loads(out.read_text())["drafter"]["strict_agreement"]  # written either way
    assert (row["checked"], row["checked_by_digest"], row["checked_by_shadow"]) == (2, 1, 1)
    assert "strict-step agreement with ar: " + ("2 / 2" if status == 0 else "1 / 2") + \
        " (1 by input digest, 1 by shadow)" in out.with_suffix(".md").read_text()
    err = capsys.readouterr().err
    assert ("drafter: strict-step agreement with ar 1 / 2: 1 strict step(s) carry other tokens than greedy ar"
            in err) == (status == 3)
