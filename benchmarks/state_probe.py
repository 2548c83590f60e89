"""Does the policy read its end-effector position? (NOTES 35)

For demo steps of each task, decode the VLA's greedy action with the state token as recorded and
with the position moved by +-OFFSET along x, y and z (same image, same everything else), and
compare the change of that axis' action with what the expert would command: its translation
action is pos_gain * (target - ee) / POS_UNIT_M (30 per metre), so moving the hand +2 cm should
move the action by -0.6 where the expert is not saturated. `gain` = measured change / expert
change over the steps whose recorded label is unsaturated (|a| < 0.5 on that axis): 1 reads
the position like the expert, 0 ignores it.

    .venv/bin/python benchmarks/state_probe.py --model artifacts/mini_vla_dwu \
        --demos artifacts/demos_db/libero_object [--tasks 0-9] [--steps-per-task 24] [--offset-m 0.02]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import numpy as np
import torch

from heisd_ros.pipeline.features import FeatureCache, collect_refs, episode_examples
from heisd_ros.models.loader import load_vla
from heisd_ros.pipeline.training import greedy_decode
from heisd_ros.sim.expert import POS_UNIT_M, ExpertConfig
from heisd_ros.tools.args import parse_tasks


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--demos", required=True)
    p.add_argument("--cache-dir", default="artifacts/mini_libero_features")
    p.add_argument("--tasks", default="0-9")
    p.add_argument("--steps-per-task", type=int, default=24)
    p.add_argument("--offset-m", type=float, default=0.02)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    vla = load_vla(args.model)
    if not vla.cfg.proprio_dim:
        sys.exit(f"{args.model} reads no end-effector position (no --proprio)")
    stats = vla.norm_stats[vla.cfg.unnorm_key]
    cache = FeatureCache(args.cache_dir, vla)
    rng = np.random.default_rng(0)
    refs = collect_refs(demos=args.demos, tasks=parse_tasks(args.tasks))
    first_demo = {}  # one demo per task: the probe moves the state, the image stays the demo's
    for r in refs:
        first_demo.setdefault(r.task, r)
    expert_slope = -ExpertConfig().pos_gain / POS_UNIT_M  # action per metre of hand offset
    moved = {axis: [] for axis in "xyz"}
    for ref in first_demo.values():
        examples = episode_examples(vla, stats, ref, cache)
        picks = sorted(rng.choice(len(examples), min(args.steps_per_task, len(examples)), replace=False))
        for t in picks:
            ex = examples[t]
            label = stats.unnormalise(vla.action_tokenizer.decode(ex.tokens[None]))[0]
            variants = [ex]
            for axis in range(3):
                for sign in (-1.0, 1.0):
                    s = np.array(ex.state, dtype=np.float64)
                    s[axis] += sign * args.offset_m
                    variants.append(dataclasses.replace(ex, state=s))
            tokens, _ = greedy_decode(vla, variants, batch_size=len(variants), use_cache=True)
            actions = stats.unnormalise(vla.action_tokenizer.decode(tokens))
            for axis, name in enumerate("xyz"):
                if abs(label[axis]) >= 0.5:
                    continue
                lo, hi = actions[1 + 2 * axis, axis], actions[2 + 2 * axis, axis]
                moved[name].append((hi - lo) / (2 * args.offset_m * expert_slope))
    out = {"model": args.model, "offset_m": args.offset_m, "expert_action_per_m": expert_slope,
           "axes": {k: {"steps": len(v), "gain": float(np.mean(v)) if v else None,
                        "share_moved": float(np.mean(np.abs(v) > 0.05)) if v else None} for k, v in moved.items()}}
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
