"""`heisd train-prior`: fit a proprioceptive action prior and write a VLA directory that carries it.

Usage:
    heisd train-prior --model models/mini_libero/vla --demos artifacts/demos_db/libero_object \
        --out artifacts/mini_vla_prior [--tasks 0-9] [--steps 10000] [--weight 1.0] [--seed 0] [--threads 2]

Per task, a two-layer MLP learns each action dimension's bin (the VLA's own q01/q99 norm stats
and 256 action tokens) from the end-effector position and the finger gap of every step of the
task's demonstrations (`models/state_prior.py` says why). `--out` receives a copy of the VLA
directory plus `state_prior.json` / `state_prior.safetensors` and `state_prior_log.json`
(command, seed, git revision, per-task fit). Every command that loads `--out` as a policy
(`load_policy_model`) then decodes with the prior; the drafter and database built for `--model`
stay valid (the prior changes no hidden state).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from heisd_ros.core.errors import ConfigError

VLA_FILES = ("config.json", "dataset_statistics.json", "model.safetensors", "train_log.json",
             "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


def prior_training_data(vla, refs) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    """task key -> [(ee position + finger gap [T, 4], action columns [T, 7])] of every episode."""
    from heisd_ros.pipeline.features import episode_tokens
    from heisd_ros.pipeline.episodes import load_episode
    from heisd_ros.models.state_prior import task_key

    first = vla.action_tokenizer.first_token_id
    data: dict[str, list] = {}
    for ref in refs:
        ep = load_episode(ref, with_images=False)
        if ep.gripper_qpos is None:
            raise ConfigError(f"{ref.source}: the state prior needs finger positions (HDF5 obs/gripper_states)")
        gaps = np.array([ep.finger_gap(t) for t in range(ep.length)])
        state = np.hstack([ep.ee_pos, gaps[:, None]])
        columns = episode_tokens(vla, vla.stats(), ep.actions) - first
        data.setdefault(task_key(ep.instruction), []).append((state, columns))
    if not data:
        raise ConfigError("no demonstrations found")
    return data


def run(args: argparse.Namespace) -> dict:
    from heisd_ros.pipeline.outputs import progress_bar, write_json
    from heisd_ros.pipeline.episodes import scan_hdf5
    from heisd_ros.models.loader import load_vla, require_heisd_vla
    from heisd_ros.models.state_prior import StatePriorConfig, fit_state_prior
    from heisd_ros.pipeline.outputs import git_revision
    from heisd_ros.tools.args import parse_tasks

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    src, out = Path(args.model), Path(args.out)
    if src.resolve() == out.resolve():
        raise ConfigError("--out must differ from --model (the prior is written into a copy)")
    require_heisd_vla(src, "heisd train-prior")
    vla = load_vla(src)
    refs = scan_hdf5(args.demos, parse_tasks(args.tasks))
    data = prior_training_data(vla, refs)
    cfg = StatePriorConfig(hidden=args.hidden, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                           seed=args.seed, weight=args.weight)
    bar = progress_bar(len(data), "train-prior (tasks)", args.progress)
    prior, report = fit_state_prior(data, cfg, progress=bar.update)
    bar.close()
    out.mkdir(parents=True, exist_ok=True)
    for name in VLA_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
    prior.save(out)
    log = {"command": "heisd train-prior " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else []),
           "model": str(src), "demos": args.demos, "episodes": len(refs), "config": dataclasses.asdict(cfg),
           "seed": args.seed, "git_revision": git_revision(), "fit": report,
           "seconds": round(time.perf_counter() - t0, 1)}
    write_json(out / "state_prior_log.json", log)
    return log


def build_parser() -> argparse.ArgumentParser:
    from heisd_ros.models.state_prior import StatePriorConfig

    d = StatePriorConfig()
    p = argparse.ArgumentParser(prog="heisd train-prior", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="VLA directory (heisd-libero train-vla --out)")
    p.add_argument("--demos", required=True, help="directory of LIBERO-layout *.hdf5 files (or one file)")
    p.add_argument("--out", required=True, help="new VLA directory: a copy of --model with the prior")
    p.add_argument("--tasks", default=None, help="HDF5 task indices, e.g. 0-9 (default: every file)")
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--steps", type=int, default=d.steps, help="optimiser steps per task")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--weight", type=float, default=d.weight, help="scale of the prior's log-probabilities")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1 or args.hidden < 1 or args.batch_size < 1 or args.weight < 0:
        raise ConfigError("--steps, --hidden and --batch-size must be >= 1, --weight >= 0")
    log = run(args)
    acc = np.mean([np.mean(f["train_accuracy_per_dim"]) for f in log["fit"].values()])
    loss = np.mean([f["final_loss"] for f in log["fit"].values()])
    print(f"train-prior: {len(log['fit'])} tasks, {log['episodes']} episodes, mean final loss {loss:.3f}, "
          f"train accuracy {acc:.3f}, {log['seconds']:.0f} s -> {args.out}")
    return 0
