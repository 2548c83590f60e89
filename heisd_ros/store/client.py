"""Demonstration store through qdrant-client: a server or cluster by URL, or local mode.

backend 'remote': `QdrantClient(url=cfg.url, api_key=<first line of cfg.api_key_file, else
$<cfg.api_key_env>>)`, TLS verified against `cfg.tls_ca_cert` when set; the key never reaches a log
or an error message. Collections (and shard keys) are created with `cfg.replication_factor`. qdrant-client rounds its
timeout up to whole seconds, so every HTTP request is additionally held to `cfg.timeout_s` (reads) or
`cfg.write_timeout_s` (writes, administration) through an httpx request hook. With
`cfg.shard_by_task` the collection uses custom sharding: one shard key per task, created on the
task's first upsert, and every read selects the task's shard.
backend 'local': qdrant-client local mode, in memory (`cfg.path == ''`) or under `cfg.path`
(a `collection/<name>/storage.sqlite` layout, locked to one client). Pure Python and exact: fine
for tests and small data. It ignores payload indexes and cannot shard.
"""

from __future__ import annotations

import math
import os
import pickle
import sqlite3
import ssl
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
from qdrant_client import QdrantClient
from qdrant_client import models as qm
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.errors import (
    ConfigError,
    DatabaseError,
    DatabaseUnavailableError,
    HeisdError,
)
from heisd_ros.core.types import Hit
from heisd_ros.store.base import StoreBase
from heisd_ros.store.schema import (
    EE_POS_FIELD,
    FEAT,
    FEAT_PREV,
    HIT_VECTORS,
    OBS,
    TASK_FIELD,
    VECTOR_NAMES,
    DemoPoint,
    check_dims,
    hit_from_stored,
)

FACET_LIMIT = 65536
"""Most distinct tasks tasks() reports."""
_LOCAL_STORAGE_ERRORS = (sqlite3.Error, OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError)
"""What local mode raises for a locked, unreadable or corrupt storage folder."""
_UNAVAILABLE_HTTP = {401, 403, 408, 429, 500, 502, 503, 504}


