"""ReconnectingStore: fail fast while the database is down, reconnect with bounded exponential backoff.

The unit tests script the store and the clock; the others run the real qdrant-client path against
the emulated server of test/conftest.py, paused (silent) or stopped (refused) mid-run.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.errors import DatabaseError, DatabaseUnavailableError, UnknownTaskError
from heisd_ros.store import DemoPoint, make_store
from heisd_ros.store.reconnect import ReconnectingStore

OBS_DIM, FEAT_DIM = 6, 4


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class ScriptedStore:
    """Counts calls; `down` makes every call raise DatabaseUnavailableError."""

    obs_dim, feat_dim = OBS_DIM, FEAT_DIM

    def __init__(self, world: dict) -> None:
        self.world = world
        self.closed = False

    def _check(self) -> None:
        self.world["calls"] += 1
        if self.world["down"]:
            raise DatabaseUnavailableError("server at http://db:6333 is unreachable")

    def search(self, query, task, top_k):
        self._check()
        if task == "unknown":
            raise UnknownTaskError(f"task {task!r} has no demonstrations")
        return ["hit"]

    def has_task(self, task):
        self._check()
        return True

    def health(self):
        if self.world["down"]:
            return False, "unreachable"
        return True, "ok"

    def close(self):
        self.closed = True


def _scripted(**cfg):
    world = {"down": False, "calls": 0, "opens": 0}

    def opener():
        world["opens"] += 1
        if world["down"]:
            raise DatabaseUnavailableError("connect: refused")
        return ScriptedStore(world)

    clock = Clock()
    store = ReconnectingStore(opener, StoreConfig(backend="local", **cfg), ScriptedStore(world), clock=clock)
    return store, world, clock


def test_backoff_doubles_up_to_the_bound_and_resets_after_success():
    store, world, clock = _scripted(reconnect_backoff_s=0.5, reconnect_max_backoff_s=3.0)
    world["down"] = True
    with pytest.raises(DatabaseUnavailableError):
        store.search(np.ones(OBS_DIM), "pick", 1)
    waits = []
    for _ in range(6):  # each retry, due exactly when announced, fails again
        waits.append(round(store.retry_in_s, 6))
        clock.t += store.retry_in_s
        with pytest.raises(DatabaseUnavailableError):
            store.search(np.ones(OBS_DIM), "pick", 1)
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    world["down"] = False
    clock.t += store.retry_in_s
    assert store.search(np.ones(OBS_DIM), "pick", 1) == ["hit"] and store.is_up and store.reconnects == 1
    world["down"] = True  # a new outage starts again from the initial delay
    with pytest.raises(DatabaseUnavailableError):
        store.has_task("pick")
    assert store.retry_in_s == pytest.approx(0.5)


def test_while_down_calls_fail_at_once_without_touching_the_database():
    store, world, clock = _scripted(reconnect_backoff_s=1.0)
    world["down"] = True
    with pytest.raises(DatabaseUnavailableError):
        store.has_task("pick")
    calls, opens = world["calls"], world["opens"]
    for _ in range(50):
        clock.t += 0.01
        with pytest.raises(DatabaseUnavailableError, match="reconnect attempt in"):
            store.search(np.ones(OBS_DIM), "pick", 1)
        assert store.health()[0] is False
    assert (world["calls"], world["opens"]) == (calls, opens)  # nothing reached the database


def test_health_check_reconnects_without_waiting_for_a_search():
    store, world, clock = _scripted(reconnect_backoff_s=1.0)
    world["down"] = True
    assert store.health()[0] is False and not store.is_up  # the probe itself notices the outage
    world["down"] = False
    clock.t += 1.0
    ok, text = store.health()
    assert ok and store.is_up and "reconnected 1x" in text


def test_errors_about_the_request_pass_through_and_keep_the_store_up():
    store, _, _ = _scripted()
    with pytest.raises(UnknownTaskError):
        store.search(np.ones(OBS_DIM), "unknown", 1)
    assert store.is_up and store.failures == 0
    store.close()
    with pytest.raises(DatabaseUnavailableError, match="closed"):
        store.has_task("pick")


def _points(task="pick", n=6):
    rng = np.random.default_rng(1)
    return [DemoPoint("unit", task, task, 0, k, rng.normal(size=OBS_DIM), rng.normal(size=FEAT_DIM),
                      rng.normal(size=FEAT_DIM), np.zeros(7), (0,) * 7, np.zeros(3)) for k in range(n)]  # fmt: skip


@pytest.fixture
def remote(qdrant_server):
    cfg = StoreConfig(backend="remote", url=qdrant_server.url, timeout_s=0.25, write_timeout_s=5.0,
                      reconnect_backoff_s=0.4, reconnect_max_backoff_s=2.0, task_cache_ttl_s=0.0)  # fmt: skip
    with make_store(cfg, OBS_DIM, FEAT_DIM, create=True) as s:
        s.upsert(_points())
    store = ReconnectingStore(lambda: make_store(cfg, OBS_DIM, FEAT_DIM), cfg, make_store(cfg))
    yield store, qdrant_server, cfg
    store.close()


def _timed(fn):
    t = time.monotonic()
    try:
        return fn(), time.monotonic() - t
    except DatabaseUnavailableError as err:
        return err, time.monotonic() - t


@pytest.mark.parametrize("outage", ["silent", "refused"])
def test_remote_outage_mid_run_fails_within_timeout_then_fast_then_reconnects(remote, outage):
    store, server, cfg = remote
    query = _points()[2].obs
    assert store.search(query, "pick", 3)[0].step == 2
    server.pause() if outage == "silent" else server.stop()
    err, first = _timed(lambda: store.search(query, "pick", 3))
    assert isinstance(err, DatabaseUnavailableError) and first < cfg.timeout_s + 0.3
    err, fast = _timed(lambda: store.search(query, "pick", 3))
    assert isinstance(err, DatabaseUnavailableError) and fast < 0.01  # no request while backing off
    time.sleep(cfg.reconnect_backoff_s + 0.05)
    err, retry = _timed(lambda: store.has_task("pick"))  # due: one reconnect attempt, held to timeout_s
    assert isinstance(err, DatabaseUnavailableError) and retry < cfg.timeout_s + 0.3
    assert store.retry_in_s == pytest.approx(2 * cfg.reconnect_backoff_s, abs=0.1)  # doubled
    server.resume() if outage == "silent" else server.start()
    time.sleep(store.retry_in_s + 0.05)
    hits, _ = _timed(lambda: store.search(query, "pick", 3))
    assert [h.step for h in hits][:1] == [2] and store.is_up and store.reconnects == 1
    assert store.health()[0]


def test_schema_change_on_reconnect_keeps_backing_off(remote):
    """The server came back with another collection layout: not used, still 'down'."""
    store, server, cfg = remote
    server.stop()
    with pytest.raises(DatabaseUnavailableError):
        store.has_task("pick")
    server.local.delete_collection(cfg.collection)
    server.start()
    with make_store(cfg, OBS_DIM + 1, FEAT_DIM, create=True):
        pass
    time.sleep(store.retry_in_s + 0.05)
    with pytest.raises(DatabaseError, match="expected 6 and 4"):
        store.has_task("pick")
    assert not store.is_up
