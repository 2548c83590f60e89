"""`heisd-libero gen-demos`: scripted LIBERO demonstrations (docs/design.md §9).

Usage:
    heisd-libero gen-demos --suite libero_object --tasks 0-9 --init-states 0-39 --out artifacts/demos \
        [--camera-size 128] [--seed 0] [--max-steps 300] [--perturbations 0] [--no-bags]
        [--noise-std 0.03] [--rot-noise-std S] [--noise-corr 0]
        [--contact-noise-std S] [--jitter-m 0.003]

Runs the waypoint expert on every (task, init state, variant), keeps the successful episodes and
writes, per suite under OUT/SUITE/:
    <task_name>_demo.hdf5             LIBERO HDF5 layout, one file per task
    bags/<task_name>/demo_<i>/        one rosbag2 (MCAP) per kept episode, on the node's topics
    summary.json                      per task: attempts, successes, mean length, seconds, and the
                                      config, seed and git revision of the run
Variant 0 is the init state as LIBERO ships it; variants 1..N shift every movable object by a
seeded U(-d, d) in x and y. Re-running skips every (task, init state, variant) already attempted.
Init states 40-49 are reserved for evaluation and refused.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.libero_runs import EVAL_INIT_STATES
from heisd_ros.pipeline.outputs import git_revision, progress_bar, write_json
from heisd_ros.tools.args import parse_range



def refuse_eval_init_states(init_states: tuple[int, ...]) -> None:
    """ConfigError if any of `init_states` is kept for evaluation (40-49): training data uses 0-39."""
    reserved = sorted(set(init_states) & set(EVAL_INIT_STATES))
    if reserved:
        raise ConfigError(f"init states {reserved} are reserved for evaluation (40-49); demos use 0-39")


@dataclass(frozen=True)
class GenDemosConfig:
    suite: str = "libero_object"
    tasks: tuple[int, ...] = tuple(range(10))
    init_states: tuple[int, ...] = tuple(range(40))
    out_dir: str = "artifacts/demos"
    camera_size_px: int = 128
    seed: int = 0
    max_steps: int = 300
    perturbations: int = 0
    """Perturbed variants per init state (in addition to the unperturbed one)."""
    perturb_xy_m: float = 0.02
    noise_std: float = 0.03
    """Executed-action noise of the expert (recorded actions stay clean)."""
    rot_noise_std: float | None = None
    """Executed noise on the rotation actions (None: noise_std)."""
    noise_corr: float = 0.0
    """Step-to-step correlation of the executed noise (`ExpertConfig.noise_corr`)."""
    contact_noise_std: float | None = None
    """Translation noise while descending and lowering (`ExpertConfig.contact_noise_std`)."""
    waypoint_jitter_m: float = 0.003
    bags: bool = True

    def __post_init__(self) -> None:
        refuse_eval_init_states(self.init_states)
        if not self.tasks or not self.init_states:
            raise ConfigError("need at least one task and one init state")
        if min(self.init_states) < 0 or min(self.tasks) < 0:
            raise ConfigError("task and init state indices must be >= 0")
        if self.max_steps < 10 or self.perturbations < 0 or self.perturb_xy_m < 0:
            raise ConfigError("need max_steps >= 10, perturbations >= 0, perturb_xy_m >= 0")


def episode_seed(seed: int, task: int, init_state: int, variant: int) -> int:
    return int(np.random.SeedSequence([seed, task, init_state, variant]).generate_state(1)[0])


class Summary:
    """summary.json next to the data; rewritten atomically after every episode."""

    def __init__(self, path: Path, config: GenDemosConfig) -> None:
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"tasks": {}}
        self.data.update(config=asdict(config), seed=config.seed, git_revision=git_revision())

    def task(self, index: int) -> dict[str, Any]:
        return self.data["tasks"].setdefault(str(index), {"episodes": []})

    def attempted(self, index: int) -> set[tuple[int, int]]:
        return {(e["init_state"], e["variant"]) for e in self.task(index)["episodes"]}

    def add(self, index: int, info: dict[str, Any], record: dict[str, Any]) -> None:
        task = self.task(index)
        task.update(info)
        task["episodes"].append(record)
        eps = task["episodes"]
        ok = [e for e in eps if e["success"]]
        task.update(
            attempts=len(eps), successes=len(ok),
            success_rate=len(ok) / len(eps),
            mean_length=float(np.mean([e["length"] for e in ok])) if ok else None,
            mean_seconds=float(np.mean([e["seconds"] for e in eps])),
        )
        self.save()

    def save(self) -> None:
        write_json(self.path, self.data)


def file_episode_offset(path: Path, offset: int) -> int:
    """The `episode_offset` a demo file keeps: its own once it holds demos (0 for files written
    before gen-demos set one), else `offset`."""
    import h5py

    if not path.is_file():
        return offset
    with h5py.File(path, "r") as f:
        data = f.get("data")
        if data is None or len(data.keys()) == 0:
            return offset
        return int(data.attrs.get("episode_offset", 0))


def run(config: GenDemosConfig, stop: "StopBetweenEpisodes | None" = None) -> dict[str, Any]:
    """Generate the demos; returns the summary dictionary. `stop` ends the run between episodes."""
    from heisd_libero.sim.expert import ExpertConfig, WaypointExpert

    root = Path(config.out_dir) / config.suite
    summary = Summary(root / "summary.json", config)
    variants = range(config.perturbations + 1)
    jobs = [(t, k, v) for t in config.tasks for k in config.init_states for v in variants]
    expert = WaypointExpert(ExpertConfig(noise_std=config.noise_std, rot_noise_std=config.rot_noise_std,
                                         noise_corr=config.noise_corr, contact_noise_std=config.contact_noise_std,
                                         waypoint_jitter_m=config.waypoint_jitter_m))
    bar = progress_bar(len(jobs), f"gen-demos {config.suite}", unit="ep")
    for task in config.tasks:
        todo = [(k, v) for (t, k, v) in jobs if t == task and (k, v) not in summary.attempted(task)]
        bar.update(len(variants) * len(config.init_states) - len(todo))
        if not todo:
            continue
        _run_task(config, task, todo, expert, summary, bar, stop)
        if stop is not None and stop.requested:
            print(f"gen-demos: stopped by signal after task {task}; rerun the same command to resume")
            break
    bar.close()
    return summary.data


def _run_task(config: GenDemosConfig, task: int, todo: list[tuple[int, int]], expert, summary: Summary, bar,
              stop: "StopBetweenEpisodes | None") -> None:
    """The (init state, variant) episodes `todo` of one task into its HDF5 file (and bags)."""
    from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig
    from heisd_libero.sim.recorder import Hdf5DemoWriter, export_mcap, record_episode

    root = Path(config.out_dir) / config.suite
    env = LiberoEnv(LiberoEnvConfig(suite=config.suite, task_index=task, camera_size_px=config.camera_size_px))
    name = str(env.task.name)
    info = {"task_name": name, "instruction": env.instruction, "goal": list(asdict(env.goal).values())}
    path = root / f"{name}_demo.hdf5"
    with Hdf5DemoWriter(path, _file_attrs(config, task, env, path)) as writer:
        written = writer.existing()
        for k, v in todo:
            if stop is not None and stop.requested:
                break
            seed = episode_seed(config.seed, task, k, v)
            if (k, v) in written:  # kept before an interrupted summary write
                demo, length = written[(k, v)]
                summary.add(task, info, {"init_state": k, "variant": v, "seed": seed, "success": True,
                                         "length": length, "seconds": 0.0, "demo": demo})
                bar.update(1)
                continue
            t0 = time.perf_counter()
            episode = record_episode(env, expert, k, variant=v, seed=seed,
                                     perturb_xy_m=config.perturb_xy_m if v else 0.0, max_steps=config.max_steps)
            demo = writer.write(episode, init_state=env.init_states[k]) if episode.success else None
            if demo is not None and config.bags:
                export_mcap(episode, root / "bags" / name / demo)
            record = {"init_state": k, "variant": v, "seed": seed, "success": episode.success,
                      "length": episode.length, "seconds": round(time.perf_counter() - t0, 2), "demo": demo}
            summary.add(task, info, record)
            bar.update(1)
            bar.set_postfix(task=task, ok=summary.task(task)["successes"], len=episode.length)
    env.close()


def _file_attrs(config: GenDemosConfig, task: int, env, path: Path) -> dict[str, Any]:
    """The attributes of a task's demo file: LIBERO's problem and environment, and its episode offset."""
    name = str(env.task.name)
    attrs = {
        "problem_info": env.problem_info, "bddl_file_name": env.bddl_file, "suite": config.suite,
        "task_index": task, "task_name": name, "instruction": env.instruction,
        "env_args": {"env_name": "OffScreenRenderEnv", "camera_size_px": config.camera_size_px,
                     "control_freq": 20, "controller": "OSC_POSE", "settle_steps": env.config.settle_steps},
    }
    # Episode numbers (database point ids) start after the demos that lower init states would
    # have, so files of disjoint init-state ranges (gen-demos runs into other --out dirs) can
    # share one demo directory; a file that already holds demos keeps its numbering.
    attrs["episode_offset"] = file_episode_offset(path, min(config.init_states) * (config.perturbations + 1))
    return attrs


class StopBetweenEpisodes:
    """While installed, SIGTERM/SIGINT let the current episode and its files finish, then the run
    stops (resumable); a second signal terminates at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "StopBetweenEpisodes":
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.requested:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.requested = True


