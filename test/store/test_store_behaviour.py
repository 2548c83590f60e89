"""The DemoDatabase behaviour suite, run for real on every embedded backend (Edge, local in memory, local on disk)."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.errors import (
    ConfigError,
    DatabaseError,
    DatabaseUnavailableError,
    EmptyDatabaseError,
    InvalidObservationError,
    UnknownTaskError,
)
from heisd_ros.core.store_api import DemoStore
from heisd_ros.store import PAYLOAD_FIELDS, DemoDatabase, DemoPoint, InvalidDemoPointError, make_store

OBS_DIM, FEAT_DIM = 24, 8
BACKENDS = ["edge", "local-memory", "local-path"]


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def make_point(rng, task="pick", episode=0, step=0, obs=None, dataset="unit", success=True):
    return DemoPoint(
        dataset=dataset,
        task=task,
        instruction=f"please {task}",
        episode=episode,
        step=step,
        obs=rng.normal(size=OBS_DIM) if obs is None else obs,
        feat=rng.normal(size=FEAT_DIM),
        feat_prev=rng.normal(size=FEAT_DIM),
        action=rng.uniform(-1, 1, size=7),
        action_tokens=tuple(int(t) for t in rng.integers(31744, 32000, size=7)),
        ee_pos=rng.uniform(-0.5, 0.5, size=3),
        next_actions=rng.uniform(-1, 1, size=(int(rng.integers(0, 4)), 7)),
        success=success,
    )


def config(kind, tmp_path, **over):
    if kind == "edge":
        return StoreConfig(backend="edge", path=str(tmp_path / "db"), **over)
    if kind == "local-memory":
        return StoreConfig(backend="local", **over)
    return StoreConfig(backend="local", path=str(tmp_path / "db"), **over)


def fill(store):
    rng = np.random.default_rng(1)
    # episode numbers are unique within a dataset (the point id is dataset/episode/step)
    points = [
        make_point(rng, task=t, episode=3 * i + e, step=k)
        for i, t in enumerate(("pick", "place"))
        for e in range(3)
        for k in range(4)
    ]
    store.upsert(points, batch_size=5)
    return points


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    """A fresh, empty store (for tests that write)."""
    s = make_store(config(request.param, tmp_path), OBS_DIM, FEAT_DIM, create=True)
    yield s
    s.close()


@pytest.fixture(scope="module", params=BACKENDS)
def filled(request, tmp_path_factory):
    """One filled store per backend, shared by the tests that only read."""
    s = make_store(config(request.param, tmp_path_factory.mktemp(request.param)), OBS_DIM, FEAT_DIM, create=True)
    points = fill(s)
    yield s, points
    s.close()


def test_is_a_demo_store(filled):
    store, _ = filled
    assert isinstance(store, DemoStore) and isinstance(store, DemoDatabase)
    assert (store.obs_dim, store.feat_dim) == (OBS_DIM, FEAT_DIM)


def test_round_trip_of_every_field_and_vector(filled):
    store, points = filled
    by_id = {p.id: p for p in points}
    scrolled = list(store.scroll())
    assert sorted(p.id for p in scrolled) == sorted(by_id)
    for got in scrolled:
        want = by_id[got.id]
        for name in PAYLOAD_FIELDS:
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)
        for name in ("obs", "feat", "feat_prev"):  # cosine vectors are stored unit-normalised
            np.testing.assert_allclose(getattr(got, name), unit(getattr(want, name)), atol=1e-6, err_msg=name)
    # a hit carries the payload and feat / feat_prev as float32
    target = points[5]
    (hit,) = store.search(target.obs, target.task, top_k=1)
    assert hit.score == pytest.approx(1.0, abs=1e-5)
    assert (hit.task, hit.episode, hit.step, hit.success) == (target.task, target.episode, target.step, target.success)
    assert hit.action_tokens == target.action_tokens
    np.testing.assert_array_equal(hit.action, target.action)
    np.testing.assert_array_equal(hit.ee_pos, target.ee_pos)
    np.testing.assert_array_equal(np.asarray(hit.next_actions).reshape(-1, 7), target.next_actions)
    assert hit.feat.dtype == np.float32 and hit.feat_prev.dtype == np.float32
    assert hit.feat.shape == hit.feat_prev.shape == (FEAT_DIM,)
    np.testing.assert_allclose(hit.feat, unit(target.feat), atol=1e-6)
    np.testing.assert_allclose(hit.feat_prev, unit(target.feat_prev), atol=1e-6)


def test_upsert_is_idempotent(store):
    points = fill(store)
    n = store.count()
    assert n == len(points) and store.count("pick") == len(points) // 2
    rng = np.random.default_rng(9)
    again = make_point(rng, task="pick", episode=points[0].episode, step=points[0].step)  # same id, new content
    assert again.id == points[0].id
    store.upsert([again, again])
    store.upsert(points[1:4])
    assert store.count() == n
    (hit,) = store.search(again.obs, "pick", top_k=1)
    assert hit.action_tokens == again.action_tokens


def test_task_filter_beats_closer_vectors(store):
    rng = np.random.default_rng(2)
    query = unit(rng.normal(size=OBS_DIM))
    near = [
        make_point(rng, task="other", episode=0, step=k, obs=query + 1e-3 * rng.normal(size=OBS_DIM)) for k in range(6)
    ]
    far = [make_point(rng, task="mine", episode=1, step=k, obs=-query + rng.normal(size=OBS_DIM)) for k in range(3)]
    store.upsert(near + far)
    hits = store.search(query, "mine", top_k=5)
    assert len(hits) == 3 and {h.task for h in hits} == {"mine"}
    assert all(h.score < 0.9 for h in hits)
    assert {h.task for h in store.search(query, "other", top_k=5)} == {"other"}
    assert all(p.task == "mine" for p in store.scroll("mine")) and len(list(store.scroll("mine"))) == 3


def test_top_k_larger_than_partition_returns_it_all(filled):
    store, points = filled
    hits = store.search(points[0].obs, "place", top_k=50)
    assert len(hits) == store.count("place") == 12
    assert len({(h.episode, h.step) for h in hits}) == 12


def test_hits_are_ordered_by_cosine(filled):
    store, points = filled
    rng = np.random.default_rng(3)
    query = rng.normal(size=OBS_DIM)
    pick = [p for p in points if p.task == "pick"]
    cos = np.array([unit(p.obs) @ unit(query) for p in pick])
    order = np.argsort(-cos)[:5]
    hits = store.search(query, "pick", top_k=5)
    assert [(h.episode, h.step) for h in hits] == [(pick[i].episode, pick[i].step) for i in order]
    np.testing.assert_allclose([h.score for h in hits], cos[order], atol=1e-5)
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))


def test_tasks_count_has_task_and_health(store):
    fill(store)
    assert store.tasks() == ["pick", "place"]
    assert store.has_task("pick") and not store.has_task("stack")
    assert store.count("stack") == 0
    rng = np.random.default_rng(4)
    store.upsert([make_point(rng, task="stack", episode=99)])  # an upsert refreshes the cached counts at once
    assert store.has_task("stack") and store.tasks() == ["pick", "place", "stack"]
    store.optimize()  # builds nothing at this size (a no-op for qdrant-client local mode)
    ok, message = store.health()
    assert ok and "25 points" in message and store.count() == 25


def test_unknown_task_and_empty_collection(store):
    rng = np.random.default_rng(5)
    with pytest.raises(EmptyDatabaseError):
        store.search(rng.normal(size=OBS_DIM), "pick", top_k=5)
    assert store.tasks() == [] and list(store.scroll()) == []
    store.upsert([make_point(rng, task="pick")])
    with pytest.raises(UnknownTaskError, match="'place'") as info:
        store.search(rng.normal(size=OBS_DIM), "place", top_k=5)
    assert isinstance(info.value, KeyError)


def test_bad_query_is_rejected(filled):
    store, _ = filled
    for bad in (np.ones(OBS_DIM - 1), np.ones((1, OBS_DIM)), np.full(OBS_DIM, np.nan), np.zeros(OBS_DIM)):
        with pytest.raises(InvalidObservationError) as info:
            store.search(bad, "pick", top_k=5)
        assert isinstance(info.value, ValueError)


def test_bad_arguments(filled):
    store, points = filled
    with pytest.raises(ConfigError):
        store.search(points[0].obs, "pick", top_k=0)
    with pytest.raises(ConfigError):
        store.upsert(points[:1], batch_size=0)
    rng = np.random.default_rng(6)
    wrong = DemoPoint(**{**vars(make_point(rng, step=99)), "obs": np.ones(OBS_DIM + 1)})
    n = store.count()
    with pytest.raises(InvalidDemoPointError, match="expects obs 24"):
        store.upsert([make_point(rng, step=98), wrong])  # nothing is written when one point is bad
    assert store.count() == n


def test_closed_store(store):
    store.close()
    store.close()
    assert store.health()[0] is False
    with pytest.raises(DatabaseUnavailableError, match="closed"):
        store.has_task("pick")


@pytest.mark.parametrize("kind", ["edge", "local-path"])
def test_persists_across_close_and_reopen(kind, tmp_path):
    cfg = config(kind, tmp_path)
    rng = np.random.default_rng(7)
    points = [make_point(rng, task="pick", episode=0, step=k) for k in range(10)]
    with make_store(cfg, OBS_DIM, FEAT_DIM, create=True) as store:
        store.upsert(points)
        before = store.search(points[3].obs, "pick", top_k=4)
    with make_store(cfg) as store:  # dimensions come from the database
        assert (store.obs_dim, store.feat_dim, store.count()) == (OBS_DIM, FEAT_DIM, 10)
        after = store.search(points[3].obs, "pick", top_k=4)
        assert [h.step for h in after] == [h.step for h in before]
        assert [h.score for h in after] == pytest.approx([h.score for h in before], abs=1e-6)
    with make_store(cfg, OBS_DIM, FEAT_DIM, create=True) as store:  # create on an existing db resumes it
        assert store.count() == 10
    with pytest.raises(DatabaseError, match="expected 32"):
        make_store(cfg, obs_dim=32)


def test_edge_exact_and_hnsw_paths_agree(tmp_path):
    """Above exact_search_below the Edge store asks for HNSW (per-task graph after optimize())."""
    rng = np.random.default_rng(8)
    points = [make_point(rng, task=t, episode=i, step=k) for i, t in enumerate("ab") for k in range(150)]
    exact_cfg = config("edge", tmp_path / "x")
    hnsw_cfg = config("edge", tmp_path / "h", exact_search_below=50)
    results = []
    for cfg in (exact_cfg, hnsw_cfg):
        with make_store(cfg, OBS_DIM, FEAT_DIM, create=True) as store:
            store.upsert(points, batch_size=128)
            store.optimize()
            results.append([(h.step, h.task) for h in store.search(points[7].obs, "a", top_k=5)])
    assert results[0][0] == results[1][0] == (7, "a")
    assert {t for _, t in results[1]} == {"a"}
    assert len(set(results[0]) & set(results[1])) >= 4


def edge_config_file(cfg):
    from pathlib import Path

    return Path(cfg.path) / cfg.collection / "edge_config.json"


def test_edge_search_pool_size_is_set_at_open_and_the_stored_index_kept(tmp_path):
    """The pool size travels in a whole configuration that Edge writes over the shard's own: opening
    with another size must change that setting only, whatever index settings the opener's config has."""
    import json

    rng = np.random.default_rng(9)
    points = [make_point(rng, task="pick", episode=0, step=k) for k in range(20)]
    cfg = config("edge", tmp_path, exact_search_below=5, hnsw_ef_construct=50)
    with make_store(cfg, OBS_DIM, FEAT_DIM, create=True) as store:
        store.upsert(points)
        before = store.search(points[4].obs, "pick", top_k=3)
    path = edge_config_file(cfg)
    created = json.loads(path.read_text())
    assert created["max_search_threads"] == 1  # the default: a query runs on the calling thread
    other = config("edge", tmp_path, search_threads=3)  # default index settings, unlike the creator's
    with make_store(other) as store:
        reopened = json.loads(path.read_text())
        assert reopened["max_search_threads"] == 3
        for key, value in created.items():  # every stored setting kept (Edge may add its defaults)
            assert key == "max_search_threads" or reopened[key] == value, key
        assert [(h.step, h.score) for h in store.search(points[4].obs, "pick", top_k=3)] == \
            [(h.step, h.score) for h in before]


def test_edge_shard_config_heisd_did_not_write_is_left_as_it_is(tmp_path, caplog):
    import json

    rng = np.random.default_rng(10)
    cfg = config("edge", tmp_path)
    with make_store(cfg, OBS_DIM, FEAT_DIM, create=True) as store:
        store.upsert([make_point(rng, task="pick", episode=0, step=k) for k in range(5)])
    path = edge_config_file(cfg)
    foreign = path.read_text().replace('"max_search_threads":1', '"max_search_threads":2').replace(
        '"deleted_threshold":null', '"deleted_threshold":0.5')  # a setting heisd never makes
    assert foreign != path.read_text()
    path.write_text(foreign)
    with caplog.at_level("WARNING"), make_store(cfg) as store:
        assert store.count() == 5
    now = json.loads(path.read_text())  # Edge rewrites the file at every load, adding its defaults
    assert (now["optimizers"]["deleted_threshold"], now["max_search_threads"]) == (0.5, 2)
    assert "keeps the search pool its files set" in caplog.text
