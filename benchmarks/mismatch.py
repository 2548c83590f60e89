"""Mismatched database: heisd against ar and the drafter when the demonstrations come from another expert.

Usage (repository root; builds the tiny policy on first use, about a minute):
    .venv/bin/python benchmarks/mismatch.py [--tiny-dir artifacts/tiny] [--episodes 4] [--steps 40]
        [--seed 3000] [--expert-seed 2000] [--offset-m 0.03] [--time-warp 1.6] [--noise-m 0.002]
        [--threads 1] [--json FILE]

The tiny policy (heisd_ros.pipeline.tiny_artifacts) learned from expert A: heisd_ros.pipeline.synthetic_demos's
demonstrations, seed 0; its own database holds them (the matching database). Expert B does the
same tasks its own way: its own seed, the whole path shifted by `--offset-m` in a random
horizontal direction per episode, another speed profile along the path (progress t**time_warp: it
starts slowly and ends fast) and `--noise-m` of hand jitter per step. B's demonstrations,
tokenised with the policy's own action statistics, form the mismatched database (built once
under <tiny-dir>/mismatch_db). Both databases are queried on held-out expert-A episodes of
`--seed`, open loop, every row taking its turn on every observation (as `heisd bench`; the row
that goes first rotates step by step), so background load falls on all of them alike.

Rows: ar, drafter, and heisd with the adaptive source choice off and on, on each database.
Per row, the figures every report gives (heisd_ros/pipeline/figures.py): mean, median, p95 and p99
step latency (ms; the first `--warmup` steps of the run left out), speedup against ar as a ratio of
means with its 95 % bootstrap interval over episodes, the median and p95 ratios, accept length;
then LLM forwards per step, the mode mix with each mode's mean step, and why steps went where they
went (StepStats.source_reason).

The source-choice defaults (heisd_ros/core/config.py: SourceChoiceConfig) were chosen on evaluation
seed 4000 (`--seed 4000 --episodes 4`) with this expert B, a milder one (`--offset-m 0.01
--time-warp 1.2 --noise-m 0.001`) and the matching database; never on the default seed 3000.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from heisd_ros.assembly import assemble_decoders
from heisd_ros.core.config import DecoderConfig, SourceChoiceConfig, to_dict
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.core.types import Observation, StepStats
from heisd_ros.pipeline import figures, tiny_artifacts
from heisd_ros.pipeline.outputs import git_revision, write_json
from heisd_ros.pipeline import synthetic_demos as synthetic


EXPERT_B_ARGS = ("expert_seed", "expert_episodes", "steps", "offset_m", "time_warp", "noise_m")
"""The arguments that make expert B's database; a change rebuilds it."""


def expert_b_trajectory(rng: np.random.Generator, n_steps: int, task_index: int, offset_m: float,
                        time_warp: float, noise_m: float) -> np.ndarray:
    """[n_steps, 3] metres: the synthetic expert's path for the task, shifted, re-timed and jittered."""
    path = synthetic.trajectory(rng, n_steps, task_index)
    heading = rng.uniform(0.0, 2.0 * np.pi)
    path = path + offset_m * np.array([np.cos(heading), np.sin(heading), 0.0])
    # Re-time along the path: B covers the same ground with progress t**time_warp.
    u = np.linspace(0.0, 1.0, n_steps)
    warped = np.stack([np.interp(u ** time_warp, u, path[:, k]) for k in range(3)], axis=1)
    return warped + rng.normal(0.0, noise_m, warped.shape)


def expert_b_demos(args: argparse.Namespace, image_size: int):
    """({(instruction, episode): [SyntheticStep]}, {(instruction, episode): raw actions [T, 7]})."""
    rng = np.random.default_rng(args.expert_seed)
    by_episode, actions = {}, {}
    for t, instruction in enumerate(synthetic.TASKS):
        for e in range(args.expert_episodes):
            traj = expert_b_trajectory(rng, args.steps, t, args.offset_m, args.time_warp, args.noise_m)
            episode = t * args.expert_episodes + e
            by_episode[(instruction, episode)] = [
                synthetic.SyntheticStep(synthetic.render(p, t, image_size, rng), p, instruction, episode, s)
                for s, p in enumerate(traj)]
            actions[(instruction, episode)] = tiny_artifacts.synthetic_actions(traj)
    return by_episode, actions


def mismatch_db(vla, args: argparse.Namespace) -> Path:
    """Expert B's database under <tiny-dir>/mismatch_db, rebuilt when its parameters change."""
    path = Path(args.tiny_dir) / "mismatch_db"
    params = {k: getattr(args, k) for k in EXPERT_B_ARGS}
    stamp = path / "expert_b.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == params:
        return path
    if path.exists():
        import shutil

        shutil.rmtree(path)
    by_episode, actions = expert_b_demos(args, vla.cfg.image_size)
    stats = vla.stats(None)
    tiny_artifacts.write_db(tiny_artifacts.demo_points(vla, by_episode, actions, stats), path)
    stamp.write_text(json.dumps(params))
    return path


def decoders(args: argparse.Namespace) -> dict[str, HybridDecoder]:
    from heisd_ros.policy import (
        TINY_MODEL,
        PolicyPaths,
        load_parts,
        open_store,
        resolve_decoder_config,
        resolve_paths,
    )

    paths = resolve_paths(PolicyPaths(TINY_MODEL, tiny_cache_dir=args.tiny_dir))
    cfg = resolve_decoder_config(DecoderConfig(method="heisd"), paths)
    parts = load_parts(paths, cfg)  # the tiny policy with its own (matching) database
    vla = parts.vla
    other = open_store(cfg, PolicyPaths(TINY_MODEL, db_path=str(mismatch_db(vla, args))), None,
                       feat_dim=vla.hidden_size)
    off = dataclasses.replace(cfg, source_choice=SourceChoiceConfig(enabled=False))
    rows = {"ar": (cfg.with_method("ar"), None), "drafter": (cfg.with_method("drafter"), None),
            "heisd_off": (off, other), "heisd_on": (cfg, other),
            "heisd_off_matching": (off, parts.store), "heisd_on_matching": (cfg, parts.store)}
    return assemble_decoders(parts, {name: c for name, (c, _) in rows.items()},
                             stores={name: s for name, (_, s) in rows.items()})


