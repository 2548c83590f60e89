"""SourceChoice: the kinematic boundary first, then what each draft source has cost this episode."""

from __future__ import annotations

import math

import pytest

from heisd_ros.core import source_choice as sc
from heisd_ros.core.config import ConfigError, SourceChoiceConfig
from heisd_ros.core.source_choice import SourceChoice
from heisd_ros.core.types import StepStats

TAU = 0.5
FORWARDS = SourceChoiceConfig(smoothing=0.5, min_retrieval_steps=2, probe_every_steps=4,
                              retrieval_overhead_forwards=0.5, skip_cost_forwards=0.5,
                              prefill_extra_forwards=0.0, drafter_overhead_forwards=0.0)


def step(mode: str, forwards: int, ms: float = 10.0, tokens_per_forward=None, fallback: str = "") -> StepStats:
    if tokens_per_forward is None:  # one token per forward, the rest in the last
        tokens_per_forward = [1] * (forwards - 1) + [8 - forwards] if forwards else []
    tpf = tokens_per_forward
    return StepStats(mode=mode, method="heisd", skipped=mode == "skip", llm_forwards=forwards,
                     tokens_per_forward=[] if mode == "skip" else tpf, tokens=(1,) * 7,
                     latency_ms={"total": ms}, fallback=fallback)


def run_step(choice: SourceChoice, retrieval_step: StepStats, drafter_step: StepStats, f: float = 0.9):
    """One decision at `f`, then the step the decision leads to is recorded."""
    d = choice.decide(f, TAU)
    choice.record(retrieval_step if d.retrieval else drafter_step)
    return d


def test_the_kinematic_boundary_is_the_first_gate():
    choice = SourceChoice(FORWARDS)
    assert choice.decide(None, TAU) == sc.SourceDecision(False, sc.REASON_NO_WINDOW)
    assert choice.decide(math.nan, TAU).reason == sc.REASON_NO_WINDOW
    assert choice.decide(0.49, TAU) == sc.SourceDecision(False, sc.REASON_BELOW_TAU)
    assert choice.decide(0.5, TAU) == sc.SourceDecision(True, sc.REASON_LEARNING)
    off = SourceChoice(SourceChoiceConfig(enabled=False))
    for _ in range(20):  # off: every step above the boundary retrieves, whatever it costs
        off.record(step("retrieval", 7))
        off.record(step("drafter", 2))
        assert off.decide(0.9, TAU) == sc.SourceDecision(True, sc.REASON_ABOVE_TAU)
    assert off.decide(0.1, TAU).reason == sc.REASON_BELOW_TAU


def test_routes_away_from_retrieval_that_keeps_costing_two_forwards_with_low_acceptance():
    """Retrieval steps accept one token in their first forward and need a second: 2 forwards plus
    the query's overhead, against a drafter that finishes in 2."""
    choice = SourceChoice(FORWARDS)
    choice.record(step("drafter", 2))  # the episode's first steps (no window) used the drafter
    reasons = [run_step(choice, step("retrieval", 2, tokens_per_forward=[1, 6]), step("drafter", 2)).reason
               for _ in range(12)]
    assert reasons[:2] == [sc.REASON_LEARNING] * 2  # min_retrieval_steps before any comparison
    assert reasons[2:5] == [sc.REASON_COSTLIER] * 3
    assert reasons[5] == sc.REASON_PROBE  # the 4th step routed away retrieves
    assert reasons[6:9] == [sc.REASON_COSTLIER] * 3 and reasons[9] == sc.REASON_PROBE
    est = choice.estimates()
    assert est["retrieval_cost"] == pytest.approx(2.5) and est["drafter_cost"] == pytest.approx(2.0)
    assert est["retrieval_accept_length"] == pytest.approx(3.5)


