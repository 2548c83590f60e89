"""The database path of a fleet: a Qdrant cluster by URL, the task as custom shard key, replication,
API key and TLS from the environment or files. Runs the real qdrant-client REST path against the
emulated server of test/conftest.py (qdrant-client's local mode behind a local HTTP endpoint)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import warnings

import numpy as np
import pytest

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.errors import ConfigError, DatabaseError, DatabaseUnavailableError
from heisd_ros.store import DemoPoint, make_store
from heisd_ros.store.reconnect import ReconnectingStore

OBS_DIM, FEAT_DIM = 6, 4
TASKS = ("pick up the bowl", "open the drawer")


def _points():
    rng = np.random.default_rng(2)
    return [DemoPoint("fleet", task, task, e, k, rng.normal(size=OBS_DIM), rng.normal(size=FEAT_DIM),
                      rng.normal(size=FEAT_DIM), np.zeros(7), (0,) * 7, np.zeros(3))
            for e, task in enumerate(TASKS) for k in range(4)]  # fmt: skip


def test_cluster_collection_shards_by_task_with_replication(qdrant_server):
    cfg = StoreConfig(backend="remote", url=qdrant_server.url, collection="franka", shard_by_task=True,
                      replication_factor=2, write_timeout_s=5.0)  # fmt: skip
    pts = _points()
    with make_store(cfg, OBS_DIM, FEAT_DIM, create=True) as store:
        store.upsert(pts)
        hits = store.search(pts[5].obs, TASKS[1], 3)
        assert hits[0].step == 1 and {h.task for h in hits} == {TASKS[1]}
        assert store.tasks() == sorted(TASKS)
    created = qdrant_server.created["franka"]
    assert created["sharding_method"] == "custom" and created["replication_factor"] == 2
    keys = [b for m, p, b in qdrant_server.requests if m == "PUT" and p.endswith("/shards")]
    assert keys == [{"shard_key": t, "replication_factor": 2} for t in TASKS]  # one shard key per task
    queries = [b for m, p, b in qdrant_server.requests if p.endswith("/points/query")]
    assert queries and all(q["shard_key"] == TASKS[1] for q in queries)  # reads go to the task's shard
    upserts = [b for m, p, b in qdrant_server.requests if m == "PUT" and p.endswith("/points")]
    assert sorted(u["shard_key"] for u in upserts) == sorted(TASKS)
    # another node of the fleet opens the same collection by URL; a mismatched sharding setting is refused
    with make_store(cfg) as other:
        assert other.count() == len(pts) and other.has_task(TASKS[0])
    with pytest.raises(DatabaseError, match="shard_by_task=True"):
        make_store(StoreConfig(backend="remote", url=qdrant_server.url, collection="franka"))


def test_cluster_fields_are_validated():
    with pytest.raises(ConfigError, match="replication_factor needs backend 'remote'"):
        StoreConfig(backend="local", replication_factor=2)
    with pytest.raises(ConfigError, match="replication_factor"):
        StoreConfig(backend="remote", url="http://q:6333", replication_factor=0)
    with pytest.raises(ConfigError, match="reconnect"):
        StoreConfig(backend="local", reconnect_backoff_s=5.0, reconnect_max_backoff_s=1.0)
    with pytest.raises(ConfigError, match="tls_ca_cert needs an https"):
        StoreConfig(backend="remote", url="http://q:6333", tls_ca_cert="/etc/ca.pem")


def test_replication_is_accepted_by_local_mode_for_ci():
    """qdrant-client's local mode takes the cluster arguments (and ignores them), so CI can build with them."""
    from qdrant_client import QdrantClient, models

    client = QdrantClient(location=":memory:")
    assert client.create_collection("c", vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE),
                                    replication_factor=2, shard_number=3)  # fmt: skip
    client.close()


