"""`heisd dagger`: roll a trained VLA out in LIBERO and label every visited state with the expert.

Usage:
    heisd dagger --model models/mini_libero/vla --suite libero_object --tasks 0-9 --init-states 20-31 \\
        --out artifacts/dagger [--beta 0.5] [--max-steps 280] [--seed 0] [--dtype float32] [--threads 1]

Why: a policy trained on expert demonstrations only meets its own mistakes at test time, states the
demos never visit, and compounds them (Ross et al., DAgger). benchmarks/NOTES.md entry 24 measured
that more model or inputs do not help the mini VLA (its token accuracy is at the labels' ceiling);
what it lacks is data from where it actually goes.

Each step of an episode: the waypoint expert (in `resync` mode, so it follows a scene that someone
else moves) labels the observation; the executed action is the expert's with probability `--beta`
(seeded, per step) and the VLA's greedy (`ar`) action otherwise. Every visited step is recorded
with the *expert's* label, successful episode or not, in LIBERO's HDF5 layout (one file per task,
`OUT/SUITE/<task>_dagger.hdf5`, `dones[-1]` = success of the mixed controller, episode numbers
offset by 500 so they never collide with the demos'). Train on demos + these files together
(`heisd train-vla --demos DIR` over a directory holding both; `--init-from` to fine-tune).
Init states 40-49 are refused (evaluation only). Re-running skips finished (task, init state)
pairs. OUT/SUITE/summary.json records per task the episodes, mixed-controller successes, and
how often the VLA's action agreed with the label.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_ros.core.gripper import finger_gap
from heisd_ros.tools.gen_demos import (
    StopBetweenEpisodes, episode_seed, git_revision, parse_range, refuse_eval_init_states,
)

EPISODE_OFFSET = 500
"""DAgger episode i of task k is database/training episode k * 1000 + 500 + i (demos: k * 1000 + i)."""


@dataclass(frozen=True)
class DaggerConfig:
    model_dir: str = "models/mini_libero/vla"
    suite: str = "libero_object"
    tasks: tuple[int, ...] = tuple(range(10))
    init_states: tuple[int, ...] = tuple(range(20, 32))
    out_dir: str = "artifacts/dagger"
    beta: float = 0.5
    """Probability that a step executes the expert's action instead of the VLA's."""
    max_steps: int = 280
    seed: int = 0
    camera_size_px: int = 128
    dtype: str = "float32"
    threads: int = 1
    progress: bool = True

    def __post_init__(self) -> None:
        refuse_eval_init_states(self.init_states)
        if not self.tasks or not self.init_states:
            raise ConfigError("need at least one task and one init state")
        if not 0.0 <= self.beta <= 1.0:
            raise ConfigError("beta must be in [0, 1]")
        if self.max_steps < 10 or self.threads < 1:
            raise ConfigError("need max_steps >= 10 and threads >= 1")


def run_episode(env, expert, decoder, init_state: int, beta: float, seed: int, max_steps: int):
    """One mixed-control episode; returns (Episode with expert labels and images, VLA/label agreement [7])."""
    from heisd_ros.core.types import Observation
    from heisd_ros.sim.recorder import EpisodeBuffer

    rng = np.random.default_rng(seed)
    vla = decoder.vla
    obs = env.reset(init_state)
    expert.reset(env.goal, seed=seed)
    decoder.reset(env.instruction)
    buffer, frames = EpisodeBuffer(), {}
    agree = np.zeros(7)
    success = False
    for _ in range(max_steps):
        label = expert.act(obs)
        action, stats = decoder.step(Observation(obs.images, env.instruction, obs.ee_pos,
                                                    gripper_gap=finger_gap(obs.gripper_qpos)))
        # Agreement in the VLA's own token space: the label's tokens against the ones it decoded.
        agree += np.asarray(stats.tokens) == vla.action_tokenizer.encode(vla.stats().normalise(label))
        buffer.append(obs, label, env.get_state())
        for view, image in obs.images.items():
            frames.setdefault(view, []).append(image)
        obs, success = env.step(label if rng.random() < beta else action)
        if success:
            break
    episode = buffer.build(instruction=env.instruction, success=success, init_state_index=init_state, seed=seed)
    episode.images = {view: np.stack(images) for view, images in frames.items()}
    return episode, agree / max(len(buffer), 1)


def run(cfg: DaggerConfig, stop: StopBetweenEpisodes | None = None) -> dict[str, Any]:
    import torch
    from tqdm import tqdm

    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.engine import HybridDecoder
    from heisd_ros.models.demo_pipeline import write_json
    from heisd_ros.models.loader import load_vla
    from heisd_ros.sim.expert import ExpertConfig, WaypointExpert
    from heisd_ros.sim.libero_env import LiberoEnv, LiberoEnvConfig
    from heisd_ros.sim.recorder import Hdf5DemoWriter

    torch.set_num_threads(cfg.threads)
    vla = load_vla(cfg.model_dir, dtype=cfg.dtype)
    decoder = HybridDecoder(vla, DecoderConfig(method="ar", dtype=cfg.dtype))
    expert = WaypointExpert(ExpertConfig(resync=True))
    root = Path(cfg.out_dir) / cfg.suite
    summary_path = root / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {"tasks": {}}
    summary.update(config=asdict(cfg), git_revision=git_revision())
    bar = tqdm(total=len(cfg.tasks) * len(cfg.init_states), desc="dagger", unit="ep", disable=not cfg.progress)
    for task in cfg.tasks:
        entry = summary["tasks"].setdefault(str(task), {"episodes": []})
        done = {e["init_state"] for e in entry["episodes"]}
        todo = [k for k in cfg.init_states if k not in done]
        bar.update(len(cfg.init_states) - len(todo))
        if not todo:
            continue
        env = LiberoEnv(LiberoEnvConfig(suite=cfg.suite, task_index=task, camera_size_px=cfg.camera_size_px))
        name = str(env.task.name)
        attrs = {"problem_info": env.problem_info, "bddl_file_name": env.bddl_file, "suite": cfg.suite,
                 "task_index": task, "task_name": name, "instruction": env.instruction,
                 "episode_offset": EPISODE_OFFSET, "source": "heisd dagger", "beta": cfg.beta,
                 "labelled_policy": str(cfg.model_dir)}
        with Hdf5DemoWriter(root / f"{name}_dagger.hdf5", attrs) as writer:
            written = {k for (k, _v) in writer.existing()}
            for k in todo:
                if stop is not None and stop.requested:
                    break
                seed = episode_seed(cfg.seed, task, k, 0)
                t0 = time.perf_counter()
                if k in written:  # kept before an interrupted summary write
                    entry["episodes"].append({"init_state": k, "seed": seed, "recovered": True})
                else:
                    episode, agree = run_episode(env, expert, decoder, k, cfg.beta, seed, cfg.max_steps)
                    demo = writer.write(episode, init_state=env.init_states[k])
                    entry["episodes"].append({
                        "init_state": k, "seed": seed, "success": episode.success, "length": episode.length,
                        "agreement": [round(float(a), 4) for a in agree], "demo": demo,
                        "seconds": round(time.perf_counter() - t0, 2)})
                eps = [e for e in entry["episodes"] if "success" in e]
                entry.update(task_name=name, episodes_run=len(eps), successes=sum(e["success"] for e in eps),
                             steps=int(sum(e["length"] for e in eps)))
                write_json(summary_path, summary)  # atomic: a kill never leaves half a summary
                bar.update(1)
                bar.set_postfix(task=task, ok=entry["successes"], len=eps[-1]["length"] if eps else 0)
        env.close()
        if stop is not None and stop.requested:
            print(f"dagger: stopped by signal after task {task}; rerun the same command to resume")
            break
    bar.close()
    return summary


def build_parser() -> argparse.ArgumentParser:
    d = DaggerConfig()
    p = argparse.ArgumentParser(prog="heisd dagger", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default=d.model_dir, help="VLA checkpoint directory to roll out")
    p.add_argument("--suite", default=d.suite)
    p.add_argument("--tasks", default="0-9")
    p.add_argument("--init-states", default="20-31", help="init states within 0-39 (40-49 are for evaluation)")
    p.add_argument("--out", default=d.out_dir, help="output root; files go to OUT/SUITE/")
    p.add_argument("--beta", type=float, default=d.beta, help="probability of executing the expert's action")
    p.add_argument("--max-steps", type=int, default=d.max_steps)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--camera-size", type=int, default=d.camera_size_px)
    p.add_argument("--dtype", default=d.dtype, choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    cfg = DaggerConfig(model_dir=a.model, suite=a.suite, tasks=parse_range(a.tasks), init_states=parse_range(a.init_states),
                       out_dir=a.out, beta=a.beta, max_steps=a.max_steps, seed=a.seed, camera_size_px=a.camera_size,
                       dtype=a.dtype, threads=a.threads, progress=a.progress)
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    with StopBetweenEpisodes() as stop:
        data = run(cfg, stop)
    brief = {i: {k: t.get(k) for k in ("task_name", "episodes_run", "successes", "steps")}
             for i, t in data["tasks"].items() if int(i) in cfg.tasks}
    print(json.dumps({"out": str(Path(cfg.out_dir) / cfg.suite), "tasks": brief}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
