"""heisd replay: play a rosbag2 into the policy node over real topics and record what it publishes.

Usage:
    heisd replay BAG [--fast | --rate R] [--out OUT_BAG] [--start-node [--params-file config/policy.yaml]
                 [--method heisd --method ar ...] [-p NAME:=VALUE ...]] [--step-timeout-s 5]
                 [--remap FROM:=TO ...] [--keep-stamps] [--domain-id N] [--json FILE] [--quiet]

BAG is a rosbag2 directory (sqlite3 or MCAP) holding image, pose, instruction and episode-result
topics (e.g. from `python -m heisd_ros.tools.make_bag`). Its messages are published as raw CDR on
their topics (after --remap), either paced by their recorded times divided by R, or with --fast in
lockstep: every synchronised image set waits for the node's DecodeStats before the next one, so each
synchronised step is decoded exactly once. Header stamps are shifted to the replay clock (recorded
stamps would be stale for the node's staleness limits) unless --keep-stamps.

Without --start-node a policy node must already run (same ROS domain). With --start-node the node is
started in this process from the parameter file, once per --method, on the same bag. The node's
outputs (ArmCommand, DecodeStats, Twist/gripper, /diagnostics) go into a new MCAP bag at OUT_BAG,
under their own topic names for one method and under /<method>/... for several. A per-method summary
is printed and optionally written as JSON: steps, mode mix, mean, median, p95 and p99 decode step
(the node's DecodeStats total_ms) and command latency, forwards per step, accept_length (the paper's:
a skipped step is one 7-token cycle) and tokens_per_forward_verified; with `ar` among the methods,
speedup_vs_ar (mean ar step / mean step) with a 95 % bootstrap interval over the bag's episodes (none
for a one-episode bag) and median_speedup_vs_ar. Definitions: heisd_ros/pipeline/figures.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heisd_ros.core.config import METHODS
from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.pipeline.figures import (
    accept_figures,
    bootstrap_meta,
    interval_text,
    latency_figures,
    speedup_figures,
)
from heisd_ros.pipeline.outputs import git_revision
from heisd_ros.ros.playback import OUTPUT_TYPES, MethodRun, Player, Recorder, read_bag


@dataclass(frozen=True)
class ReplayConfig:
    """How a bag is replayed."""

    rate: float = 1.0
    """Playback rate relative to the recording (ignored with fast)."""
    fast: bool = False
    """Lockstep: each synchronised image set waits for the node's DecodeStats (or step_timeout_s)."""
    out: str = ""
    """Output MCAP bag ('' = BAG + '_replay')."""
    methods: tuple[str, ...] = ()
    """With start_node: one replay per method ('' = the parameter file's decoder.method)."""
    start_node: bool = False
    """Start the policy node in this process instead of using a running one."""
    params_file: str = "config/policy.yaml"
    """Parameter file of the started node."""
    params: tuple[str, ...] = ()
    """NAME:=VALUE overrides for the started node."""
    step_timeout_s: float = 5.0
    """Lockstep: give up waiting for a step's output after this."""
    connect_timeout_s: float = 10.0
    """How long to wait for the node's subscriptions and publishers to appear."""
    slop_s: float = 0.05
    """Stamp spread that groups the bag's images into one synchronised step (lockstep only)."""
    settle_s: float = 1.0
    """Time to keep recording after the last message."""
    restamp: bool = True
    """Shift header stamps to the replay clock."""
    remap: tuple[str, ...] = ()
    """FROM:=TO topic renames applied to the bag's topics."""
    domain_id: int = -1
    """ROS domain (-1 = ROS_DOMAIN_ID from the environment)."""
    quiet: bool = False

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ConfigError("rate must be > 0")
        if self.step_timeout_s <= 0 or self.connect_timeout_s <= 0 or self.settle_s < 0 or self.slop_s < 0:
            raise ConfigError("step_timeout_s and connect_timeout_s must be > 0, settle_s and slop_s >= 0")
        bad = [m for m in self.methods if m not in METHODS]
        if bad:
            raise ConfigError(f"unknown method(s) {bad}; choose from {METHODS}")
        if len(self.methods) > 1 and not self.start_node:
            raise ConfigError("several methods need --start-node (the decoder method of a running node is read-only)")
        for r in self.remap + self.params:
            if ":=" not in r:
                raise ConfigError(f"expected NAME:=VALUE, got {r!r}")


