"""A policy's decoders from files: model (with its state prior), drafter, database, calibration.

Every `model_dir` is a local model directory (offline, never a hub). Two model names are not
directories, and are resolved here only (`resolve_paths`), for the offline tools (bench, eval,
demo, benchmarks): "tiny" builds (once, cached under `tiny_cache_dir`) the tiny test policy from
synthetic demonstrations; "auto" is the first trained policy the tool names that is present, else
"tiny". The policy node loads only the directories it is given (`build_policy`).

The decoders themselves are assembled by `heisd_ros.assembly.assemble_decoders`; this module loads
what they share from files (`load_parts`) and builds them (`build_decoders`, `build_policy`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from heisd_ros.assembly import PolicyParts, assemble_decoders
from heisd_ros.core.config import DecoderConfig, StoreConfig
from heisd_ros.core.drafter import load_drafter
from heisd_ros.core.engine import NEEDS_DRAFTER, NEEDS_STORE, HybridDecoder
from heisd_ros.core.errors import (
    DatabaseError,
    DatabaseUnavailableError,
    EmptyDatabaseError,
    ModelLoadError,
)
from heisd_ros.models.dtypes import DTYPES
from heisd_ros.models.loader import load_model
from heisd_ros.models.spec import ModelSpec
from heisd_ros.pipeline.calibration import apply_calibration

log = logging.getLogger(__name__)
DEFAULT_TINY_DIR = Path("artifacts/tiny")
TINY_MODEL = "tiny"
"""The model name of the tiny test policy (built under `tiny_cache_dir`)."""
AUTO_MODEL = "auto"
"""The model name of 'the first trained policy present, else the tiny one' (`choose_auto`)."""
Key = TypeVar("Key", bound=Hashable)


@dataclass(frozen=True)
class PolicyPaths:
    model_dir: str
    drafter_dir: str = ""
    db_path: str = ""
    calibration_path: str = ""
    tiny_cache_dir: str = str(DEFAULT_TINY_DIR)


def set_torch_threads(threads: int) -> None:
    """Fix torch's CPU threads for the whole process: every thread (the node's inference thread
    too) runs its ops on `threads` intra-op threads. The inter-op pool is sized alike while torch
    still allows it: that is refused once parallel work has started or it was set before, and it is
    then left as it is (the decoder runs no inter-op work)."""
    if threads > (os.cpu_count() or threads):
        log.warning("torch_threads %d exceeds the %d CPU cores: threads will wait for each other",
                    threads, os.cpu_count())
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != threads:
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # already fixed, or parallel work has started
            log.debug("torch inter-op threads stay at %d", torch.get_num_interop_threads())


def is_tiny(model_dir: str) -> bool:
    """Whether `model_dir` names the tiny test policy rather than a directory."""
    return model_dir == TINY_MODEL


def choose_auto(paths: PolicyPaths, trained: Sequence[PolicyPaths] = ()) -> PolicyPaths:
    """`paths` with `model_dir="auto"` made concrete: the first of `trained` (the policies the
    caller found present, best first), else "tiny"; the drafter, database and calibration the
    caller gave win over the chosen policy's. Any other `model_dir` is returned as it is."""
    if paths.model_dir != AUTO_MODEL:
        return paths
    if not trained:
        return dataclasses.replace(paths, model_dir=TINY_MODEL)
    chosen = trained[0]
    return PolicyPaths(model_dir=chosen.model_dir, drafter_dir=paths.drafter_dir or chosen.drafter_dir,
                       db_path=paths.db_path or chosen.db_path,
                       calibration_path=paths.calibration_path or chosen.calibration_path,
                       tiny_cache_dir=paths.tiny_cache_dir)


def resolve_paths(paths: PolicyPaths, trained: Sequence[PolicyPaths] = (), tiny_own_files: bool = False,
                  progress: Callable[[str], None] | None = None) -> PolicyPaths:
    """Expand the model names: "auto" (`choose_auto` over `trained`), then "tiny" to the built tiny
    artifacts (building them if needed, `progress` told how it goes). The drafter, database and
    calibration given win over the tiny policy's own unless `tiny_own_files` (for a tool whose
    path defaults name another policy's files)."""
    paths = choose_auto(paths, trained)
    if not is_tiny(paths.model_dir):
        return paths
    from heisd_ros.pipeline.tiny_artifacts import build_tiny_artifacts

    if tiny_own_files:
        paths = PolicyPaths(paths.model_dir, tiny_cache_dir=paths.tiny_cache_dir)
    root = build_tiny_artifacts(paths.tiny_cache_dir, progress=progress)
    return PolicyPaths(
        model_dir=str(root / "model"),
        drafter_dir=paths.drafter_dir or str(root / "drafter"),
        db_path=paths.db_path or str(root / "db"),
        calibration_path=paths.calibration_path or str(root / "calibration.json"),
        tiny_cache_dir=paths.tiny_cache_dir,
    )


