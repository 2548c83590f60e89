"""heisd replay: play a rosbag2 into the policy node over real topics and record what it publishes.

Usage:
    heisd replay BAG [--fast | --rate R [--clock]] [--out OUT_BAG] [--map BAG_TOPIC=INPUT[,...] ...]
                 [--node-name policy_node] [--namespace NS] [--params-file config/policy.yaml]
                 [--start-node [--method heisd --method ar ...] [-p NAME:=VALUE ...] [--warmup-steps 8]]
                 [--step-timeout-s 5] [--keep-stamps] [--plots DIR] [--domain-id N] [--json FILE] [--quiet]

BAG is a rosbag2 directory (sqlite3 or MCAP). It is read lazily in recorded order (memory does not
grow with its length). Its topics are routed to the node's inputs: a view by name, `pose`,
`joint_states`, `instruction`, `episode_result`, either with --map (`--map
/cam_high/image_raw=agentview,/cam_wrist/image_raw=wrist,/ee=pose`) or, for inputs --map does not
name, by topic name (the node's own, resolved in its namespace or in the root namespace). Every
other topic (a depth camera, /robot_description, /diagnostics, recorded commands) is left out and
listed once. Messages are published as raw CDR, either paced by their recorded times divided by R,
or with --fast in lockstep: every synchronised image set (with the pose and joint states recorded
with it) waits for the node's DecodeStats before the next one, so each step is decoded exactly once
with its own state. Header stamps are shifted to the replay clock (recorded stamps would be stale
for the node's staleness limits) unless --keep-stamps. --clock (paced) keeps the stamps and
publishes /clock from the bag's time instead, for a node running with use_sim_time:=true.

The node is found by --node-name and --namespace: its topics are resolved as it resolves them
(from --params-file and -p), and a running node's outputs are read from the ROS graph. Without
--start-node such a node must already run (same ROS domain). With --start-node it is started in
this process, once per --method, and warmed up first: the bag's first --warmup-steps steps (default
8) are decoded unmeasured, then the decoder is reset, so the measured steps start a clean episode
with every decoding path warm.
The node's outputs (ArmCommand, DecodeStats, Twist/gripper, /diagnostics) go into a new MCAP bag at
OUT_BAG, under their own topic names for one method and under /<method>/... for several.

A per-method summary is printed and optionally written as JSON: steps, mode mix, mean, median, p95
and p99 decode step (the node's DecodeStats total_ms) and command latency, forwards per step,
accept_length and tokens_per_forward_verified, the replay's resident memory; with `ar` among the
methods, speedup_vs_ar with a 95 % bootstrap interval over the bag's episodes and
median_speedup_vs_ar. Definitions: heisd_ros/pipeline/figures.py. --plots DIR writes a mode
timeline, latency histograms and, when the bag records commands, action traces (PNG).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heisd_ros.core.config import METHODS
from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.pipeline import bags
from heisd_ros.pipeline.outputs import git_revision
from heisd_ros.replay import target
from heisd_ros.replay.bag_stream import RoutePlan, StreamLog, plan_routes, stream_segments
from heisd_ros.replay.playback import MethodRun, PlayConfig, Player, Recorder
from heisd_ros.ros import topics
from heisd_ros.tools.replay_summary import (
    add_speedups,
    episode_step_ms,
    format_summary,
    summarise,
)

__all__ = ["ReplayConfig", "add_speedups", "episode_step_ms", "format_summary", "main", "replay", "summarise"]


@dataclass(frozen=True)
class ReplayConfig:
    """How a bag is replayed."""

    rate: float = 1.0
    """Playback rate relative to the recording (ignored with fast)."""
    fast: bool = False
    """Lockstep: each synchronised image set waits for the node's DecodeStats (or step_timeout_s)."""
    out: str = ""
    """Output MCAP bag ('' = BAG + '_replay')."""
    maps: tuple[str, ...] = ()
    """BAG_TOPIC=INPUT entries (comma-separated lists allowed): which bag topic feeds which input."""
    node_name: str = target.NODE_NAME
    namespace: str = "/"
    """Name and namespace of the node: its topics are resolved in them."""
    methods: tuple[str, ...] = ()
    """With start_node: one replay per method ('' = the parameter file's decoder.method)."""
    start_node: bool = False
    """Start the policy node in this process instead of using a running one."""
    params_file: str = "config/policy.yaml"
    """Parameter file of the node (started, or running: its topic names)."""
    params: tuple[str, ...] = ()
    """NAME:=VALUE overrides of the node's parameters."""
    warmup_steps: int = 8
    """With start_node: the bag's first steps, decoded unmeasured before the node starts (0 = none)."""
    step_timeout_s: float = 5.0
    """Lockstep: give up waiting for a step's output after this."""
    max_silent_steps: int = 10
    """Lockstep: stop with the node's refusal after this many steps in a row without an answer (0 = never)."""
    connect_timeout_s: float = 10.0
    """How long to wait for the node's subscriptions and publishers to appear."""
    slop_s: float = 0.05
    """Stamp spread that groups the bag's images (and the state recorded with them) into one step."""
    settle_s: float = 1.0
    """Time to keep recording after the last message."""
    restamp: bool = True
    """Shift header stamps to the replay clock."""
    clock: bool = False
    """Paced: keep the recorded stamps and publish /clock from the bag's time (node: use_sim_time)."""
    plots: str = ""
    """Directory for the PNG figures ('' = none)."""
    domain_id: int = -1
    """ROS domain (-1 = ROS_DOMAIN_ID from the environment)."""
    quiet: bool = False

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ConfigError("rate must be > 0")
        if self.max_silent_steps < 0:
            raise ConfigError(f"max_silent_steps must be >= 0 (0 = never stop), got {self.max_silent_steps}")
        if self.step_timeout_s <= 0 or self.connect_timeout_s <= 0 or self.settle_s < 0 or self.slop_s < 0:
            raise ConfigError("step_timeout_s and connect_timeout_s must be > 0, settle_s and slop_s >= 0")
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ConfigError(f"unknown method(s) {bad}; choose from {METHODS}")
        if len(self.methods) > 1 and not self.start_node:
            raise ConfigError("several methods need --start-node (the decoder method of a running node is read-only)")
        if self.clock and self.fast:
            raise ConfigError("--clock plays at the recorded pace; it cannot be combined with --fast")
        if self.warmup_steps < 0:
            raise ConfigError("warmup_steps must be >= 0")
        for r in self.params:
            if ":=" not in r:
                raise ConfigError(f"expected NAME:=VALUE, got {r!r}")
        self.explicit_map()

    def explicit_map(self) -> dict[str, str]:
        """bag topic -> input, from `maps`."""
        out: dict[str, str] = {}
        for entry in (e.strip() for m in self.maps for e in m.split(",") if e.strip()):
            topic, sep, kind = entry.partition("=")
            if not sep or not topic.strip() or not kind.strip():
                raise ConfigError(f"--map expects BAG_TOPIC=INPUT, got {entry!r}")
            out["/" + topic.strip().lstrip("/")] = kind.strip()
        return out

    def overrides(self) -> dict[str, Any]:
        import yaml

        return {name: yaml.safe_load(text) for name, _, text in (p.partition(":=") for p in self.params)}


