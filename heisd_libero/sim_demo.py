"""`heisd-libero sim-demo` (`make demo`): one LIBERO-Object episode through `policy_node` and the simulated
arm, closed loop in arm time, for ar and then heisd.

    heisd-libero sim-demo [--methods ar,heisd] [--task 0] [--init-state 40] [--time-mode arm_time]
                      [--latency-scale 1] [--max-steps 300] [--out artifacts/sim_demo]

1. the policy: the committed mini policy (models/mini_libero: model, drafter, operating point) and
   a database of the task, built once (10 expert episodes at training init states, then `heisd
   build-db`: about 4 minutes, cached under artifacts/mini_libero_db);
2. per method, a `policy_node` process (the node a user's stack runs, in simulation time) and the
   simulated arm (heisd_libero/sim_arm.py) run the episode from an evaluation init state (in no
   demonstration, database or training set). In arm time the arm keeps executing the previous
   command while the node decodes, for as many control periods as the frame-to-command age spans;
3. prints one line per method (outcome, task time in simulation seconds, frame-to-command age,
   decode step, mode mix) and writes under OUT/<time>/: episode.mp4 (the methods side by side,
   each frame labelled with the mode of the command being executed), modes.png, ages.png and
   result.json (every step's figures). The node's logs are in OUT/<time>/logs.

The bag-replay demo of the node alone (no simulator) is `heisd demo`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


from heisd_ros.core.errors import HeisdError
from heisd_ros.pipeline.outputs import git_revision

VIEW = "agentview"


@dataclass(frozen=True)
class LoopDemoConfig:
    """What the closed-loop demo runs."""

    methods: tuple[str, ...] = ("ar", "heisd")
    suite: str = "libero_object"
    task: int = 0
    init_state: int = 40
    """An evaluation init state (40-49: in no demonstration, database or training set)."""
    time_mode: str = "arm_time"
    latency_scale: float = 1.0
    control_rate_hz: float = 20.0
    max_steps: int = 300
    db_path: str = ""
    """The database of the task; empty: the one the demo builds once (artifacts/mini_libero_db)."""
    out: str = "artifacts/sim_demo"
    domain_id: int = 80


class Progress:
    """One line per method, redrawn in place on a terminal (printed once, at the end, in a log)."""

    WIDTH = 30

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.tty = label, total, sys.stdout.isatty()

    def line(self, steps: int, note: str = "") -> str:
        filled = round(self.WIDTH * min(steps, self.total) / self.total)
        return f"      {self.label:<6} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {steps:3d}/{self.total} steps {note}"

    def update(self, steps: int) -> None:
        if self.tty and (steps % 5 == 0):
            print("\r" + self.line(steps), end="", flush=True)

    def end(self, steps: int, note: str) -> None:
        print(("\r" if self.tty else "") + self.line(steps, note), flush=True)


def run_method(method: str, cfg: LoopDemoConfig, db_path: str, run_dir: Path, ctx: Any) -> tuple[dict, Any]:
    """One episode of `method` through a fresh policy_node: its figures (sim-episodes' record and
    summary) and its film."""
    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig
    from heisd_libero.sim_arm import SimArm, SimArmConfig
    from heisd_libero.sim_demo_media import EpisodeFilm
    from heisd_libero.sim_episodes import episode_record, start_node, summary
    from heisd_ros.ros.node_main import stop_process

    # after LIBERO's import, which sets DeprecationWarnings to "once": lark's (via rosidl) is noise here
    warnings.filterwarnings("ignore", message="module 'sre_", category=DeprecationWarning)
    film = EpisodeFilm(method)
    progress = Progress(method, cfg.max_steps)
    proc = start_node(method, db_path, cfg.control_rate_hz, str(run_dir / "logs"), cfg.domain_id)
    env = arm = None
    try:
        env = LiberoEnv(LiberoEnvConfig(suite=cfg.suite, task_index=cfg.task))
        arm = SimArm(env, SimArmConfig(init_state=cfg.init_state, control_rate_hz=cfg.control_rate_hz,
                                       max_steps=cfg.max_steps, time_mode=cfg.time_mode,
                                       latency_scale=cfg.latency_scale), context=ctx, record_stats=True)  # fmt: skip
        deadline = time.monotonic() + 180.0
        while not arm.wait_for_node(1.0):
            if proc.poll() is not None or time.monotonic() > deadline:
                log = run_dir / "logs" / f"node_{method}.log"
                tail = "".join(log.read_text().splitlines(keepends=True)[-3:])
                raise HeisdError(f"policy_node ({method}) did not come up; the end of {log}:\n{tail}")

        def on_step(obs: Any, t: float, stamp: float | None) -> None:
            film.frames.append(obs.images[VIEW])
            film.times_s.append(t)
            film.executing.append(stamp)
            progress.update(len(film.frames) - 1)

        out = arm.run_episode(on_step=on_step)
        stats = arm.take_stats(expect=len(out.frame_stamps_s))
    except RuntimeError as err:  # the node refused the episode's goal
        raise HeisdError(f"{method}: {err}; see {run_dir / 'logs'}") from err
    finally:
        if arm is not None:
            arm.close()
        if env is not None:
            env.close()
        code = stop_process(proc)
    record = episode_record(cfg.task, cfg.init_state, out, stats, cfg.latency_scale)
    film.ages_ms = {round(s, 6): 1e3 * a for s, a in zip(out.frame_stamps_s, record["frame_to_command_s"])}
    film.modes = {k: mode for k, (_, mode, _) in stats.items()}
    film.decode_ms = {k: ms for k, (ms, _, _) in stats.items()}
    row = {"method": method, "ended": out.ended, "decoded_frames": len(out.frame_stamps_s), "node_exit_code": code,
           **summary([record]), "record": record}  # fmt: skip
    progress.end(out.steps, f"{'success' if out.success else out.ended} in {out.sim_time_s:.1f} s sim")
    return row, film


def format_table(rows: list[dict]) -> str:
    """The per-method lines, each column saying what it measures."""
    head = (f"      {'method':<7}{'outcome':<11}{'task time':>10}{'frame-to-command age':>23}{'decode step':>18}"
            f"   mode mix\n      {'':<7}{'':<11}{'(sim s)':>10}{'p50 / p95 (ms)':>23}{'mean / p95 (ms)':>18}")  # fmt: skip
    lines = [head]
    for r in rows:
        total = sum(r["mode_mix"].values()) or 1
        mix = " ".join(f"{m} {100 * n / total:.0f}%" for m, n in r["mode_mix"].items())
        age = "{p50} / {p95}".format(**r["frame_to_command_ms"])
        dec = "{mean} / {p95}".format(**r["decode_ms"])
        outcome = "success" if r["successes"] else r["ended"]
        lines.append(f"      {r['method']:<7}{outcome:<11}{r['task_time_s_mean']:>10.2f}{age:>23}{dec:>18}   {mix}")
    by = {r["method"]: r for r in rows}
    ar = by.get("ar")
    if ar and ar["decode_ms"]["mean"] and ar["frame_to_command_ms"]["p50"]:
        for m, r in by.items():
            if m != "ar" and r["decode_ms"]["mean"] and r["frame_to_command_ms"]["p50"]:
                lines.append(f"      {m} against ar: decode step {by['ar']['decode_ms']['mean'] / r['decode_ms']['mean']:.2f}x "
                             f"(ratio of means), frame-to-command age "
                             f"{by['ar']['frame_to_command_ms']['p50'] / r['frame_to_command_ms']['p50']:.2f}x (ratio of "
                             f"medians); one episode each: its outcome and task time are one sample, not a rate")  # fmt: skip
    return "\n".join(lines)


def run(cfg: LoopDemoConfig, say=print) -> dict:
    os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering, before MuJoCo is first imported
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    import rclpy

    from heisd_libero.sim_demo_media import write_figures, write_video
    from heisd_ros.pipeline.libero_runs import published_paths
    from heisd_ros.tools.demo import PUBLISHED_DB, DemoConfig, ensure_task_db

    t0 = time.monotonic()
    paths = {k: str(v) for k, v in published_paths().items()}
    db_path = cfg.db_path or str(PUBLISHED_DB / f"{cfg.suite}_task{cfg.task}")
    say(f"[1/3] policy {Path(paths['model_dir']).parent}; database {db_path}")
    if not cfg.db_path:
        ensure_task_db(DemoConfig(model_dir=paths["model_dir"], calibration_path=paths["calibration_path"],
                                  db_path=db_path, libero_suite=cfg.suite, libero_task=cfg.task), say)  # fmt: skip
    run_dir = Path(cfg.out) / time.strftime("%Y%m%d-%H%M%S")
    while run_dir.exists():  # two runs in one second keep both
        run_dir = run_dir.with_name(run_dir.name + "x")
    run_dir.mkdir(parents=True)
    say(f"[2/3] {cfg.suite} task {cfg.task}, init state {cfg.init_state}: closed loop through policy_node and the "
        f"simulated arm, {cfg.time_mode} at {cfg.control_rate_hz:g} Hz" +
        (f", latency x{cfg.latency_scale:g}" if cfg.latency_scale != 1 else ""))  # fmt: skip
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=cfg.domain_id)
    rows, films = [], []
    try:
        for method in cfg.methods:
            row, film = run_method(method, cfg, db_path, run_dir, ctx)
            rows.append(row)
            films.append(film)
    finally:
        rclpy.shutdown(context=ctx)
    say("[3/3] results\n" + format_table(rows))
    video = write_video(films, run_dir / "episode.mp4", cfg.control_rate_hz)
    figures = write_figures(films, run_dir)
    result = {"command": "heisd-libero sim-demo", "git_rev": git_revision(), "config": asdict(cfg), "db_path": db_path,
              "methods": rows, "wall_s": round(time.monotonic() - t0, 1)}  # fmt: skip
    (run_dir / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    say(f"done in {result['wall_s']:.0f} s: {video}, {', '.join(str(f) for f in figures)}, {run_dir / 'result.json'}")
    return result


def _parser() -> argparse.ArgumentParser:
    d = LoopDemoConfig()
    p = argparse.ArgumentParser(prog="heisd-libero sim-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=",".join(d.methods))
    p.add_argument("--suite", default=d.suite)
    p.add_argument("--task", type=int, default=d.task)
    p.add_argument("--init-state", type=int, default=d.init_state)
    p.add_argument("--time-mode", choices=("lockstep", "arm_time"), default=d.time_mode)
    p.add_argument("--latency-scale", type=float, default=d.latency_scale)
    p.add_argument("--control-rate-hz", type=float, default=d.control_rate_hz)
    p.add_argument("--max-steps", type=int, default=d.max_steps)
    p.add_argument("--db-path", default=d.db_path, help="the task's database (default: built once under artifacts/mini_libero_db)")
    p.add_argument("--out", default=d.out)
    p.add_argument("--domain-id", type=int, default=d.domain_id)
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    cfg = LoopDemoConfig(methods=tuple(a.methods.split(",")), suite=a.suite, task=a.task, init_state=a.init_state,
                         time_mode=a.time_mode, latency_scale=a.latency_scale, control_rate_hz=a.control_rate_hz,
                         max_steps=a.max_steps, db_path=a.db_path, out=a.out, domain_id=a.domain_id)  # fmt: skip
    try:
        run(cfg)
    except HeisdError as e:
        print(f"heisd-libero sim-demo: {e}", file=sys.stderr)
        return 1
    return 0