# ---------------------------------------------------------------------------------------------
# running and summarising


def _stamp_s(msg: Any) -> float:
    return msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec


def episode_step_ms(run: MethodRun) -> list[list[float]]:
    """Decode step latencies (ms) per input episode: the node numbers an episode's published steps
    from 1, so a step_id that does not grow starts the next episode."""
    episodes: list[list[float]] = []
    last = None
    for _, s in run.stats:
        if last is None or s.step_id <= last:
            episodes.append([])
        episodes[-1].append(float(s.total_ms))
        last = s.step_id
    return episodes


def summarise(run: MethodRun, bag_steps: int) -> dict:
    """One method's figures (speedups over `ar` are added by `add_speedups`)."""
    stats = [s for _, s in run.stats]
    n = len(stats)
    modes: dict[str, int] = {}
    for s in stats:
        modes[s.mode] = modes.get(s.mode, 0) + 1
    e2e = [(t - _stamp_s(c)) * 1e3 for t, c in run.commands]
    diag = {}
    if run.diagnostics:
        for st in run.diagnostics[-1].status:
            if st.name.endswith(": policy"):
                diag = {kv.key: kv.value for kv in st.values}
    return {
        "method": run.method,
        "bag_steps": bag_steps,
        "decoded_steps": n,
        "episodes": len(episode_step_ms(run)),
        "commands": len(run.commands),
        "timeouts": run.timeouts,
        "mode_mix": dict(sorted(modes.items())),
        **latency_figures([s.total_ms for s in stats]),
        **latency_figures(e2e, "command_latency"),
        "forwards_per_step": sum(s.llm_forwards for s in stats) / n if n else float("nan"),
        **accept_figures([s.llm_forwards for s in stats], [bool(s.skipped) for s in stats]),
        "dropped_ticks": int(diag.get("dropped_ticks", 0) or 0),
        "rejected": diag.get("rejected", ""),
        "wall_s": run.wall_s,
    }


def add_speedups(rows: dict[str, dict], runs: list[MethodRun]) -> dict | None:
    """Speedups over `ar` into each row when `ar` was replayed; the bootstrap's description (or None).

    Every method replays the same bag, so its episodes pair with `ar`'s when it decoded as many."""
    by_method = {r.method: episode_step_ms(r) for r in runs}
    if "ar" not in by_method:
        return None
    ar = by_method["ar"]
    paired = all(len(eps) == len(ar) for eps in by_method.values())
    for method, eps in by_method.items():
        rows[method].update(speedup_figures(ar, eps, paired=len(eps) == len(ar)))
    return bootstrap_meta(len(ar), paired, unit="bag episode")


def format_summary(rows: list[dict], bootstrap: dict | None = None) -> str:
    """Means first, then median, p95, p99; speedups and their interval when `ar` ran."""
    head = (f"{'method':<10} {'steps':>11} {'cmds':>5} {'mean ms':>8} {'median':>7} {'p95':>7} {'p99':>7} "
            f"{'cmd lat ms':>10} {'fwd/step':>8} {'acc len':>7} {'tok/fwd':>7}  mode mix")
    lines = [head, "-" * len(head)]
    for r in rows:
        mix = " ".join(f"{k}:{v}" for k, v in r["mode_mix"].items()) or "-"
        lines.append(f"{r['method']:<10} {r['decoded_steps']:>5}/{r['bag_steps']:<5} {r['commands']:>5} "
                     f"{r['mean_step_ms']:>8.1f} {r['median_step_ms']:>7.1f} {r['p95_step_ms']:>7.1f} "
                     f"{r['p99_step_ms']:>7.1f} {r['mean_command_latency_ms']:>10.1f} "
                     f"{r['forwards_per_step']:>8.2f} {r['accept_length']:>7.2f} "
                     f"{r['tokens_per_forward_verified']:>7.2f}  {mix}")  # fmt: skip
    if bootstrap is not None:
        n = bootstrap["episodes"]
        lines.append("speed-up over ar (mean decode step; 95 % bootstrap interval over the bag's episodes): " + ", ".join(
            f"{r['method']} {r['speedup_vs_ar']:.2f}x {interval_text(r.get('speedup_vs_ar_ci95'), n_episodes=n)}"
            f" (median {r['median_speedup_vs_ar']:.2f}x)" for r in rows if "speedup_vs_ar" in r))  # fmt: skip
    return "\n".join(lines)


