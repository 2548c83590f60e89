"""heisd demo: run the policy node on a generated bag and compare decoding methods.

Usage:
    heisd demo [--model auto|tiny|DIR] [--drafter-dir DIR --db-path DIR --calibration-path FILE]
               [--scene auto|synthetic|libero] [--libero-task 0] [--libero-init-state 40]
               [--methods ar,heisd] [--episodes 1] [--steps 30] [--seed 1]
               [--params-file config/policy.yaml] [--out artifacts/demo] [--domain-id N] [--json FILE]

What it does, printing progress as it goes:
1. the policy: `--model auto` (the default) takes the mini LIBERO artifacts of the training pipeline
   (artifacts/mini_vla_prior, mini_drafter, mini_db_1v, mini_calibration.json; scripts/mini_pipeline.sh)
   when all four exist; else, with the LIBERO workbench installed (heisd_libero, docs/install.md),
   the committed compact copy of that policy (models/mini_libero, `heisd-libero publish-mini`), with
   a database of the demo task that it builds once (`heisd-libero gen-demos` of 10 expert episodes,
   then `heisd build-db`: about 4 minutes, cached under artifacts/mini_libero_db); with neither, the
   tiny policy, trained once with its drafter, database and calibration (artifacts/tiny, 2-3 min);
2. the input bag: for the mini policy (`--scene libero`), one episode of the scripted expert in
   LIBERO at an evaluation init state (40-49: in no demonstration, database or training set),
   recorded once (with the workbench's simulator) as rosbag2 MCAP on the node's topics and cached
   under artifacts/demo_bags (about a minute); for the tiny policy (`--scene synthetic`), a
   synthetic rosbag2 (two camera views, end-effector pose, instruction) of held-out episodes
   written by `heisd_ros.tools.make_bag`;
3. replays it with `heisd replay --start-node --fast` once per method: the real policy node, over
   real ROS 2 topics, with the embedded Qdrant database, one decoded step per synchronised set
   (with the pose recorded with it); each method's node is warmed up first (the bag's first
   --warmup-steps steps decoded unmeasured, then a fresh episode);
4. prints per-method figures (mode mix; mean, median, p95 and p99 decode step; LLM forwards per
   step; accept length) and, with `ar` among the methods, the speed-up over plain autoregressive
   decoding (mean ar step / mean step; a bootstrap interval over the bag's episodes needs two or
   more: --episodes), and writes them as JSON (`heisd replay`'s summary) with its figures (mode
   timeline, latency histograms, action traces against the recorded commands; with matplotlib)
   under OUT/<time>/plots.

The node's staleness limits are relaxed for the demo (replay on a busy CPU); on a robot keep the
limits of config/policy.yaml.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from heisd_ros.core.config import METHODS
from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.pipeline.bags import BagTopics, topic_counts
from heisd_ros.pipeline.libero_runs import EVAL_INIT_STATES
from heisd_ros.pipeline.optional import installed, optional_dependency

if TYPE_CHECKING:
    from heisd_ros.policy import PolicyPaths


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs."""

    model_dir: str = "auto"
    """'auto' (the mini artifacts when present, else tiny), 'tiny' (built and cached under
    artifacts/tiny) or a VLA checkpoint directory."""
    drafter_dir: str = ""
    db_path: str = ""
    calibration_path: str = ""
    scene: str = "auto"
    """Input bag: 'synthetic', 'libero' (an expert episode at an evaluation init state) or 'auto'
    (libero for the mini artifacts, synthetic otherwise)."""
    libero_suite: str = "libero_object"
    libero_task: int = 0
    libero_init_state: int = 40
    """First evaluation init state tried (the next ones if the expert fails there)."""
    methods: tuple[str, ...] = ("ar", "heisd")
    """Methods replayed side by side on the same bag."""
    episodes: int = 1
    steps: int = 30
    """Control steps per episode of the generated bag."""
    seed: int = 1
    """Scene seed of the generated bag (the tiny database is built from seed 0)."""
    params_file: str = "config/policy.yaml"
    out: str = "artifacts/demo"
    """Each run writes OUT/<time>/{input, output} bags and result.json."""
    domain_id: int = -1
    """ROS domain (-1 = ROS_DOMAIN_ID from the environment)."""
    staleness_s: float = 5.0
    """image/pose staleness limits of the demo node."""
    warmup_steps: int = 8
    """The bag's first steps, decoded unmeasured before each method's node starts."""

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in METHODS]
        if not self.methods or bad:
            raise ConfigError(f"methods must be a non-empty subset of {METHODS}, got {list(self.methods)}")
        if self.episodes < 1 or self.steps < 1:
            raise ConfigError("episodes and steps must be >= 1")
        if not self.staleness_s > 0:
            raise ConfigError("staleness_s must be > 0")
        if self.warmup_steps < 0:
            raise ConfigError("warmup_steps must be >= 0")
        if self.scene not in ("auto", "synthetic", "libero"):
            raise ConfigError(f"scene must be auto, synthetic or libero, got {self.scene!r}")
        if self.libero_init_state not in EVAL_INIT_STATES:
            raise ConfigError("libero_init_state must be an evaluation init state (40-49)")


