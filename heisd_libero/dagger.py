"""`heisd-libero dagger`: roll a policy out in LIBERO and label every state it visits with the expert.

Usage:
    heisd-libero dagger --model models/mini_libero/vla --suite libero_object --tasks 0-9 --init-states 0-19 \\
        --out artifacts/dagger/r1 [--beta 0.5] [--episode-offset 500] [--max-steps 280] [--seed 0] \\
        [--threads 1] [--camera-size 128]

A policy trained on expert demonstrations meets its own mistakes only at run time, in states the
demonstrations never visit (Ross et al.'s DAgger). Each step of an episode here: the waypoint
expert, in `resync` mode (it re-derives its phase from the scene someone else moves), labels the
observation from the simulator's privileged object poses; the step executes the expert's action
with probability `--beta` (seeded, per step) and the policy's greedy `ar` action (with its state
prior) otherwise. Every visited step is written with the *expert's* label, successful episode or
not, in LIBERO's HDF5 layout: `OUT/SUITE/<task>_dagger.hdf5`, `dones[-1]` the mixed controller's
success, episode numbers from `--episode-offset` (give every round its own, so rounds and demos
share one training directory without colliding). Train on demos + rounds together
(`heisd-libero train-vla --demos DIR --init-from MODEL`, `heisd train-prior`); the demonstration
database keeps the expert's demos only.

Init states 0-19 only: 20-29 choose the operating point, 30-39 screen policies, 40-49 evaluate.
Re-running skips finished (task, init state) pairs. OUT/SUITE/summary.json records per task the
episodes, the mixed controller's successes and how often the policy's tokens equalled the label's.
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
from heisd_ros.pipeline.outputs import git_revision, progress_bar, write_json
from heisd_ros.tools.args import parse_range
from heisd_libero.gen_demos import StopBetweenEpisodes, episode_seed

DAGGER_INIT_STATES = range(0, 20)
"""The init states a rollout may use: the demonstrations'. Policies are screened on 30-39."""


@dataclass(frozen=True)
class DaggerConfig:
    """What `heisd-libero dagger` rolls out and where it writes the labelled states."""

    model_dir: str = "models/mini_libero/vla"
    suite: str = "libero_object"
    tasks: tuple[int, ...] = tuple(range(10))
    init_states: tuple[int, ...] = tuple(DAGGER_INIT_STATES)
    out_dir: str = "artifacts/dagger/r1"
    beta: float = 0.5
    """Probability that a step executes the expert's action instead of the policy's."""
    episode_offset: int = 500
    """Episode number of init state 0 of this round (demos use 0-19)."""
    max_steps: int = 280
    seed: int = 0
    camera_size_px: int = 128
    threads: int = 1
    progress: bool = True

    def __post_init__(self) -> None:
        outside = sorted(set(self.init_states) - set(DAGGER_INIT_STATES))
        if outside:
            raise ConfigError(f"init states {outside} refused: DAgger rolls out at 0-19 only "
                              "(20-29 choose the operating point, 30-39 screen, 40-49 evaluate)")
        if not self.tasks or not self.init_states:
            raise ConfigError("need at least one task and one init state")
        if not 0.0 <= self.beta <= 1.0:
            raise ConfigError("beta must be in [0, 1]")
        if self.max_steps < 10 or self.threads < 1 or self.episode_offset < 20:
            raise ConfigError("need max_steps >= 10, threads >= 1 and episode_offset >= 20 (above the demos)")


def run_episode(env, expert, decoder, init_state: int, beta: float, seed: int, max_steps: int):
    """One mixed-control episode: (Episode of expert labels with images, policy/label token agreement [7])."""
    from heisd_ros.core.gripper import finger_gap
    from heisd_ros.core.types import Observation
    from heisd_libero.sim.recorder import EpisodeBuffer

    rng = np.random.default_rng(seed)
    vla = decoder.vla
    obs = env.reset(init_state, seed=seed)  # the seed places the fixtures (LIBERO-Spatial's), as gen-demos'
    expert.reset(env.goal, seed=seed)
    decoder.reset(env.instruction)
    buffer, frames = EpisodeBuffer(), {}
    agree = np.zeros(7)
    success = False
    for _ in range(max_steps):
        label = expert.act(obs)
        action, stats = decoder.step(Observation(obs.images, env.instruction, obs.ee_pos,
                                                 gripper_gap=finger_gap(obs.gripper_qpos)))
        # agreement in the policy's own token space: the label's tokens against the decoded ones
        agree += np.asarray(stats.tokens) == vla.action_tokenizer.encode(decoder.stats_norm.normalise(label))
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

    from heisd_ros.assembly import PolicyParts, assemble_decoders
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.models.loader import load_policy_model
    from heisd_libero.sim.expert import ExpertConfig, WaypointExpert

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    vla, prior = load_policy_model(cfg.model_dir)
    decoder = assemble_decoders(PolicyParts(vla, prior), {"ar": DecoderConfig(method="ar")})["ar"]
    expert = WaypointExpert(ExpertConfig(resync=True))
    root = Path(cfg.out_dir) / cfg.suite
    summary_path = root / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {"tasks": {}}
    summary.update(config=asdict(cfg), git_revision=git_revision())
    bar = progress_bar(len(cfg.tasks) * len(cfg.init_states), "dagger", cfg.progress, unit="ep")
    try:
        for task in cfg.tasks:
            _run_task(cfg, task, summary, summary_path, decoder, expert, bar, stop)
            if stop is not None and stop.requested:
                print(f"dagger: stopped by signal after task {task}; rerun the same command to resume")
                break
    finally:
        bar.close()
    return summary


