"""heisd bench: run decoding methods side by side on the same observations.

Usage:
    heisd bench --model tiny [--methods ar,drafter,specvla,retrieval,heisd] [--episodes 2]
                [--threads 1] [--pace-hz HZ] [--dtype float32] [--json FILE]
    heisd bench --model DIR --drafter DIR --db PATH --calibration FILE ...

Every method decodes the same held-out episodes (synthetic for the tiny model) in one process,
taking turns step by step so that background load affects all methods alike. By default the steps
run back to back; with --pace-hz every step starts on the tick of a control loop at HZ and the rest
of the period is slept (not counted), as a robot's control loop runs them: a step that follows idle
time (or other processes' work) finds colder caches than one that follows another step. Paced, the
methods run one after the other, each over all episodes, so that a step follows its own method's
previous step; a step that overruns its period skips the ticks it covered, as a control timer that
finds the step busy.
Per method: mean, median, p95 and p99 step latency (the first --warmup steps excluded) with the mean
and median per stage; speedup_vs_ar (mean ar step / mean step) with a 95 % bootstrap interval over
the input episodes (none with one episode) and median_speedup_vs_ar; LLM forwards per step;
accept_length (the paper's: tokens per decoding cycle, a skipped step being one 7-token cycle) and
tokens_per_forward_verified (7 x verified steps / their LLM forwards); mode mix; whether its tokens
equal `ar`'s at every step. Definitions: heisd_ros/pipeline/figures.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import platform
import sys
import time

import numpy as np
import torch

from heisd_ros.core.config import METHODS, DecoderConfig, to_dict
from heisd_ros.core.types import Observation, StepStats
from heisd_ros.pipeline.figures import (
    mode_floor_ms,
    accept_figures,
    bootstrap_meta,
    interval_text,
    latency_figures,
    speedup_figures,
)
from heisd_ros.pipeline.outputs import git_revision, write_json

STAGES = ("vision", "retrieval", "draft", "prompt", "verify", "detokenize", "total")
PROFILE_STAGES = ("vision", "projector", "retrieval", "draft", "prompt", "forward", "accept", "detokenize")
"""--profile: `forward` is the LLM forwards alone, `accept` the rest of verification (acceptance
logic, KV commit, bookkeeping); `python` is whatever the total leaves unaccounted for."""


def step_floor_ms(st: StepStats) -> float:
    """The floor of this step's mode (`figures.mode_floor_ms`)."""
    return mode_floor_ms(st.latency_ms, st.forward_ms)


def profile(stats: list[StepStats]) -> dict:
    """Per-stage means/medians and, per mode, step time against its floor (mean step / mean floor,
    and the median ratio of step time to floor) and the LLM's cost split: the first forward of a
    step (the prefill, with the tree it verifies), the forwards after it (single-token decodes in
    ar), and the share of the mean step the LLM's forwards take."""
    out: dict = {"stage_mean_ms": {}, "stage_median_ms": {}, "modes": {}}
    for k in PROFILE_STAGES:
        vals = [s.latency_ms.get(k, 0.0) for s in stats]
        out["stage_mean_ms"][k], out["stage_median_ms"][k] = float(np.mean(vals)), float(np.median(vals))
    python = [s.latency_ms["total"] - sum(s.latency_ms.get(k, 0.0) for k in PROFILE_STAGES) for s in stats]
    out["stage_mean_ms"]["python"], out["stage_median_ms"]["python"] = float(np.mean(python)), float(np.median(python))
    for mode in sorted({s.mode for s in stats}):
        sel = [s for s in stats if s.mode == mode]
        ratios = [s.latency_ms["total"] / max(step_floor_ms(s), 1e-6) for s in sel]
        step_ms, floor = [s.latency_ms["total"] for s in sel], [step_floor_ms(s) for s in sel]
        prefill = [s.forward_ms[0] if s.forward_ms else 0.0 for s in sel]
        decodes = [sum(s.forward_ms[1:]) for s in sel]
        out["modes"][mode] = {
            "steps": len(sel),
            "mean_step_ms": float(np.mean(step_ms)),
            "mean_floor_ms": float(np.mean(floor)),
            "mean_ratio_to_floor": float(np.mean(step_ms) / max(np.mean(floor), 1e-6)),
            "median_step_ms": float(np.median(step_ms)),
            "median_floor_ms": float(np.median(floor)),
            "median_ratio_to_floor": float(np.median(ratios)),
            "forwards_per_step": float(np.mean([s.llm_forwards for s in sel])),
            "prefill_mean_ms": float(np.mean(prefill)),
            "decodes_mean_ms": float(np.mean(decodes)),
            "llm_share": float((np.mean(prefill) + np.mean(decodes)) / max(np.mean(step_ms), 1e-6)),
        }
    return out