def replay(bag: str | Path, cfg: ReplayConfig, decoder_factory: Callable | None = None,
           progress: Callable[[str], None] | None = None) -> dict:  # fmt: skip
    """Replay `bag` once per method; returns the JSON-ready result (also written into cfg.out)."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor

    say = progress or (lambda s: None if cfg.quiet else print(s, flush=True))
    out = Path(cfg.out or f"{Path(bag).as_posix().rstrip('/')}_replay")
    if out.exists():
        raise ConfigError(f"output bag {out} exists; choose another --out")
    if cfg.start_node and not Path(cfg.params_file).is_file():
        raise ConfigError(f"parameter file {cfg.params_file} not found")
    messages, bag_steps = read_bag(bag, dict(r.split(":=", 1) for r in cfg.remap), cfg.slop_s)
    say(f"replay {bag}: {len(messages)} messages, {bag_steps} synchronised steps -> {out}")

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
        player = Player(node, messages, fast=cfg.fast, rate=cfg.rate, restamp=cfg.restamp,
                        step_timeout_s=cfg.step_timeout_s)  # fmt: skip
        session = _Session(cfg, ctx, executor, player, recorder, bag_steps, say)
        for method in cfg.methods or ("",):
            runs.append(_run_method(session, method, decoder_factory))
    finally:
        recorder.stop()
        executor.shutdown(timeout_sec=2.0)
        spinner.join(2.0)
        recorder.close()
        node.destroy_node()
        rclpy.try_shutdown(context=ctx)
    rows = {r.method: summarise(r, bag_steps) for r in runs}
    bootstrap = add_speedups(rows, runs)
    say("\n" + format_summary(list(rows.values()), bootstrap))
    result = {"bag": str(bag), "out": str(out), "config": dataclasses.asdict(cfg), "git_rev": git_revision(),
              "methods": rows}  # fmt: skip
    if bootstrap is not None:
        result["bootstrap"] = bootstrap
    return result


@dataclass
class _Session:
    """What every method's replay shares: the ROS context and executor, the player and the recorder."""

    cfg: ReplayConfig
    ctx: Any
    executor: Any
    player: Player
    recorder: Recorder
    bag_steps: int
    say: Callable[[str], None]


def _start_policy(cfg: ReplayConfig, ctx: Any, method: str, decoder_factory: Callable | None) -> tuple[Any, dict]:
    """The policy node for `method` ('' = the parameter file's), started in this process, and its
    output topics -> types."""
    import yaml
    from rclpy.parameter import Parameter

    from heisd_ros.ros.node import PolicyNode

    overrides = []
    for pair in cfg.params:
        name, _, text = pair.partition(":=")
        overrides.append(Parameter(name, value=yaml.safe_load(text)))
    if cfg.fast and not any(o.name == "watchdog_factor" for o in overrides):
        # Lockstep publishes the next inputs only after the node answered the last ones, so a slow
        # step (first-call warm-up, a loaded machine) builds no backlog; the real-time watchdog
        # would only withhold the next commands and make the replay wait step_timeout_s for each.
        # The largest budget (100 control periods) unless the user sets one.
        overrides.append(Parameter("watchdog_factor", value=100.0))
    if cfg.fast and not any(o.name == "input_limits.max_pose_jump_m" for o in overrides):
        # Lockstep restamps the inputs with the time they are sent, milliseconds apart, so a move the
        # recording made in one control period would look like a jump at an impossible speed.
        overrides.append(Parameter("input_limits.max_pose_jump_m", value=10.0))
    if method:
        overrides.append(Parameter("decoder.method", value=method))
    policy = PolicyNode(decoder_factory, context=ctx, parameter_overrides=overrides)
    n = policy.cfg.node
    outputs = {n.command_topic: OUTPUT_TYPES["arm_command"], n.stats_topic: OUTPUT_TYPES["decode_stats"],
               "/diagnostics": OUTPUT_TYPES["/diagnostics"]}  # fmt: skip
    if n.publish_twist:
        outputs.update({n.twist_topic: OUTPUT_TYPES["cmd_twist"], n.gripper_topic: OUTPUT_TYPES["gripper_command"]})
    return policy, outputs