def _run_task(cfg: DaggerConfig, task: int, summary: dict[str, Any], summary_path: Path, decoder, expert, bar,
              stop: StopBetweenEpisodes | None) -> None:
    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig
    from heisd_libero.sim.recorder import Hdf5DemoWriter

    entry = summary["tasks"].setdefault(str(task), {"episodes": []})
    todo = [k for k in cfg.init_states if k not in {e["init_state"] for e in entry["episodes"]}]
    bar.update(len(cfg.init_states) - len(todo))
    if not todo:
        return
    env = LiberoEnv(LiberoEnvConfig(suite=cfg.suite, task_index=task, camera_size_px=cfg.camera_size_px))
    name = str(env.task.name)
    attrs = {"problem_info": env.problem_info, "bddl_file_name": env.bddl_file, "suite": cfg.suite,
             "task_index": task, "task_name": name, "instruction": env.instruction,
             "episode_offset": cfg.episode_offset, "source": "heisd-libero dagger", "beta": cfg.beta,
             "labelled_policy": str(cfg.model_dir)}
    try:
        with Hdf5DemoWriter(Path(cfg.out_dir) / cfg.suite / f"{name}_dagger.hdf5", attrs) as writer:
            written = writer.existing()
            for k in todo:
                if stop is not None and stop.requested:
                    break
                seed = episode_seed(cfg.seed, task, k, 0)
                t0 = time.perf_counter()
                if (k, 0) in written:  # kept before an interrupted summary write: never labelled twice
                    demo, length = written[(k, 0)]
                    entry["episodes"].append({"init_state": k, "seed": seed, "length": length, "demo": demo,
                                              "recovered": True, "success": None})
                else:
                    episode, agree = run_episode(env, expert, decoder, k, cfg.beta, seed, cfg.max_steps)
                    demo = writer.write(episode, init_state=env.init_states[k])
                    entry["episodes"].append({"init_state": k, "seed": seed, "success": episode.success,
                                              "length": episode.length, "demo": demo,
                                              "agreement": [round(float(a), 4) for a in agree],
                                              "seconds": round(time.perf_counter() - t0, 2)})
                eps = entry["episodes"]
                entry.update(task_name=name, episodes_run=len(eps), successes=sum(bool(e["success"]) for e in eps),
                             steps=int(sum(e["length"] for e in eps)))
                write_json(summary_path, summary)  # atomic: a kill never leaves half a summary
                bar.update(1)
    finally:
        env.close()


def build_parser() -> argparse.ArgumentParser:
    d = DaggerConfig()
    p = argparse.ArgumentParser(prog="heisd-libero dagger", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", default=d.model_dir, help="VLA directory to roll out (its state prior is used)")
    p.add_argument("--suite", default=d.suite)
    p.add_argument("--tasks", default="0-9")
    p.add_argument("--init-states", default="0-19", help="init states within 0-19")
    p.add_argument("--out", default=d.out_dir, help="output root; files go to OUT/SUITE/")
    p.add_argument("--beta", type=float, default=d.beta, help="probability of executing the expert's action")
    p.add_argument("--episode-offset", type=int, default=d.episode_offset,
                   help="episode number of init state 0 (one per round; demos use 0-19)")
    p.add_argument("--max-steps", type=int, default=d.max_steps)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--camera-size", type=int, default=d.camera_size_px)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        cfg = DaggerConfig(model_dir=a.model, suite=a.suite, tasks=parse_range(a.tasks),
                           init_states=parse_range(a.init_states), out_dir=a.out, beta=a.beta,
                           episode_offset=a.episode_offset, max_steps=a.max_steps, seed=a.seed,
                           camera_size_px=a.camera_size, threads=a.threads, progress=a.progress)
    except ConfigError as err:
        print(f"heisd-libero dagger: {err}")
        return 2
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