def build_parser() -> argparse.ArgumentParser:
    d = GenDemosConfig()
    p = argparse.ArgumentParser(prog="heisd-libero gen-demos", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--suite", default=d.suite)
    p.add_argument("--tasks", default="0-9", help="task indices, e.g. 0-9 or 0,3,5-7")
    p.add_argument("--init-states", default="0-39", help="init state indices within 0-39 (40-49 are for evaluation)")
    p.add_argument("--out", default=d.out_dir, help="output root; files go to OUT/SUITE/")
    p.add_argument("--camera-size", type=int, default=d.camera_size_px, help="square image size in pixels")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-steps", type=int, default=d.max_steps)
    p.add_argument("--perturbations", type=int, default=d.perturbations, help="perturbed variants per init state")
    p.add_argument("--perturb-xy-m", type=float, default=d.perturb_xy_m, help="object shift bound of a variant, metres")
    p.add_argument("--noise-std", type=float, default=d.noise_std, help="executed-action noise of the expert")
    p.add_argument("--rot-noise-std", type=float, default=d.rot_noise_std,
                   help="executed noise on the rotation actions (default: --noise-std)")
    p.add_argument("--noise-corr", type=float, default=d.noise_corr,
                   help="step-to-step correlation of the executed noise, in [0, 1) (0.9: pushes of ~10 steps)")
    p.add_argument("--contact-noise-std", type=float, default=d.contact_noise_std,
                   help="translation noise while descending to grasp and lowering to place (default: --noise-std)")
    p.add_argument("--jitter-m", type=float, default=d.waypoint_jitter_m, help="waypoint jitter of the expert, metres")
    p.add_argument("--no-bags", action="store_true", help="skip the rosbag2 (MCAP) export")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = GenDemosConfig(
        suite=args.suite, tasks=parse_range(args.tasks), init_states=parse_range(args.init_states),
        out_dir=args.out, camera_size_px=args.camera_size, seed=args.seed, max_steps=args.max_steps,
        perturbations=args.perturbations, perturb_xy_m=args.perturb_xy_m, noise_std=args.noise_std,
        rot_noise_std=args.rot_noise_std, noise_corr=args.noise_corr,
        contact_noise_std=args.contact_noise_std,
        waypoint_jitter_m=args.jitter_m, bags=not args.no_bags,
    )
    # MuJoCo picks its GL backend when first imported; headless CPU rendering needs EGL.
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    with StopBetweenEpisodes() as stop:
        data = run(config, stop)
    brief = {i: {k: t.get(k) for k in ("task_name", "attempts", "successes", "mean_length", "mean_seconds")}
             for i, t in data["tasks"].items() if int(i) in config.tasks}
    print(json.dumps({"suite": config.suite, "out": str(Path(config.out_dir) / config.suite), "tasks": brief}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