def tiny_observations(seed: int, n_episodes: int, n_steps: int) -> list[list[Observation]]:
    """Held-out synthetic episodes (a seed the database was not built from)."""
    from heisd_ros.pipeline import synthetic_demos as synthetic

    episodes: dict[int, list[Observation]] = {}
    for s in synthetic.episodes(seed, n_episodes, n_steps):
        episodes.setdefault(s.episode, []).append(Observation(s.images, s.instruction, s.ee_pos))
    return list(episodes.values())


def demo_observations(demos: str, model_dir: str, tasks: str, n_episodes: int, n_steps: int) -> list[list[Observation]]:
    """Recorded LIBERO-layout demonstration episodes as observation sequences (open loop).

    Per task, the model's held-out episodes (`train_log.json` of the model directory) come first,
    then the rest in file order; `n_steps` <= 0 keeps whole episodes. The database holds every demo,
    so on these states retrieval finds the episode's own steps: retrieval and heisd figures are an
    upper bound here, drafter-versus-ar figures are not affected."""
    from heisd_ros.pipeline.episodes import VIEWS, load_episode, scan_hdf5
    from heisd_ros.pipeline.features import held_out_sources
    from heisd_ros.tools.args import parse_tasks

    held = held_out_sources(model_dir)
    refs = scan_hdf5(demos, parse_tasks(tasks) if tasks else None)
    by_task: dict[str, list] = {}
    for r in sorted(refs, key=lambda r: r.source not in held):
        by_task.setdefault(r.task, []).append(r)
    out = []
    for task_refs in by_task.values():
        for ref in task_refs[:n_episodes]:
            ep = load_episode(ref)
            t_end = ep.length if n_steps <= 0 else min(ep.length, n_steps)
            out.append([Observation({v: ep.images[v][t] for v in VIEWS}, ep.instruction, ep.ee_pos[t],
                                    gripper_gap=ep.finger_gap(t)) for t in range(t_end)])
    if not out:
        raise SystemExit(f"no demonstration episodes under {demos} for tasks {tasks or 'all'}")
    return out


class Pacer:
    """The ticks of a control loop at `hz` (None: no pacing, every `wait` returns at once)."""

    def __init__(self, hz: float | None, clock=time.monotonic, sleep=time.sleep) -> None:
        self.period_s = 1.0 / hz if hz else 0.0
        self._clock, self._sleep = clock, sleep
        self._tick: float | None = None
        self.skipped_ticks = 0
        """Ticks that passed while a step overran its period."""

    def wait(self) -> None:
        """Sleep until the next tick (the first call is the first tick)."""
        if not self.period_s:
            return
        now = self._clock()
        if self._tick is None:
            self._tick = now
            return
        self._tick += self.period_s
        if now > self._tick:  # the last step overran: the ticks it covered are skipped
            late = math.ceil((now - self._tick) / self.period_s)
            self._tick += late * self.period_s
            self.skipped_ticks += late
        self._sleep(self._tick - now)


