"""What the decoding engine needs from a demonstration database, as a Protocol beside its user.

`heisd_ros.core.engine.HybridDecoder` reads its store only through `DemoStore`: exactly the calls
it makes, and no more, so a wrapper (reconnecting, timed) or a test double has a short, checked
list to implement. The Qdrant stores (`heisd_ros.store`) implement it and add what building and
inspecting a database takes (`heisd_ros.store.schema.DemoDatabase`: upsert, scroll, count, ...).

This module sits apart from `model_api` so that the store package can name it without importing
torch.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from heisd_ros.core.types import Hit


@runtime_checkable
class DemoStore(Protocol):
    """A demonstration database partitioned by task, as the control step reads it.

    Failures are `heisd_ros.core.errors.DatabaseError` subclasses: the engine falls back to
    decoding without retrieval on those, and raises `UnknownTaskError` on to its caller."""

    def has_task(self, task: str) -> bool:
        """Whether `task` has points (cached, cheap enough for every control step)."""
        ...

    def search(self, query: np.ndarray, task: str, top_k: int) -> list[Hit]:
        """Top-k by cosine on the query vector within `task`, best first; hits carry feat/feat_prev."""
        ...

    def search_near(self, query: np.ndarray, task: str, top_k: int, ee_pos: np.ndarray, pool: int,
                    timing_ms: dict[str, float] | None = None) -> list[Hit]:
        """The `top_k` of the Top-`pool` by cosine nearest `ee_pos` [3] in recorded hand position,
        nearest first; `timing_ms` (if given) receives the wall ms of its stages."""
        ...

    def tasks(self) -> list[str]:
        """The tasks that have points, sorted."""
        ...

    def health(self) -> tuple[bool, str]:
        """(ok, human-readable status); never raises."""
        ...

    def close(self) -> None:
        """Release the database (an embedded one holds a file lock until closed)."""
        ...