def _run_method(session: _Session, method: str, decoder_factory: Callable | None) -> MethodRun:
    """Play the bag once into the running or started node for `method`, recording its outputs."""
    cfg, player, recorder, say = session.cfg, session.player, session.recorder, session.say
    policy, outputs = None, dict(OUTPUT_TYPES)
    if cfg.start_node:
        policy, outputs = _start_policy(cfg, session.ctx, method, decoder_factory)
        method = policy.cfg.decoder.method
        session.executor.add_node(policy)
    prefix = f"/{method}" if len(cfg.methods) > 1 else ""
    run = MethodRun(method or "node")
    try:
        for topic, msgtype in outputs.items():
            recorder.record(topic, msgtype, prefix + (topic if topic.startswith("/") else "/" + topic))
        missing = player.wait_for_subscribers(cfg.connect_timeout_s)
        if missing:
            raise ConfigError(f"no subscriber on {missing}: is the policy node running (or use --start-node)?")
        unmatched = recorder.wait_matched(cfg.connect_timeout_s)
        if unmatched:
            say(f"warning: nothing publishes {unmatched} yet; recording them anyway")
        seen: list[float] = []

        def on_stats(msg: Any) -> None:
            seen.append(_stamp_s(msg))
            say(f"[{run.method}] step {len(seen):>4}/{session.bag_steps} mode={msg.mode:<9} "
                f"forwards={msg.llm_forwards} decode={msg.total_ms:7.1f} ms")  # fmt: skip

        recorder.on_stats, recorder.run = on_stats, run
        t0 = time.monotonic()
        player.play(run, lambda stamp: any(s >= stamp - 1e-6 for s in seen[-3:]))
        time.sleep(cfg.settle_s)
        run.wall_s = time.monotonic() - t0
    finally:
        recorder.run = None
        recorder.stop()
        if policy is not None:
            session.executor.remove_node(policy)
            policy.destroy_node()
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
    p.add_argument("--out", default=d.out, help="output MCAP bag (default BAG_replay)")
    p.add_argument("--method", dest="methods", action="append", default=[], choices=METHODS,
                   help="with --start-node: one replay per method (repeatable)")  # fmt: skip
    p.add_argument("--start-node", action="store_true", help="start the policy node in this process")
    p.add_argument("--params-file", default=d.params_file, help="parameter file of the started node")
    p.add_argument("-p", "--param", dest="params", action="append", default=[], metavar="NAME:=VALUE",
                   help="parameter override for the started node (repeatable)")  # fmt: skip
    p.add_argument("--step-timeout-s", type=float, default=d.step_timeout_s)
    p.add_argument("--connect-timeout-s", type=float, default=d.connect_timeout_s)
    p.add_argument("--slop-s", type=float, default=d.slop_s)
    p.add_argument("--settle-s", type=float, default=d.settle_s)
    p.add_argument("--keep-stamps", action="store_true", help="publish the recorded header stamps unchanged")
    p.add_argument("--remap", action="append", default=[], metavar="FROM:=TO")
    p.add_argument("--domain-id", type=int, default=d.domain_id)
    p.add_argument("--json", default="", help="write the result as JSON here")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = ReplayConfig(rate=args.rate, fast=args.fast, out=args.out, methods=tuple(args.methods),
                           start_node=args.start_node, params_file=args.params_file, params=tuple(args.params),
                           step_timeout_s=args.step_timeout_s, connect_timeout_s=args.connect_timeout_s,
                           slop_s=args.slop_s, settle_s=args.settle_s,
                           restamp=not args.keep_stamps, remap=tuple(args.remap), domain_id=args.domain_id,
                           quiet=args.quiet)  # fmt: skip
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
