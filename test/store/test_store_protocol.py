"""Every store the decoder can be given is a `core.store_api.DemoStore`: both Qdrant backends (the
embedded Edge shard, the remote client against the emulated server of test/conftest.py), the
ReconnectingStore the policy wraps them in, and the evaluation's TimedStore over that (where the
LIBERO workbench is installed); an object missing any one of the protocol's members is not."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.store_api import DemoStore
from heisd_ros.store import DemoDatabase, make_store
from heisd_ros.store.reconnect import ReconnectingStore

OBS_DIM, FEAT_DIM = 6, 4
MEMBERS = sorted(name for name in vars(DemoStore) if not name.startswith("_"))


def _config(backend: str, request, tmp_path) -> StoreConfig:
    if backend == "edge":
        return StoreConfig(backend="edge", path=str(tmp_path / "db"))
    server = request.getfixturevalue("qdrant_server")  # only the remote case starts a server
    return StoreConfig(backend="remote", url=server.url, timeout_s=2.0)


@pytest.fixture(params=["edge", "remote"])
def opened(request, tmp_path):
    """(the backend's store, the ReconnectingStore over it, the workbench's TimedStore over that)."""
    cfg = _config(request.param, request, tmp_path)
    store = make_store(cfg, OBS_DIM, FEAT_DIM, create=True)
    reconnecting = ReconnectingStore(lambda: make_store(cfg, OBS_DIM, FEAT_DIM), cfg, store)
    timed = () if importlib.util.find_spec("heisd_libero") is None else (
        importlib.import_module("heisd_libero.eval_policies").TimedStore(reconnecting),)
    yield store, reconnecting, *timed
    reconnecting.close()  # closes `store` too


def test_backends_and_their_wrappers_are_demo_stores(opened):
    store, reconnecting = opened[:2]
    for layer in opened:
        assert isinstance(layer, DemoStore), type(layer).__name__
        assert layer.health()[0], type(layer).__name__  # reachable through the protocol, not just shaped like it
    assert isinstance(store, DemoDatabase) and isinstance(reconnecting, DemoDatabase)


def _store_with(names):
    def member(self, *args, **kwargs):
        raise AssertionError("never called: only the shape is checked")

    return type("PartialStore", (), {name: member for name in names})()


def test_the_engines_calls_suffice():
    assert isinstance(_store_with(MEMBERS), DemoStore)


@pytest.mark.parametrize("missing", MEMBERS)
def test_an_object_missing_one_member_is_not_a_demo_store(missing):
    assert not isinstance(_store_with([m for m in MEMBERS if m != missing]), DemoStore)
