"""`heisd-libero sim-episodes`: LIBERO episodes through `policy_node` and the simulated arm, per method.

    heisd-libero sim-episodes --methods ar,heisd --tasks 0-9 --init-states 40-41 --time-mode arm_time \
        --db-path artifacts/eval_object/db --out /tmp/sim_episodes.json

For each method a `policy_node` process runs a published mini policy (`--policy`, default
models/mini_libero: model, drafter, operating point; `--db-path` the database of the tasks) with `use_sim_time` at
`--control-rate-hz`; the simulated arm (heisd_libero/sim_arm.py) runs every (task, init state)
through it, in lockstep or arm time. The report has, per method: success, steps and task time in
simulation seconds, the frame-to-command age (the wall latency the arm time turns into simulation
time, times the scale), the node's decode step (DecodeStats total_ms) and its mode mix; each
episode's figures are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from heisd_libero.eval_evidence import contended
from heisd_libero.shadow_recorder import ShadowRecorder
from heisd_ros.pipeline.libero_runs import PUBLISHED_DIR, published_paths
from heisd_ros.pipeline.outputs import git_revision
from heisd_ros.ros.node_main import stop_process
from heisd_ros.tools.args import parse_range

DOMAIN_ID = 79
SIM_PARAMS = str(Path(__file__).resolve().parent / "config" / "sim_policy.yaml")
"""The policy node's simulator settings (sim time, commanding on), as sim.launch.py applies them."""


def node_command(method: str, db_path: str, control_rate_hz: float, policy: str = PUBLISHED_DIR,
                 **params: Any) -> list[str]:  # fmt: skip
    """The `policy_node` command line of `start_node`."""
    paths = published_paths(policy)
    params = {"model_dir": paths["model_dir"], "drafter_dir": paths["drafter_dir"],
              "calibration_path": paths["calibration_path"], "db_path": db_path, "decoder.method": method,
              "control_rate_hz": float(control_rate_hz), **params}  # fmt: skip
    cmd = [sys.executable, "-m", "heisd_ros.ros.node", "--params-file", "config/policy.yaml", "--params-file", SIM_PARAMS]
    for k, v in params.items():
        cmd += ["-p", f"{k}:={v}"]
    return cmd


def start_node(method: str, db_path: str, control_rate_hz: float, log_dir: str, domain_id: int,
               policy: str = PUBLISHED_DIR, **params: Any) -> subprocess.Popen:  # fmt: skip
    """A `policy_node` process running the published mini policy at `policy` with `method`, in
    simulation time; `params` set more of its parameters (e.g. calibration_path, shadow.method)."""
    cmd = node_command(method, db_path, control_rate_hz, policy, **params)
    log = Path(log_dir) / f"node_{method}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ROS_DOMAIN_ID": str(domain_id), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def percentile(values, q: float) -> float | None:
    """The q-th percentile, to 0.01 (None for no values)."""
    return round(float(np.percentile(values, q)), 2) if len(values) else None


def episode_record(task: int, init_state: int, out: Any, stats: dict[float, tuple[float, str, float]],
                   latency_scale: float) -> dict[str, Any]:
    """One episode's figures (`SimArm.run_episode`'s outcome and `take_stats`), as the report keeps them."""
    keys = sorted(stats)
    return {"task": task, "init_state": init_state, "success": out.success, "steps": out.steps,
            "sim_time_s": round(out.sim_time_s, 3), "ended": out.ended,
            "frame_to_command_s": [round(latency_scale * x, 5) for x in out.latencies_s],
            "held_steps": out.held_steps, "waits": out.waits, "decode_ms": [stats[k][0] for k in keys],
            "modes": [stats[k][1] for k in keys], "cpu_ms": [round(stats[k][2], 2) for k in keys]}  # fmt: skip


