"""Embedded demonstration store on Qdrant Edge (Qdrant's engine in-process, one shard on disk).

Layout: `<cfg.path>/<cfg.collection>/` holds the Edge shard (segments, WAL, edge_config.json) and
`heisd_store.json` (schema version and vector dimensions). The task is a tenant keyword index;
HNSW graphs are built per task (payload_m) by `optimize()`, only in segments larger than
`exact_search_below` obs vectors (the indexing threshold; a segment may hold many tasks), and used
only for partitions of at least `exact_search_below` points; smaller partitions are searched exactly.
Edge does not index in the background: call `optimize()` after a bulk ingest.
The search pool has `search_threads` threads (1: a query runs on the calling thread), set at every
open; Edge keeps the size in edge_config.json with the rest of the shard's configuration.
One process at a time: the shard's WAL is locked while open.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import qdrant_edge as qe

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.errors import (
    ConfigError,
    DatabaseError,
    DatabaseUnavailableError,
    HeisdError,
)
from heisd_ros.core.files import parse_json, read_capped_bytes, read_json
from heisd_ros.core.types import Hit
from heisd_ros.store.base import StoreBase
from heisd_ros.store.schema import (
    FEAT,
    FEAT_PREV,
    HIT_VECTORS,
    OBS,
    SCHEMA_VERSION,
    EE_POS_FIELD,
    TASK_FIELD,
    DemoPoint,
    check_dims,
    hit_from_stored,
)

log = logging.getLogger(__name__)

META_FILE = "heisd_store.json"
FACET_LIMIT = 65536
"""Most distinct tasks tasks() reports."""


def _is_engine_error(err: BaseException) -> bool:
    # qdrant_edge reports failures as plain `Exception`, and malformed files can make the Rust engine
    # panic, which pyo3 raises as `PanicException` (a BaseException subclass, not importable by name).
    return isinstance(err, Exception) or type(err).__name__ == "PanicException"


@contextmanager
def _engine(action: str, where: str, unavailable: bool = False) -> Iterator[None]:
    """Turn an engine failure inside the block into a DatabaseError (cause chained)."""
    try:
        yield
    except HeisdError:
        raise
    except BaseException as err:
        if not _is_engine_error(err):
            raise  # KeyboardInterrupt, SystemExit, ...
        cls = DatabaseUnavailableError if unavailable else DatabaseError
        raise cls(f"Qdrant Edge: {action} failed at {where}: {err}") from err


def _task_filter(task: str | None) -> qe.Filter | None:
    if task is None:
        return None
    return qe.Filter(must=[qe.FieldCondition(TASK_FIELD, match=qe.MatchValue(task))])


def _threshold_kb(cfg: StoreConfig, obs_dim: int) -> int:
    """Size in KB of `exact_search_below` obs vectors: Qdrant's full-scan and indexing thresholds."""
    return max(1, cfg.exact_search_below * obs_dim * 4 // 1024)


def _edge_config(cfg: StoreConfig, obs_dim: int, feat_dim: int) -> qe.EdgeConfig:
    return _shard_config(_threshold_kb(cfg, obs_dim), cfg.hnsw_ef_construct, cfg.hnsw_m, cfg.feat_on_disk,
                         obs_dim, feat_dim, cfg.search_threads)


def _shard_config(kb: int, ef_construct: int, payload_m: int, feat_on_disk: bool, obs_dim: int, feat_dim: int,
                  search_threads: int) -> qe.EdgeConfig:
    # Multitenancy: no global graph (m=0), one graph per task (payload_m); feat vectors are
    # never searched, so they get no graph at all.
    per_task = qe.HnswIndexConfig(m=0, ef_construct=ef_construct, full_scan_threshold=kb, payload_m=payload_m)
    no_graph = qe.HnswIndexConfig(m=0, ef_construct=ef_construct, full_scan_threshold=kb, payload_m=0)
    vectors = {
        OBS: qe.EdgeVectorParams(obs_dim, qe.Distance.Cosine),
        FEAT: qe.EdgeVectorParams(feat_dim, qe.Distance.Cosine, on_disk=feat_on_disk, hnsw_config=no_graph),
        FEAT_PREV: qe.EdgeVectorParams(feat_dim, qe.Distance.Cosine, on_disk=feat_on_disk, hnsw_config=no_graph),
    }
    return qe.EdgeConfig(
        vectors=vectors, hnsw_config=per_task, optimizers=qe.EdgeOptimizersConfig(indexing_threshold=kb),
        max_search_threads=search_threads or None,
    )


EDGE_CONFIG_FILE = "edge_config.json"
"""Where Edge keeps a shard's configuration; `load` with a configuration rewrites it."""


def _load(shard_dir: Path, search_threads: int, obs_dim: int, feat_dim: int) -> qe.EdgeShard:
    """Load the shard with its search pool sized `search_threads` (0: Edge's default).

    Edge takes the pool size only inside a whole configuration: `EdgeShard.load(path, config)`
    writes that configuration over the shard's own file. So the shard's configuration is read back
    from the file into the form `_edge_config` gives it, and if loading with it would change the
    file in anything but the pool size (a shard made by other code or another Edge version), the
    file is put back and the shard is loaded as it is. A shard whose file already has the size is
    loaded as it is, without rewriting anything."""
    where = str(shard_dir)
    path = shard_dir / EDGE_CONFIG_FILE
    try:
        before = read_capped_bytes(path, DatabaseUnavailableError)
        stored = parse_json(before)
        if stored.get("max_search_threads") == (search_threads or None):
            return qe.EdgeShard.load(where)
        hnsw, feat = stored["hnsw_config"], stored["vectors"][FEAT]
        config = _shard_config(int(hnsw["full_scan_threshold"]), int(hnsw["ef_construct"]), int(hnsw["payload_m"]),
                               bool(feat.get("on_disk", False)), obs_dim, feat_dim, search_threads)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return _stored_pool(where, f"its {EDGE_CONFIG_FILE} is not readable as heisd's ({err!r})")
    try:
        shard = qe.EdgeShard.load(where, config)
    except BaseException as err:  # a refusal, or a panic (a BaseException): the file as it was, always
        _restore(path, before)
        if not _is_engine_error(err):
            raise
        return _stored_pool(where, f"loading with its configuration read back failed ({err})")
    try:
        # a file Edge wrote past the cap counts as changed (ValueError, caught below): the old one goes back
        changed = _changed(stored, parse_json(read_capped_bytes(path, ValueError)))
    except (OSError, ValueError) as err:
        changed = f"unreadable after loading ({err!r})"
    if changed:
        shard.close()
        _restore(path, before)
        return _stored_pool(where, f"its configuration is not the one heisd creates ({changed})")
    return shard


def _changed(stored: dict, written: dict, prefix: str = "") -> str:
    """The first stored setting (other than the pool size) that `written` does not keep; '' if none.
    Settings Edge adds with their defaults (absent from `stored`) are not changes."""
    for key, value in stored.items():
        name = prefix + key
        if name == "max_search_threads":
            continue
        if isinstance(value, dict) and isinstance(written.get(key), dict):
            inner = _changed(value, written[key], name + ".")
            if inner:
                return inner
        elif key not in written or written[key] != value:
            return name
    return ""


def _stored_pool(where: str, why: str) -> qe.EdgeShard:
    log.warning("Qdrant Edge shard %s keeps the search pool its files set: %s", where, why)
    return qe.EdgeShard.load(where)


def _restore(path: Path, content: bytes) -> None:
    """Put `content` back as the file, atomically (a crash leaves the old or the new file, whole)."""
    try:
        if path.stat().st_size == len(content) and path.read_bytes() == content:
            return
    except OSError:
        pass
    tmp = path.with_name(path.name + ".restore")
    try:
        with open(tmp, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise DatabaseError(f"cannot restore {path}: {err}") from err


def _read_meta(shard_dir: Path) -> tuple[int, int]:
    meta_path = shard_dir / META_FILE
    try:
        meta = read_json(meta_path, DatabaseUnavailableError)
        version, obs_dim, feat_dim = meta["schema_version"], meta["obs_dim"], meta["feat_dim"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DatabaseUnavailableError(f"{meta_path} is missing or corrupt: {err}") from err
    if version != SCHEMA_VERSION:
        raise DatabaseError(f"{shard_dir} has schema version {version}; this code reads {SCHEMA_VERSION}")
    try:
        return check_dims(obs_dim, feat_dim)
    except ValueError as err:
        raise DatabaseUnavailableError(f"{meta_path} is corrupt: {err}") from err


def _write_meta(shard_dir: Path, collection: str, obs_dim: int, feat_dim: int) -> None:
    meta = {"schema_version": SCHEMA_VERSION, "collection": collection, "obs_dim": obs_dim, "feat_dim": feat_dim}
    tmp = shard_dir / (META_FILE + ".tmp")
    try:
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        os.replace(tmp, shard_dir / META_FILE)
    except OSError as err:
        raise DatabaseUnavailableError(f"cannot write {shard_dir / META_FILE}: {err}") from err


class EdgeStore(StoreBase):
    """DemoDatabase on an embedded Qdrant Edge shard. Build with `EdgeStore.open` (or make_store)."""

    backend = "edge"

    def __init__(self, shard: qe.EdgeShard, cfg: StoreConfig, obs_dim: int, feat_dim: int, where: str) -> None:
        super().__init__(cfg, obs_dim, feat_dim, where)
        self._shard = shard

    @classmethod
    def open(
        cls, cfg: StoreConfig, obs_dim: int | None = None, feat_dim: int | None = None, create: bool = False
    ) -> "EdgeStore":
        """Open `<cfg.path>/<cfg.collection>`; with `create`, make it first if it does not exist."""
        if not cfg.path:
            raise ConfigError("the edge store needs cfg.path")
        shard_dir = Path(cfg.path) / cfg.collection
        where = str(shard_dir)
        fresh = not shard_dir.exists() or (shard_dir.is_dir() and not any(shard_dir.iterdir()))
        if fresh and not create:
            raise DatabaseUnavailableError(
                f"no demonstration database at {where} (path {cfg.path!r}, collection {cfg.collection!r}); "
                "build one first or open it with create=True"
            )
        if fresh:
            if obs_dim is None or feat_dim is None:
                raise ConfigError("creating a store needs obs_dim and feat_dim")
            obs_dim, feat_dim = check_dims(obs_dim, feat_dim)
            return cls(cls._create(cfg, shard_dir, obs_dim, feat_dim), cfg, obs_dim, feat_dim, where)
        if not shard_dir.is_dir():
            raise DatabaseUnavailableError(f"{where} is not a directory")
        stored = _read_meta(shard_dir)
        wanted = (obs_dim if obs_dim is not None else stored[0], feat_dim if feat_dim is not None else stored[1])
        if wanted != stored:
            raise DatabaseError(
                f"{where} stores obs {stored[0]}-d and feat {stored[1]}-d vectors; expected {wanted[0]} and {wanted[1]}"
            )
        with _engine("open", where, unavailable=True):
            shard = _load(shard_dir, cfg.search_threads, *stored)
        return cls(shard, cfg, *stored, where=where)

    @staticmethod
    def _create(cfg: StoreConfig, shard_dir: Path, obs_dim: int, feat_dim: int) -> qe.EdgeShard:
        where = str(shard_dir)
        try:
            shard_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise DatabaseUnavailableError(f"cannot create {where}: {err}") from err
        with _engine("create", where, unavailable=True):
            shard = qe.EdgeShard.create(where, _edge_config(cfg, obs_dim, feat_dim))
        try:
            with _engine("create the task index", where, unavailable=True):
                shard.update(qe.UpdateOperation.create_field_index(TASK_FIELD, qe.KeywordIndexParams(is_tenant=True)))
                shard.flush()
            _write_meta(shard_dir, cfg.collection, obs_dim, feat_dim)
        except DatabaseError:
            shard.close()
            raise
        return shard

    # -- hooks -------------------------------------------------------------------------------
    def _count_points(self, task: str | None) -> int:
        with _engine("count", self._where):
            return int(self._shard.count(qe.CountRequest(exact=True, filter=_task_filter(task))))

    def _write(self, points: Sequence[DemoPoint]) -> None:
        batch = [qe.Point(p.id, p.vectors(), p.payload()) for p in points]
        with _engine("upsert", self._where):
            self._shard.update(qe.UpdateOperation.upsert_points(batch))

    def _query(self, query: list[float], task: str, top_k: int, exact: bool) -> list[Hit]:
        request = qe.QueryRequest(
            limit=top_k,
            query=qe.Query.Nearest(query, using=OBS),
            filter=_task_filter(task),
            with_vector=HIT_VECTORS,
            with_payload=True,
            params=qe.SearchParams(exact=exact),
        )
        with _engine("search", self._where):
            found = self._shard.query(request)
        return [hit_from_stored(p.score, p.payload or {}, p.vector or {}) for p in found]

    def _query_positions(self, query: list[float], task: str, top_k: int,
                         exact: bool) -> list[tuple[Any, float, np.ndarray]]:
        request = qe.QueryRequest(
            limit=top_k,
            query=qe.Query.Nearest(query, using=OBS),
            filter=_task_filter(task),
            with_vector=False,
            with_payload=qe.PayloadSelector.Include([EE_POS_FIELD]),
            params=qe.SearchParams(exact=exact),
        )
        with _engine("search", self._where):
            found = self._shard.query(request)
        try:
            return [(p.id, float(p.score), np.asarray(p.payload[EE_POS_FIELD], dtype=np.float64)) for p in found]
        except (KeyError, TypeError, ValueError) as err:
            raise DatabaseError(f"stored point is malformed: {err!r}") from err

    def _fetch(self, ids: Sequence[Any], scores: Sequence[float]) -> list[Hit]:
        with _engine("retrieve", self._where):
            records = {r.id: r for r in self._shard.retrieve(list(ids), True, HIT_VECTORS)}
        missing = [i for i in ids if i not in records]
        if missing:  # deleted between the query and the fetch: the database changed under the search
            raise DatabaseError(f"points {missing} vanished between search and fetch at {self._where}")
        return [hit_from_stored(s, records[i].payload or {}, records[i].vector or {}) for i, s in zip(ids, scores)]

    def _page(self, task: str | None, offset: Any, limit: int) -> tuple[list[DemoPoint], Any]:
        request = qe.ScrollRequest(
            offset=offset, limit=limit, filter=_task_filter(task), with_payload=True, with_vector=True
        )
        with _engine("scroll", self._where):
            records, next_offset = self._shard.scroll(request)
        return [DemoPoint.from_stored(r.payload or {}, r.vector or {}) for r in records], next_offset

    def _task_names(self) -> list[str]:
        with _engine("list tasks", self._where):
            facets = self._shard.facet(qe.FacetRequest(TASK_FIELD, limit=FACET_LIMIT, exact=True))
        return [str(h.value) for h in facets if h.count > 0]

    def _optimize(self) -> None:
        with _engine("optimize", self._where):
            self._shard.optimize()

    def _shutdown(self) -> None:
        with _engine("close", self._where):
            try:
                self._shard.flush()
            finally:
                self._shard.close()