def decode_all(decoders: dict, episodes: list[list[Observation]], pacer: Pacer) -> tuple[dict, list[int]]:
    """Every decoder on every observation: (method -> its StepStats, the input episode of each
    observation). Back to back the methods take turns on each observation, so background load hits
    all of them alike; paced, each method decodes all episodes on its own, as a control loop runs
    one method (a step then follows that method's previous step, whose data it finds in the caches
    or not, never another method's)."""
    stats: dict[str, list[StepStats]] = {m: [] for m in decoders}
    episode_of = [e for e, episode in enumerate(episodes) for _ in episode]
    turns = [list(decoders)] if not pacer.period_s else [[m] for m in decoders]
    for methods in turns:
        for episode in episodes:
            for m in methods:
                decoders[m].reset(episode[0].instruction)
            for obs in episode:
                for m in methods:
                    pacer.wait()
                    stats[m].append(decoders[m].step(obs)[1])
    return stats, episode_of


def episode_step_ms(stats: list[StepStats], episode_of: list[int], warmup: int) -> list[list[float]]:
    """Step latencies (ms) per input episode, the first `warmup` steps of the run left out."""
    out: dict[int, list[float]] = {}
    for i, (s, e) in enumerate(zip(stats, episode_of)):
        if i >= warmup:
            out.setdefault(e, []).append(s.latency_ms["total"])
    return [out[e] for e in sorted(out)]


def mode_stage_means(stats: list[StepStats]) -> dict[str, dict[str, float]]:
    """Per mode: its steps and the mean of every stage of STAGES, ms (the node's DecodeStats carry
    the same stages, so a node's steps compare with bench's mode by mode)."""
    out: dict[str, dict[str, float]] = {}
    for mode in sorted({s.mode for s in stats}):
        sel = [s for s in stats if s.mode == mode]
        out[mode] = {"steps": len(sel), **{k: float(np.mean([s.latency_ms.get(k, 0.0) for s in sel])) for k in STAGES}}
    return out


def summarise(name: str, stats: list[StepStats], ar_tokens: list[tuple] | None, warmup: int,
              with_profile: bool = False) -> dict:
    """One method's figures (speedups are added by `run`, which holds `ar`'s steps)."""
    measured = stats[warmup:]
    modes: dict[str, int] = {}
    for s in stats:
        modes[s.mode] = modes.get(s.mode, 0) + 1
    out = {
        "method": name,
        "steps": len(stats),
        **latency_figures([s.latency_ms["total"] for s in measured]),
        "stage_mean_ms": {k: float(np.mean([s.latency_ms.get(k, 0.0) for s in measured])) for k in STAGES},
        "stage_median_ms": {k: float(np.median([s.latency_ms.get(k, 0.0) for s in measured])) for k in STAGES},
        "mode_stage_mean_ms": mode_stage_means(measured),
        "forwards_per_step": sum(s.llm_forwards for s in stats) / len(stats),
        **accept_figures([s.llm_forwards for s in stats], [s.skipped for s in stats]),
        "mode_mix": {k: v / len(stats) for k, v in sorted(modes.items())},
        "fallbacks": sum(1 for s in stats if s.fallback),
    }
    if with_profile:
        out["profile"] = profile(measured)
    if ar_tokens is not None:
        same = [tuple(s.tokens) == t for s, t in zip(stats, ar_tokens)]
        out["tokens_identical_to_ar"] = bool(all(same))
        out["fraction_steps_identical_to_ar"] = float(np.mean(same))
    return out


