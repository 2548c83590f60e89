"""Position-aware retrieval (`retrieval.position_pool`): fetch a pool of hits by embedding similarity,
keep the Top-K whose recorded end-effector position is nearest the robot's. Checks the ordering and
its ties, the option's validation, and that `retrieval` and `heisd` on the real test database fetch
the pool and draft from the nearest hands."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from heisd_ros.core.config import ConfigError, DecoderConfig, FusedMetricConfig, RetrievalConfig
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.core.types import Hit
from heisd_ros.store.base import nearest_first


def _hit(score: float, x: float) -> Hit:
    z = np.zeros(4)
    return Hit(score, "t", 0, int(score * 100), np.zeros(7), (0,) * 7, z, z, np.array([x, 0.0, 0.2]))


def nearest_in_position(hits: list[Hit], ee_pos: np.ndarray, k: int) -> list[Hit]:
    return [hits[i] for i in nearest_first([h.ee_pos for h in hits], ee_pos)[:k]]


def test_nearest_first_keeps_the_k_nearest_nearest_first_ties_in_similarity_order():
    hits = [_hit(0.9, 0.10), _hit(0.8, -0.02), _hit(0.7, 0.02), _hit(0.6, 0.30), _hit(0.5, 0.0)]
    kept = nearest_in_position(hits, np.array([0.0, 0.0, 0.2]), 3)
    assert [h.score for h in kept] == [0.5, 0.8, 0.7]  # 0 cm, then the two at 2 cm in score order
    assert nearest_in_position(hits, np.array([0.3, 0.0, 0.2]), 1)[0].score == 0.6
    assert nearest_in_position(hits[:2], np.zeros(3), 5) == nearest_in_position(hits[:2], np.zeros(3), 2)
    assert nearest_first([], np.zeros(3)) == []


@pytest.fixture(params=["local", "edge"])
def either_store(request, demo_store, tmp_path):
    """The test database in qdrant-client's local mode, and the same points in Qdrant Edge."""
    if request.param == "local":
        yield demo_store
        return
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.store.factory import make_store

    edge = make_store(StoreConfig(backend="edge", path=str(tmp_path / "edge")), obs_dim=demo_store.obs_dim,
                      feat_dim=demo_store.feat_dim, create=True)
    edge.upsert(list(demo_store.scroll()))
    yield edge
    edge.close()


def test_search_near_equals_the_full_pool_re_ranked(either_store, helpers):
    """The two-phase search (ids and positions of the pool, then the kept hits' payloads and
    features) returns what fetching the whole pool and re-ranking it returns, field by field."""
    demo_store = either_store
    for seed in range(3):
        obs = helpers.random_obs(seed)
        query = np.random.default_rng(seed).normal(size=demo_store.obs_dim).astype(np.float32)
        timing: dict[str, float] = {}
        got = demo_store.search_near(query, obs.instruction, 3, obs.ee_pos, 12, timing)
        want = nearest_in_position(demo_store.search(query, obs.instruction, 12), obs.ee_pos, 3)
        assert len(got) == 3 and set(timing) == {"query", "rerank", "fetch"}
        for g, w in zip(got, want):
            assert (g.episode, g.step, g.action_tokens) == (w.episode, w.step, w.action_tokens)
            assert g.score == pytest.approx(w.score)
            np.testing.assert_array_equal(g.feat_prev, w.feat_prev)
            np.testing.assert_array_equal(g.feat, w.feat)
            np.testing.assert_array_equal(g.ee_pos, w.ee_pos)


def test_position_pool_is_validated():
    assert RetrievalConfig(position_pool=0).position_pool == 0
    assert RetrievalConfig(top_k=5, position_pool=20).position_pool == 20
    with pytest.raises(ConfigError, match="position_pool"):
        RetrievalConfig(top_k=5, position_pool=3)
    with pytest.raises(ConfigError, match="position_pool"):
        RetrievalConfig(position_pool=1000)


class _Spy:
    """The real test database, recording what each search asked for and returned."""

    def __init__(self, store) -> None:
        self.store, self.calls = store, []

    def search_near(self, query, task, top_k, ee_pos, pool, timing_ms=None):
        self.calls.append((top_k, pool, self.store.search(query, task, pool)))
        return self.store.search_near(query, task, top_k, ee_pos, pool, timing_ms)

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.mark.parametrize("method", ["retrieval", "heisd"])
def test_decoder_fetches_the_pool_and_drafts_from_the_nearest_hands(vla, drafter, demo_store, helpers, method):
    spy = _Spy(demo_store)
    cfg = DecoderConfig(method=method, fused_metric=FusedMetricConfig(tau=-1.0),
                        retrieval=RetrievalConfig(top_k=2, position_pool=12))
    dec = HybridDecoder(vla, dataclasses.replace(cfg, verify_skip=dataclasses.replace(cfg.verify_skip, enabled=False)),
                        store=spy, drafter=drafter)
    obs = helpers.random_obs(3)
    dec.reset(obs.instruction)
    checked = 0
    for i in range(4):  # the hand moves away from where the exact demo was recorded
        obs.ee_pos = helpers.random_obs(3).ee_pos + np.array([0.05 * i, 0.0, 0.0])
        _, st = dec.step(obs)
        if st.mode == "drafter":
            continue
        k, n_pool, pool = spy.calls[-1]
        assert (k, n_pool, len(pool)) == ((1 if method == "retrieval" else 2), 12, 12)
        assert {"retrieval_query", "retrieval_rerank", "retrieval_fetch"} <= set(st.latency_ms)
        nearest = min(pool, key=lambda h: float(np.linalg.norm(np.asarray(h.ee_pos) - obs.ee_pos)))
        assert st.retrieval_score == pytest.approx(float(nearest.score))
        checked += 1
    assert checked >= 2
