"""Latency of the embedded demonstration stores: Qdrant Edge vs qdrant-client local mode.

Usage:
    python benchmarks/store_latency.py [--points 2000 20000] [--obs-dim 2560] [--feat-dim 256]
        [--tasks 10] [--queries 200] [--top-k 5] [--backends edge local local-path] [--seed 0]
        [--hnsw] [--feat-on-disk] [--out result.json]

For each backend and database size: ingest time (upserts of 256 points), disk bytes per point (over
an empty store; persisted backends), then `--queries` Top-k
task-filtered searches through the DemoStore API (validation and Hit conversion included), each
query a stored obs vector plus noise, searched in that point's task. Vectors are clustered Gaussians
(one cluster per episode), L2-normalised. `local` is qdrant-client in memory, `local-path` the same
persisted under a directory (slow to ingest: pickles in sqlite). `--hnsw` also measures Edge with the
per-task HNSW graph (exact_search_below=0, optimize()) and its recall against exact search.
Prints and optionally writes a JSON record: config, seed, git revision, figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from heisd_ros.core.config import StoreConfig, to_dict
from heisd_ros.store import DemoPoint, make_store
from heisd_ros.pipeline.outputs import git_revision

STEPS_PER_EPISODE = 100


def make_points(n: int, n_tasks: int, obs_dim: int, feat_dim: int, rng: np.random.Generator) -> list[DemoPoint]:
    n_episodes = max(1, n // STEPS_PER_EPISODE)
    centres = rng.normal(size=(n_episodes, obs_dim)).astype(np.float32)
    points = []
    for i in range(n):
        ep = i // STEPS_PER_EPISODE % n_episodes
        obs = centres[ep] + 0.5 * rng.normal(size=obs_dim).astype(np.float32)
        points.append(
            DemoPoint(
                dataset="bench",
                task=f"task_{ep % n_tasks}",
                instruction=f"do task {ep % n_tasks}",
                episode=i // STEPS_PER_EPISODE,
                step=i % STEPS_PER_EPISODE,
                obs=obs / np.linalg.norm(obs),
                feat=rng.normal(size=feat_dim).astype(np.float32),
                feat_prev=rng.normal(size=feat_dim).astype(np.float32),
                action=rng.uniform(-1, 1, size=7),
                action_tokens=tuple(int(t) for t in rng.integers(31744, 32000, size=7)),
                ee_pos=rng.uniform(-0.5, 0.5, size=3),
                next_actions=rng.uniform(-1, 1, size=(3, 7)),
            )
        )
    return points


def store_config(backend: str, root: Path, **over: object) -> StoreConfig:
    if backend == "edge":
        return StoreConfig(backend="edge", path=str(root / "edge"), **over)
    if backend == "local-path":
        return StoreConfig(backend="local", path=str(root / "local"), **over)
    return StoreConfig(backend="local", **over)


def allocated_bytes(root: Path) -> int:
    """Bytes the files under root occupy on disk (sparse files count what is written, as `du`)."""
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def empty_store_bytes(backend: str, obs_dim: int, feat_dim: int) -> int:
    with tempfile.TemporaryDirectory(prefix="heisd_store_bench_") as tmp:
        make_store(store_config(backend, Path(tmp)), obs_dim, feat_dim, create=True).close()
        return allocated_bytes(Path(tmp))


def time_queries(store, queries, tasks, top_k) -> tuple[dict, list[list[tuple[int, int]]]]:
    store.search(queries[0], tasks[0], top_k)  # warm-up
    lat, results = [], []
    for q, task in zip(queries, tasks):
        t0 = time.perf_counter()
        hits = store.search(q, task, top_k)
        lat.append(time.perf_counter() - t0)
        results.append([(h.episode, h.step) for h in hits])
    t0 = time.perf_counter()
    for task in tasks:
        store.has_task(task)
    has_task_us = 1e6 * (time.perf_counter() - t0) / len(tasks)
    ms = 1e3 * np.asarray(lat)
    figures = {
        "query_median_ms": round(float(np.median(ms)), 3),
        "query_p95_ms": round(float(np.percentile(ms, 95)), 3),
        "has_task_us": round(has_task_us, 2),
    }
    return figures, results


def run_one(backend: str, points: list[DemoPoint], args, rng: np.random.Generator, hnsw: bool = False) -> dict:
    picks = rng.integers(len(points), size=args.queries)
    queries = [points[i].obs + 0.02 * rng.normal(size=args.obs_dim).astype(np.float32) for i in picks]
    tasks = [points[i].task for i in picks]
    with tempfile.TemporaryDirectory(prefix="heisd_store_bench_") as tmp:
        over = {"exact_search_below": 0} if hnsw else {}
        over["feat_on_disk"] = args.feat_on_disk
        cfg = store_config(backend, Path(tmp), **over)
        store = make_store(cfg, args.obs_dim, args.feat_dim, create=True)
        t0 = time.perf_counter()
        store.upsert(points, batch_size=256)
        ingest_s = time.perf_counter() - t0
        record = {"backend": backend + ("+hnsw" if hnsw else ""), "points": len(points), "ingest_s": round(ingest_s, 2)}
        if hnsw:
            t0 = time.perf_counter()
            store.optimize()
            record["index_build_s"] = round(time.perf_counter() - t0, 2)
        figures, results = time_queries(store, queries, tasks, args.top_k)
        record.update(figures)
        record["partition_points"] = store.count(tasks[0])
        store.close()
        if cfg.path:  # on-disk cost per point, over an empty store of the same dimensions
            used = allocated_bytes(Path(tmp)) - empty_store_bytes(backend, args.obs_dim, args.feat_dim)
            record["disk_bytes_per_point"] = round(used / len(points), 1)
            record["raw_vector_bytes_per_point"] = 4 * (args.obs_dim + 2 * args.feat_dim)
        if cfg.path:
            t0 = time.perf_counter()
            make_store(cfg).close()
            record["reopen_s"] = round(time.perf_counter() - t0, 3)
    record["_results"] = results
    return record


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, nargs="+", default=[2000, 20000])
    parser.add_argument("--obs-dim", type=int, default=2560)
    parser.add_argument("--feat-dim", type=int, default=256)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--backends", nargs="+", default=["edge", "local"], choices=["edge", "local", "local-path"])
    parser.add_argument("--hnsw", action="store_true", help="also measure Edge with per-task HNSW graphs")
    parser.add_argument("--feat-on-disk", action="store_true", help="feat/feat_prev memory-mapped (StoreConfig.feat_on_disk)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=str, default="")
    args = parser.parse_args(argv)

    runs = []
    for n in args.points:
        points = make_points(n, args.tasks, args.obs_dim, args.feat_dim, np.random.default_rng(args.seed))
        variants = [(b, False) for b in args.backends] + ([("edge", True)] if args.hnsw else [])
        exact_results = None
        for backend, hnsw in variants:
            record = run_one(backend, points, args, np.random.default_rng(args.seed + 1), hnsw)
            results = record.pop("_results")
            if exact_results is None:
                exact_results = results
            else:  # same queries, same data: agreement with the first (exact) backend's top-k
                overlap = [len(set(a) & set(b)) / max(1, len(a)) for a, b in zip(exact_results, results)]
                record["agreement_with_first"] = round(float(np.mean(overlap)), 4)
            print(json.dumps(record), file=sys.stderr)
            runs.append(record)
    result = {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "store_defaults": to_dict(StoreConfig(path="x")),
        "seed": args.seed,
        "git_revision": git_revision(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "runs": runs,
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