def run(args: argparse.Namespace) -> dict:
    from heisd_ros.policy import (
        PolicyPaths,
        build_decoders,
        resolve_decoder_config,
        resolve_paths,
        set_torch_threads,
    )

    set_torch_threads(args.threads)  # as the node's torch_threads
    torch.manual_seed(args.seed)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}; choose from {METHODS}")
    if "ar" not in methods:
        methods = ["ar"] + methods
    paths = resolve_paths(PolicyPaths(args.model, args.drafter, args.db, args.calibration, tiny_cache_dir=args.tiny_dir))
    # The configuration every method shares, resolved as the most demanding method's (the query
    # views of the database, when one retrieves); the methods differ in `method` alone.
    base = "heisd" if {"retrieval", "heisd"} & set(methods) else "drafter" if {"drafter", "specvla"} & set(methods) else "ar"
    base_cfg = DecoderConfig(method=base, dtype=args.dtype)
    if args.min_path_prob is not None:
        base_cfg = dataclasses.replace(
            base_cfg, drafter_tree=dataclasses.replace(base_cfg.drafter_tree, min_path_prob=args.min_path_prob))
    if args.max_tree_nodes is not None:
        base_cfg = dataclasses.replace(
            base_cfg, retrieval=dataclasses.replace(base_cfg.retrieval, max_tree_nodes=args.max_tree_nodes))
    base_cfg = resolve_decoder_config(base_cfg, paths)
    # one model, drafter and database (only the parts the chosen methods need), shared by every method
    decoders = build_decoders(paths, {m: base_cfg.with_method(m) for m in methods}, load_cfg=base_cfg)
    if args.demos:
        episodes = demo_observations(args.demos, args.model, args.tasks, args.episodes, args.steps)
    else:
        episodes = tiny_observations(args.seed + 1000, args.episodes, args.steps)
    for dec in decoders.values():
        dec.profile = args.profile  # exact stage times on a GPU, at the cost of a wait per stage
    pacer = Pacer(args.pace_hz)
    t0 = time.monotonic()
    stats, episode_of = decode_all(decoders, episodes, pacer)
    steps_wall_s = time.monotonic() - t0
    ar_tokens = [tuple(s.tokens) for s in stats["ar"]]
    results = {m: summarise(m, stats[m], ar_tokens, args.warmup, args.profile) for m in methods}
    ar_eps = episode_step_ms(stats["ar"], episode_of, args.warmup)
    for m, r in results.items():
        # every method decoded the same episodes: the bootstrap draws them once for both
        r.update(speedup_figures(ar_eps, episode_step_ms(stats[m], episode_of, args.warmup), paired=True))
        r["lossless"] = r["method"] in ("ar", "drafter", "retrieval")
    meta = {
        "command": " ".join(["heisd", "bench"] + sys.argv[2:]) if sys.argv[1:2] == ["bench"] else "heisd bench",
        "args": vars(args), "seed": args.seed, "threads": args.threads, "pace_hz": args.pace_hz,
        "paced_ticks_skipped": pacer.skipped_ticks, "steps_wall_s": steps_wall_s, "git_rev": git_revision(),
        "platform": platform.platform(), "torch": torch.__version__, "config": to_dict(base_cfg),
        "bootstrap": bootstrap_meta(len(ar_eps), paired=True, unit="input episode"),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return {**{m: results[m] for m in methods}, "_meta": meta}


def print_table(report: dict) -> None:
    """Means first, then median, p95, p99 and the other figures; stage means on a second table."""
    n = report.get("_meta", {}).get("bootstrap", {}).get("episodes")
    head = (f"{'method':<10} {'mean ms':>8} {'speedup':>8} {'95% CI':>14} {'median ms':>9} {'med spd':>7} "
            f"{'p95 ms':>7} {'p99 ms':>7} {'fwd/step':>8} {'accept':>6} {'tok/fwd':>7} {'= ar':>5}  modes")
    print(head)
    print("-" * len(head))
    rows = {name: r for name, r in report.items() if not name.startswith("_")}
    for name, r in rows.items():
        modes = ",".join(f"{k}:{v:.0%}" for k, v in r["mode_mix"].items())
        same = "yes" if r.get("tokens_identical_to_ar") else f"{r.get('fraction_steps_identical_to_ar', 0):.0%}"
        print(f"{name:<10} {r['mean_step_ms']:>8.2f} {r['speedup_vs_ar']:>7.2f}x "
              f"{interval_text(r['speedup_vs_ar_ci95'], n_episodes=n):>14} {r['median_step_ms']:>9.2f} "
              f"{r['median_speedup_vs_ar']:>6.2f}x {r['p95_step_ms']:>7.2f} {r['p99_step_ms']:>7.2f} "
              f"{r['forwards_per_step']:>8.2f} {r['accept_length']:>6.2f} {r['tokens_per_forward_verified']:>7.2f} "
              f"{same:>5}  {modes}")
    print("speedup = mean ar step / mean step; 95% CI: bootstrap over the input episodes; accept = tokens per "
          "cycle (a skip is one 7-token cycle); tok/fwd = 7 x verified steps / their LLM forwards")
    print(f"\n{'stage mean ms':<14}" + " ".join(f"{k[:9]:>9}" for k in STAGES[:-1]))
    for name, r in rows.items():
        print(f"{name:<14}" + " ".join(f"{r['stage_mean_ms'][k]:>9.2f}" for k in STAGES[:-1]))


def print_profile(report: dict) -> None:
    cols = PROFILE_STAGES + ("python",)
    print(f"\n{'mean ms':<10} " + " ".join(f"{c[:9]:>9}" for c in cols))
    for name, r in report.items():
        if name.startswith("_") or "profile" not in r:
            continue
        st = r["profile"]["stage_mean_ms"]
        print(f"{name:<10} " + " ".join(f"{st[c]:>9.2f}" for c in cols))
    print(f"\n{'method':<10} {'mode':<10} {'steps':>5} {'mean ms':>8} {'floor':>7} {'ratio':>6} "
          f"{'median ms':>9} {'floor':>7} {'ratio':>6} {'fwd/step':>8} {'prefill':>8} {'decodes':>8} {'LLM %':>6}")
    for name, r in report.items():
        if name.startswith("_") or "profile" not in r:
            continue
        for mode, m in r["profile"]["modes"].items():
            print(f"{name:<10} {mode:<10} {m['steps']:>5} {m['mean_step_ms']:>8.2f} {m['mean_floor_ms']:>7.2f} "
                  f"{m['mean_ratio_to_floor']:>6.2f} {m['median_step_ms']:>9.2f} {m['median_floor_ms']:>7.2f} "
                  f"{m['median_ratio_to_floor']:>6.2f} {m['forwards_per_step']:>8.2f} {m['prefill_mean_ms']:>8.2f} "
                  f"{m['decodes_mean_ms']:>8.2f} {m['llm_share']:>6.1%}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="heisd bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="'tiny' or a model directory")
    p.add_argument("--tiny-dir", default="artifacts/tiny", help="where --model tiny builds/caches its artifacts")
    p.add_argument("--drafter", default="", help="drafter directory (default: the tiny one for --model tiny)")
    p.add_argument("--db", default="", help="embedded database directory")
    p.add_argument("--calibration", default="", help="calibration JSON")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--episodes", type=int, default=2, help="held-out episodes per task")
    p.add_argument("--steps", type=int, default=40, help="steps per episode (<= 0: whole demo episodes)")
    p.add_argument("--demos", default="", help="LIBERO-layout HDF5 demos to replay open loop instead of synthetic "
                   "observations (the model's held-out episodes first)")
    p.add_argument("--tasks", default="", help="with --demos: task indices, e.g. 0-9")
    p.add_argument("--min-path-prob", type=float, default=None, help="override drafter_tree.min_path_prob")
    p.add_argument("--max-tree-nodes", type=int, default=None, help="override retrieval.max_tree_nodes")
    p.add_argument("--warmup", type=int, default=3, help="steps excluded from latency statistics")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed for comparable timings)")
    p.add_argument("--pace-hz", type=float, default=None,
                   help="start the steps on the ticks of a control loop at this rate, sleeping the rest of "
                        "each period (not counted), instead of back to back")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="write the report here")
    p.add_argument("--profile", action="store_true", help="per-stage breakdown and step time / floor per mode")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.pace_hz is not None and not (math.isfinite(args.pace_hz) and args.pace_hz > 0):
        parser.error(f"--pace-hz must be > 0, got {args.pace_hz}")
    if args.threads < 1:
        parser.error(f"--threads must be >= 1, got {args.threads}")
    report = run(args)
    print_table(report)
    if args.profile:
        print_profile(report)
    if args.json:
        write_json(args.json, report)
        print(f"wrote {args.json}")
    return 0
