"""What the Qdrant stores share: validation, the task-count cache, error choice and the two
ways a search reads the database (by similarity alone, or by similarity then hand position)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.errors import (
    ConfigError,
    DatabaseError,
    DatabaseUnavailableError,
    EmptyDatabaseError,
    UnknownTaskError,
)
from heisd_ros.core.types import Hit
from heisd_ros.store.schema import DemoPoint, InvalidDemoPointError, check_dims, check_query


class TaskCounts:
    """Per-task point counts cached for `ttl_s` (has_task runs every control step).

    Upserts through the same store call `invalidate()`; the TTL only matters when another
    process writes to a shared server.
    """

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._counts: dict[str | None, tuple[int, float]] = {}
        self._generation = 0  # bumped by invalidate(); a fetch that raced an upsert is not cached

    def get(self, task: str | None, fetch: Callable[[str | None], int]) -> int:
        now = time.monotonic()
        with self._lock:
            cached, generation = self._counts.get(task), self._generation
        if cached is not None and now - cached[1] < self._ttl_s:
            return cached[0]
        n = int(fetch(task))
        with self._lock:
            if generation == self._generation:
                self._counts[task] = (n, now)
        return n

    def invalidate(self) -> None:
        with self._lock:
            self._counts.clear()
            self._generation += 1


class StoreBase:
    """Behaviour shared by the Qdrant stores: validation, task-count cache, error choice.

    A backend implements the hooks `_count_points`, `_write`, `_query`, `_page`, `_task_names`,
    `_shutdown` (and optionally `_optimize`), raising DatabaseError subclasses with the cause chained.
    """

    backend = ""

    def __init__(self, cfg: StoreConfig, obs_dim: int, feat_dim: int, where: str) -> None:
        self._cfg = cfg
        self._obs_dim, self._feat_dim = check_dims(obs_dim, feat_dim)
        self._where = where  # a path or a credential-free URL, safe to log
        self._counts = TaskCounts(cfg.task_cache_ttl_s)
        self._closed = False

    # -- backend hooks -----------------------------------------------------------------------
    def _count_points(self, task: str | None) -> int:
        raise NotImplementedError

    def _write(self, points: Sequence[DemoPoint]) -> None:
        raise NotImplementedError

    def _query(self, query: list[float], task: str, top_k: int, exact: bool) -> list[Hit]:
        raise NotImplementedError

    def _query_positions(self, query: list[float], task: str, top_k: int,
                         exact: bool) -> list[tuple[Any, float, np.ndarray]]:
        """Top-k by cosine on `obs` within `task`, best first, as (point id, score, ee_pos [3]):
        no vectors and no other payload are read."""
        raise NotImplementedError

    def _fetch(self, ids: Sequence[Any], scores: Sequence[float]) -> list[Hit]:
        """Full hits (payload, feat, feat_prev) of the points `ids`, in that order, with `scores`."""
        raise NotImplementedError

    def _page(self, task: str | None, offset: Any, limit: int) -> tuple[list[DemoPoint], Any]:
        """One scroll page and the offset of the next one (None at the end)."""
        raise NotImplementedError

    def _task_names(self) -> list[str]:
        raise NotImplementedError

    def _optimize(self) -> None:
        return None

    def _shutdown(self) -> None:
        raise NotImplementedError

    # -- the DemoDatabase API ----------------------------------------------------------------
    @property
    def obs_dim(self) -> int:
        return self._obs_dim

    @property
    def feat_dim(self) -> int:
        return self._feat_dim

    @property
    def where(self) -> str:
        return self._where

    def _ensure_open(self) -> None:
        if self._closed:
            raise DatabaseUnavailableError(f"{self.backend} store at {self._where} is closed")

    def upsert(self, points: Sequence[DemoPoint], batch_size: int = 256) -> int:
        self._ensure_open()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        pts = list(points)
        tasks: dict[str, str] = {}
        for p in pts:  # validate everything before the first write
            if not isinstance(p, DemoPoint):
                raise InvalidDemoPointError(f"expected DemoPoint, got {type(p).__name__}")
            p.check_dims(self._obs_dim, self._feat_dim)
            if tasks.setdefault(p.id, p.task) != p.task:
                raise InvalidDemoPointError(
                    f"{p.dataset}/{p.episode}/{p.step} appears under tasks {tasks[p.id]!r} and {p.task!r}: "
                    "episode numbers must be unique within a dataset (the point id is dataset/episode/step)"
                )
        try:
            for start in range(0, len(pts), batch_size):
                self._write(pts[start : start + batch_size])
        finally:
            self._counts.invalidate()
        return len(pts)

    def _checked(self, query: np.ndarray, task: str, top_k: int) -> tuple[list[float], bool]:
        """(the query as the engine takes it, whether the task's partition is searched exactly)."""
        self._ensure_open()
        vec = check_query(query, self._obs_dim)
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
            raise ConfigError(f"top_k must be an integer >= 1, got {top_k!r}")
        n_task = self._counts.get(task, self._count_points)
        if n_task == 0:
            if self._counts.get(None, self._count_points) == 0:
                raise EmptyDatabaseError(f"{self.backend} store at {self._where} holds no demonstrations")
            raise UnknownTaskError(f"task {task!r} has no demonstrations in {self._where}")
        return vec, n_task < self._cfg.exact_search_below

    def search(self, query: np.ndarray, task: str, top_k: int) -> list[Hit]:
        vec, exact = self._checked(query, task, top_k)
        return self._query(vec, task, int(top_k), exact=exact)

    def search_near(self, query: np.ndarray, task: str, top_k: int, ee_pos: np.ndarray, pool: int,
                    timing_ms: dict[str, float] | None = None) -> list[Hit]:
        """The `top_k` of the Top-`pool` hits by similarity whose recorded hand position is nearest
        `ee_pos` [3] (m), nearest first; equally near hits keep their similarity order.

        The pool is read as ids, scores and positions only; payloads and feature vectors are
        fetched once, for the kept hits. `timing_ms` (if given) receives the wall ms of the
        `query`, the `rerank` and the `fetch`."""
        vec, exact = self._checked(query, task, max(int(top_k), int(pool)))
        t0 = time.perf_counter()
        pooled = self._query_positions(vec, task, max(int(top_k), int(pool)), exact)
        t1 = time.perf_counter()
        kept = [pooled[i] for i in nearest_first([p for _, _, p in pooled], ee_pos)[:top_k]]
        t2 = time.perf_counter()
        hits = self._fetch([i for i, _, _ in kept], [s for _, s, _ in kept]) if kept else []
        if timing_ms is not None:
            timing_ms.update(query=(t1 - t0) * 1e3, rerank=(t2 - t1) * 1e3, fetch=(time.perf_counter() - t2) * 1e3)
        return hits

    def has_task(self, task: str) -> bool:
        self._ensure_open()
        return self._counts.get(task, self._count_points) > 0

    def count(self, task: str | None = None) -> int:
        self._ensure_open()
        return self._count_points(task)

    def tasks(self) -> list[str]:
        self._ensure_open()
        return sorted(self._task_names())

    def scroll(self, task: str | None = None, page_size: int = 256) -> Iterator[DemoPoint]:
        self._ensure_open()
        offset: Any = None
        while True:
            points, offset = self._page(task, offset, page_size)
            yield from points
            if offset is None:
                return

    def health(self) -> tuple[bool, str]:
        if self._closed:
            return False, f"{self.backend} store at {self._where} is closed"
        try:
            n = self._count_points(None)
        except DatabaseError as err:
            return False, f"{self.backend} store at {self._where}: {err}"
        return True, f"{self.backend} store at {self._where}: {n} points (obs {self._obs_dim}, feat {self._feat_dim})"

    def optimize(self) -> None:
        self._ensure_open()
        self._optimize()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._shutdown()

    def __enter__(self) -> "StoreBase":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def nearest_first(positions: Sequence[np.ndarray], ee_pos: np.ndarray) -> list[int]:
    """Indices of `positions` ([3] each, m) by distance to `ee_pos`, nearest first; a stable order,
    so equally near entries keep the order they came in (their similarity order)."""
    if not len(positions):
        return []
    distance = np.linalg.norm(np.asarray(positions, dtype=np.float64) - np.asarray(ee_pos, dtype=np.float64), axis=1)
    return [int(i) for i in np.argsort(distance, kind="stable")]