def redact_url(url: str) -> str:
    """The URL without user info, query or fragment: safe to log."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@contextmanager
def _client_errors(action: str, where: str, unavailable: bool = False) -> Iterator[None]:
    """Map qdrant-client / local-storage failures inside the block onto DatabaseError (cause chained)."""
    try:
        yield
    except HeisdError:
        raise
    except ResponseHandlingException as err:  # transport: refused, timed out, DNS, TLS
        raise DatabaseUnavailableError(f"Qdrant at {where} is unreachable ({action}): {err}") from err
    except UnexpectedResponse as err:
        cls = DatabaseUnavailableError if unavailable or err.status_code in _UNAVAILABLE_HTTP else DatabaseError
        raise cls(f"Qdrant at {where}: {action} failed with HTTP {err.status_code} {err.reason_phrase}") from err
    except NotImplementedError as err:  # local mode: sharding
        raise DatabaseError(f"Qdrant at {where}: {action} is not supported: {err}") from err
    except _LOCAL_STORAGE_ERRORS as err:
        cls = DatabaseUnavailableError if unavailable else DatabaseError
        raise cls(f"Qdrant at {where}: {action} failed: {err!r}") from err


@contextmanager
def _writing(deadline: threading.local | None, cfg: StoreConfig) -> Iterator[None]:
    """Hold remote requests in the block to write_timeout_s instead of timeout_s."""
    if deadline is None:
        yield
        return
    deadline.s = cfg.write_timeout_s
    try:
        yield
    finally:
        deadline.s = cfg.timeout_s


def _task_filter(task: str | None) -> qm.Filter | None:
    if task is None:
        return None
    return qm.Filter(must=[qm.FieldCondition(key=TASK_FIELD, match=qm.MatchValue(value=task))])


class ClientStore(StoreBase):
    """DemoDatabase through qdrant-client. Build with `ClientStore.open` (or make_store)."""

    def __init__(
        self,
        client: QdrantClient,
        cfg: StoreConfig,
        obs_dim: int,
        feat_dim: int,
        where: str,
        deadline: threading.local | None = None,
    ) -> None:
        super().__init__(cfg, obs_dim, feat_dim, where)
        self.backend = cfg.backend
        self._client = client
        self._name = cfg.collection
        self._local = cfg.backend == "local"
        self._deadline = deadline
        self._shard_keys: set[str] = set()
        if cfg.shard_by_task:
            self._refresh_shard_keys()

    @classmethod
    def open(
        cls, cfg: StoreConfig, obs_dim: int | None = None, feat_dim: int | None = None, create: bool = False
    ) -> "ClientStore":
        """Connect, then open `cfg.collection` (creating it with `create` if it does not exist)."""
        if cfg.backend not in ("local", "remote"):
            raise ConfigError(f"ClientStore serves backends 'local' and 'remote', not {cfg.backend!r}")
        deadline = threading.local() if cfg.backend == "remote" else None
        client, where = _connect(cfg, create, deadline)
        try:
            dims = _open_collection(client, cfg, where, obs_dim, feat_dim, create, deadline)
            return cls(client, cfg, *dims, where=where, deadline=deadline)
        except BaseException:
            client.close()
            raise

    def _writing(self) -> Any:
        return _writing(self._deadline, self._cfg)

    def _shard(self, task: str | None) -> str | None:
        return task if self._cfg.shard_by_task else None

    def _refresh_shard_keys(self) -> None:
        with _client_errors("list shard keys", self._where):
            response = self._client.list_shard_keys(self._name)
        self._shard_keys = {str(k.key) for k in (response.shard_keys or [])}

    def _ensure_shard_key(self, task: str) -> None:
        if task in self._shard_keys:
            return
        self._refresh_shard_keys()  # another writer may have made it
        if task not in self._shard_keys:
            with self._writing(), _client_errors(f"create shard key {task!r}", self._where):
                self._client.create_shard_key(self._name, task, replication_factor=self._cfg.replication_factor)
            self._shard_keys.add(task)

    # -- hooks -------------------------------------------------------------------------------
    def _count_points(self, task: str | None) -> int:
        if self._cfg.shard_by_task and task is not None and task not in self._shard_keys:
            self._refresh_shard_keys()
            if task not in self._shard_keys:
                return 0
        with _client_errors("count", self._where):
            result = self._client.count(
                self._name, count_filter=_task_filter(task), exact=True, shard_key_selector=self._shard(task)
            )
        return int(result.count)

    def _write(self, points: Sequence[DemoPoint]) -> None:
        by_shard: dict[str | None, list[qm.PointStruct]] = {}
        for p in points:
            by_shard.setdefault(self._shard(p.task), []).append(
                qm.PointStruct(id=p.id, vector=p.vectors(), payload=p.payload())
            )
        for shard, batch in by_shard.items():
            if shard is not None:
                self._ensure_shard_key(shard)
            with self._writing(), _client_errors("upsert", self._where):
                self._client.upsert(self._name, points=batch, wait=True, shard_key_selector=shard)

    def _query(self, query: list[float], task: str, top_k: int, exact: bool) -> list[Hit]:
        with _client_errors("search", self._where):
            response = self._client.query_points(
                self._name,
                query=query,
                using=OBS,
                query_filter=_task_filter(task),
                limit=top_k,
                with_vectors=HIT_VECTORS,
                with_payload=True,
                # local mode is always exact and warns about search params
                search_params=None if self._local else qm.SearchParams(exact=exact),
                shard_key_selector=self._shard(task),
            )
        return [hit_from_stored(p.score, p.payload or {}, p.vector or {}) for p in response.points]

    def _query_positions(self, query: list[float], task: str, top_k: int,
                         exact: bool) -> list[tuple[Any, float, np.ndarray]]:
        with _client_errors("search", self._where):
            response = self._client.query_points(
                self._name, query=query, using=OBS, query_filter=_task_filter(task), limit=top_k,
                with_vectors=False, with_payload=[EE_POS_FIELD],
                search_params=None if self._local else qm.SearchParams(exact=exact),
                shard_key_selector=self._shard(task),
            )
        try:
            return [(p.id, float(p.score), np.asarray((p.payload or {})[EE_POS_FIELD], dtype=np.float64))
                    for p in response.points]
        except (KeyError, TypeError, ValueError) as err:
            raise DatabaseError(f"stored point is malformed: {err!r}") from err

    def _fetch(self, ids: Sequence[Any], scores: Sequence[float]) -> list[Hit]:
        task = None  # the ids are global; a sharded cluster is asked on every shard
        with _client_errors("retrieve", self._where):
            records = {r.id: r for r in self._client.retrieve(self._name, ids=list(ids), with_payload=True,
                                                               with_vectors=HIT_VECTORS,
                                                               shard_key_selector=self._shard(task))}
        missing = [i for i in ids if i not in records]
        if missing:
            raise DatabaseError(f"points {missing} vanished between search and fetch at {self._where}")
        return [hit_from_stored(s, records[i].payload or {}, records[i].vector or {}) for i, s in zip(ids, scores)]

    def _page(self, task: str | None, offset: Any, limit: int) -> tuple[list[DemoPoint], Any]:
        with _client_errors("scroll", self._where):
            records, next_offset = self._client.scroll(
                self._name,
                scroll_filter=_task_filter(task),
                limit=limit,
                offset=offset,
                with_payload=True,
                with_vectors=True,
                shard_key_selector=self._shard(task),
            )
        return [DemoPoint.from_stored(r.payload or {}, r.vector or {}) for r in records], next_offset

    def _task_names(self) -> list[str]:
        with _client_errors("list tasks", self._where):
            response = self._client.facet(self._name, key=TASK_FIELD, limit=FACET_LIMIT, exact=True)
        return [str(h.value) for h in response.hits if h.count > 0]

    def _shutdown(self) -> None:
        with _client_errors("close", self._where):
            self._client.close()


def _connect(cfg: StoreConfig, create: bool, deadline: threading.local | None) -> tuple[QdrantClient, str]:
    if cfg.backend == "local":
        if not cfg.path:
            return QdrantClient(location=":memory:"), f"memory/{cfg.collection}"
        path = Path(cfg.path)
        if not path.is_dir() and not create:
            raise DatabaseUnavailableError(
                f"no demonstration database at {path} (collection {cfg.collection!r}); "
                "build one first or open it with create=True"
            )
        with _client_errors("open", str(path), unavailable=True):
            return QdrantClient(path=str(path)), str(path)
    assert deadline is not None
    deadline.s = cfg.timeout_s

    def hold_to_deadline(request: httpx.Request) -> None:
        # qdrant-client only takes whole seconds; impose the configured sub-second deadline.
        request.extensions["timeout"] = httpx.Timeout(getattr(deadline, "s", cfg.timeout_s)).as_dict()

    where = redact_url(cfg.url)
    tls = {"verify": _tls_context(cfg.tls_ca_cert)} if cfg.tls_ca_cert else {}
    with _client_errors("connect", where, unavailable=True):
        client = QdrantClient(
            url=cfg.url,
            api_key=read_api_key(cfg),
            timeout=max(1, math.ceil(cfg.write_timeout_s)),
            check_compatibility=False,  # we probe the collection ourselves, under our deadline
            event_hooks={"request": [hold_to_deadline]},
            **tls,
        )
    return client, where


def read_api_key(cfg: StoreConfig) -> str | None:
    """The API key from `cfg.api_key_file` (first line) or else `$<cfg.api_key_env>`; None if neither.

    Errors name the file, never its content.
    """
    if cfg.api_key_file:
        try:
            lines = Path(cfg.api_key_file).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"cannot read the API key file {cfg.api_key_file}: {type(err).__name__}") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise ConfigError(f"the API key file {cfg.api_key_file} is empty")
        return key
    return os.environ.get(cfg.api_key_env) or None


def _tls_context(ca_file: str) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"cannot load the TLS CA bundle {ca_file}: {err}") from err


def _open_collection(
    client: QdrantClient,
    cfg: StoreConfig,
    where: str,
    obs_dim: int | None,
    feat_dim: int | None,
    create: bool,
    deadline: threading.local | None,
) -> tuple[int, int]:
    name = cfg.collection
    with _client_errors("open", where, unavailable=True):
        exists = client.collection_exists(name)
    if not exists:
        if not create:
            raise DatabaseUnavailableError(f"no collection {name!r} at {where}; build one first or use create=True")
        if obs_dim is None or feat_dim is None:
            raise ConfigError("creating a store needs obs_dim and feat_dim")
        dims = check_dims(obs_dim, feat_dim)
        with _writing(deadline, cfg):
            _create_collection(client, cfg, where, *dims)
        return dims
    with _client_errors("read collection info", where, unavailable=True):
        params = client.get_collection(name).config.params
    vectors = params.vectors if isinstance(params.vectors, dict) else {}
    if any(v not in vectors for v in VECTOR_NAMES):
        raise DatabaseError(f"collection {name!r} at {where} is no demonstration collection: vectors {list(vectors)}")
    stored = (vectors[OBS].size, vectors[FEAT].size)
    wanted = (obs_dim if obs_dim is not None else stored[0], feat_dim if feat_dim is not None else stored[1])
    if wanted != stored or vectors[FEAT_PREV].size != stored[1]:
        raise DatabaseError(
            f"collection {name!r} at {where} stores obs {stored[0]}-d and feat {stored[1]}-d vectors; "
            f"expected {wanted[0]} and {wanted[1]}"
        )
    sharded = params.sharding_method == qm.ShardingMethod.CUSTOM
    if sharded != cfg.shard_by_task:
        uses = "uses" if sharded else "does not use"
        raise DatabaseError(f"collection {name!r} at {where} {uses} custom sharding; set shard_by_task={sharded}")
    return check_dims(*stored)


def _create_collection(client: QdrantClient, cfg: StoreConfig, where: str, obs_dim: int, feat_dim: int) -> None:
    kb = max(1, cfg.exact_search_below * obs_dim * 4 // 1024)
    no_graph = qm.HnswConfigDiff(m=0, payload_m=0)  # feat vectors are never searched
    vectors = {
        OBS: qm.VectorParams(size=obs_dim, distance=qm.Distance.COSINE),
        FEAT: qm.VectorParams(size=feat_dim, distance=qm.Distance.COSINE, hnsw_config=no_graph, on_disk=cfg.feat_on_disk),
        FEAT_PREV: qm.VectorParams(size=feat_dim, distance=qm.Distance.COSINE, hnsw_config=no_graph,
                                   on_disk=cfg.feat_on_disk),
    }
    # Multitenancy: no global graph, one HNSW graph per task (payload_m) over the tenant index.
    hnsw = qm.HnswConfigDiff(
        m=0, payload_m=cfg.hnsw_m, ef_construct=cfg.hnsw_ef_construct, full_scan_threshold=kb
    )
    sharding = qm.ShardingMethod.CUSTOM if cfg.shard_by_task else None
    index = qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=True)
    with warnings.catch_warnings(), _client_errors("create collection", where, unavailable=True):
        warnings.filterwarnings("ignore", message="Payload indexes have no effect")  # local mode
        client.create_collection(cfg.collection, vectors_config=vectors, hnsw_config=hnsw, sharding_method=sharding,
                                 replication_factor=cfg.replication_factor)
        client.create_payload_index(cfg.collection, TASK_FIELD, field_schema=index, wait=True)