def summary(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """A method's figures over its episodes (`episode_record`s)."""
    ages = np.array([a for e in episodes for a in e["frame_to_command_s"]]) * 1e3
    decode = np.array([d for e in episodes for d in e["decode_ms"]])
    steps = [{"ms": {"total": d}, "cpu_ms": c} for e in episodes for d, c in zip(e["decode_ms"], e["cpu_ms"])]
    modes: dict[str, int] = {}
    for e in episodes:
        for m in e["modes"]:
            modes[m] = modes.get(m, 0) + 1
    return {
        "episodes": len(episodes), "successes": sum(e["success"] for e in episodes),
        "task_time_s_mean": round(float(np.mean([e["sim_time_s"] for e in episodes])), 3) if episodes else None,
        "steps_mean": round(float(np.mean([e["steps"] for e in episodes])), 1) if episodes else None,
        "frame_to_command_ms": {"p50": percentile(ages, 50), "p95": percentile(ages, 95)},
        "decode_ms": {"mean": round(float(decode.mean()), 2) if len(decode) else None, "p95": percentile(decode, 95)},
        "mode_mix": modes,
        # eval-libero's rule: a step whose wall time its own CPU time does not explain waited for a CPU
        "contended_share": round(sum(map(contended, steps)) / len(steps), 4) if steps else None,
    }  # fmt: skip


def run(args: argparse.Namespace, say=print) -> dict[str, Any]:
    os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering, before MuJoCo is first imported
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    import rclpy

    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig, scene_shift_seed
    from heisd_libero.sim_arm import SimArm, SimArmConfig

    report: dict[str, Any] = {"command": "heisd-libero sim-episodes " + " ".join(args.argv), "git_rev": git_revision(),
                              "config": {k: v for k, v in vars(args).items() if k != "argv"}, "methods": {}}  # fmt: skip
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=args.domain_id)
    try:
        for method in args.methods.split(","):
            params = {"calibration_path": args.point} if args.point else {}
            recorder = proc = None
            shadowed = bool(args.shadow_bags) and method != "heisd"
            if shadowed:  # every step shadowed in lockstep (the arm waits); in arm time only where the period has room
                params.update({"shadow.method": "heisd", "shadow.when": "always" if args.time_mode == "lockstep" else "slack"})
            episodes = []
            try:
                recorder = ShadowRecorder(Path(args.shadow_bags) / method, ctx) if shadowed else None
                proc = start_node(method, args.db_path, args.control_rate_hz, args.log_dir, args.domain_id, args.policy,
                                  **params)  # fmt: skip
                for task in parse_range(args.tasks):
                    env = LiberoEnv(LiberoEnvConfig(suite=args.suite, task_index=task))
                    try:
                        for init in parse_range(args.init_states):
                            # the same shifted scene as eval-libero's episode of this (task, init state)
                            seed = scene_shift_seed(args.scene_seed, task, init)
                            cfg = SimArmConfig(init_state=init, scene_shift_m=args.scene_shift_m, scene_seed=seed,
                                               control_rate_hz=args.control_rate_hz, max_steps=args.max_steps,
                                               time_mode=args.time_mode, latency_scale=args.latency_scale)  # fmt: skip
                            arm = SimArm(env, cfg, context=ctx, record_stats=True)
                            try:
                                if not arm.wait_for_node(180.0):
                                    raise RuntimeError(f"policy_node ({method}) did not come up; see {args.log_dir}")
                                t0 = time.monotonic()
                                out = arm.run_episode()
                                stats = arm.take_stats(expect=len(out.frame_stamps_s))
                            finally:
                                arm.close()
                            episodes.append({**episode_record(task, init, out, stats, args.latency_scale),
                                             "wall_s": round(time.monotonic() - t0, 1)})
                            say(f"sim-episodes: {method} task {task} init {init}: "
                                f"{'success' if out.success else out.ended} in {out.steps} steps ({out.sim_time_s:.1f} s sim)")
                    finally:
                        env.close()
            finally:
                code = stop_process(proc) if proc is not None else None
                if recorder is not None:
                    recorder.close()
            report["methods"][method] = {"summary": summary(episodes), "node_exit_code": code, "episodes": episodes,
                                         **({"shadow_records": recorder.records} if recorder else {})}  # fmt: skip
    finally:
        rclpy.shutdown(context=ctx)
    return report


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="heisd-libero sim-episodes", description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="ar,heisd")
    p.add_argument("--suite", default="libero_object")
    p.add_argument("--tasks", default="0")
    p.add_argument("--init-states", default="40")
    p.add_argument("--scene-shift-m", type=float, default=0.0)
    p.add_argument("--scene-seed", type=int, default=0, help="eval-libero's --scene-seed: the same scenes")
    p.add_argument("--time-mode", choices=("lockstep", "arm_time"), default="arm_time")
    p.add_argument("--latency-scale", type=float, default=1.0)
    p.add_argument("--control-rate-hz", type=float, default=20.0)
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--db-path", default="artifacts/mini_libero_db/libero_object_task0",
                   help="the database of the tasks run (the demo's holds task 0 only)")
    p.add_argument("--policy", default=PUBLISHED_DIR, metavar="DIR",
                   help="the published mini policy the node runs (vla/, drafter/, calibration.json), e.g. "
                        "models/mini_libero_spatial for --suite libero_spatial")
    p.add_argument("--point", default="", metavar="FILE",
                   help="the operating-point file the node runs (default: the policy's calibration.json)")
    p.add_argument("--shadow-bags", default="", metavar="DIR",
                   help="shadow mode: methods other than heisd run with shadow.method heisd, records to DIR/<method>")
    p.add_argument("--domain-id", type=int, default=DOMAIN_ID)
    p.add_argument("--log-dir", default="artifacts/sim_episodes")
    p.add_argument("--out", default="artifacts/sim_episodes/report.json")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    report = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for method, r in report["methods"].items():
        print(f"{method}: {json.dumps(r['summary'])}")
    return 0


