"""Demonstration database (docs/design.md §4): Qdrant embedded (Edge, or qdrant-client local mode) or remote.

    store = make_store(StoreConfig(path="db"), obs_dim=2560, feat_dim=256, create=True)
    store.upsert(points)                      # DemoPoint, idempotent (id = hash of dataset/episode/step)
    hits = store.search(query, task, top_k=5) # list[Hit], best first, filtered by task

Importing this package loads neither Qdrant library nor ROS; `make_store` imports the backend it needs.
"""

from heisd_ros.store.factory import STORES, make_store
from heisd_ros.store.schema import (
    PAYLOAD_FIELDS,
    VECTOR_NAMES,
    DemoDatabase,
    DemoPoint,
    InvalidDemoPointError,
    point_id,
)

__all__ = [
    "PAYLOAD_FIELDS",
    "STORES",
    "VECTOR_NAMES",
    "DemoDatabase",
    "DemoPoint",
    "InvalidDemoPointError",
    "make_store",
    "point_id",
]