@dataclass
class _Session:
    """What every method's replay shares."""

    cfg: ReplayConfig
    bag: Path
    plan: RoutePlan
    node_cfg: Any
    ctx: Any
    node: Any
    executor: Any
    player: Player
    recorder: Recorder
    est_steps: int
    say: Callable[[str], None]
    log: StreamLog = field(default_factory=StreamLog)
    """The first method's stream: the recorded commands, for the plots."""
    warmup: list | None = None
    """The bag's first steps (read once, when a started node is warmed up)."""


def _node_config(cfg: ReplayConfig, say: Callable[[str], None]) -> Any:
    params_file: str | None = cfg.params_file
    if not Path(cfg.params_file).is_file():
        if cfg.start_node:
            raise ConfigError(f"parameter file {cfg.params_file} not found")
        say(f"no parameter file {cfg.params_file}: the node's topics are taken to be the defaults")
        params_file = None
    return target.load_node_config(params_file, cfg.overrides(), cfg.node_name, cfg.namespace)


def _plan(bag: Path, cfg: ReplayConfig, node_cfg: Any, say: Callable[[str], None]) -> RoutePlan:
    """The bag's routes into the node, checked; topics left out are listed once."""
    try:
        types = bags.topic_types(bag) if bag.is_dir() else None
    except bags.BagError as err:
        raise ConfigError(str(err)) from err
    if types is None:
        raise ConfigError(f"bag {bag} not found (a rosbag2 directory)")
    targets = target.input_targets(node_cfg, cfg.node_name, cfg.namespace)
    command = target.resolve(topics.ARM_COMMAND, cfg.node_name, "/")
    plan = plan_routes(types, targets, node_cfg.decoder.views, cfg.explicit_map(), command)
    views = node_cfg.decoder.views
    missing = [v for v in views if v not in plan.views]
    if missing:
        raise ConfigError(f"{bag}: no topic feeds view(s) {missing} of the node (views {list(views)}); "
                          f"map one with --map BAG_TOPIC={missing[0]} (bag topics: {sorted(types)})")  # fmt: skip
    for r in plan.routes.values():
        say(f"  {r.bag_topic} -> {r.topic} ({r.kind})")
    if plan.ignored:
        say("  not replayed: " + ", ".join(f"{t} ({ty.rsplit('/', 1)[-1]})" for t, ty in plan.ignored.items()))
    return plan