def test_api_key_from_file_is_sent_and_never_logged(qdrant_server, tmp_path, monkeypatch, caplog):
    key_file = tmp_path / "qdrant.key"
    key_file.write_text("file-k3y-7f3a9\n")
    monkeypatch.setenv("HEISD_TEST_KEY", "env-k3y-1b2c")
    cfg = StoreConfig(backend="remote", url=qdrant_server.url, api_key_env="HEISD_TEST_KEY",
                      api_key_file=str(key_file), timeout_s=0.2, reconnect_backoff_s=0.05)  # fmt: skip
    caplog.set_level(logging.DEBUG)
    texts = [repr(cfg)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # qdrant-client warns about an API key over http
        store = make_store(cfg, OBS_DIM, FEAT_DIM, create=True)
        wrapped = ReconnectingStore(lambda: make_store(cfg, OBS_DIM, FEAT_DIM), cfg, store)
        wrapped.upsert(_points())
        texts.append(wrapped.health()[1])
        qdrant_server.stop()  # faults produce logs and errors: none may carry the key
        for _ in range(3):
            try:
                wrapped.search(_points()[0].obs, TASKS[0], 1)
            except DatabaseUnavailableError as err:
                texts += [str(err), repr(err), str(err.__cause__)]
        texts.append(wrapped.health()[1])
        wrapped.close()
    assert {h.get("api-key") for h in qdrant_server.headers} == {"file-k3y-7f3a9"}  # the file wins over the env
    texts += [r.getMessage() for r in caplog.records]
    assert not [t for t in texts if "k3y" in t]


def test_api_key_from_environment_when_no_file(qdrant_server, monkeypatch):
    monkeypatch.setenv("HEISD_TEST_KEY", "env-k3y-1b2c")
    cfg = StoreConfig(backend="remote", url=qdrant_server.url, api_key_env="HEISD_TEST_KEY")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        make_store(cfg, OBS_DIM, FEAT_DIM, create=True).close()
    assert qdrant_server.headers[-1].get("api-key") == "env-k3y-1b2c"


@pytest.mark.parametrize("content", [None, "", "\n"])
def test_unreadable_or_empty_key_file_names_the_file_not_the_key(tmp_path, content):
    key_file = tmp_path / "missing.key"
    if content is not None:
        key_file.write_text(content)
    cfg = StoreConfig(backend="remote", url="http://127.0.0.1:1", api_key_file=str(key_file))
    with pytest.raises(ConfigError, match=str(key_file)):
        make_store(cfg)


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
                   check=True, capture_output=True)  # fmt: skip
    return str(d / "cert.pem"), str(d / "key.pem")


@pytest.fixture
def tls_server(self_signed, qdrant_factory):
    return qdrant_factory(tls=self_signed)


def test_tls_with_the_configured_ca_and_without_it(tls_server, self_signed):
    cert, _ = self_signed
    ok = StoreConfig(backend="remote", url=tls_server.url, tls_ca_cert=cert, timeout_s=2.0)
    with make_store(ok, OBS_DIM, FEAT_DIM, create=True) as store:
        assert store.count() == 0
    untrusted = StoreConfig(backend="remote", url=tls_server.url, timeout_s=2.0)  # system CAs: rejected
    with pytest.raises(DatabaseUnavailableError, match="unreachable"):
        make_store(untrusted)
    with pytest.raises(ConfigError, match="nowhere.pem"):
        make_store(StoreConfig(backend="remote", url=tls_server.url, tls_ca_cert="/nowhere.pem"))


def test_feat_vectors_on_disk_for_large_databases(qdrant_server, tmp_path):
    """feat_on_disk: the never-searched feature vectors are created memory-mapped (remote and Edge)."""
    cfg = StoreConfig(backend="remote", url=qdrant_server.url, feat_on_disk=True)
    pts = _points()
    with make_store(cfg, OBS_DIM, FEAT_DIM, create=True) as store:
        store.upsert(pts)
        assert store.search(pts[1].obs, TASKS[0], 1)[0].feat_prev.shape == (FEAT_DIM,)
    vectors = qdrant_server.created[cfg.collection]["vectors"]
    assert vectors["feat"]["on_disk"] is True and vectors["feat_prev"]["on_disk"] is True
    assert not vectors["obs"].get("on_disk")  # the searched vector stays in RAM
    edge = StoreConfig(backend="edge", path=str(tmp_path / "db"), feat_on_disk=True)
    with make_store(edge, OBS_DIM, FEAT_DIM, create=True) as store:
        store.upsert(pts)
    with make_store(edge) as store:
        hit = store.search(pts[1].obs, TASKS[0], 1)[0]
        assert hit.step == 1 and np.allclose(hit.feat, pts[1].feat / np.linalg.norm(pts[1].feat), atol=1e-6)
