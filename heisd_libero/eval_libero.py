"""`heisd-libero eval-libero`: closed-loop LIBERO evaluation of every decoding method (docs/design.md §9).

Usage:
    heisd-libero eval-libero --model artifacts/mini_vla --drafter artifacts/mini_drafter --db artifacts/mini_db \\
        --calibration artifacts/mini_calibration.json --suite libero_object --tasks 0-9 --init-states 40-49 \\
        --methods ar,drafter,specvla,retrieval,heisd --max-steps 280 --out benchmarks/libero_object.json \\
        [--plots DIR] [--seed 0] [--threads 1] [--camera-size 128] [--unknown-task error] [--no-progress] \\
        [--no-shadow-ar] [--online-methods heisd_online --variants heisd_online=heisd] \\
        [--scene-shift-m 0.02 --scene-seed 7]   (sealed scenes: every movable object shifted, seeded)
    heisd-libero eval-libero --model tiny ...      (the tiny test policy; it knows no LIBERO task)
    heisd-libero eval-libero --report-from benchmarks/libero_object.jsonl --tasks 9 --init-states 40-45 \
        --methods ar,drafter --out benchmarks/subset.json   (a report of part of a log; runs nothing)

Protocol (the same for every method, in one process):
- For each task (in --tasks order) and init state (in --init-states order: 40-49, or 20-39 with
  --purpose calibration; the demonstrations use 0-19), every method gets its own LiberoEnv of the
  task, reset to that init state (10 settle steps),
  and its own HybridDecoder; the decoders share the VLA weights, drafter and database read-only.
  With --scene-shift-m D every movable object is shifted (before settling) by U(-D, D) in x and y, from
  (--scene-seed, task, init state) alone: the same shifted scene for every method of the pair.
- The methods take turns at every control step, in --methods order: observation (two upright views,
  end-effector position, instruction) -> decoder.step -> env.step. Background CPU load therefore
  falls on all methods alike. An episode ends at task success or after --max-steps steps.
- Episodes are independent: each starts from the configured operating point (`restore_operating_point`,
  then `reset(instruction)`), and each env reset gives a freshly built env's observation. Only the
  labels in --online-methods get `episode_feedback(success)` after each episode (Alg. 1's online
  stage over the run's task sequence); a resumed run replays their logged results first.
- Evidence (heisd_libero/eval_evidence.py): every step logs an input digest, whether it was strict, its
  thread CPU time beside its wall time and, with --shadow-ar (the default), greedy ar's tokens on
  the same observation for every lossy step and, by --shadow-strict-every N (default 1: all), for
  every N-th strict step of an episode (every method but ar). The run key holds the git revision: a
  log is never resumed by other code. The command exits 3 when a strict step disagrees with ar (on
  ar's own inputs, or with its shadow) or a method's first observation of a pair differs from ar's
  (the report is written all the same).

Outputs: `<out stem>.jsonl` (one line per finished (task, init state, method) episode with its per-step
StepStats; a rerun with the same settings skips finished triples), the JSON report `--out` (one object
per method plus `_meta`), `<out stem>.md` (tables) and, with --plots, PNG plots. The report covers the
requested tasks x init states x methods found in the log. Per method: success with its 95 % Wilson
interval; mean, median, p95, p99 step latency; speedup_vs_ar (ratio of means) with a bootstrap
interval over the (task, init state) episodes, median_speedup_vs_ar; episode_time_ratio (time per task:
ar's summed episode decode time over the method's on the same pairs); accept_length (the paper's) and
tokens_per_forward_verified (definitions: heisd_ros/pipeline/figures.py).

Variants (`--variants`) are methods with some DecoderConfig fields changed, reported under their own
names (ablations; the candidate operating points of a calibration run). `--subset-methods` run only
on `--subset-init-states`, in the same run; their speedups are paired with `ar` on those episodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from heisd_ros.core.config import METHODS
from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.pipeline.method_variants import parse_variants
from heisd_ros.pipeline.outputs import cpu_model, git_revision, progress_bar, source_revision, write_json
from heisd_ros.tools.args import parse_range
from heisd_libero.eval_config import PURPOSE_INIT_STATES, EvalLiberoConfig
from heisd_libero.eval_episodes import run_pair
from heisd_libero.eval_policies import Policies, count_or_none, retrieval_probe

def run(cfg: EvalLiberoConfig, command: str = "") -> dict[str, Any]:
    """Run every missing episode, then rebuild the report (and Markdown, plots) from the whole log."""
    import torch

    from heisd_ros.core import onednn
    from heisd_libero.eval_report import ResultLog

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    t_start = time.perf_counter()
    pol = Policies(cfg)
    key = {"suite": cfg.suite, "max_steps": cfg.max_steps, "camera_size_px": cfg.camera_size_px,
           "dtype": cfg.dtype, "unknown_task": cfg.unknown_task, "seed": cfg.seed,
           "scene_shift_m": cfg.scene_shift_m, "scene_seed": cfg.scene_seed, **pol.fingerprint()}
    key.update(purpose=cfg.purpose, variants=[v.describe() for v in cfg.variants], shadow_ar=cfg.shadow_ar,
               shadow_strict_every=cfg.shadow_strict_every if cfg.shadow_ar else 0,
               online_methods=list(cfg.online_methods),
               # one revision a run: a log resumed by other code is refused (a new revision is a new run)
               git_rev=source_revision())
    log = ResultLog(cfg.log_path, key)
    # First, so that a process stopped before its `session` line still names its revision. Read
    # once: the code of this process is the revision it started at, whatever is committed meanwhile.
    rev = git_revision()
    log.append({"kind": "session_start", "command": command, "git_rev": rev, "cpu": cpu_model(),
                "linear_kernels": onednn.decisions(),  # what `llm_linear` 'auto' chose on this machine
                "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    for rec in log.episodes:  # resume an online method: the thresholds an uninterrupted run would have
        if rec["method"] in pol.online:
            pol.decoders[rec["method"]].episode_feedback(rec["success"])
    done = log.done()
    todo = {triple for triple in cfg.triples() if triple not in done}
    bar = progress_bar(len(todo), f"eval-libero {cfg.suite}", cfg.progress, unit="ep")
    n_run = 0
    probe: list[float] = []
    try:
        for task in cfg.tasks:
            n_run += _run_task(cfg, task, todo, pol, log, bar)
        evaluated = sorted({e["instruction"] for e in log.episodes if e["task"] in cfg.tasks})
        probe = retrieval_probe(pol.store, evaluated) if pol.store is not None else []
    finally:
        bar.close()
        db_points = count_or_none(pol.store)
        pol.close()
        session = {"kind": "session", "command": command, "git_rev": rev, "episodes_run": n_run,
                   "db_points": db_points,
                   "wall_s": round(time.perf_counter() - t_start, 1),
                   "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        if probe:
            session["probe_top5_ms"] = [round(x, 4) for x in probe]
        log.append(session)
    return write_outputs(cfg, log, command, key)


def _run_task(cfg: EvalLiberoConfig, task: int, todo: set[tuple[int, int, str]], pol: Policies, log, bar) -> int:
    """The missing episodes of one task, init state by init state, on as many envs as the most methods
    any init state still needs; returns how many episodes ran."""
    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig

    pending = {k: [m for m in cfg.methods_at(k) if (task, k, m) in todo] for k in cfg.init_states}
    need = max((len(v) for v in pending.values()), default=0)
    if need == 0:
        return 0
    envs = [LiberoEnv(LiberoEnvConfig(suite=cfg.suite, task_index=task, camera_size_px=cfg.camera_size_px))
            for _ in range(need)]
    n_run = 0
    try:
        for k, methods in pending.items():
            if methods:
                run_pair(cfg.max_steps, task, k, methods, envs, pol, log, bar, cfg.scene_shift_m, cfg.scene_seed,
                         shadow_strict_every=cfg.shadow_strict_every)
                n_run += len(methods)
    finally:
        for env in envs:
            env.close()
    return n_run


def report_from_log(cfg: EvalLiberoConfig, log_path: str, command: str = "") -> dict[str, Any]:
    """Rebuild the report of `cfg`'s tasks x init states x methods from an existing log; runs nothing.

    No model, database or simulator is loaded: the run settings (suite, max steps, seed, camera, dtype)
    come from the log's run key, so a report of a subset (say the init states every method finished)
    can be written on any machine that holds the log.
    """
    from heisd_libero.eval_report import ResultLog

    log = ResultLog.read(log_path)
    key = log.run_key
    cfg = dataclasses.replace(cfg, suite=key["suite"], max_steps=key["max_steps"], seed=key["seed"],
                              camera_size_px=key["camera_size_px"], dtype=key["dtype"],
                              # a log written before sealed scenes ran LIBERO's init states unshifted
                              scene_shift_m=key.get("scene_shift_m", 0.0), scene_seed=key.get("scene_seed", 0),
                              # what the run shadowed (a log written before strict shadows had none)
                              shadow_ar=key.get("shadow_ar", cfg.shadow_ar),
                              shadow_strict_every=key.get("shadow_strict_every", 0))
    found = {(e["task"], e["init_state"], e["method"]) for e in log.episodes}
    missing = [triple for triple in cfg.triples() if triple not in found]
    if missing:
        raise ConfigError(f"--report-from {log_path}: {len(missing)} requested episode(s) are not in the log, "
                          f"e.g. task {missing[0][0]} init {missing[0][1]} {missing[0][2]}; narrow "
                          "--tasks/--init-states/--methods to what it holds")
    return write_outputs(cfg, log, command, key)


def write_outputs(cfg: EvalLiberoConfig, log, command: str, key: dict[str, Any]) -> dict[str, Any]:
    """The JSON report `cfg.out`, its Markdown tables beside it and, with `cfg.plots_dir`, the plots."""
    import torch

    from heisd_libero.eval_markdown import markdown
    from heisd_libero.eval_report import build_report

    wanted = set(cfg.triples())
    episodes = [e for e in log.episodes if (e["task"], e["init_state"], e["method"]) in wanted]
    pairs = sorted({(e["task"], e["init_state"]) for e in episodes})
    meta = {
        "command": command, "suite": cfg.suite, "tasks": list(cfg.tasks), "init_states": list(cfg.init_states),
        "pairs": len(pairs), "methods": list(cfg.methods), "max_steps": cfg.max_steps, "seed": cfg.seed,
        "scene_shift_m": cfg.scene_shift_m, "scene_seed": cfg.scene_seed,
        "purpose": cfg.purpose, "variants": [v.describe() for v in cfg.variants],
        "subset": {"methods": list(cfg.subset_methods), "init_states": list(cfg.subset_init_states)},
        "seeds": {"torch": cfg.seed, "env": 0, "decoding": "greedy (deterministic)"},
        "threads": cfg.threads, "camera_size_px": cfg.camera_size_px, "git_rev": git_revision(),
        "protocol": ("per (task, init state) every method runs on its own env instance and decoder; methods take "
                     "turns per control step in the methods order; every episode starts from the configured "
                     "operating point (episode feedback only for the online methods, in log order); greedy ar "
                     "shadows every lossy step and, of the methods but ar, strict steps 1, N+1, 2N+1, ... of each "
                     f"episode (N = {cfg.shadow_strict_every}; 0: none)" if cfg.shadow_ar else "no ar shadow"),
        "online_methods": list(cfg.online_methods), "shadow_ar": cfg.shadow_ar,
        "shadow_strict_every": cfg.shadow_strict_every if cfg.shadow_ar else 0,
        "model": key, "log": str(log.path),
        "invocations": [{k: v for k, v in sess.items() if k != "probe_top5_ms"} for sess in log.sessions],
        "stopped_invocations": list(getattr(log, "stopped", [])),
        # step times compare within one machine only: which ones the run's processes started on
        "machines": sorted({x["cpu"] for x in [*log.sessions, *getattr(log, "stopped", [])] if x.get("cpu")}),
        "db_points": next((x["db_points"] for x in reversed(log.sessions) if x.get("db_points") is not None), None),
        "platform": platform.platform(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
        "nice": os.nice(0), "loadavg": list(os.getloadavg()),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    probe = [x for sess in log.sessions for x in sess.get("probe_top5_ms", [])]
    report = build_report(episodes, cfg.labels, meta, probe_ms=probe)
    out = Path(cfg.out)
    write_json(out, report)
    out.with_suffix(".md").write_text(markdown(report))
    if cfg.plots_dir:
        from heisd_libero.eval_plots import write_plots

        report["_meta"]["plots"] = write_plots(report, episodes, cfg.plots_dir)
        write_json(out, report)
    return report


def build_parser() -> argparse.ArgumentParser:
    d = EvalLiberoConfig()
    p = argparse.ArgumentParser(prog="heisd-libero eval-libero", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default=d.model_dir, help="model directory, or 'tiny' (the test policy)")
    p.add_argument("--drafter", default=d.drafter_dir)
    p.add_argument("--db", default=d.db_path, help="embedded Qdrant database directory")
    p.add_argument("--calibration", default=d.calibration_path)
    p.add_argument("--tiny-dir", default=d.tiny_dir, help="where --model tiny builds/caches its artifacts")
    p.add_argument("--suite", default=d.suite)
    p.add_argument("--tasks", default="0-9", help="task indices, e.g. 0-9 or 0,3,5-7")
    p.add_argument("--init-states", default="40-49",
                   help="init states: 40-49 (evaluation) or, with --purpose calibration, 20-39")
    p.add_argument("--methods", default=",".join(d.methods),
                   help=f"comma-separated, from {', '.join(METHODS)} and the --variants names")
    p.add_argument("--variants", default="", metavar="SPEC",
                   help="named method variants, 'NAME=METHOD:section.field=value,...;...' "
                        "(e.g. heisd_tau0=heisd:fused_metric.tau=0)")
    p.add_argument("--subset-methods", default="", help="methods run only on --subset-init-states")
    p.add_argument("--subset-init-states", default="", help="init states of the subset methods")
    p.add_argument("--purpose", default=d.purpose, choices=sorted(PURPOSE_INIT_STATES),
                   help="calibration: init states 20-39, to choose an operating point without the evaluation")
    p.add_argument("--max-steps", type=int, default=d.max_steps)
    p.add_argument("--camera-size", type=int, default=d.camera_size_px, help="square image size in pixels")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--scene-shift-m", type=float, default=d.scene_shift_m, metavar="D",
                   help="sealed scenes: shift every movable object by a seeded U(-D, D) m in x and y after the "
                        "init state, the same for every method of a pair (0 = as LIBERO ships it; at most 0.02: beyond it objects may overlap)")
    p.add_argument("--scene-seed", type=int, default=d.scene_seed, metavar="S",
                   help="seed of the sealed scenes (with the task and init state it fixes a pair's shift)")
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--dtype", default=d.dtype, choices=("float32", "bfloat16"))
    p.add_argument("--unknown-task", default=d.unknown_task, choices=("error", "drafter"))
    p.add_argument("--shadow-ar", action=argparse.BooleanOptionalAction, default=d.shadow_ar,
                   help="decode greedy ar (untimed) on every lossy step and log its tokens")
    p.add_argument("--shadow-strict-every", type=int, default=d.shadow_strict_every, metavar="N",
                   help="with --shadow-ar, also decode greedy ar on every N-th strict step of an episode "
                        "(1: all, 0: none; never ar's own): strict-step agreement along the method's path")
    p.add_argument("--online-methods", default="",
                   help="labels whose verify-skip thresholds adapt across episodes (Alg. 1's online stage)")
    p.add_argument("--out", default=d.out, help="JSON report; the log is <out stem>.jsonl, the table <out stem>.md")
    p.add_argument("--plots", default=d.plots_dir, help="directory for PNG plots ('' = none)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--report-from", default="", metavar="LOG",
                   help="only rebuild the report of the selected tasks x init states x methods from this "
                        "eval-libero log (.jsonl) into --out; loads no model and runs nothing")
    return p


def config_from_args(args: argparse.Namespace) -> EvalLiberoConfig:
    return EvalLiberoConfig(
        model_dir=args.model, drafter_dir=args.drafter, db_path=args.db, calibration_path=args.calibration,
        tiny_dir=args.tiny_dir, suite=args.suite, tasks=parse_range(args.tasks), init_states=parse_range(args.init_states),
        methods=_names(args.methods), variants=parse_variants(args.variants),
        subset_methods=_names(args.subset_methods),
        subset_init_states=parse_range(args.subset_init_states) if args.subset_init_states else (),
        purpose=args.purpose, max_steps=args.max_steps,
        camera_size_px=args.camera_size, seed=args.seed, scene_shift_m=args.scene_shift_m,
        scene_seed=args.scene_seed, threads=args.threads, dtype=args.dtype,
        unknown_task=args.unknown_task, shadow_ar=args.shadow_ar, shadow_strict_every=args.shadow_strict_every,
        online_methods=_names(args.online_methods),
        out=args.out,
        plots_dir=args.plots, progress=not args.no_progress,
    )


def _names(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


def _variants_of_log(args: argparse.Namespace) -> None:
    """--report-from without --variants: the variants the log's run was made with."""
    if args.report_from and not args.variants:
        from heisd_libero.eval_report import ResultLog

        args.variants = ";".join(ResultLog.read(args.report_from).run_key.get("variants", []))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    # MuJoCo picks its GL backend when first imported; headless CPU rendering needs EGL.
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    command = "heisd-libero eval-libero " + shlex.join(argv)
    try:
        _variants_of_log(args)
        cfg = config_from_args(args)
        report = report_from_log(cfg, args.report_from, command) if args.report_from else run(cfg, command)
    except HeisdError as err:
        print(f"heisd-libero eval-libero: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    from heisd_libero.eval_markdown import markdown

    print(markdown(report))
    print(f"wrote {cfg.out}, {Path(cfg.out).with_suffix('.md')}, log {args.report_from or cfg.log_path}")
    broken = report["_meta"]["evidence"]["broken"]
    if broken:  # the figures are written, but they are not evidence about the methods
        print("heisd-libero eval-libero: the run does not hold as evidence: " + "; ".join(broken), file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
