"""Closed-loop nearest-neighbour policies on privileged simulator state (NOTES 38).

Can behaviour cloning of these demos succeed at all, and on what input? Each step, the action of
the nearest demo step of the same task is executed (no learning, no images):

- `robot`: end-effector position (m) and finger gap (m, times `--gap-weight`): what the VLA's state
  token carries, plus the gripper opening;
- `dwell`: end-effector position and, times `--gap-weight`, for how many steps (capped at 16, / 16)
  the gripper has held its command: exactly the state token of the mini VLAs
  (`--proprio --gripper-dwell 16`), counted by the node's own `GripperDebounce`;
- `full`: the simulator's full state vector (every body's pose and velocity, the entries that vary
  across the demos, standardised), the input of benchmarks/label_ceiling.py, minus the clock.

If `robot` succeeds where the VLA fails, the VLA's trouble is how it reads its position, not the
demos; if `full` does worse than `robot`, the extra state hides the position in a nearest-neighbour
metric.

    MUJOCO_GL=egl .venv/bin/python benchmarks/nn_closed_loop.py --demos artifacts/demos_db/libero_object \
        --tasks 0-9 --init-states 40-41 --features robot --gap-weight 5 --json benchmarks/nn_closed_loop.json

No rendering, so it is quick (~2 s per episode).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import h5py
import numpy as np

from heisd_ros.core.gripper import GripperDebounce
from heisd_ros.pipeline.features import gripper_dwell
from heisd_ros.tools.args import parse_range

DWELL_CAP = 16


def demo_table(demos: Path, task: int, features: str, gap_weight: float):
    """(feature rows [N, F], actions [N, 7], feature function of an env) over the task's demos."""
    rows, actions = [], []
    for f in sorted(demos.glob("*.hdf5")):
        with h5py.File(f) as h:
            if int(h["data"].attrs["task_index"]) != task:
                continue
            for name in h["data"]:
                ep = h["data"][name]
                actions.append(ep["actions"][()])
                if features == "dwell":
                    d = np.minimum(gripper_dwell(ep["actions"][()]), DWELL_CAP) / DWELL_CAP
                    rows.append(np.hstack([ep["obs/ee_pos"][()], gap_weight * d[:, None]]))
                elif features == "robot":
                    g = ep["obs/gripper_states"][()]
                    rows.append(np.hstack([ep["obs/ee_pos"][()], gap_weight * (g[:, :1] - g[:, 1:])]))
                else:
                    rows.append(ep["states"][()])
    if not rows:
        raise SystemExit(f"no demos of task {task} in {demos}")
    x, a = np.concatenate(rows), np.concatenate(actions)
    if features == "dwell":
        return x, a, lambda env, obs, dwell: np.hstack([obs.ee_pos, gap_weight * min(dwell, DWELL_CAP) / DWELL_CAP])
    if features == "robot":
        return x, a, lambda env, obs, dwell: np.hstack([obs.ee_pos, gap_weight * (obs.gripper_qpos[:1] - obs.gripper_qpos[1:])])
    mu, sd = x.mean(0), x.std(0)
    live = sd > 1e-3  # static bodies: their scaled noise would dominate the distance
    live[0] = False  # the clock: an episode that falls behind would be matched to the wrong phase
    return (x[:, live] - mu[live]) / sd[live], a, lambda env, obs, dwell: (env.get_state()[live] - mu[live]) / sd[live]


def closed_loop(suite: str, task: int, init_states: str, max_steps: int, act) -> list[dict]:
    """Run `act(env, obs, gripper_dwell) -> action [7]` from each init state of one task, no
    rendering; one record per episode (also printed to stderr as it ends)."""
    from heisd_ros.sim.libero_env import LiberoEnv, LiberoEnvConfig

    episodes = []
    env = LiberoEnv(LiberoEnvConfig(suite=suite, task_index=task, views=("agentview",)))
    try:
        for init in parse_range(init_states):
            obs, ok = env.reset(init), False
            gripper = GripperDebounce(0)  # the node's own count of executed gripper commands
            for t in range(max_steps):
                action = act(env, obs, gripper.dwell)
                gripper(float(action[6]))
                obs, ok = env.step(action, render=False)
                if ok:
                    break
            episodes.append({"task": task, "init_state": init, "success": bool(ok), "steps": t + 1})
            print(json.dumps(episodes[-1]), file=sys.stderr, flush=True)
    finally:
        env.close()
    return episodes


def run(args) -> dict:
    episodes = []
    for task in parse_range(args.tasks):
        x, a, feat = demo_table(Path(args.demos), task, args.features, args.gap_weight)

        def nearest(env, obs, dwell, x=x, a=a, feat=feat):
            return a[np.argmin(((x - feat(env, obs, dwell)) ** 2).sum(1))]

        episodes += closed_loop(args.suite, task, args.init_states, args.max_steps, nearest)
    wins = sum(e["success"] for e in episodes)
    return {"demos": args.demos, "features": args.features, "gap_weight": args.gap_weight,
            "max_steps": args.max_steps, "success": wins, "episodes_run": len(episodes),
            "success_rate": wins / max(len(episodes), 1), "episodes": episodes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--demos", default="artifacts/demos_db/libero_object")
    p.add_argument("--suite", default="libero_object")
    p.add_argument("--tasks", default="0-9")
    p.add_argument("--init-states", default="40-41")
    p.add_argument("--features", choices=("robot", "dwell", "full"), default="robot")
    p.add_argument("--gap-weight", type=float, default=5.0)
    p.add_argument("--max-steps", type=int, default=280)
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    res = run(args)
    print(f"{args.features} on {args.demos}: {res['success']}/{res['episodes_run']}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