def database_manifest(db_path: str) -> dict | None:
    """An embedded database's build manifest, or None."""
    from heisd_ros.store.manifest import read_manifest

    return read_manifest(db_path)


def resolve_query_views(cfg: DecoderConfig, db_path: str) -> DecoderConfig:
    """`cfg` with `retrieval.query_views` set from the database's manifest when it is 0 (auto).

    A value given explicitly must match the manifest's: the stored `obs` vectors pool exactly
    those views, and a query over other views would find neighbours by accident. Databases
    without a manifest (remote clusters, builds before `--query-views`) pool every view."""
    manifest = database_manifest(db_path)
    built = int(manifest.get("query_views", 0)) if manifest is not None else 0
    wanted = cfg.retrieval.query_views
    if wanted and built and wanted != built:
        raise DatabaseUnavailableError(
            f"the database at {db_path} pools {built} view(s) per query, the policy asks for {wanted} "
            f"(retrieval.query_views); rebuild it with heisd build-db --query-views {wanted} or set {built}")
    if wanted or not built:
        return cfg
    if built > len(cfg.views):
        raise DatabaseUnavailableError(f"the database at {db_path} pools {built} views per query; "
                                       f"the policy has only {list(cfg.views)}")
    log.info("retrieval query pools the first %d view(s) %s, as the database at %s was built",
             built, list(cfg.views[:built]), db_path)
    return dataclasses.replace(cfg, retrieval=dataclasses.replace(cfg.retrieval, query_views=built))


def store_config(paths: PolicyPaths, store_cfg: StoreConfig | None) -> StoreConfig | None:
    """The database the files name, decided here only: `store_cfg` when given (the node's, whose
    path is its db_path; or a remote server's), else an embedded database at `paths.db_path`, else
    None."""
    if store_cfg is not None:
        if store_cfg.backend != "remote" and paths.db_path and store_cfg.path != paths.db_path:
            raise DatabaseUnavailableError(f"two database directories given: {paths.db_path!r} and "
                                           f"store.path {store_cfg.path!r}")  # fmt: skip
        return store_cfg
    return StoreConfig(backend="edge", path=paths.db_path) if paths.db_path else None


def open_store(cfg: DecoderConfig, paths: PolicyPaths, store_cfg: StoreConfig | None,
               obs_dim: int | None = None, feat_dim: int | None = None):
    """The database for methods that retrieve, wrapped in a ReconnectingStore.

    obs_dim / feat_dim: the model's retrieval query and feature sizes, checked against the
    database's (None = not checked). Raises DatabaseError (with the path or URL) when it cannot be
    opened or was built for another model, EmptyDatabaseError when it holds nothing.
    """
    from heisd_ros.store.factory import make_store
    from heisd_ros.store.reconnect import ReconnectingStore

    store_cfg = store_config(paths, store_cfg)
    if store_cfg is None:
        raise DatabaseUnavailableError(f"method {cfg.method!r} needs a database; no db_path given")
    store = make_store(store_cfg, obs_dim, feat_dim)  # a database that cannot be opened fails the start-up
    if store.count() == 0:
        store.close()
        raise EmptyDatabaseError(f"the demonstration database at {store_cfg.path or store_cfg.url} is empty")
    if store_cfg.backend == "edge":  # a remote database has no manifest to check
        try:
            ModelSpec.of_decoder(paths.model_dir, cfg).check_database(database_manifest(store_cfg.path), store_cfg.path)
        except DatabaseError:
            store.close()
            raise
    dims = (store.obs_dim, store.feat_dim)
    # A fault after start-up is ridden out: drafter mode while down, reconnection with backoff.
    return ReconnectingStore(lambda: make_store(store_cfg, *dims), store_cfg, store)


