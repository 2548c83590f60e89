"""DemoStore lists exactly what HybridDecoder calls on its database: a decoder whose store exposes
the protocol's members and nothing else runs every database path, and calls every member."""

from __future__ import annotations

import pytest

from heisd_ros.core.config import DecoderConfig, RetrievalConfig
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.core.store_api import DemoStore

MEMBERS = sorted(name for name in vars(DemoStore) if not name.startswith("_"))


class ProtocolOnly:
    """The real test database seen through DemoStore's members alone; records which are called.
    `close` is recorded, not passed on: the database is shared by the session's tests."""

    def __init__(self, store) -> None:
        self._store = store
        self.called: set[str] = set()

    def __getattr__(self, name: str):
        if name not in MEMBERS:
            raise AttributeError(f"the engine asked its store for {name!r}, which DemoStore does not list")
        self.called.add(name)
        return (lambda: None) if name == "close" else getattr(self._store, name)


def test_the_protocol_lists_the_engines_calls():
    assert MEMBERS == ["close", "has_task", "health", "search", "search_near", "tasks"]


@pytest.mark.parametrize("pool", [0, 8], ids=["search", "search_near"])
def test_the_engine_needs_nothing_beyond_the_protocol(vla, demo_store, helpers, pool):
    store = ProtocolOnly(demo_store)
    dec = HybridDecoder(vla, DecoderConfig(method="retrieval", retrieval=RetrievalConfig(position_pool=pool)),
                        store=store)
    obs = helpers.random_obs(3)
    assert obs.task_key in dec.known_tasks()
    assert dec.health()[0]
    assert dec.task_problem(obs.task_key) == ""
    _, st = dec.step(obs)
    assert st.mode == "retrieval"
    dec.close()
    search = "search_near" if pool else "search"
    assert store.called == set(MEMBERS) - ({"search", "search_near"} - {search})