MINI_ARTIFACTS = {"model_dir": "artifacts/mini_vla_prior", "drafter_dir": "artifacts/mini_drafter",
                  "db_path": "artifacts/mini_db_1v", "calibration_path": "artifacts/mini_calibration.json"}
"""Where the training pipeline (train-vla, train-drafter, build-db, calibrate) writes the mini policy."""
DEMO_BAGS = Path("artifacts/demo_bags")


def mini_artifacts_present(root: Path = Path(".")) -> bool:
    return (root / MINI_ARTIFACTS["model_dir"] / "config.json").is_file() and all(
        (root / p).exists() for p in MINI_ARTIFACTS.values())


PUBLISHED_DB = Path("artifacts/mini_libero_db")
"""The one-task database the demo builds for the committed mini policy (models/mini_libero)."""
PUBLISHED_DEMOS = Path("artifacts/mini_libero_demos")
PUBLISHED_DB_INIT_STATES = "0-9"
"""Demonstrations for that database: 10 expert episodes of the demo task (about 3 minutes)."""


def resolve(cfg: DemoConfig) -> DemoConfig:
    """Concrete policy paths and scene for `model_dir='auto'` / `scene='auto'` (`policy.choose_auto`):
    the pipeline's artifacts when present, else the committed mini policy (models/mini_libero, with
    a one-task database the demo builds), else the tiny policy (built by `run`). A trained policy
    found so runs on a LIBERO bag, any other on a synthetic one."""
    from heisd_ros.pipeline.libero_runs import published_paths, published_present
    from heisd_ros.policy import PolicyPaths, choose_auto, is_tiny

    trained = []  # the first present only: choose_auto takes the first
    if mini_artifacts_present():
        trained.append(PolicyPaths(**MINI_ARTIFACTS))
    elif published_present() and installed("heisd_libero"):  # its database is built from LIBERO demonstrations
        db = PUBLISHED_DB / f"{cfg.libero_suite}_task{cfg.libero_task}"
        trained.append(PolicyPaths(**{k: str(v) for k, v in published_paths().items()}, db_path=str(db)))
    given = policy_paths(cfg)
    chosen = choose_auto(given, trained)
    found_trained = chosen != given and not is_tiny(chosen.model_dir)  # 'auto' found one of `trained`
    scene = cfg.scene if cfg.scene != "auto" else "libero" if found_trained else "synthetic"
    return dataclasses.replace(cfg, model_dir=chosen.model_dir, drafter_dir=chosen.drafter_dir, db_path=chosen.db_path,
                               calibration_path=chosen.calibration_path, scene=scene)


def policy_paths(cfg: DemoConfig) -> PolicyPaths:
    """The policy files `cfg` names."""
    from heisd_ros.policy import PolicyPaths

    return PolicyPaths(cfg.model_dir, cfg.drafter_dir, cfg.db_path, cfg.calibration_path)


