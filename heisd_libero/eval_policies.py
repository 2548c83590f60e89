"""The policies `heisd-libero eval-libero` compares: one HybridDecoder per method over one loaded VLA,
drafter and database, plus what the report records about them (artifact digests, search times)."""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heisd_ros.pipeline.outputs import file_digest

if TYPE_CHECKING:
    from heisd_libero.eval_config import EvalLiberoConfig


class TimedStore:
    """The shared database seen through one decoder: times every `search` (ms) for the report."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.search_ms: list[float] = []
        self.last_k = 0

    def search(self, query, task: str, top_k: int):
        return self._timed(top_k, self._store.search, query, task, top_k)

    def search_near(self, query, task: str, top_k: int, ee_pos, pool: int, timing_ms=None):
        return self._timed(top_k, self._store.search_near, query, task, top_k, ee_pos, pool, timing_ms)

    def _timed(self, top_k: int, call, *args):
        t0 = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.search_ms.append((time.perf_counter() - t0) * 1e3)
            self.last_k = top_k

    def close(self) -> None:  # the shared store is closed once, by the evaluator
        pass

    # the rest of the engine's DemoStore, forwarded by name (isinstance checks of a Protocol do not
    # go through __getattr__ from Python 3.12 on)
    def has_task(self, task: str) -> bool:
        return self._store.has_task(task)

    def tasks(self) -> list[str]:
        return self._store.tasks()

    def health(self) -> tuple[bool, str]:
        return self._store.health()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def db_digest(db_path: str) -> str:
    """Digest of a database directory's build manifest (written once by `heisd build-db`)."""
    if not db_path:
        return "none"
    from heisd_ros.store.manifest import manifest_path

    manifest = manifest_path(db_path)
    return file_digest(str(manifest)) if manifest.is_file() else "no manifest"


def count_or_none(store) -> int | None:
    """Points in the run's database for the report (None without one, or when it cannot say)."""
    if store is None:
        return None
    try:
        return int(store.count())
    except Exception:  # noqa: BLE001 - a report figure must not mask the run's own outcome
        return None


class Policies:
    """One HybridDecoder per method over one loaded VLA, drafter and database."""

    def __init__(self, cfg: EvalLiberoConfig) -> None:
        from heisd_ros.assembly import assemble_decoders
        from heisd_ros.core.engine import NEEDS_STORE
        from heisd_ros.policy import (
            PolicyPaths,
            load_parts,
            resolve_decoder_config,
            resolve_paths,
        )

        raw = PolicyPaths(cfg.model_dir, cfg.drafter_dir, cfg.db_path, cfg.calibration_path, tiny_cache_dir=cfg.tiny_dir)
        # the path defaults name the mini policy's files: the tiny policy brings its own
        self.paths = resolve_paths(raw, tiny_own_files=True)
        variants = {v.name: v for v in cfg.variants}
        method_of = {m: variants[m].method if m in variants else m for m in cfg.labels}
        needs_store = any(m in NEEDS_STORE for m in method_of.values())
        # the calibration and, where a method retrieves, the database's query views: resolved once
        base = resolve_decoder_config(_base_config(cfg), self.paths if needs_store else
                                      dataclasses.replace(self.paths, db_path=""))
        self.base_cfg = base
        parts = load_parts(self.paths, base, method_of.values())  # one model, drafter and database
        self.vla, self.store = parts.vla, parts.store
        self.timed = {m: TimedStore(self.store) if self.store is not None else None for m in cfg.labels}
        configs = {m: variants[m].config(base) if m in variants else base.with_method(m) for m in cfg.labels}
        for m in cfg.online_methods:  # the online stage is the decoder's own setting (verify_skip.online)
            configs[m] = dataclasses.replace(configs[m], verify_skip=dataclasses.replace(configs[m].verify_skip,
                                                                                        online=True))  # fmt: skip
        self.decoders = assemble_decoders(parts, configs, stores=self.timed)
        self.online = frozenset(m for m, c in configs.items() if c.verify_skip.online)
        """Labels whose verify-skip thresholds carry over between episodes (the online stage)."""
        self.shadow = (assemble_decoders(parts, {"shadow": base.with_method("ar")}, stores={"shadow": None})["shadow"]
                       if cfg.shadow_ar else None)
        """Greedy `ar` on the observations of lossy steps (never timed, never executed)."""
        for decoder in [*self.decoders.values(), *([self.shadow] if self.shadow else [])]:
            decoder.prepare_vision()  # the backbone's graphs are built here, not in the first timed step

    def fingerprint(self) -> dict[str, Any]:
        from heisd_ros.core.config import to_dict

        return {
            "model_dir": self.paths.model_dir, "model_digest": file_digest(self.paths.model_dir),
            "drafter_dir": self.paths.drafter_dir, "drafter_digest": file_digest(self.paths.drafter_dir),
            # The database's build manifest, not a count from the open store: an `ar`-only shard
            # never opens the database, and must share the run key with a `heisd` shard.
            "db_path": self.paths.db_path, "db_digest": db_digest(self.paths.db_path),
            "calibration_path": self.paths.calibration_path,
            "calibration_digest": file_digest(self.paths.calibration_path),
            "decoder_config": to_dict(self.base_cfg),
        }

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def _base_config(cfg: EvalLiberoConfig):
    """The DecoderConfig every method shares (`with_method` sets the method), before the operating point."""
    from heisd_ros.core.config import DecoderConfig

    # every setting of the operating point comes from the calibration file (`resolve_decoder_config`)
    return DecoderConfig(method="heisd", dtype=cfg.dtype, unknown_task=cfg.unknown_task)


def retrieval_probe(store, tasks: list[str], per_task: int = 40, top_k: int = 5) -> list[float]:
    """Wall ms of Top-k task-filtered searches on `store`, querying with stored demonstration obs
    vectors of each task (the same embedding as live queries; the exact hit itself is allowed)."""
    out = []
    for task in tasks:
        for point in itertools.islice(store.scroll(task), per_task):
            t0 = time.perf_counter()
            store.search(point.obs, task, top_k)
            out.append((time.perf_counter() - t0) * 1e3)
    return out
