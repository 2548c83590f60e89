"""The vision backbone's time per runtime (`decoder.vision_runtime`): eager, the frozen TorchScript
trace, ONNX Runtime and OpenVINO, on a model's own input shape, warm and with caches evicted between calls.

Usage:
    python benchmarks/vision_runtime.py --model models/mini_libero/vla [--views 1,2] [--calls 200]
        [--threads 1] [--evict-mb 64] [--json out.json]

Each runtime is a ShapeTracedModule as the decoder holds it (its graph built and checked on the
first call, outside the timing). The runtimes take turns call by call on the same pixels, so
background load falls on all alike. Warm: calls back to back. Evicted: `--evict-mb` of memory
streamed before every call, as a simulator or camera driver does between control steps.
Reported per views and runtime: mean, median, p95 ms, and the largest difference from eager.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from heisd_ros.core.traced import RUNTIMES, ShapeTracedModule
from heisd_ros.models.loader import load_vla
from heisd_ros.pipeline.outputs import git_revision


def _timed(backbones: dict[str, ShapeTracedModule], px: torch.Tensor, calls: int,
           evict: np.ndarray | None) -> dict[str, dict[str, float]]:
    times: dict[str, list[float]] = {name: [] for name in backbones}
    for _ in range(calls):
        for name, backbone in backbones.items():
            if evict is not None:
                evict += 1.0
            t0 = time.perf_counter()
            backbone(px)
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: {"mean_ms": float(np.mean(t)), "median_ms": float(np.median(t)), "p95_ms": float(np.percentile(t, 95))}
            for name, t in times.items()}


def run(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    vla = load_vla(args.model)
    rng = np.random.default_rng(0)
    size = vla.cfg.image_size
    evict = np.ones(args.evict_mb * 2**20 // 8)
    figures = {}
    with torch.inference_mode():  # as the decoder calls it
        for views in [int(v) for v in args.views.split(",")]:
            images = [rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8) for _ in range(views)]
            px = vla.preprocess(images)
            eager = vla.vision_backbone(px)
            backbones = {name: ShapeTracedModule(vla.vision_backbone, name) for name in RUNTIMES}
            diffs = {name: float((b(px) - eager).abs().max()) for name, b in backbones.items()}
            fallen = [name for name, b in backbones.items() if name != "eager" and b.eager_only]
            if fallen:
                raise SystemExit(f"runtimes fell back to eager: {fallen}")
            _timed(backbones, px, 10, None)
            warm = _timed(backbones, px, args.calls, None)
            evicted = _timed(backbones, px, args.calls, evict)
            figures[f"{views}_views"] = {name: {"warm": warm[name], "caches_evicted": evicted[name],
                                                "max_abs_diff_vs_eager": diffs[name]} for name in backbones}
    return {"config": {"model": args.model, "image_size": size, "views": args.views, "calls": args.calls,
                       "threads": args.threads, "evict_mb": args.evict_mb},
            "git_rev": git_revision(), "figures": figures}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--views", default="1,2")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--evict-mb", type=int, default=64)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    out = run(args)
    for views, rows in out["figures"].items():
        for name, f in rows.items():
            print(f"{views} {name:12s} warm mean {f['warm']['mean_ms']:.2f} ms (p95 {f['warm']['p95_ms']:.2f}), "
                  f"evicted mean {f['caches_evicted']['mean_ms']:.2f} ms (p95 {f['caches_evicted']['p95_ms']:.2f}), "
                  f"max |diff| {f['max_abs_diff_vs_eager']:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
