"""Choose a demonstration store by `StoreConfig.backend`; the Qdrant libraries load only here."""

from __future__ import annotations

from heisd_ros.core.config import StoreConfig
from heisd_ros.core.errors import ConfigError
from heisd_ros.store.schema import DemoDatabase


def _open_edge(cfg: StoreConfig, obs_dim: int | None, feat_dim: int | None, create: bool) -> DemoDatabase:
    from heisd_ros.store.edge import EdgeStore

    return EdgeStore.open(cfg, obs_dim, feat_dim, create)


def _open_client(cfg: StoreConfig, obs_dim: int | None, feat_dim: int | None, create: bool) -> DemoDatabase:
    from heisd_ros.store.client import ClientStore

    return ClientStore.open(cfg, obs_dim, feat_dim, create)


STORES = {"edge": _open_edge, "local": _open_client, "remote": _open_client}
"""backend name -> opener (embedded Qdrant Edge; qdrant-client local mode; server/cluster by URL)."""


def make_store(
    cfg: StoreConfig, obs_dim: int | None = None, feat_dim: int | None = None, create: bool = False
) -> DemoDatabase:
    """Open the demonstration database `cfg` describes.

    obs_dim / feat_dim: expected vector dimensions (checked against an existing database; required
    to create one). create: make the database (or collection) if it does not exist.
    Raises DatabaseUnavailableError when it cannot be reached or opened, DatabaseError when it does
    not match the expected dimensions or sharding, ConfigError for an unusable configuration.
    """
    try:
        opener = STORES[cfg.backend]
    except KeyError as err:
        raise ConfigError(f"unknown store backend {cfg.backend!r}; choose one of {sorted(STORES)}") from err
    return opener(cfg, obs_dim, feat_dim, create)