def replay(bag: str | Path, cfg: ReplayConfig, decoder_factory: Callable | None = None,
           progress: Callable[[str], None] | None = None) -> dict:  # fmt: skip
    """Replay `bag` once per method; returns the JSON-ready result (the node's outputs go to cfg.out)."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    say = progress or (lambda s: None if cfg.quiet else print(s, flush=True))
    bag = Path(bag)
    out = Path(cfg.out or f"{bag.as_posix().rstrip('/')}_replay")
    if out.exists():
        raise ConfigError(f"output bag {out} exists; choose another --out")
    node_cfg = _node_config(cfg, say)
    say(f"replay {bag} -> {out}")
    plan = _plan(bag, cfg, node_cfg, say)
    counts = bags.topic_counts(bag)
    est_steps = min(counts.get(t, 0) for t, r in plan.routes.items() if r.is_image)

    args = ["heisd-replay"] + (["--ros-args", "--params-file", cfg.params_file] if cfg.start_node else [])
    ctx = rclpy.Context()
    rclpy.init(args=args, context=ctx, domain_id=None if cfg.domain_id < 0 else cfg.domain_id)
    node = rclpy.create_node("heisd_replay", context=ctx)
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    recorder = Recorder(node, out)
    runs: list[MethodRun] = []
    try:
        play = PlayConfig(fast=cfg.fast, rate=cfg.rate, restamp=cfg.restamp and not cfg.clock,
                          step_timeout_s=cfg.step_timeout_s, max_silent_steps=cfg.max_silent_steps,
                          clock=cfg.clock)  # fmt: skip
        session = _Session(cfg, bag, plan, node_cfg, ctx, node, executor, Player(node, plan, play), recorder,
                           est_steps, say)  # fmt: skip
        for method in cfg.methods or ("",):
            runs.append(_run_method(session, method, decoder_factory))
    finally:
        recorder.stop()
        executor.shutdown(timeout_sec=2.0)
        spinner.join(2.0)
        recorder.close()
        node.destroy_node()
        rclpy.try_shutdown(context=ctx)
    return _result(bag, out, cfg, session, runs)


def _result(bag: Path, out: Path, cfg: ReplayConfig, session: _Session, runs: list[MethodRun]) -> dict:
    rows = {r.method: summarise(r, r.steps) for r in runs}
    bootstrap = add_speedups(rows, runs)
    session.say("\n" + format_summary(list(rows.values()), bootstrap))
    result = {"bag": str(bag), "out": str(out), "config": dataclasses.asdict(cfg), "git_rev": git_revision(),
              "routes": {t: r.topic for t, r in session.plan.routes.items()},
              "not_replayed": session.plan.ignored, "methods": rows}  # fmt: skip
    if bootstrap is not None:
        result["bootstrap"] = bootstrap
    if cfg.plots:
        from heisd_ros.tools.replay_plots import write_plots

        result["plots"] = [str(p) for p in write_plots(runs, session.log.reference, Path(cfg.plots))]
        session.say(f"figures: {', '.join(result['plots'])}")
    return result


def _start_policy(session: _Session, method: str, decoder_factory: Callable | None) -> Any:
    """The policy node for `method` ('' = the parameter file's), started (and warmed up) in this process."""
    from rclpy.parameter import Parameter

    from heisd_ros.ros.node import PolicyNode, load_node_policy

    cfg = session.cfg
    overrides = [Parameter(name, value=value) for name, value in cfg.overrides().items()]
    names = {o.name for o in overrides}
    if cfg.fast and "watchdog_factor" not in names:
        # Lockstep publishes the next inputs only after the node answered the last ones, so a slow
        # step (a loaded machine) builds no backlog; the real-time watchdog would only withhold the
        # next commands and make the replay wait step_timeout_s for each. The largest budget
        # (100 control periods) unless the user sets one.
        overrides.append(Parameter("watchdog_factor", value=100.0))
    if cfg.fast and "input_limits.max_pose_jump_m" not in names:
        # Lockstep restamps the inputs with the time they are sent, milliseconds apart, so a move the
        # recording made in one control period would look like a jump at an impossible speed.
        overrides.append(Parameter("input_limits.max_pose_jump_m", value=10.0))
    if cfg.clock and "use_sim_time" not in names:
        overrides.append(Parameter("use_sim_time", value=True))
    if method:
        overrides.append(Parameter("decoder.method", value=method))
    if "command_enabled" not in names:  # a replay records the commands: the node must send them
        overrides.append(Parameter("command_enabled", value=True))
    if session.warmup is None:
        session.warmup = target.first_steps(session.bag, session.plan, cfg.slop_s, cfg.warmup_steps)
    factory = target.warmed(decoder_factory or load_node_policy, session.warmup,
                            lambda s: session.say(f"[{method or 'node'}] {s}"))  # fmt: skip
    return PolicyNode(factory, node_name=cfg.node_name, namespace=target.normalise_namespace(cfg.namespace),
                      context=session.ctx, parameter_overrides=overrides)  # fmt: skip


def _outputs(session: _Session) -> dict[str, str]:
    """A running node's output topics: from the graph, else resolved from its parameters."""
    cfg = session.cfg
    found = target.discover_outputs(session.node, cfg.node_name, cfg.namespace, min(cfg.connect_timeout_s, 3.0))
    if found:
        return found
    return target.output_topics(session.node_cfg, cfg.node_name, cfg.namespace)


def _not_found(session: _Session, what: str) -> ConfigError:
    cfg = session.cfg
    full = target.normalise_namespace(cfg.namespace).rstrip("/") + "/" + cfg.node_name
    others = [n for n in target.policy_nodes(session.node) if n != full]
    hint = f"; policy nodes on the graph: {others} (--namespace, --node-name)" if others else ""
    return ConfigError(f"{what}: is the policy node {full} running (or use --start-node)?{hint}")


def _connect(session: _Session, outputs: dict[str, str], prefix: str) -> None:
    """Subscribe to the outputs and wait for the node's inputs and outputs to match."""
    cfg, player, recorder = session.cfg, session.player, session.recorder
    for topic, msgtype in outputs.items():
        recorder.record(topic, msgtype, prefix + topic)
    required = set(session.plan.views) | {"pose", "instruction"}  # a volatile subscriber misses earlier messages
    missing = player.wait_for_subscribers(cfg.connect_timeout_s, required)
    if missing:
        raise _not_found(session, f"no subscriber on {missing}")
    idle = player.unsubscribed()
    if idle:  # e.g. joint states a model that ignores the finger gap does not subscribe to
        session.say(f"  nothing subscribes to {idle} (published anyway)")
    unmatched = recorder.wait_matched(cfg.connect_timeout_s)
    if unmatched and cfg.fast:  # lockstep would wait step_timeout_s for every step
        raise _not_found(session, f"nothing publishes {unmatched}")
    if unmatched:
        session.say(f"warning: nothing publishes {unmatched} yet; recording them anyway")


def _run_method(session: _Session, method: str, decoder_factory: Callable | None) -> MethodRun:
    """Play the bag once into the running or started node for `method`, recording its outputs."""
    cfg, player, recorder, say = session.cfg, session.player, session.recorder, session.say
    policy = None
    if cfg.start_node:
        policy = _start_policy(session, method, decoder_factory)
        method = policy.cfg.decoder.method
        outputs = target.node_outputs(policy)
        session.executor.add_node(policy)
    else:
        outputs = _outputs(session)
    prefix = f"/{method}" if len(cfg.methods) > 1 else ""
    run = MethodRun(method or "node")
    try:
        _connect(session, outputs, prefix)
        seen: list[float] = []

        def on_stats(rec: Any) -> None:
            seen.append(rec.stamp_s)
            say(f"[{run.method}] step {len(seen):>4}/{session.est_steps} mode={rec.mode:<9} "
                f"forwards={rec.llm_forwards} decode={rec.total_ms:7.1f} ms")  # fmt: skip

        recorder.on_stats, recorder.run = on_stats, run
        log = StreamLog()
        t0 = time.monotonic()
        player.play(stream_segments(session.bag, session.plan, cfg.slop_s, log), run,
                    lambda stamp: any(s >= stamp - 1e-6 for s in seen[-3:]))  # fmt: skip
        player.settle(cfg.settle_s)
        run.wall_s = time.monotonic() - t0
        if not session.log.messages:
            session.log = log
    finally:
        recorder.run = None
        recorder.stop()
        if policy is not None:
            session.executor.remove_node(policy)
            policy.destroy_node()
            # the next method's node takes the same name: let this one's handles go first
            # (rcl keeps a name's rosout publisher while a node of that name is alive)
            del policy
            gc.collect()
    return run


# ---------------------------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="heisd replay", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    p.add_argument("bag", help="rosbag2 directory (sqlite3 or MCAP)")
    d = ReplayConfig()
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--rate", type=float, default=d.rate, help="playback rate (default 1.0)")
    mode.add_argument("--fast", action="store_true", help="lockstep: one decoded step per synchronised set")
    p.add_argument("--clock", action="store_true", help="paced: keep stamps, publish /clock (node: use_sim_time)")
    p.add_argument("--out", default=d.out, help="output MCAP bag (default BAG_replay)")
    p.add_argument("--map", dest="maps", action="append", default=[], metavar="BAG_TOPIC=INPUT[,...]",
                   help="feed a bag topic to an input: a view name, pose, joint_states, instruction, episode_result")
    p.add_argument("--node-name", default=d.node_name)
    p.add_argument("--namespace", default=d.namespace)
    p.add_argument("--method", dest="methods", action="append", default=[], choices=METHODS,
                   help="with --start-node: one replay per method (repeatable)")  # fmt: skip
    p.add_argument("--start-node", action="store_true", help="start the policy node in this process")
    p.add_argument("--params-file", default=d.params_file, help="the node's parameter file")
    p.add_argument("-p", "--param", dest="params", action="append", default=[], metavar="NAME:=VALUE",
                   help="parameter override of the node (repeatable)")  # fmt: skip
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--step-timeout-s", type=float, default=d.step_timeout_s)
    p.add_argument("--max-silent-steps", type=int, default=d.max_silent_steps,
                   help="--fast: stop after this many steps in a row without DecodeStats, printing the node's "
                        "last refusal (0 = never)")  # fmt: skip
    p.add_argument("--connect-timeout-s", type=float, default=d.connect_timeout_s)
    p.add_argument("--slop-s", type=float, default=d.slop_s)
    p.add_argument("--settle-s", type=float, default=d.settle_s)
    p.add_argument("--keep-stamps", action="store_true", help="publish the recorded header stamps unchanged")
    p.add_argument("--plots", default="", metavar="DIR", help="write PNG figures of the run here")
    p.add_argument("--domain-id", type=int, default=d.domain_id)
    p.add_argument("--json", default="", help="write the result as JSON here")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = ReplayConfig(rate=args.rate, fast=args.fast, out=args.out, maps=tuple(args.maps),
                           node_name=args.node_name, namespace=args.namespace, methods=tuple(args.methods),
                           start_node=args.start_node, params_file=args.params_file, params=tuple(args.params),
                           warmup_steps=args.warmup_steps, step_timeout_s=args.step_timeout_s,
                           max_silent_steps=args.max_silent_steps,
                           connect_timeout_s=args.connect_timeout_s, slop_s=args.slop_s, settle_s=args.settle_s,
                           restamp=not args.keep_stamps, clock=args.clock, plots=args.plots,
                           domain_id=args.domain_id, quiet=args.quiet)  # fmt: skip
        result = replay(args.bag, cfg)
    except HeisdError as err:
        print(f"heisd replay: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
