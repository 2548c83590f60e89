"""DemoPoint validation, point ids, payload round trip, the task-count cache, config switches."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from heisd_ros.core.config import StoreConfig, from_dict
from heisd_ros.core.errors import ConfigError, DatabaseError, HeisdError, InvalidObservationError
from heisd_ros.store import PAYLOAD_FIELDS, VECTOR_NAMES, DemoPoint, InvalidDemoPointError, point_id
from heisd_ros.store.base import TaskCounts
from heisd_ros.store.schema import check_query, hit_from_stored


def demo(**over):
    rng = np.random.default_rng(0)
    fields = dict(
        dataset="libero_object",
        task="pick the bowl",
        instruction="pick up the black bowl",
        episode=3,
        step=7,
        obs=rng.normal(size=12),
        feat=rng.normal(size=5),
        feat_prev=rng.normal(size=5),
        action=rng.uniform(-1, 1, size=7),
        action_tokens=(31744, 31800, 31900, 31777, 31999, 31744, 32000),
        ee_pos=[0.1, -0.2, 0.95],
        next_actions=rng.uniform(-1, 1, size=(3, 7)),
        success=False,
    )
    fields.update(over)
    return DemoPoint(**fields)


def test_point_id_is_deterministic_and_distinct():
    assert point_id("a", 1, 2) == point_id("a", 1, 2) == demo(dataset="a", episode=1, step=2).id
    ids = {point_id("a", 1, 2), point_id("a", 2, 1), point_id("b", 1, 2), point_id("a/1", 2, 2)}
    assert len(ids) == 4
    assert point_id("a", np.int64(1), 2) == point_id("a", 1, 2)


def test_demo_point_normalises_types():
    p = demo(episode=np.int32(3), action_tokens=np.arange(7), next_actions=[])
    assert p.obs.dtype == np.float32 and p.feat.dtype == np.float32 and p.feat_prev.dtype == np.float32
    assert type(p.episode) is int and p.action_tokens == tuple(range(7))
    assert p.next_actions.shape == (0, 7)


@pytest.mark.parametrize(
    "over, match",
    [
        (dict(obs=[np.nan, 1.0]), "obs contains NaN"),
        (dict(feat=np.zeros(5)), "feat is all zeros"),
        (dict(feat_prev=np.ones(4)), "feat_prev has dimension 4"),
        (dict(obs=np.ones((2, 6))), "obs must be a non-empty 1-D"),
        (dict(action=np.ones(6)), "action must have shape"),
        (dict(action=[0, 0, 0, 0, 0, 0, np.inf]), "action contains NaN or Inf"),
        (dict(action_tokens=(1, 2, 3)), "action_tokens must be 7"),
        (dict(action_tokens=(1, 2, 3, 4, 5, 6, -1)), "action_tokens must be 7"),
        (dict(ee_pos=[0.0, 1.0]), "ee_pos must have shape"),
        (dict(next_actions=np.zeros((4, 7))), "at most 3 next_actions"),
        (dict(episode=-1), "episode must be an integer"),
        (dict(step=1.5), "step must be an integer"),
        (dict(task=""), "task must be a non-empty"),
    ],
)
def test_demo_point_rejects(over, match):
    with pytest.raises(InvalidDemoPointError, match=match) as info:
        demo(**over)
    assert isinstance(info.value, ValueError) and isinstance(info.value, HeisdError)


def test_payload_round_trip_covers_every_field():
    p = demo()
    payload, vectors = p.payload(), p.vectors()
    assert set(payload) == set(PAYLOAD_FIELDS) and set(vectors) == set(VECTOR_NAMES)
    q = DemoPoint.from_stored(payload, vectors)
    for name in PAYLOAD_FIELDS:
        np.testing.assert_array_equal(getattr(q, name), getattr(p, name), err_msg=name)
    for name in VECTOR_NAMES:
        np.testing.assert_array_equal(getattr(q, name), getattr(p, name), err_msg=name)
    hit = hit_from_stored(0.5, payload, vectors)
    assert hit.action_tokens == p.action_tokens and hit.episode == 3 and hit.step == 7 and not hit.success
    np.testing.assert_array_equal(hit.next_actions, p.next_actions)
    assert hit.feat.dtype == np.float32


def test_malformed_stored_point_is_a_database_error():
    p = demo()
    payload = p.payload()
    del payload["action"]
    with pytest.raises(DatabaseError):
        DemoPoint.from_stored(payload, p.vectors())
    with pytest.raises(DatabaseError) as info:
        hit_from_stored(1.0, payload, p.vectors())
    assert isinstance(info.value.__cause__, KeyError)


def test_check_query():
    assert len(check_query(np.ones(4), 4)) == 4
    for bad in (np.ones(3), np.ones((1, 4)), [0, 0, np.nan, 1], np.zeros(4)):
        with pytest.raises(InvalidObservationError):
            check_query(bad, 4)


def test_task_counts_cache_and_ttl():
    calls = []

    def fetch(task):
        calls.append(task)
        return 7

    cache = TaskCounts(ttl_s=60.0)
    assert cache.get("a", fetch) == 7 and cache.get("a", fetch) == 7 and calls == ["a"]
    cache.invalidate()
    cache.get("a", fetch)
    assert calls == ["a", "a"]
    always = TaskCounts(ttl_s=0.0)
    always.get("a", fetch)
    always.get("a", fetch)
    assert calls == ["a", "a", "a", "a"]


def test_store_config_switches():
    assert StoreConfig(path="x").shard_by_task is False
    assert StoreConfig(backend="remote", url="http://h:6333", shard_by_task=True).shard_by_task
    with pytest.raises(ConfigError, match="shard_by_task"):
        StoreConfig(backend="local", shard_by_task=True)
    with pytest.raises(ConfigError):
        from_dict(StoreConfig, {"backend": "edge", "path": "x", "task_cache_ttl_s": -1})
    with pytest.raises(ConfigError):
        StoreConfig(backend="local", write_timeout_s=0)


def test_importing_the_store_loads_neither_qdrant_nor_ros():
    code = (
        "import sys, heisd_ros.store;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('rclpy', 'qdrant_client', 'qdrant_edge')];"
        "assert not bad, bad;"
        "import heisd_ros.store.edge, heisd_ros.store.client;"
        "assert 'rclpy' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