def test_keeps_retrieval_while_it_is_cheaper_and_counts_skips_as_cheap_retrieval_steps():
    choice = SourceChoice(FORWARDS)
    choice.record(step("drafter", 3))
    steps = [step("retrieval", 1), step("skip", 0), step("skip", 0), step("retrieval", 2)] * 4
    reasons = []
    for s in steps:
        d = choice.decide(0.9, TAU)
        assert d.retrieval
        reasons.append(d.reason)
        choice.record(s)
    assert set(reasons[2:]) == {sc.REASON_CHEAPER}
    # verified steps cost up to 2.5 (2 forwards + the overhead), skips 0.5: the average stays well
    # below the drafter's 3
    assert choice.estimates()["retrieval_cost"] < 2.0


def test_probes_pick_up_a_database_that_starts_matching():
    choice = SourceChoice(FORWARDS)
    choice.record(step("drafter", 2))
    for _ in range(6):
        run_step(choice, step("retrieval", 4), step("drafter", 2))
    assert choice.decide(0.9, TAU).reason == sc.REASON_COSTLIER
    # the scene changes: retrieval drafts are now accepted whole (1 forward)
    reasons = [run_step(choice, step("retrieval", 1), step("drafter", 2)).reason for _ in range(16)]
    assert reasons.index(sc.REASON_PROBE) < FORWARDS.probe_every_steps
    assert reasons[-4:] == [sc.REASON_CHEAPER] * 4  # each probe pulls the average down until it is back


def test_reset_forgets_the_episode():
    choice = SourceChoice(FORWARDS)
    choice.record(step("drafter", 2))
    for _ in range(3):
        run_step(choice, step("retrieval", 5), step("drafter", 2))
    assert choice.decide(0.9, TAU).reason == sc.REASON_COSTLIER
    choice.reset()
    assert choice.estimates() == {k: None for k in choice.estimates()}
    assert choice.routed_away == 0
    assert choice.decide(0.9, TAU).reason == sc.REASON_LEARNING


def test_fallback_and_ar_steps_teach_nothing():
    choice = SourceChoice(FORWARDS)
    choice.record(step("drafter", 7, fallback="database fault: gone"))
    choice.record(step("ar", 7))
    assert choice.estimates()["drafter_cost"] is None


def test_costs_are_counted_in_forwards_never_timed():
    """Two runs of the same steps, one on a machine ten times slower (or a loaded one): the same
    costs and the same routing, because no decision reads a step's time."""
    runs = []
    for ms in (2.0, 200.0):
        choice = SourceChoice(SourceChoiceConfig(smoothing=1.0, min_retrieval_steps=1))
        choice.record(step("drafter", 2, ms=ms))
        choice.record(step("retrieval", 2, ms=ms / 10))  # faster by the clock, one overhead dearer
        runs.append((choice.estimates(), choice.decide(0.9, TAU)))
    assert runs[0] == runs[1]
    assert runs[0][1].reason == sc.REASON_COSTLIER
    assert runs[0][0]["retrieval_cost"] == pytest.approx(3.4)  # 2 forwards + prefill 0.5 + overhead 0.9


def test_a_step_costs_its_forwards_its_prefill_and_its_mode():
    """The mini VLA's measured ranking, counted: a verified retrieval step of 1.24 forwards is cheaper
    than a drafter step of 2.1 (the drafter's calls), a skip cheapest; a retrieval step whose drafts
    fail and needs 2.5 forwards is dearer than the drafter."""
    choice = SourceChoice()
    cost = {m: choice.step_cost(step(m, f)) for m, f in (("drafter", 2), ("retrieval", 1), ("skip", 0))}
    assert cost == pytest.approx({"drafter": 3.2, "retrieval": 2.4, "skip": 0.3})
    assert choice.step_cost(step("retrieval", 3)) > cost["drafter"]


@pytest.mark.parametrize("field, value", [("smoothing", 0.0), ("smoothing", 1.5),
                                          ("min_retrieval_steps", 0), ("probe_every_steps", 0),
                                          ("retrieval_overhead_forwards", -1.0),
                                          ("skip_cost_forwards", math.nan), ("drafter_overhead_forwards", 8.0)])
def test_bad_config_is_refused(field, value):
    with pytest.raises(ConfigError):
        SourceChoiceConfig(**{field: value})