def libero_bag(cfg: DemoConfig, say=print) -> tuple[Path, int]:
    """An expert episode at an evaluation init state as rosbag2 MCAP (recorded once, then cached)."""
    for k in range(cfg.libero_init_state, max(EVAL_INIT_STATES) + 1):
        bag = DEMO_BAGS / f"{cfg.libero_suite}_task{cfg.libero_task}_init{k}"
        if (bag / "metadata.yaml").is_file():
            if BagTopics().joint_states in topic_counts(bag):
                return bag, _bag_steps(bag)
            say(f"      {bag} was recorded before bags carried /joint_states (the finger gap): recording it again")
            shutil.rmtree(bag)
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    with optional_dependency("recording the demo's LIBERO bag (none is cached under artifacts/demo_bags)"):
        from heisd_libero.sim.expert import WaypointExpert
        from heisd_libero.sim.libero_env import LiberoEnv, LiberoEnvConfig
        from heisd_libero.sim.recorder import export_mcap, record_episode

    env = LiberoEnv(LiberoEnvConfig(suite=cfg.libero_suite, task_index=cfg.libero_task))
    try:
        for k in range(cfg.libero_init_state, max(EVAL_INIT_STATES) + 1):
            say(f"      recording the LIBERO expert: {cfg.libero_suite} task {cfg.libero_task}, init state {k}")
            episode = record_episode(env, WaypointExpert(), k, seed=cfg.seed, max_steps=300)
            if episode.success:
                bag = DEMO_BAGS / f"{cfg.libero_suite}_task{cfg.libero_task}_init{k}"
                tmp = bag.with_name(bag.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                DEMO_BAGS.mkdir(parents=True, exist_ok=True)
                export_mcap(episode, tmp)
                tmp.rename(bag)
                return bag, episode.length
    finally:
        env.close()
    raise HeisdError(f"the expert solved none of init states {cfg.libero_init_state}-49 of task {cfg.libero_task}")


def ensure_task_db(cfg: DemoConfig, say=print) -> None:
    """Build `cfg.db_path` for the demo task when it does not exist: `heisd-libero gen-demos` (10 expert
    episodes at training init states 0-9) then `heisd build-db` with the policy's own backbone,
    pooling the views the operating point's retrieval queries (a cached database built otherwise is
    built again)."""
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.pipeline.calibration import apply_calibration
    from heisd_ros.store.manifest import read_manifest

    query_views = apply_calibration(DecoderConfig(), cfg.calibration_path).retrieval.query_views
    if Path(cfg.db_path).exists():
        built = int((read_manifest(cfg.db_path) or {}).get("query_views", 0))
        if query_views in (0, built):
            return
        say(f"      {cfg.db_path} pools {built or 'all'} view(s), the operating point {query_views}: building it again")
        shutil.rmtree(cfg.db_path)
    from heisd_ros.tools import build_db

    with optional_dependency(f"building the demo task's database {cfg.db_path} (LIBERO demonstrations)"):
        from heisd_libero import gen_demos

    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    task = str(cfg.libero_task)
    say(f"      no database at {cfg.db_path}: generating demonstrations of task {task} (about 3 min)")
    if gen_demos.main(["--suite", cfg.libero_suite, "--tasks", task, "--init-states", PUBLISHED_DB_INIT_STATES,
                       "--out", str(PUBLISHED_DEMOS), "--seed", str(cfg.seed), "--no-bags"]) != 0:
        raise HeisdError("gen-demos failed; see its output above")
    say(f"      building the database {cfg.db_path}")
    tmp = Path(cfg.db_path + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if build_db.main(["--model", cfg.model_dir, "--demos", str(PUBLISHED_DEMOS / cfg.libero_suite),
                      "--out", str(tmp), "--tasks", task, "--fresh", "--query-views", str(query_views)]) != 0:
        raise HeisdError("build-db failed; see its output above")
    tmp.rename(cfg.db_path)


def _bag_steps(bag: Path) -> int:
    return int(topic_counts(bag).get(BagTopics().ee_pose, 0))


def run(cfg: DemoConfig, say=print) -> dict:
    from heisd_ros.policy import DEFAULT_TINY_DIR, is_tiny, resolve_paths
    from heisd_ros.tools import replay as rp
    from heisd_ros.tools.make_bag import MakeBagConfig, make_bag

    t0 = time.monotonic()
    cfg = resolve(cfg)
    if is_tiny(cfg.model_dir):
        say(f"[1/3] tiny policy (trained once, cached in {DEFAULT_TINY_DIR})")
        tiny = resolve_paths(policy_paths(cfg), progress=lambda m: say(f"      {m}"))
        # the node loads only the directories it is given: name each one
        cfg = dataclasses.replace(cfg, model_dir=tiny.model_dir, drafter_dir=tiny.drafter_dir, db_path=tiny.db_path,
                                  calibration_path=tiny.calibration_path)  # fmt: skip
    else:
        say(f"[1/3] policy from {cfg.model_dir}")
        if cfg.db_path and cfg.db_path.startswith(str(PUBLISHED_DB)):
            ensure_task_db(cfg, say)
    run_dir = Path(cfg.out) / time.strftime("%Y%m%d-%H%M%S")
    while run_dir.exists():
        run_dir = run_dir.with_name(run_dir.name + "x")
    run_dir.mkdir(parents=True)
    if cfg.scene == "libero":
        say("[2/3] LIBERO bag: the scripted expert at an evaluation init state (recorded once, cached)")
        bag, steps = libero_bag(cfg, say)
        say(f"      {steps} steps, two views + pose + instruction <- {bag}")
    else:
        bag = run_dir / "input"
        summary = make_bag(bag, MakeBagConfig(episodes=cfg.episodes, steps=cfg.steps, seed=cfg.seed))
        say(f"[2/3] synthetic bag: {summary['steps']} steps, two views + pose + instruction -> {bag}")
    params = [f"model_dir:={cfg.model_dir}", f"image_staleness_s:={cfg.staleness_s}",
              f"pose_staleness_s:={cfg.staleness_s}"]  # fmt: skip
    for name in ("drafter_dir", "db_path", "calibration_path"):
        if getattr(cfg, name):
            params.append(f"{name}:={getattr(cfg, name)}")
    say(f"[3/3] replaying into the policy node, methods {', '.join(cfg.methods)}")
    rcfg = rp.ReplayConfig(fast=True, start_node=True, methods=cfg.methods, params_file=cfg.params_file,
                           params=tuple(params), out=str(run_dir / "output"), domain_id=cfg.domain_id,
                           settle_s=0.5, step_timeout_s=60.0, warmup_steps=cfg.warmup_steps,
                           plots=str(run_dir / "plots") if installed("matplotlib") else "")  # fmt: skip
    result = rp.replay(bag, rcfg, progress=lambda m: say(f"      {m}"))
    result.update(demo_config=dataclasses.asdict(cfg), wall_s=time.monotonic() - t0, run_dir=str(run_dir))
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))
    plots = f" and {run_dir / 'plots'}" if rcfg.plots else " (no plots: pip install matplotlib)"
    say(f"done in {result['wall_s']:.0f} s: input bag {bag}, node outputs {run_dir / 'output'}, "
        f"figures {run_dir / 'result.json'}{plots}")  # fmt: skip
    return result


def _parser() -> argparse.ArgumentParser:
    d = DemoConfig()
    p = argparse.ArgumentParser(prog="heisd demo", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    for f in dataclasses.fields(DemoConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(d, f.name)
        if f.name == "model_dir":
            p.add_argument("--model", flag, dest="model_dir", default=default,
                           help="'auto' (mini artifacts if present, else tiny), 'tiny' or a model directory")
        elif f.name == "methods":
            p.add_argument(flag, default=",".join(default), help=f"comma-separated, from {', '.join(METHODS)}")
        else:
            p.add_argument(flag, type=type(default), default=default, help=f"(default {default!r})")
    p.add_argument("--json", default="", help="also write the result here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(DemoConfig)}
    values["methods"] = tuple(m.strip() for m in values["methods"].split(",") if m.strip())
    # the demo publishes on generic topic names: keep it on this machine unless told otherwise
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    try:
        result = run(DemoConfig(**values))
    except HeisdError as err:
        print(f"heisd demo: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
