"""ShadowDecoder: what heisd reads on steps ar executed, without touching what ar executes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heisd_ros.core.config import ConfigError, DecoderConfig, FusedMetricConfig
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.core.shadow import LIVE_LAGS, ShadowDecoder
from heisd_ros.core.types import Hit
from heisd_ros.core.verify_skip import cosine_similarity, gripper_switch_in


def _shadow(vla, drafter, store) -> ShadowDecoder:
    # tau above any F: the shadow still retrieves on every step (a replay applies each candidate's tau)
    cfg = DecoderConfig(method="heisd", fused_metric=FusedMetricConfig(tau=1e9))
    return ShadowDecoder(vla, cfg, store=store, drafter=drafter)


def _run(vla, drafter, demo_store, helpers, seeds, with_shadow: bool):
    ar = HybridDecoder(vla, DecoderConfig(method="ar"))
    shadow = _shadow(vla, drafter, demo_store) if with_shadow else None
    executed, records, lives = [], [], []
    for i, seed in enumerate(seeds):
        obs = helpers.random_obs(seed)
        obs.ee_pos = obs.ee_pos * 0 + np.array([0.1, 0.0, 0.2 + 0.01 * i])  # a window that moves
        _, st = ar.step(obs)
        executed.append(st.tokens)
        if shadow is not None:
            records.append(shadow.shadow(obs, st.tokens, ar.f_live))
            lives.append(ar.f_live.copy())
    return executed, records, lives


def test_the_shadow_never_changes_what_the_executing_method_decodes(vla, drafter, demo_store, helpers):
    seeds = [3, 5, 3, 8, 3, 11]
    alone, _, _ = _run(vla, drafter, demo_store, helpers, seeds, with_shadow=False)
    shadowed, records, _ = _run(vla, drafter, demo_store, helpers, seeds, with_shadow=True)
    assert shadowed == alone
    assert [r.executed_tokens for r in records] == alone  # one record per executed step


def test_a_record_holds_what_a_replay_of_any_point_reads(vla, drafter, demo_store, helpers):
    seeds = [3, 5, 3, 8, 3, 11]
    executed, records, lives = _run(vla, drafter, demo_store, helpers, seeds, with_shadow=True)
    # the window: undefined until it holds 3 positions, then defined
    assert [math.isnan(r.fused_metric) for r in records] == [True, True] + [False] * 4
    for i, r in enumerate(records):
        assert len(r.hits) == DecoderConfig().retrieval.top_k and r.fallback == ""
        assert 1 <= r.drafter_forwards <= 7 and 1 <= r.tree_forwards <= 7 and len(r.tree_tokens) == 7
        assert min(r.vision_ms, r.retrieval_ms, r.drafter_ms, r.tree_ms) > 0
        for h in r.hits:
            # similarity to the live feature of each earlier executed step, newest first
            assert len(h.similarity) == min(i, LIVE_LAGS)
            assert h.distance_m >= 0 and h.gripper_switch_in == 0  # the demo store's actions are all zero
    # seed 3's exact ar tokens are in the database: the tree accepts them in one forward
    exact = [r for r, s in zip(records, seeds) if s == 3]
    assert all(r.tree_forwards == 1 and r.tree_tokens == r.executed_tokens for r in exact)
    # lag 0 of step i is the live feature ar's step i-1 produced
    obs = helpers.random_obs(3)
    demo = demo_store.search(helpers.query(vla, obs), obs.instruction, 1)[0]
    top = records[2].hits[0]
    assert top.tokens == tuple(demo.action_tokens)
    assert top.similarity[0] == pytest.approx(cosine_similarity(lives[1], demo.feat_prev), abs=1e-6)
    assert top.similarity[1] == pytest.approx(cosine_similarity(lives[0], demo.feat_prev), abs=1e-6)


def test_a_task_the_database_lacks_is_a_record_without_hits(vla, drafter, demo_store, helpers):
    ar = HybridDecoder(vla, DecoderConfig(method="ar"))
    obs = helpers.random_obs(3, instruction="a task nobody demonstrated")
    _, st = ar.step(obs)
    record = _shadow(vla, drafter, demo_store).shadow(obs, st.tokens, ar.f_live)
    assert record.hits == () and record.tree_forwards == 0 and record.fallback == "task not in database"
    assert record.drafter_forwards >= 1 and record.executed_tokens == st.tokens


def test_shadow_mode_computes_heisd_only(vla, drafter, demo_store):
    with pytest.raises(ConfigError, match="heisd"):
        ShadowDecoder(vla, DecoderConfig(method="ar"), store=demo_store, drafter=drafter)


def test_the_gripper_switch_is_counted_from_the_hit():
    def hit(now: float, ahead: list[float]) -> Hit:
        z = np.zeros(3)
        return Hit(score=1.0, task="t", episode=0, step=0, action=np.array([0, 0, 0, 0, 0, 0, now]), action_tokens=(0,) * 7,
                   feat=z, feat_prev=z, ee_pos=z, next_actions=tuple((0, 0, 0, 0, 0, 0, g) for g in ahead))  # fmt: skip

    assert gripper_switch_in(hit(-1.0, [-1.0, 1.0, 1.0])) == 2
    assert gripper_switch_in(hit(1.0, [-1.0])) == 1
    assert gripper_switch_in(hit(-1.0, [-1.0, -1.0, -1.0])) == 0
    assert gripper_switch_in(hit(-1.0, [])) == 0


def test_a_replay_of_the_records_decides_what_heisd_decides_on_the_same_observations(vla, drafter, demo_store, helpers):
    """Open loop, the database holding ar's exact tokens for these observations (so heisd executes
    what ar executes): heisd at a point, stepping the observations itself, and the offline replay of
    that point over the shadow records of ar's run take the same mode on every step."""
    from heisd_ros.core.config import SourceChoiceConfig, VerifySkipConfig
    from heisd_ros.pipeline.shadow_replay import replay_episode

    point = DecoderConfig(method="heisd", fused_metric=FusedMetricConfig(tau=0.0),
                          source_choice=SourceChoiceConfig(enabled=False),
                          verify_skip=VerifySkipConfig(min_similarity=-1.0, min_similarity_bounds=(-1.0, 1.0),
                                                       max_distance_m=0.2, max_consecutive_skips=2,
                                                       max_bins_from_verified=12))  # fmt: skip
    seeds = [3, 3, 3, 3, 5, 3, 3, 3, 3, 3]  # seed 5 at a far pose: a step that cannot skip
    heisd = HybridDecoder(vla, point, store=demo_store, drafter=drafter)
    ar = HybridDecoder(vla, DecoderConfig(method="ar"))
    shadow = ShadowDecoder(vla, point, store=demo_store, drafter=drafter)
    modes, records = [], []
    for i, seed in enumerate(seeds):
        obs = helpers.random_obs(seed)
        obs.ee_pos = obs.ee_pos + np.array([0.0, 0.0, 0.001 * i])  # near the demonstrations' poses, moving
        modes.append(heisd.step(obs)[1].mode)
        _, st = ar.step(obs)
        records.append(shadow.shadow(obs, st.tokens, ar.f_live))
    assert "skip" in modes and "retrieval" in modes
    assert [s.mode for s in replay_episode(records, point)] == modes