def resolve_decoder_config(cfg: DecoderConfig, paths: PolicyPaths, store_cfg: StoreConfig | None = None) -> DecoderConfig:
    """The configuration a decoder of these files runs: `cfg` (parameters, flags) with the
    calibration file's values and, for a method that retrieves from an embedded database, the query
    views its build manifest records. Reads files, changes nothing; the node and every loader call it
    once, so what runs is what they report."""
    cfg = apply_calibration(cfg, paths.calibration_path)
    store_cfg = store_config(paths, store_cfg)
    if cfg.method in NEEDS_STORE and store_cfg is not None and store_cfg.backend == "edge":
        cfg = resolve_query_views(cfg, store_cfg.path)  # the manifest of the database open_store opens
    return cfg


def load_policy(paths: PolicyPaths, cfg: DecoderConfig, store_cfg: StoreConfig | None = None, store=None,
                torch_threads: int | None = None, build_tiny: bool = True) -> HybridDecoder:
    """The decoder of `cfg.method` over the files in `paths`, its configuration resolved
    (`resolve_decoder_config`) and built (`build_policy`). `build_tiny`: whether `model_dir="tiny"`
    means the test policy (`resolve_paths`); False reads it as a directory."""
    if torch_threads is not None:
        set_torch_threads(torch_threads)  # before anything is loaded, tiny artifacts included
    if build_tiny:
        paths = resolve_paths(paths)
    return build_policy(paths, resolve_decoder_config(cfg, paths, store_cfg), store_cfg, store)


def build_policy(paths: PolicyPaths, effective: DecoderConfig, store_cfg: StoreConfig | None = None, store=None,
                 torch_threads: int | None = None) -> HybridDecoder:
    """The decoder of an already resolved configuration (`build_decoders` for its one method): the
    model and its state prior, the drafter and the database where the method needs them. `store`:
    an open database to use instead of opening one. `torch_threads`: set (`set_torch_threads`)
    before anything is loaded; None leaves torch's threads as they are."""
    method = effective.method
    return build_decoders(paths, {method: effective}, store_cfg=store_cfg, store=store,
                          torch_threads=torch_threads)[method]


def build_decoders(paths: PolicyPaths, configs: Mapping[Key, DecoderConfig], load_cfg: DecoderConfig | None = None,
                   store_cfg: StoreConfig | None = None, store=None,
                   torch_threads: int | None = None) -> dict[Key, HybridDecoder]:
    """Decoders for already resolved configurations, keyed as `configs`, over one model, drafter and
    database loaded once from `paths` (`load_parts`, for every configured method, the model as
    `load_cfg` runs it: default the first configuration) and shared (`assemble_decoders`).
    `store`, `store_cfg`: as `load_parts`; `torch_threads`: as `build_policy`."""
    if torch_threads is not None:
        set_torch_threads(torch_threads)
    load_cfg = load_cfg if load_cfg is not None else next(iter(configs.values()))
    parts = load_parts(paths, load_cfg, [c.method for c in configs.values()], store_cfg, store)
    return assemble_decoders(parts, configs)


def load_parts(paths: PolicyPaths, cfg: DecoderConfig, methods: Iterable[str] | None = None,
               store_cfg: StoreConfig | None = None, store=None) -> PolicyParts:
    """What the decoders of `methods` (default: `cfg.method` alone) share, loaded from `paths`: the
    model and its state prior as `cfg` runs them (dtype, device, unnorm_key, centre crop, LLM
    kernel), the drafter if a method drafts, and if one retrieves the database: `store` when given
    (then kept whatever the methods), else `open_store`'s, checked against the model's sizes.
    Raises ModelLoadError when a method needs a drafter and `paths` names none."""
    methods = list(dict.fromkeys([cfg.method] if methods is None else methods))
    vla, state_prior = load_model(ModelSpec.of_decoder(paths.model_dir, cfg))
    drafter = None
    drafting = [m for m in methods if m in NEEDS_DRAFTER]
    if drafting:
        if not paths.drafter_dir:
            raise ModelLoadError(f"method {drafting[0]!r} needs a drafter; no drafter_dir given")
        drafter = load_drafter(paths.drafter_dir, vla.language_model.config, DTYPES[cfg.dtype]).to(cfg.device)
    retrieving = [m for m in methods if m in NEEDS_STORE]
    if store is None and retrieving:
        per_view = vla.query_dim  # not every backbone says
        obs_dim = cfg.query_view_count * per_view if per_view is not None else None
        store = open_store(cfg.with_method(retrieving[0]), paths, store_cfg, obs_dim=obs_dim,
                           feat_dim=vla.hidden_size)
    return PolicyParts(vla, state_prior, drafter, store)
