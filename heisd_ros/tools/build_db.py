"""`heisd build-db`: the demonstration database of a VLA, in embedded Qdrant (docs/design.md §4).

Usage:
    heisd build-db --model artifacts/mini_vla --demos artifacts/demos/libero_object --out artifacts/mini_db
    heisd build-db --model artifacts/mini_vla --bags artifacts/demos/libero_object/bags --out artifacts/mini_db_bags
    heisd build-db --model my_vla --bags recordings --instruction "put the cup on the plate" --out my_db \
        --map /cam_high/image_raw=agentview,/cam_wrist/image_raw=wrist,/ee_pose=pose,/teleop/cmd=action,/gripper=gripper
    heisd build-db --model my_vla --lerobot my_dataset --out my_db \
        --map observation.images.front=agentview,observation.images.wrist=wrist,observation.state[0:3]=pose
        [--tasks 0-9] [--dataset NAME] [--collection heisd_demos] [--fresh] [--latency-queries 200] [--threads 1]
        [--dtype float32|bfloat16]   (the dtype the policy runs in; a different dtype re-embeds everything)
        [--query-views N]            (the leading views the query pools, 0 = all; recorded in the manifest)
        [--unnorm-key KEY] [--center-crop]   (OpenVLA checkpoints: the statistics and the crop the policy uses)
        [--gripper-open-positive] [--gripper-range LO,HI] [--twist-linear-scale S] [--trust-actions] ...

One point per demo step: `obs` = the VLA's own backbone over both views, or over the first
`--query-views` of them (`embed_views`, the very function the live query uses), `feat` /
`feat_prev` = the mean lm_head input over the 7 action positions when the demo's own action
tokens are teacher-forced (this step / the previous one), and the instruction as the task
partition.

Sources (`heisd_ros.pipeline.sources`; docs/your_data.md walks through them): LIBERO-layout HDF5
files (`--demos`), rosbag2 recordings (`--bags`: every directory holding a metadata.yaml below it;
by default on the node's topics, as `heisd-libero gen-demos` exports them; `--map` names the topics of
other recordings) and LeRobot datasets (`--lerobot`, with `--map` naming its cameras and pose).
Give one source per set of episodes: the same episode from two would be stored twice.

Before anything is embedded, every episode's actions are read and checked against the action
convention (7-D deltas + gripper, -1 open; `heisd_ros.pipeline.action_convention`) and the
model's action statistics; a source that does not fit is refused with the dimensions and ranges
that do not, and the flags that declare its convention.

Idempotent (point id = hash of dataset/episode/step) and resumable: `<out>/build_db_manifest.json`
records the model and the episodes already stored, so a killed run continues where it stopped;
a different model re-embeds everything; `--fresh` deletes the database first. Ends with
`optimize()` (Edge indexes only on request) and a Top-K latency measurement (task-filtered, on
stored queries); the report goes to `<out>/build_db_report.json`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from heisd_ros.core.errors import ConfigError, DatabaseError
from heisd_ros.core.files import read_json
from heisd_ros.models.spec import ModelSpec
from heisd_ros.pipeline.action_convention import DemoDataError
from heisd_ros.pipeline.episodes import VIEWS
from heisd_ros.pipeline.outputs import git_revision, progress_bar, write_json
from heisd_ros.pipeline.sources import EpisodeSources, SourceOptions
from heisd_ros.store.manifest import MANIFEST
from heisd_ros.tools.source_args import add_source_arguments, pop_options

REPORT = "build_db_report.json"


@dataclass(frozen=True)
class BuildDbConfig:
    """What `heisd build-db` builds, from which sources."""

    model: str = "artifacts/mini_vla"
    demos: str = ""
    bags: str = ""
    lerobot: str = ""
    out: str = "artifacts/mini_db"
    dataset: str = ""
    """Dataset name in point ids ('' = the HDF5 'suite' attribute; '<bags dir>_bags' for bags; the
    LeRobot directory's name)."""
    collection: str = "heisd_demos"
    tasks: tuple[int, ...] | None = None
    """HDF5 or LeRobot task indices to store (None = all)."""
    source_options: SourceOptions = field(default_factory=SourceOptions)
    """How bags and LeRobot datasets are read (`--map`, the action convention, ...)."""
    fresh: bool = False
    train_split_only: bool = False
    """Leave out the episodes the model held out in training (its train_log.json), so open-loop
    benchmarks on those episodes (`heisd bench --demos`) cannot retrieve their own steps."""
    latency_queries: int = 200
    top_k: int = 5
    batch_size: int = 64
    threads: int = 1
    seed: int = 0
    dtype: str = "float32"
    """Model dtype for the embeddings: build with the dtype the policy runs in, since verify-skip
    compares live features with the stored ones at similarities closer to 1 than a bf16 feature of
    the same input is to its float32 one."""
    unnorm_key: str = ""
    """The dataset whose action statistics tokenise the demonstrations ('' = the model's only or
    default one): the policy's `decoder.unnorm_key`."""
    center_crop: bool = False
    """OpenVLA's 90 % centre crop of every frame, as the policy will run; recorded in the manifest."""
    query_views: int = 0
    """Leading views (agentview, wrist) the `obs` query pools; 0 = both. Recorded in the manifest,
    where a policy with `retrieval.query_views: 0` picks it up; 1 spares every retrieval step
    the wrist view's backbone pass."""
    progress: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.query_views <= len(VIEWS):
            raise ConfigError(f"query_views must be in [0, {len(VIEWS)}] (0 = all), got {self.query_views}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        EpisodeSources.of(self)  # at least one source, and options that fit it (ConfigError)
        if self.latency_queries < 0 or self.top_k < 1 or self.batch_size < 1 or self.threads < 1:
            raise ConfigError("latency_queries >= 0, top_k, batch_size and threads >= 1")

    @property
    def model_spec(self) -> ModelSpec:
        """How the model is loaded; recorded in the manifest, where the node checks it."""
        return ModelSpec(self.model, self.dtype, "cpu", self.unnorm_key, self.center_crop)


def search_latency(store, n_queries: int, top_k: int, seed: int) -> dict:
    """Top-k task-filtered query latency (ms) over `n_queries` stored obs vectors as queries."""
    if n_queries == 0:
        return {}
    n = store.count()
    rng = np.random.default_rng(seed)
    wanted = set(rng.choice(n, min(n_queries, n), replace=False).tolist())
    points = [p for i, p in enumerate(store.scroll()) if i in wanted]
    rng.shuffle(points)
    for p in points[:5]:  # warm-up
        store.search(p.obs, p.task, top_k)
    ms, self_hit = [], []
    for p in points:
        t = time.perf_counter()
        hits = store.search(p.obs, p.task, top_k)
        ms.append((time.perf_counter() - t) * 1e3)
        self_hit.append(bool(hits) and hits[0].episode == p.episode and hits[0].step == p.step)
    return {"queries": len(ms), "top_k": top_k, "median_ms": float(np.median(ms)), "p95_ms": float(np.percentile(ms, 95)),
            "mean_ms": float(np.mean(ms)), "self_is_top1": float(np.mean(self_hit))}


def run(cfg: BuildDbConfig) -> dict:
    """Store every missing episode of the sources, optimise, measure search latency; the build report."""
    from heisd_ros.core.config import StoreConfig
    from heisd_ros.models.loader import load_model
    from heisd_ros.pipeline.features import model_digest
    from heisd_ros.store.factory import make_store

    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    out = Path(cfg.out)
    if cfg.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    vla = load_model(cfg.model_spec).vla
    digest = model_digest(cfg.model)
    query_views = cfg.query_views or len(VIEWS)
    manifest = _current_manifest(out / MANIFEST, cfg, digest, query_views)
    refs, held_out = _episode_refs(cfg)
    action_check = EpisodeSources.of(cfg).check(refs, vla.stats())
    obs_dim = vla.query_dim * query_views
    store = make_store(StoreConfig(backend="edge", path=str(out), collection=cfg.collection),
                       obs_dim=obs_dim, feat_dim=vla.hidden_size, create=True)
    try:
        t_embed = time.perf_counter()
        written, skipped = _store_episodes(store, vla, refs, manifest, out / MANIFEST, cfg, query_views)
        embed_s = time.perf_counter() - t_embed
        t_opt = time.perf_counter()
        store.optimize()
        optimize_s = time.perf_counter() - t_opt
        tasks = {task: store.count(task) for task in store.tasks()}
        latency = search_latency(store, cfg.latency_queries, cfg.top_k, cfg.seed)
        total = store.count()
    finally:
        store.close()
    disk_mb, apparent_mb = _disk_usage_mb(out)
    report = {
        "command": "heisd build-db",
        "config": dataclasses.asdict(cfg),
        "git_revision": git_revision(),
        "threads": cfg.threads,
        "model_digest": digest, **cfg.model_spec.recorded(), "query_views": query_views,
        "action_check": action_check,
        "episodes": len(refs), "held_out_left_out": len(held_out) if cfg.train_split_only else 0,
        "episodes_skipped_as_done": skipped, "points_written": written,
        "points": total, "tasks": tasks, "obs_dim": obs_dim, "feat_dim": vla.hidden_size,
        "disk_mb": disk_mb,
        "apparent_mb": apparent_mb,
        "search_latency": latency,
        "seconds": {"embed": embed_s, "optimize": optimize_s, "total": time.perf_counter() - t0},
    }
    write_json(out / REPORT, report)
    return report


def _current_manifest(path: Path, cfg: BuildDbConfig, digest: str, query_views: int) -> dict:
    """The manifest at `path` if its vectors fit this build, else a fresh one (nothing done)."""
    try:
        manifest = read_json(path, DatabaseError) if path.is_file() else {}
    except (OSError, json.JSONDecodeError) as err:
        raise DatabaseError(f"build manifest {path} unreadable ({err}); remove it to embed every episode again") from err
    recorded = cfg.model_spec.recorded()
    built = {"dtype": manifest.get("dtype", "float32"), "unnorm_key": manifest.get("unnorm_key", ""),
             "center_crop": manifest.get("center_crop", False)}  # fmt: skip
    if manifest.get("model_digest") != digest or built != recorded or manifest.get("query_views", len(VIEWS)) != query_views:
        # another model, the same one loaded another way, or other views: every stored vector is stale
        manifest = {"model": str(cfg.model), "model_digest": digest, **recorded, "query_views": query_views, "done": {}}
    return manifest


def _episode_refs(cfg: BuildDbConfig) -> tuple[list, set[str]]:
    """(the episodes to store, the model's held-out sources left out with --train-split-only)."""
    from heisd_ros.pipeline.features import held_out_sources

    refs = EpisodeSources.of(cfg).refs()
    held_out: set[str] = set()
    if cfg.train_split_only:
        held_out = held_out_sources(cfg.model)
        if not held_out:
            raise ConfigError(f"--train-split-only needs {Path(cfg.model) / 'train_log.json'} with held-out "
                              "episodes (written by heisd-libero train-vla)")
        refs = [r for r in refs if r.kind != "hdf5" or r.source not in held_out]
    return refs, held_out


def _store_episodes(store, vla, refs: list, manifest: dict, manifest_file: Path, cfg: BuildDbConfig,
                    query_views: int) -> tuple[int, int]:
    """Embed and upsert every episode the manifest does not list as done, recording each in it as
    it is stored (so a killed run resumes); returns (points written, episodes skipped)."""
    from heisd_ros.pipeline.episodes import load_episode
    from heisd_ros.pipeline.features import episode_points

    stats = vla.stats()
    written = skipped = 0
    bar = progress_bar(len(refs), "build-db", cfg.progress)
    for ref in refs:
        key = f"{ref.dataset}/{ref.episode}"
        if key in manifest["done"]:
            skipped += 1
        else:
            points = episode_points(vla, stats, load_episode(ref), cfg.batch_size, query_views)
            store.upsert(points)
            manifest["done"][key] = len(points)
            write_json(manifest_file, manifest)
            written += len(points)
        bar.update(1)
        bar.set_postfix(points=store.count())
    bar.close()
    return written, skipped


def _disk_usage_mb(directory: Path) -> tuple[float, float]:
    """(allocated, apparent) size of the files under `directory` in MiB; Edge files are sparse."""
    files = [p.stat() for p in directory.rglob("*") if p.is_file()]
    return sum(st.st_blocks * 512 for st in files) / 2**20, sum(st.st_size for st in files) / 2**20


def build_parser() -> argparse.ArgumentParser:
    d = BuildDbConfig(demos="x")
    p = argparse.ArgumentParser(prog="heisd build-db", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=d.model, help="VLA directory (heisd-libero train-vla --out, or an OpenVLA checkpoint)")
    p.add_argument("--out", default=d.out, help="database directory (embedded Qdrant Edge)")
    p.add_argument("--collection", default=d.collection)
    p.add_argument("--fresh", action="store_true", help="delete an existing database at --out first")
    p.add_argument("--train-split-only", action="store_true",
                   help="leave out the episodes the model held out in training (open-loop benchmarks on them)")
    p.add_argument("--latency-queries", type=int, default=d.latency_queries)
    p.add_argument("--top-k", type=int, default=d.top_k)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--dtype", default=d.dtype, choices=("float32", "bfloat16"),
                   help="model dtype for the embeddings (the dtype the policy will run in)")
    p.add_argument("--unnorm-key", default="", help="dataset of the model's action statistics (default: its only one)")
    p.add_argument("--center-crop", action="store_true",
                   help="OpenVLA checkpoints: 90 %% centre crop of every frame, as the policy will run")
    p.add_argument("--query-views", type=int, default=d.query_views,
                   help="leading views (agentview, wrist) the retrieval query pools; 0 = all (default)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    add_source_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    from heisd_ros.tools.args import parse_tasks

    args = vars(build_parser().parse_args(argv))
    args["tasks"] = parse_tasks(args["tasks"])
    options = pop_options(args)
    try:
        cfg = BuildDbConfig(**args, source_options=options)
        r = run(cfg)
    except (ConfigError, DemoDataError) as err:
        print(f"heisd build-db: {err}", file=sys.stderr)
        return 2
    lat = r["search_latency"]
    lat_s = f", Top-{lat['top_k']} median {lat['median_ms']:.2f} ms / p95 {lat['p95_ms']:.2f} ms" if lat else ""
    print(f"build-db: {r['points']} points, {len(r['tasks'])} tasks, {r['disk_mb']:.0f} MB{lat_s}, "
          f"{r['seconds']['total']:.0f} s -> {cfg.out}")
    return 0