def evaluation_episodes(args: argparse.Namespace) -> list[list[Observation]]:
    """Held-out expert-A episodes (seed `args.seed`)."""
    episodes: dict[int, list[Observation]] = {}
    for s in synthetic.episodes(args.seed, args.episodes, args.steps):
        episodes.setdefault(s.episode, []).append(Observation(s.images, s.instruction, s.ee_pos))
    return list(episodes.values())


def summarise(episodes: list[list[StepStats]], ar: list[list[float]] | None,
              warmup: int) -> tuple[dict, list[list[float]]]:
    """(the report figures of one row's episodes, their step latencies per episode [ms]); `ar`: ar's
    latencies per episode (None: this row is ar). Latencies leave out the first `warmup` steps of the run."""
    stats = [s for e in episodes for s in e]
    ms = [[s.latency_ms["total"] for s in e] for e in episodes]
    ms[0] = ms[0][warmup:]
    out = {
        "steps": len(stats),
        **figures.latency_figures([x for e in ms for x in e]),
        **figures.speedup_figures(ar if ar is not None else ms, ms, paired=True),
        "forwards_per_step": float(np.mean([s.llm_forwards for s in stats])),
        **figures.accept_figures([s.llm_forwards for s in stats], [s.skipped for s in stats]),
        "mode_mix": {k: v / len(stats) for k, v in sorted(Counter(s.mode for s in stats).items())},
        "by_mode": {m: {"mean_step_ms": float(np.mean([s.latency_ms["total"] for s in stats[warmup:] if s.mode == m])),
                        "forwards_per_step": float(np.mean([s.llm_forwards for s in stats if s.mode == m]))}
                    for m in sorted({s.mode for s in stats[warmup:]})},
        "source_reasons": {k: v / len(stats) for k, v in sorted(Counter(s.source_reason for s in stats).items())},
    }
    return out, ms


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    decs = decoders(args)
    names = list(decs)
    stats: dict[str, list[list[StepStats]]] = {name: [] for name in names}
    for episode in evaluation_episodes(args):
        for name, dec in decs.items():
            dec.reset(episode[0].instruction)
            stats[name].append([])
        for i, obs in enumerate(episode):
            # Rotate who goes first: a decoder right after another on the same observation finds
            # warm caches, which would favour whichever row follows its twin.
            for name in names[i % len(names):] + names[: i % len(names)]:
                stats[name][-1].append(decs[name].step(obs)[1])
    for dec in (decs["heisd_on"], decs["heisd_on_matching"]):
        dec.close()
    rows, ar_ms = {}, None
    for name in names:  # ar first
        rows[name], ms = summarise(stats[name], ar_ms, args.warmup)
        ar_ms = ar_ms or ms
    meta = {"args": vars(args), "git_rev": git_revision(), "platform": platform.platform(), "torch": torch.__version__,
            "config": to_dict(decs["heisd_on"].cfg), "bootstrap": figures.bootstrap_meta(len(stats["ar"]), paired=True),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    return {**rows, "_meta": meta}


def print_table(report: dict) -> None:
    head = (f"{'row':<19} {'mean ms':>8} {'median':>7} {'p95':>7} {'x ar (95% CI)':>20} {'p95 x':>6} {'fwd/step':>8}"
            "  modes | why")
    print(head)
    print("-" * len(head))
    for name, r in report.items():
        if name.startswith("_"):
            continue
        modes = ",".join(f"{k}:{v:.0%}" for k, v in r["mode_mix"].items())
        reasons = ",".join(f"{k}:{v:.0%}" for k, v in r["source_reasons"].items())
        ci = figures.interval_text(r["speedup_vs_ar_ci95"])
        print(f"{name:<19} {r['mean_step_ms']:>8.2f} {r['median_step_ms']:>7.2f} {r['p95_step_ms']:>7.2f} "
              f"{r['speedup_vs_ar']:>5.2f}x {ci:>14} {r['p95_speedup_vs_ar']:>5.2f}x {r['forwards_per_step']:>8.2f}  "
              f"{modes} | {reasons}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny-dir", default="artifacts/tiny", help="the tiny policy's artifacts (built if missing)")
    p.add_argument("--episodes", type=int, default=8, help="evaluation episodes per task")
    p.add_argument("--steps", type=int, default=40, help="steps per episode")
    p.add_argument("--seed", type=int, default=3000, help="seed of the expert-A evaluation episodes")
    p.add_argument("--expert-seed", type=int, default=2000, help="seed of expert B's demonstrations")
    p.add_argument("--expert-episodes", type=int, default=8, help="expert B's demonstrations per task")
    p.add_argument("--offset-m", type=float, default=0.03, help="expert B's path shift, metres")
    p.add_argument("--time-warp", type=float, default=1.6, help="expert B's progress profile t**time_warp")
    p.add_argument("--noise-m", type=float, default=0.002, help="expert B's hand jitter per step, metres (std)")
    p.add_argument("--warmup", type=int, default=3, help="steps excluded from latency statistics")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--json", default="", help="write the report here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    report = run(args)
    print_table(report)
    if args.json:
        write_json(args.json, report)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
