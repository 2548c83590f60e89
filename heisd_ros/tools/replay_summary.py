"""The figures of `heisd replay`, per method: steps, mode mix, decode step and command latency,
LLM forwards per step, accept length, speed-up over `ar` (definitions: heisd_ros/pipeline/figures.py),
and the replay's own memory. ROS-free: it reads `MethodRun` records."""

from __future__ import annotations

from heisd_ros.pipeline.figures import (
    accept_figures,
    bootstrap_meta,
    interval_text,
    latency_figures,
    speedup_figures,
)


def episode_step_ms(run) -> list[list[float]]:
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


def summarise(run, bag_steps: int) -> dict:
    """One method's figures (speedups over `ar` are added by `add_speedups`)."""
    stats = [s for _, s in run.stats]
    n = len(stats)
    modes: dict[str, int] = {}
    for s in stats:
        modes[s.mode] = modes.get(s.mode, 0) + 1
    e2e = [(t - c.stamp_s) * 1e3 for t, c in run.commands]
    diag = getattr(run, "diagnostic", {}) or {}
    rss = getattr(run, "rss_mb", {}) or {}
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
        "rejected": "" if diag.get("rejected", "-") == "-" else diag["rejected"],  # "-": the node rejected none
        "wall_s": run.wall_s,
        "rss_mb": {k: round(v, 1) for k, v in rss.items()},
    }


def add_speedups(rows: dict[str, dict], runs: list) -> dict | None:
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
    timeouts = sum(r.get("timeouts", 0) for r in rows)
    if timeouts:
        lines.append(f"{timeouts} step(s) got no answer within the step timeout (see the node's diagnostics)")
    return "\n".join(lines)
