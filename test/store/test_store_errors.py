"""Failures: missing or corrupt databases, locks, unreachable or silent servers, secrets kept out of messages."""

from __future__ import annotations

import glob
import socket
import subprocess
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.errors import ConfigError, DatabaseError, DatabaseUnavailableError
from heisd_ros.store import DemoPoint, make_store

OBS_DIM, FEAT_DIM = 6, 4


def points(n=5, task="pick"):
    rng = np.random.default_rng(0)
    return [
        DemoPoint("unit", task, task, 0, k, rng.normal(size=OBS_DIM), rng.normal(size=FEAT_DIM),
                  rng.normal(size=FEAT_DIM), np.zeros(7), (0,) * 7, np.zeros(3))
        for k in range(n)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def edge_template(tmp_path_factory):
    """A small Edge database built once; tests damage copies of it."""
    root = tmp_path_factory.mktemp("edge_template")
    with make_store(StoreConfig(backend="edge", path=str(root)), OBS_DIM, FEAT_DIM, create=True) as store:
        store.upsert(points())
    return root


@pytest.fixture
def built_edge(edge_template, tmp_path) -> tuple[StoreConfig, Path]:
    # cp keeps the engine's sparse files sparse (its WAL alone is 64 MB apparent); copytree would not
    subprocess.run(["cp", "-r", str(edge_template), str(tmp_path / "db")], check=True)
    cfg = StoreConfig(backend="edge", path=str(tmp_path / "db"))
    return cfg, tmp_path / "db" / cfg.collection


@pytest.mark.parametrize("backend", ["edge", "local"])
def test_missing_path_names_it(backend, tmp_path):
    missing = tmp_path / "nowhere"
    cfg = StoreConfig(backend=backend, path=str(missing))
    with pytest.raises(DatabaseUnavailableError, match=str(missing)):
        make_store(cfg)
    assert not missing.exists()  # opening without create never creates anything


def test_local_memory_without_create_has_no_collection():
    with pytest.raises(DatabaseUnavailableError, match="no collection"):
        make_store(StoreConfig(backend="local"))


def test_create_needs_dimensions(tmp_path):
    with pytest.raises(ConfigError, match="obs_dim and feat_dim"):
        make_store(StoreConfig(backend="edge", path=str(tmp_path / "db")), create=True)


def corrupt_engine_config(shard: Path) -> None:
    (shard / "edge_config.json").write_text("not json {")


def truncate_vectors(shard: Path) -> None:  # makes the Rust engine panic while loading
    for f in glob.glob(str(shard / "segments" / "*" / "vector_storage-obs" / "**"), recursive=True):
        if Path(f).is_file():
            Path(f).write_bytes(b"\0" * 7)


def corrupt_wal(shard: Path) -> None:
    for f in (shard / "wal").iterdir():
        f.write_bytes(b"junk" * 3)


def corrupt_meta(shard: Path) -> None:
    (shard / "heisd_store.json").write_text("{")


@pytest.mark.parametrize("damage", [corrupt_engine_config, truncate_vectors, corrupt_wal, corrupt_meta])
def test_corrupt_edge_directory(damage, built_edge):
    cfg, shard = built_edge
    damage(shard)
    with pytest.raises(DatabaseUnavailableError) as info:
        make_store(cfg)
    assert info.value.__cause__ is not None and str(shard) in str(info.value)


@pytest.mark.parametrize("name", ["heisd_store.json", "edge_config.json"])
def test_a_database_file_over_the_size_cap_is_refused_by_name_before_it_is_read(built_edge, name):
    """One byte over MAX_JSON_BYTES (sparse): neither heisd nor Edge reads it whole."""
    from heisd_ros.core.files import MAX_JSON_BYTES

    cfg, shard = built_edge
    with (shard / name).open("wb") as f:
        f.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(DatabaseUnavailableError, match=f"{name} is {MAX_JSON_BYTES + 1} bytes") as info:
        make_store(cfg)
    assert str(shard) in str(info.value)


def test_foreign_directory_is_not_a_store(tmp_path):
    shard = tmp_path / "db" / "heisd_demos"
    shard.mkdir(parents=True)
    (shard / "notes.txt").write_text("hello")
    with pytest.raises(DatabaseUnavailableError, match="heisd_store.json"):
        make_store(StoreConfig(backend="edge", path=str(tmp_path / "db")))


def test_corrupt_local_directory(tmp_path):
    cfg = StoreConfig(backend="local", path=str(tmp_path / "db"))
    with make_store(cfg, OBS_DIM, FEAT_DIM, create=True) as store:
        store.upsert(points())
    (tmp_path / "db" / "collection" / cfg.collection / "storage.sqlite").write_bytes(b"garbage" * 100)
    with pytest.raises(DatabaseUnavailableError) as info:
        make_store(cfg)
    assert info.value.__cause__ is not None


@pytest.mark.parametrize("backend", ["edge", "local"])
def test_second_opener_is_refused_while_open(backend, built_edge, tmp_path):
    cfg = built_edge[0] if backend == "edge" else StoreConfig(backend="local", path=str(tmp_path / "local"))
    with make_store(cfg, OBS_DIM, FEAT_DIM, create=True):
        with pytest.raises(DatabaseUnavailableError) as info:
            make_store(cfg)
        assert info.value.__cause__ is not None
    make_store(cfg).close()  # released on close


def test_unreachable_url_fails_fast():
    cfg = StoreConfig(backend="remote", url="http://127.0.0.1:1", timeout_s=0.2)
    start = time.monotonic()
    with pytest.raises(DatabaseUnavailableError, match="127.0.0.1:1") as info:
        make_store(cfg)
    assert time.monotonic() - start < 2.0
    assert info.value.__cause__ is not None


def test_silent_server_times_out_at_timeout_s():
    """A server that accepts but never answers: requests are held to timeout_s, not qdrant-client's whole seconds."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        for shard_by_task in (False, True):
            cfg = StoreConfig(
                backend="remote", url=url, timeout_s=0.25, write_timeout_s=5.0, shard_by_task=shard_by_task
            )
            start = time.monotonic()
            with pytest.raises(DatabaseUnavailableError, match="unreachable"):
                make_store(cfg, OBS_DIM, FEAT_DIM, create=True)
            assert 0.2 < time.monotonic() - start < 1.5


def test_secrets_stay_out_of_messages(monkeypatch):
    monkeypatch.setenv("HEISD_TEST_QDRANT_KEY", "s3cr3t-key")
    cfg = StoreConfig(
        backend="remote", url="http://user:hunter2@127.0.0.1:1/?api-key=s3cr3t-key", api_key_env="HEISD_TEST_QDRANT_KEY"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # qdrant-client warns about an API key over http
        with pytest.raises(DatabaseUnavailableError) as info:
            make_store(cfg)
    text = str(info.value)
    assert "s3cr3t" not in text and "hunter2" not in text and "127.0.0.1:1" in text


def test_local_mode_cannot_shard():
    """Pins the limitation behind StoreConfig.shard_by_task: qdrant-client local mode has no shard keys."""
    from qdrant_client import QdrantClient, models

    client = QdrantClient(location=":memory:")
    client.create_collection(
        "c",
        vectors_config={"obs": models.VectorParams(size=4, distance=models.Distance.COSINE)},
        sharding_method=models.ShardingMethod.CUSTOM,
    )
    with pytest.raises(NotImplementedError):
        client.create_shard_key("c", "pick")
    client.close()
    with pytest.raises(ConfigError, match="shard_by_task"):
        StoreConfig(backend="local", shard_by_task=True)


def test_schema_mismatch_is_reported(built_edge):
    cfg, _ = built_edge
    with pytest.raises(DatabaseError, match="expected 6 and 5"):
        make_store(cfg, OBS_DIM, 5)


def test_a_database_embedded_at_another_dtype_is_named_at_open(edge_template, tmp_path, caplog):
    """A bf16 policy on an fp32 database would almost never skip (features differ at ~1e-3); the
    policy still opens it (retrieval works) but says why in the log."""
    import json
    import logging
    import shutil

    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.errors import DatabaseError
    from heisd_ros.policy import PolicyPaths, open_store

    db = tmp_path / "db"
    shutil.copytree(edge_template, db)
    # a manifest from before build-db --dtype: float32
    (db / "build_db_manifest.json").write_text(json.dumps({"model_digest": "x", "done": {}}))
    with caplog.at_level(logging.WARNING, logger="heisd_ros"):
        open_store(DecoderConfig(), PolicyPaths("x", db_path=str(db)), None).close()
        assert not caplog.records  # same dtype: nothing to say
        open_store(DecoderConfig(dtype="bfloat16"), PolicyPaths("x", db_path=str(db)), None).close()
    assert "embedded at float32, the policy runs at bfloat16" in caplog.text
    # the model spec recorded by build-db: another unnorm_key tokenised other actions, refused
    (db / "build_db_manifest.json").write_text(json.dumps({"dtype": "float32", "unnorm_key": "libero_object",
                                                           "center_crop": False, "done": {}}))
    with pytest.raises(DatabaseError, match="unnorm_key 'libero_object'.*'libero_spatial'"):
        open_store(DecoderConfig(unnorm_key="libero_spatial"), PolicyPaths("x", db_path=str(db)), None)
    open_store(DecoderConfig(unnorm_key="libero_object"), PolicyPaths("x", db_path=str(db)), None).close()
    open_store(DecoderConfig(), PolicyPaths("x", db_path=str(db)), None).close()  # '': the model's default


def test_query_views_come_from_the_database_manifest(tmp_path) -> None:
    """retrieval.query_views 0 adopts the views the database pooled; an explicit value must match."""
    import json

    from heisd_ros.core.config import DecoderConfig, RetrievalConfig
    from heisd_ros.core.errors import DatabaseUnavailableError
    from heisd_ros.policy import resolve_query_views

    db = tmp_path / "db"
    db.mkdir()
    assert resolve_query_views(DecoderConfig(), str(db)).retrieval.query_views == 0  # no manifest: all views
    (db / "build_db_manifest.json").write_text(json.dumps({"dtype": "float32", "done": {}}))
    assert resolve_query_views(DecoderConfig(), str(db)).retrieval.query_views == 0  # built before the option
    (db / "build_db_manifest.json").write_text(json.dumps({"query_views": 1, "done": {}}))
    assert resolve_query_views(DecoderConfig(), str(db)).retrieval.query_views == 1
    one = DecoderConfig(retrieval=RetrievalConfig(query_views=1))
    assert resolve_query_views(one, str(db)) == one
    with pytest.raises(DatabaseUnavailableError, match="pools 1 view"):
        resolve_query_views(DecoderConfig(retrieval=RetrievalConfig(query_views=2)), str(db))
    (db / "build_db_manifest.json").write_text(json.dumps({"query_views": 3, "done": {}}))
    with pytest.raises(DatabaseUnavailableError, match="only"):
        resolve_query_views(DecoderConfig(), str(db))
    with pytest.raises(Exception, match="exceeds"):
        DecoderConfig(views=("agentview",), retrieval=RetrievalConfig(query_views=2))
