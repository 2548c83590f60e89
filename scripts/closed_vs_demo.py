"""Diagnostic: drive a policy (ar) in LIBERO from a *training* init state, beside its own demo.

Prints, per step, the end effector and the action of the closed loop next to the demo's, so the
step where the policy leaves the demonstrations shows (benchmarks/NOTES.md entries 18-19).

    MUJOCO_GL=egl .venv/bin/python scripts/closed_vs_demo.py MODEL_DIR TASK INIT_STATE [STEPS] \
        [--demos artifacts/demos_db/libero_object]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import h5py
import numpy as np
import torch

from heisd_ros.core.config import DecoderConfig
from heisd_ros.core.types import Observation
from heisd_ros.policy import PolicyPaths, load_policy
from heisd_ros.sim.libero_env import LiberoEnv, LiberoEnvConfig


def find_demo(demos: Path, task: int, init_state: int):
    """The unperturbed demo (variant 0) of `init_state` in the task's HDF5 file."""
    for path in sorted(demos.glob("*.hdf5")):
        f = h5py.File(path, "r")
        if int(f["data"].attrs["task_index"]) != task:
            continue
        for name, g in f["data"].items():
            if int(g.attrs["init_state_index"]) == init_state and int(g.attrs["variant"]) == 0:
                return name, g
    raise SystemExit(f"no demo of task {task} at init state {init_state} under {demos}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("task", type=int)
    p.add_argument("init_state", type=int)
    p.add_argument("steps", type=int, nargs="?", default=200)
    p.add_argument("--demos", default="artifacts/demos_db/libero_object")
    args = p.parse_args()
    torch.set_num_threads(1)
    env = LiberoEnv(LiberoEnvConfig(task_index=args.task))
    obs = env.reset(args.init_state)
    name, demo = find_demo(Path(args.demos), args.task, args.init_state)
    first = demo["obs"]["agentview_rgb"][0].astype(float)
    print(f"demo {name}, {len(demo['actions'])} steps; agentview mean |diff| at t=0: "
          f"{np.abs(first - obs.images['agentview']).mean():.3f} (flipped: {np.abs(first[::-1] - obs.images['agentview']).mean():.3f})")
    decoder = load_policy(PolicyPaths(model_dir=args.model), DecoderConfig(method="ar", dtype="float32"))
    decoder.reset(env.instruction)
    demo_ee, demo_act = demo["obs"]["ee_pos"][()], demo["actions"][()]
    np.set_printoptions(precision=3, suppress=True)
    for t in range(args.steps):
        action, _ = decoder.step(Observation(obs.images, env.instruction, obs.ee_pos))
        line = f"{t:3d} ee {obs.ee_pos} act {np.round(action, 2)}"
        if t < len(demo_act):
            line += f" | demo ee {demo_ee[t]} act {np.round(demo_act[t], 2)}"
        print(line)
        obs, success = env.step(action)
        if success:
            print(f"success at step {t}")
            break
    env.close()


if __name__ == "__main__":
    main()
