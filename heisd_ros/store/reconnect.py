"""A demonstration store that rides out database faults: fail fast while down, reconnect with backoff.

The control step must never wait on a database that is down. `ReconnectingStore` wraps the store
the decoder uses:

- **up**: calls go to the store. A `DatabaseUnavailableError` (server down or silent, timeout,
  files gone, store closed) is re-raised, so that step runs without retrieval, and the wrapper
  goes **down** with a retry due after `reconnect_backoff_s`.
- **down**: every call fails at once with `DatabaseUnavailableError` (no request is made) until
  the retry is due. The first call after that (a search, or the node's periodic health check)
  **reconnects**: the old store is closed, a new one is opened through the same opener and the
  call is made on it. Success: up again, delay reset. Failure: down again, the delay doubled up to
  `reconnect_max_backoff_s`.

A retry costs what opening the store costs: with a remote server every request is held to
`StoreConfig.timeout_s`, so a retry against a server that is still down blocks for at most one
`timeout_s`, once per backoff period. Errors that say nothing about reachability (a malformed point,
an unknown task, an empty partition) pass through and leave the state alone.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.errors import DatabaseError, DatabaseUnavailableError
from heisd_ros.core.types import Hit
from heisd_ros.store.schema import DemoDatabase, DemoPoint

log = logging.getLogger(__name__)


class ReconnectingStore:
    """DemoDatabase wrapper (see the module docstring). `store` is the already opened store.

    opener() -> a new DemoDatabase of the same database (raises DatabaseError when it cannot).
    clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(self, opener: Callable[[], DemoDatabase], cfg: StoreConfig, store: DemoDatabase,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._opener = opener
        self._cfg = cfg
        self._store: DemoDatabase | None = store
        self._clock = clock
        self._lock = threading.RLock()
        self._obs_dim, self._feat_dim = int(store.obs_dim), int(store.feat_dim)
        self._delay_s = cfg.reconnect_backoff_s
        self._retry_at: float | None = None  # None = up
        self._last_error = ""
        self._closed = False
        self.failures = 0
        """Faults seen (each one sent a step, or a retry, to the fallback)."""
        self.reconnects = 0
        """Successful reconnections."""

    # -- state ---------------------------------------------------------------------------------
    @property
    def is_up(self) -> bool:
        return self._retry_at is None and not self._closed

    @property
    def retry_in_s(self) -> float:
        """Seconds until the next reconnect attempt (0 when up or due)."""
        return 0.0 if self._retry_at is None else max(0.0, self._retry_at - self._clock())

    def _down(self, err: DatabaseError) -> None:
        first = self._retry_at is None
        self.failures += 1
        self._last_error = f"{type(err).__name__}: {err}"
        self._retry_at = self._clock() + self._delay_s
        log.warning("database %s (%s); running without retrieval, reconnect attempt in %.1f s",
                    "unavailable" if first else "still unavailable", self._last_error, self._delay_s)  # fmt: skip
        self._delay_s = min(2.0 * self._delay_s, self._cfg.reconnect_max_backoff_s)

    def _up(self) -> None:
        if self._retry_at is not None:
            log.warning("database reachable again after %d fault(s); retrieval restored", self.failures)
        self._retry_at = None
        self._delay_s = self._cfg.reconnect_backoff_s

    def _ready(self) -> DemoDatabase:
        """The store to call, reconnecting first when a retry is due; raises at once while down."""
        if self._closed:
            raise DatabaseUnavailableError("the demonstration store is closed")
        if self._retry_at is None:
            return self._store
        wait = self._retry_at - self._clock()
        if wait > 0:
            raise DatabaseUnavailableError(f"{self._last_error} (reconnect attempt in {wait:.1f} s)")
        self._drop()
        try:
            self._store = self._opener()
        except DatabaseError as err:  # unreachable, or back with another schema: keep backing off
            self._down(err)
            raise
        self.reconnects += 1
        return self._store

    def _drop(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            try:
                store.close()
            except DatabaseError as err:  # closing a broken connection may fail too; it is gone either way
                log.debug("closing the failed store: %s", err)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            store = self._ready()
            try:
                result = getattr(store, name)(*args, **kwargs)
            except DatabaseUnavailableError as err:
                self._down(err)
                raise
            self._up()
            return result

    # -- the DemoDatabase API ------------------------------------------------------------------
    @property
    def obs_dim(self) -> int:
        return self._obs_dim

    @property
    def feat_dim(self) -> int:
        return self._feat_dim

    def search(self, query: np.ndarray, task: str, top_k: int) -> list[Hit]:
        return self._call("search", query, task, top_k)

    def search_near(self, query: np.ndarray, task: str, top_k: int, ee_pos: np.ndarray, pool: int,
                    timing_ms: dict[str, float] | None = None) -> list[Hit]:
        return self._call("search_near", query, task, top_k, ee_pos, pool, timing_ms)

    def has_task(self, task: str) -> bool:
        return self._call("has_task", task)

    def count(self, task: str | None = None) -> int:
        return self._call("count", task)

    def tasks(self) -> list[str]:
        return self._call("tasks")

    def upsert(self, points: Sequence[DemoPoint], batch_size: int = 256) -> int:
        return self._call("upsert", points, batch_size)

    def scroll(self, task: str | None = None) -> Iterator[DemoPoint]:
        return self._call("scroll", task)

    def optimize(self) -> None:
        self._call("optimize")

    def health(self) -> tuple[bool, str]:
        """(ok, status); never raises. A due retry is made here too, so recovery does not wait
        for the next retrieval step."""
        with self._lock:
            try:
                store = self._ready()
            except DatabaseError:
                return False, f"unavailable: {self._last_error}; reconnect attempt in {self.retry_in_s:.1f} s"
            ok, text = store.health()
            if not ok:
                self._down(DatabaseUnavailableError(text))
                return False, f"unavailable: {text}; reconnect attempt in {self.retry_in_s:.1f} s"
            self._up()
            return True, text + (f" (reconnected {self.reconnects}x)" if self.reconnects else "")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._drop()

    def __enter__(self) -> "ReconnectingStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
