"""Adaptive verify-skip (docs/design.md §6): every veto at its edge, feedback, persistence, offline calibration."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os

import numpy as np
import pytest

from heisd_ros.core.config import VerifySkipConfig
from heisd_ros.core.errors import InvalidObservationError
from heisd_ros.core.types import Hit
from heisd_ros.core.verify_skip import (
    REASON_DISABLED,
    REASON_DISTANCE,
    REASON_FROM_VERIFIED,
    REASON_GRIPPER,
    REASON_GRIPPER_AHEAD,
    REASON_MAX_CONSECUTIVE,
    REASON_NO_LIVE_FEATURE,
    REASON_SIMILARITY,
    REASON_SKIP,
    REASON_SPREAD,
    VerifySkipPolicy,
    calibrate_thresholds,
    cosine_similarity,
)

# cos([3, 4], [4, 3]) = 24 / 25 = 0.96 exactly in binary64 (norms are exactly 5); 2**-6 m is exact too.
F_LIVE = np.array([3.0, 4.0])
FEAT_PREV = np.array([4.0, 3.0])
SIM = 0.96
DIST = 2.0**-6
GRIP = 255


def make_hit(feat_prev=FEAT_PREV, ee_pos=(0.0, 0.0, DIST), gripper=GRIP, next_grippers=(), position=(10, 11, 12)) -> Hit:
    """A hit whose demonstration holds the gripper closed (+1) now and then takes `next_grippers`."""
    return Hit(
        score=0.9,
        task="t",
        episode=0,
        step=3,
        action=np.array([0, 0, 0, 0, 0, 0, 1.0]),
        action_tokens=(*position, 13, 14, 15, gripper),
        next_actions=tuple((0, 0, 0, 0, 0, 0, g) for g in next_grippers),
        feat=np.asarray(feat_prev, dtype=float),
        feat_prev=np.asarray(feat_prev, dtype=float),
        ee_pos=np.asarray(ee_pos, dtype=float),
    )


def edge_cfg(**kw) -> VerifySkipConfig:
    base = dict(min_similarity=SIM, max_distance_m=DIST, max_consecutive_skips=3)
    base.update(kw)
    return VerifySkipConfig(**base)


EE = np.zeros(3)


def test_fixture_arithmetic_is_exact():
    assert cosine_similarity(F_LIVE, FEAT_PREV) == SIM
    assert float(np.linalg.norm(EE - make_hit().ee_pos)) == DIST


def test_skips_exactly_at_both_thresholds():
    d = VerifySkipPolicy(edge_cfg()).decide(F_LIVE, make_hit(), EE, GRIP)
    assert d.skip and d.reason == REASON_SKIP
    assert d.similarity == SIM and d.distance == DIST


def test_similarity_just_below_min_s_does_not_skip():
    cfg = edge_cfg(min_similarity=float(np.nextafter(SIM, 1.0)))
    d = VerifySkipPolicy(cfg).decide(F_LIVE, make_hit(), EE, GRIP)
    assert not d.skip and d.reason == REASON_SIMILARITY


def test_distance_just_above_o_dist_does_not_skip():
    cfg = edge_cfg(max_distance_m=float(np.nextafter(DIST, 0.0)))
    d = VerifySkipPolicy(cfg).decide(F_LIVE, make_hit(), EE, GRIP)
    assert not d.skip and d.reason == REASON_DISTANCE


def test_disabled_never_skips():
    d = VerifySkipPolicy(edge_cfg(enabled=False)).decide(F_LIVE, make_hit(), EE, GRIP)
    assert not d.skip and d.reason == REASON_DISABLED


def test_no_live_feature_never_skips():
    d = VerifySkipPolicy(edge_cfg()).decide(None, make_hit(), EE, GRIP)
    assert not d.skip and d.reason == REASON_NO_LIVE_FEATURE


def test_consecutive_skips_capped_at_n_max_and_reset_by_a_verified_step():
    policy = VerifySkipPolicy(edge_cfg(max_consecutive_skips=3))
    for _ in range(3):
        assert policy.decide(F_LIVE, make_hit(), EE, GRIP).skip
        policy.record(True)
    d = policy.decide(F_LIVE, make_hit(), EE, GRIP)
    assert not d.skip and d.reason == REASON_MAX_CONSECUTIVE
    policy.record(False)
    assert policy.consecutive_skips == 0
    assert policy.decide(F_LIVE, make_hit(), EE, GRIP).skip


def test_n_max_zero_never_skips():
    d = VerifySkipPolicy(edge_cfg(max_consecutive_skips=0)).decide(F_LIVE, make_hit(), EE, GRIP)
    assert not d.skip and d.reason == REASON_MAX_CONSECUTIVE


def test_reset_episode_clears_the_counter():
    policy = VerifySkipPolicy(edge_cfg(max_consecutive_skips=1))
    policy.record(True)
    assert not policy.decide(F_LIVE, make_hit(), EE, GRIP).skip
    policy.reset_episode()
    assert policy.decide(F_LIVE, make_hit(), EE, GRIP).skip


@pytest.mark.parametrize(("lookahead", "next_grippers", "skips"), [
    (0, (1.0, -1.0, -1.0), True),     # the guard off: the demo's coming switch does not matter
    (1, (1.0, -1.0, -1.0), True),     # the switch is 2 actions ahead: beyond a 1-step lookahead
    (2, (1.0, -1.0, -1.0), False),    # within 2
    (3, (1.0, 1.0, 1.0), True),       # no switch ahead
    (3, (), True),                    # the demonstration's last step: nothing ahead
    (3, (1.0, 1.0, -0.5), False),     # any change of sign counts
])
def test_gripper_lookahead_refuses_a_skip_where_the_demonstration_switches_the_gripper(lookahead, next_grippers, skips):
    d = VerifySkipPolicy(edge_cfg(gripper_lookahead_steps=lookahead)).decide(
        F_LIVE, make_hit(next_grippers=next_grippers), EE, GRIP)
    assert d.skip is skips and d.reason == (REASON_SKIP if skips else REASON_GRIPPER_AHEAD)


@pytest.mark.parametrize("bad", [-1, 4])
def test_gripper_lookahead_beyond_the_stored_actions_is_refused(bad):
    with pytest.raises(Exception, match="gripper_lookahead_steps"):
        edge_cfg(gripper_lookahead_steps=bad)


def test_hit_spread_gate_needs_the_other_hits_to_agree():
    """The median position |delta bin| to the other hits decides, at its edge; no other hit, no skip."""
    hit = make_hit()
    near, far = make_hit(position=(12, 11, 13)), make_hit(position=(40, 11, 12))  # 3 and 30 bins away
    args = (F_LIVE, hit, np.zeros(3), GRIP)
    policy = VerifySkipPolicy(edge_cfg(max_hit_spread_bins=3))
    d = policy.decide(*args, hits=(hit, near, near, far))
    assert (d.skip, d.spread_bins) == (True, 3.0)
    d = policy.decide(*args, hits=(hit, near, far, far))
    assert (d.skip, d.reason, d.spread_bins) == (False, REASON_SPREAD, 30.0)
    assert policy.decide(*args, hits=(hit,)).reason == REASON_SPREAD
    off = VerifySkipPolicy(edge_cfg()).decide(*args, hits=(hit, far))
    assert off.skip and off.spread_bins == 30.0  # measured, not gated, when the check is off


def test_from_verified_gate_compares_with_the_last_verified_tokens():
    hit = make_hit()
    policy = VerifySkipPolicy(edge_cfg(max_bins_from_verified=5))
    args = (F_LIVE, hit, np.zeros(3), GRIP)
    d = policy.decide(*args, last_verified_tokens=(12, 14, 12, 0, 0, 0, GRIP))  # 2 + 3 + 0 bins
    assert (d.skip, d.from_verified_bins) == (True, 5.0)
    d = policy.decide(*args, last_verified_tokens=(16, 11, 12, 0, 0, 0, GRIP))
    assert (d.skip, d.reason) == (False, REASON_FROM_VERIFIED)
    assert policy.decide(*args).reason == REASON_FROM_VERIFIED  # none verified yet: no evidence


@pytest.mark.parametrize("last", [GRIP - 1, None])
def test_gripper_mismatch_or_unknown_blocks(last):
    d = VerifySkipPolicy(edge_cfg()).decide(F_LIVE, make_hit(), EE, last)
    assert not d.skip and d.reason == REASON_GRIPPER


def test_decide_does_not_change_state():
    policy = VerifySkipPolicy(edge_cfg())
    before = policy.state_dict()
    for _ in range(5):
        policy.decide(F_LIVE, make_hit(), EE, GRIP)
    assert policy.state_dict() == before


def test_feature_shape_mismatch_raises():
    with pytest.raises(InvalidObservationError):
        VerifySkipPolicy(edge_cfg()).decide(np.ones(3), make_hit(), EE, GRIP)
    with pytest.raises(InvalidObservationError):
        VerifySkipPolicy(edge_cfg()).decide(F_LIVE, make_hit(), np.array([0.0, math.nan, 0.0]), GRIP)


def test_zero_feature_never_skips():
    d = VerifySkipPolicy(edge_cfg()).decide(np.zeros(2), make_hit(), EE, GRIP)
    assert not d.skip and d.similarity == 0.0


# ------------------------------------------------------------------------------------- feedback


def test_feedback_direction():
    cfg = VerifySkipConfig(min_similarity=0.9, max_distance_m=0.05, feedback_step=0.01, distance_shrink=0.5)
    policy = VerifySkipPolicy(cfg)
    policy.feedback(True)
    assert policy.min_similarity == pytest.approx(0.89)
    assert policy.max_distance_m == 0.05  # success leaves O_dist alone
    policy.feedback(False)
    policy.feedback(False)
    assert policy.min_similarity == pytest.approx(0.91)
    assert policy.max_distance_m == pytest.approx(0.0125)


def test_feedback_clamps_to_bounds():
    cfg = VerifySkipConfig(
        min_similarity=0.9,
        max_distance_m=0.05,
        feedback_step=0.1,
        distance_shrink=0.1,
        min_similarity_bounds=(0.8, 0.95),
        max_distance_bounds_m=(0.01, 0.1),
    )
    policy = VerifySkipPolicy(cfg)
    for _ in range(5):
        policy.feedback(True)
    assert policy.min_similarity == 0.8
    for _ in range(5):
        policy.feedback(False)
    assert policy.min_similarity == 0.95
    assert policy.max_distance_m == 0.01


# ------------------------------------------------------------------------------------- persistence


def test_persistence_round_trip(tmp_path):
    path = tmp_path / "sub" / "skip_state.json"
    cfg = VerifySkipConfig(state_path=str(path), feedback_step=0.01, online=True)
    policy = VerifySkipPolicy(cfg)
    policy.feedback(False)
    assert path.exists()
    restarted = VerifySkipPolicy(cfg)
    assert restarted.min_similarity == policy.min_similarity != cfg.min_similarity
    assert restarted.max_distance_m == policy.max_distance_m != cfg.max_distance_m
    assert restarted.consecutive_skips == 0
    # without the online stage the point's thresholds run, whatever an earlier online run saved
    offline = VerifySkipPolicy(dataclasses.replace(cfg, online=False))
    assert (offline.min_similarity, offline.max_distance_m) == (cfg.min_similarity, cfg.max_distance_m)


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path, monkeypatch):
    path = tmp_path / "skip_state.json"
    cfg = VerifySkipConfig(state_path=str(path), online=True)
    policy = VerifySkipPolicy(cfg)
    policy.feedback(True)
    good = path.read_text()
    calls = []
    real_replace = os.replace

    def spy_replace(src, dst):
        calls.append((os.path.dirname(src), dst))
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", spy_replace)
    policy.feedback(True)  # must not raise; the old file must survive intact
    monkeypatch.setattr(os, "replace", real_replace)
    assert calls and calls[0][0] == str(tmp_path) and str(calls[0][1]) == str(path)
    assert path.read_text() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["skip_state.json"]


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        json.dumps({"min_similarity": 0.9}),
        json.dumps({"min_similarity": "abc", "max_distance_m": 0.01}),
        json.dumps(
            {
                "min_similarity": math.nan,
                "max_distance_m": 0.01,
                "base_min_similarity": 0.95,
                "base_max_distance_m": 0.02,
            }
        ),
    ],
)
def test_corrupt_state_file_gives_defaults_and_a_warning(tmp_path, caplog, content):
    path = tmp_path / "skip_state.json"
    path.write_text(content)
    cfg = VerifySkipConfig(state_path=str(path), online=True)
    with caplog.at_level(logging.WARNING, logger="heisd_ros.core.verify_skip"):
        policy = VerifySkipPolicy(cfg)
    assert policy.min_similarity == cfg.min_similarity
    assert policy.max_distance_m == cfg.max_distance_m
    assert any(r.levelno == logging.WARNING for r in caplog.records)


def test_state_from_other_configured_thresholds_is_ignored(tmp_path, caplog):
    path = tmp_path / "skip_state.json"
    old = VerifySkipConfig(state_path=str(path), min_similarity=0.95, online=True)
    VerifySkipPolicy(old).feedback(True)
    recalibrated = dataclasses.replace(old, min_similarity=0.9)
    with caplog.at_level(logging.WARNING, logger="heisd_ros.core.verify_skip"):
        policy = VerifySkipPolicy(recalibrated)
    assert policy.min_similarity == 0.9
    assert caplog.records


def test_out_of_bounds_state_is_clamped(tmp_path):
    path = tmp_path / "skip_state.json"
    cfg = VerifySkipConfig(state_path=str(path), online=True)
    state = VerifySkipPolicy(cfg).state_dict()
    state.update(min_similarity=5.0, max_distance_m=-1.0)
    path.write_text(json.dumps(state))
    policy = VerifySkipPolicy(cfg)
    assert policy.min_similarity == cfg.min_similarity_bounds[1]
    assert policy.max_distance_m == cfg.max_distance_bounds_m[0]


# ------------------------------------------------------------------------------------- calibration


def brute_force_min_s(s, ok, target):
    best = None
    for v in np.unique(s):
        sel = s >= v
        if ok[sel].mean() >= target:
            best = v if best is None else min(best, v)
    return best


def test_calibration_recovers_a_planted_threshold():
    rng = np.random.default_rng(0)
    m = 20000
    s = rng.uniform(0.0, 1.0, m)
    planted = 0.8
    ok = s >= planted  # every pair above the planted similarity passes, none below
    d = np.where(ok, rng.uniform(0.0, 0.01, m), rng.uniform(0.0, 0.1, m))
    cal = calibrate_thresholds(s, d, ok, target_pass_rate=1.0)
    assert cal.qualified
    assert planted <= cal.min_similarity < planted + 1e-3
    assert cal.max_distance_m == pytest.approx(0.0095, abs=3e-4)
    # at 95% the threshold may dip below the planted one by exactly the allowed failures:
    # (1 - 0.8) / (1 - s) >= 0.95  <=>  s >= 1 - 0.2 / 0.95
    cal95 = calibrate_thresholds(s, d, ok)
    assert cal95.min_similarity == pytest.approx(1 - 0.2 / 0.95, abs=5e-3)
    assert cal95.pass_rate_at_min >= 0.95


def test_calibration_matches_brute_force_with_ties_and_noise():
    rng = np.random.default_rng(1)
    s = np.round(rng.uniform(0.5, 1.0, 800), 2)  # many ties
    ok = rng.uniform(size=800) < (s - 0.4) * 1.6
    d = rng.uniform(0, 0.05, 800)
    for target in (0.8, 0.9, 0.95):
        cal = calibrate_thresholds(s, d, ok, target_pass_rate=target)
        expected = brute_force_min_s(s, ok, target)
        assert cal.qualified == (expected is not None)
        if expected is not None:
            assert cal.min_similarity == expected
            assert cal.max_distance_m == pytest.approx(np.percentile(d[(s >= expected) & ok], 95))


def test_calibration_without_a_qualifying_threshold_never_skips():
    s = np.linspace(0, 1, 100)
    cal = calibrate_thresholds(s, np.zeros(100), np.zeros(100, dtype=bool))
    assert not cal.qualified and cal.min_similarity == 1.0 and math.isnan(cal.pass_rate_at_min)
    empty = calibrate_thresholds(np.array([]), np.array([]), np.array([], dtype=bool))
    assert not empty.qualified and empty.n_pairs == 0


def test_calibration_curve_bins():
    s = np.array([0.0, 0.1, 0.9, 1.0])
    d = np.array([0.1, 0.3, 0.02, 0.04])
    ok = np.array([False, True, True, True])
    curve = calibrate_thresholds(s, d, ok, n_bins=2).curve
    np.testing.assert_allclose(curve.bin_edges, [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(curve.count, [2, 2])
    np.testing.assert_allclose(curve.mean_distance_m, [0.2, 0.03])
    np.testing.assert_allclose(curve.pass_rate, [0.5, 1.0])
    assert json.loads(json.dumps(curve.to_dict()))["count"] == [2, 2]


def test_calibration_rejects_bad_input():
    with pytest.raises(ValueError):
        calibrate_thresholds(np.ones(3), np.ones(2), np.ones(3, dtype=bool))
    with pytest.raises(ValueError):
        calibrate_thresholds(np.array([math.nan]), np.ones(1), np.ones(1, dtype=bool))
    with pytest.raises(ValueError):
        calibrate_thresholds(np.ones(3), np.ones(3), np.ones(3, dtype=bool), target_pass_rate=0.0)


# --- the N_max safety bound as a property -------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_vec = st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=2, max_size=2)
_hit = st.builds(lambda f, p, g: make_hit(feat_prev=np.array(f) + 1e-3, ee_pos=p, gripper=g), _vec,
                 st.tuples(*[st.floats(-0.05, 0.05, allow_nan=False)] * 3), st.sampled_from([GRIP, GRIP - 1]))  # fmt: skip
_op = st.one_of(
    st.tuples(st.just("step"), st.lists(_hit, min_size=1, max_size=4), st.one_of(st.none(), _vec),
              st.sampled_from([None, GRIP, GRIP - 1])),
    st.tuples(st.just("feedback"), st.booleans()),
    st.tuples(st.just("reset")),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(n_max=st.integers(0, 6), min_s=st.floats(-1.0, 1.0), o_dist=st.floats(0.0, 0.2), ops=st.lists(_op, max_size=60))
def test_consecutive_skips_never_exceed_n_max(n_max, min_s, o_dist, ops):
    """Whatever the hits, live features, thresholds, feedback and resets, no run of skips is longer
    than N_max: the engine's loop (decide over the Top-K hits, then record) can never break the bound."""
    policy = VerifySkipPolicy(VerifySkipConfig(
        min_similarity=min_s, max_distance_m=o_dist, max_consecutive_skips=n_max, feedback_step=0.3,
        min_similarity_bounds=(-1.0, 1.0), max_distance_bounds_m=(0.0, 0.2)))  # fmt: skip
    run = 0
    for op in ops:
        if op[0] == "reset":
            policy.reset_episode()
            run = 0
        elif op[0] == "feedback":
            policy.feedback(op[1])
        else:
            _, hits, f_live, last_grip = op
            f = None if f_live is None else np.array(f_live) + 1e-3
            skipped = any(policy.decide(f, h, EE, last_grip).skip for h in hits)
            policy.record(skipped)
            run = run + 1 if skipped else 0
            assert run <= n_max and policy.consecutive_skips == run


def test_episode_results_move_the_thresholds_only_where_the_point_turns_the_online_stage_on():
    """What ships is what was measured: a point measured without the online stage keeps its
    thresholds through any number of episode results (the node feeds every episode_result)."""
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.engine import HybridDecoder
    from heisd_ros.models.loader import tiny_vla

    vla = tiny_vla(seed=0)
    for online in (False, True):
        decoder = HybridDecoder(vla, DecoderConfig(method="ar", verify_skip=VerifySkipConfig(online=online)))
        before = (decoder.skip.min_similarity, decoder.skip.max_distance_m)
        decoder.episode_feedback(False)
        decoder.episode_feedback(False)
        assert ((decoder.skip.min_similarity, decoder.skip.max_distance_m) != before) is online
