"""A retrieval query's wall time against the size of Qdrant Edge's search pool, on an idle machine
and with every core busy (as in a closed-loop evaluation, where each core runs a simulator and a
policy, or on a robot computer that runs other nodes).

Usage:
    python benchmarks/search_pool.py --db artifacts/eval_object/db [--queries 300] [--pool 20] [--top-k 5]
        [--threads 0,1] [--evict-mb 64] [--json out.json]

Each pool size opens its own copy of the database (an Edge shard is one process's at a time, and
the pool size is stored with it); the queries are the database's own observation vectors of one
task, the evaluation's Top-`pool` query re-ranked to the `top_k` nearest hands (`search_near`).
The sizes take turns query by query, so background load falls on all alike, and must return the
same hits (checked). Phases: idle; caches evicted (`--evict-mb` of memory streamed before every
query); every core busy (one busy process per CPU); both. Reported per size and phase: mean, median, p95 wall ms, and the calling thread's CPU ms (a query handed to pool threads
costs the caller wall time but not CPU time).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from heisd_ros.core.config import StoreConfig
from heisd_ros.pipeline.outputs import git_revision
from heisd_ros.store.factory import make_store


def _busy(stop) -> None:
    while not stop.is_set():
        pass


def _phase(stores: dict[int, object], task: str, queries: list[np.ndarray], positions: list[np.ndarray],
           pool: int, top_k: int, evict: np.ndarray | None = None) -> dict[str, dict[str, float]]:
    wall = {n: [] for n in stores}
    cpu = {n: [] for n in stores}
    for q, pos in zip(queries, positions):
        hits = {}
        for n, store in stores.items():
            if evict is not None:
                evict += 1.0  # stream through memory, as a simulator or camera driver does between steps
            t0, c0 = time.perf_counter(), time.thread_time()
            found = store.search_near(q, task, top_k, pos, pool)
            wall[n].append((time.perf_counter() - t0) * 1e3)
            cpu[n].append((time.thread_time() - c0) * 1e3)
            hits[n] = [(h.score, h.episode, h.step) for h in found]
        if len({json.dumps(h) for h in hits.values()}) != 1:
            raise SystemExit("pool sizes returned different hits")
    return {str(n): {"mean_ms": float(np.mean(wall[n])), "median_ms": float(np.median(wall[n])),
                     "p95_ms": float(np.percentile(wall[n], 95)), "thread_cpu_ms": float(np.mean(cpu[n]))}
            for n in stores}


def run(args: argparse.Namespace) -> dict:
    sizes = [int(s) for s in args.threads.split(",")]
    with tempfile.TemporaryDirectory(prefix="search_pool_") as tmp:
        stores = {}
        for n in sizes:
            copy = Path(tmp) / f"threads_{n}"
            shutil.copytree(args.db, copy)
            stores[n] = make_store(StoreConfig(backend="edge", path=str(copy), search_threads=n))
        store = stores[sizes[0]]
        task = store.tasks()[0]
        points = [p for _, p in zip(range(args.queries), store.scroll(task))]
        queries = [np.asarray(p.vectors()["obs"], dtype=np.float32) for p in points]
        positions = [np.asarray(p.payload()["ee_pos"], dtype=np.float64) for p in points]
        _phase(stores, task, queries[:20], positions[:20], args.pool, args.top_k)  # warm-up
        figures = {"idle": _phase(stores, task, queries, positions, args.pool, args.top_k)}
        evict = np.ones(args.evict_mb * 2**20 // 8)
        figures["caches_evicted"] = _phase(stores, task, queries, positions, args.pool, args.top_k, evict)
        stop = mp.Event()
        burners = [mp.Process(target=_busy, args=(stop,), daemon=True) for _ in range(os.cpu_count() or 1)]
        for b in burners:
            b.start()
        try:
            time.sleep(0.5)
            figures["all_cores_busy"] = _phase(stores, task, queries, positions, args.pool, args.top_k)
            figures["busy_and_evicted"] = _phase(stores, task, queries, positions, args.pool, args.top_k, evict)
        finally:
            stop.set()
            for b in burners:
                b.join()
        for s in stores.values():
            s.close()
    return {"config": {"db": args.db, "task": task, "queries": len(queries), "pool": args.pool, "top_k": args.top_k,
                       "search_threads": sizes, "cpus": os.cpu_count(), "evict_mb": args.evict_mb},
            "git_rev": git_revision(), "figures": figures}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", required=True)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--pool", type=int, default=20)
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--threads", default="0,1", help="search pool sizes to compare (0 = Edge's default)")
    p.add_argument("--evict-mb", type=int, default=64, help="memory streamed before each query in the evicted phases")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    out = run(args)
    for phase, rows in out["figures"].items():
        for n, f in rows.items():
            print(f"{phase:15s} search_threads {n}: mean {f['mean_ms']:.2f} ms, median {f['median_ms']:.2f}, "
                  f"p95 {f['p95_ms']:.2f}, caller CPU {f['thread_cpu_ms']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
