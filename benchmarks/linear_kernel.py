"""Decode steps per LLM linear kernel (`decoder.llm_linear`): torch's own CPU linear against oneDNN
with weights packed once at load, on recorded demonstration steps.

Usage:
    python benchmarks/linear_kernel.py --model models/mini_libero/vla --drafter models/mini_libero/drafter \
        --demos artifacts/eval_object/demos [--tasks 0-3] [--steps 40] [--methods ar,drafter] \
        [--threads 1] [--json out.json]

The model is loaded once per kernel; for each method the two decoders take turns step by step on
the same observations, so background load falls on both alike (the first 5 steps warm up and are
not counted). Reported per method and kernel: mean, median and p95 step ms, mean ms of the LLM
forwards by rows (one-row decodes, multi-row verifications and prefills), and whether every step's
tokens equal across the kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from heisd_ros.core.config import DecoderConfig
from heisd_ros.pipeline.outputs import git_revision
from heisd_ros.policy import PolicyPaths, build_decoders
from heisd_ros.tools.bench import demo_observations

KERNELS = ("torch", "onednn")
WARMUP = 5


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--drafter", default="")
    p.add_argument("--demos", required=True)
    p.add_argument("--tasks", default="0-3")
    p.add_argument("--episodes", type=int, default=1)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--methods", default="ar,drafter")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    observations = [o for ep in demo_observations(a.demos, a.model, a.tasks, a.episodes, a.steps) for o in ep]
    results: dict = {}
    for method in a.methods.split(","):
        decoders = {}
        for kernel in KERNELS:
            cfg = DecoderConfig(method=method, llm_linear=kernel)
            # a model of its own per kernel: the packed one replaces the LLM's linear layers
            decoders[kernel] = build_decoders(PolicyPaths(a.model, a.drafter), {kernel: cfg})[kernel]
            decoders[kernel].prepare_vision()
        steps = {k: [] for k in KERNELS}
        forwards: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in KERNELS}
        tokens = {k: [] for k in KERNELS}
        for i, obs in enumerate(observations):
            for kernel, decoder in decoders.items():
                t0 = time.perf_counter()
                _, stats = decoder.step(obs)
                ms = (time.perf_counter() - t0) * 1e3
                tokens[kernel].append(list(stats.tokens))
                if i >= WARMUP:
                    steps[kernel].append(ms)
                    for i_fwd, fwd_ms in enumerate(stats.forward_ms):
                        # a step's first forward is its prefill; after it, only ar decodes one row
                        one_row = i_fwd > 0 and stats.mode == "ar"
                        forwards[kernel]["one_row" if one_row else "rows"].append(fwd_ms)
        results[method] = {
            kernel: {"steps": len(steps[kernel]), "mean_step_ms": float(np.mean(steps[kernel])),
                     "median_step_ms": float(np.median(steps[kernel])),
                     "p95_step_ms": float(np.percentile(steps[kernel], 95)),
                     **{f"mean_forward_ms_{rows}": float(np.mean(v)) for rows, v in forwards[kernel].items()},
                     **{f"forwards_{rows}": len(v) for rows, v in forwards[kernel].items()}}
            for kernel in KERNELS}
        results[method]["tokens_equal"] = tokens["torch"] == tokens["onednn"]
        t, o = results[method]["torch"], results[method]["onednn"]
        print(f"{method}: torch {t['mean_step_ms']:.2f} ms, onednn {o['mean_step_ms']:.2f} ms a step "
              f"(p95 {t['p95_step_ms']:.1f} / {o['p95_step_ms']:.1f}); multi-row forward "
              f"{t.get('mean_forward_ms_rows', float('nan')):.2f} / {o.get('mean_forward_ms_rows', float('nan')):.2f} ms, "
              f"one-row {t.get('mean_forward_ms_one_row', float('nan')):.2f} / {o.get('mean_forward_ms_one_row', float('nan')):.2f} ms; "
              f"tokens equal: {results[method]['tokens_equal']}")
    report = {"command": "python benchmarks/linear_kernel.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "git_rev": git_revision(), "threads": a.threads, "observations": len(observations), "methods": results}
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(r["tokens_equal"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
