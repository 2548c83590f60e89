"""Figures of one `heisd replay` (`--plots DIR`), drawn with matplotlib's Agg canvas (no display):

- `mode_timeline.png`: the decode mode of every step over the bag's time, one row per method;
- `latency_histogram.png`: the decode step latency (DecodeStats total_ms) of each method;
- `action_traces.png`, when the bag records commands (an ArmCommand topic, e.g. /arm_command of
  a recorded demonstration): the 7 action dimensions as recorded and as each method commanded them.

Outputs are placed on the bag's time through the replay's step map (published stamp -> recorded
stamp of each step), so every method lines up with the recording whatever the replay mode.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Sequence

import numpy as np

from heisd_ros.pipeline.optional import optional_dependency

MODES = ("ar", "drafter", "retrieval", "skip")
ACTION_NAMES = ("dx", "dy", "dz", "drx", "dry", "drz", "gripper")
SLACK_NS = 60_000_000
"""An output stamped this much after its step's set stamp still belongs to it (the pose may be newer)."""


def _figure(width: float, height: float):
    with optional_dependency("heisd replay --plots"):
        from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def bag_times_s(run, stamps_s: Sequence[float], t0_ns: int) -> np.ndarray:
    """Output stamps (s) -> seconds of bag time since t0_ns (NaN for an output of no played step)."""
    pairs = sorted(run.step_map)
    published = [p for p, _ in pairs]
    out = np.full(len(stamps_s), np.nan)
    for i, s in enumerate(stamps_s):
        ns = int(round(s * 1e9))
        k = bisect.bisect_right(published, ns + 1000) - 1
        if k >= 0 and ns - published[k] <= SLACK_NS:
            out[i] = (ns - published[k] + pairs[k][1] - t0_ns) * 1e-9
    return out


def _t0_ns(runs, reference) -> int:
    firsts = [min(b for _, b in r.step_map) for r in runs if r.step_map] + [t for t, _ in reference[:1]]
    return min(firsts) if firsts else 0


def mode_timeline(runs, t0_ns: int, path: Path) -> Path:
    fig = _figure(10, 1.2 + 1.1 * len(runs))
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    for ax, run in zip(axes, runs):
        recs = [s for _, s in run.stats]
        modes = list(MODES) + sorted({s.mode for s in recs} - set(MODES))
        t = bag_times_s(run, [s.stamp_s for s in recs], t0_ns)
        for k, mode in enumerate(modes):
            sel = np.array([s.mode == mode for s in recs], dtype=bool)
            if sel.any():
                ax.scatter(t[sel], np.full(sel.sum(), k), s=90, marker="|", linewidths=1.5, label=mode)
        ax.set_yticks(range(len(modes)), modes)
        ax.set_ylim(-0.6, len(modes) - 0.4)
        ax.set_title(f"{run.method}: decode mode per step ({len(recs)} steps)", fontsize=9, loc="left")
    axes[-1].set_xlabel("bag time (s)")
    fig.savefig(path)
    return path


def latency_histogram(runs, path: Path) -> Path:
    fig = _figure(8, 4)
    ax = fig.subplots()
    values = {r.method: np.array([s.total_ms for _, s in r.stats], dtype=float) for r in runs}
    positive = np.concatenate([v[v > 0] for v in values.values()] + [np.zeros(0)])
    if not positive.size:
        positive = np.array([1.0])
    bins = np.geomspace(max(positive.min() * 0.9, 1e-3), positive.max() * 1.1 + 1e-3, 40)
    for method, v in values.items():
        if v.size:
            ax.hist(np.clip(v, bins[0], bins[-1]), bins=bins, alpha=0.55,
                    label=f"{method} (median {np.median(v):.1f} ms, n={v.size})")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("decode step (ms, DecodeStats total_ms)")
    ax.set_ylabel("steps")
    ax.legend(fontsize=8)
    fig.savefig(path)
    return path


def action_traces(runs, reference, t0_ns: int, path: Path) -> Path:
    fig = _figure(10, 12)
    axes = fig.subplots(len(ACTION_NAMES), 1, sharex=True)
    ref_t = np.array([(t - t0_ns) * 1e-9 for t, _ in reference])
    ref_a = np.stack([a for _, a in reference])
    for d, ax in enumerate(axes):
        ax.plot(ref_t, ref_a[:, d], color="black", lw=1.2, label="recorded")
        for run in runs:
            recs = [c for _, c in run.commands]
            if recs:
                t = bag_times_s(run, [c.stamp_s for c in recs], t0_ns)
                ax.plot(t, [c.action[d] for c in recs], ".", ms=3, label=run.method)
        ax.set_ylabel(ACTION_NAMES[d])
    axes[0].legend(fontsize=8, ncol=len(runs) + 1)
    axes[-1].set_xlabel("bag time (s)")
    fig.savefig(path)
    return path


def write_plots(runs, reference, out_dir: Path) -> list[Path]:
    """The figures of a replay into out_dir (created); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = _t0_ns(runs, reference)
    paths = [mode_timeline(runs, t0, out_dir / "mode_timeline.png"),
             latency_histogram(runs, out_dir / "latency_histogram.png")]
    if reference:
        paths.append(action_traces(runs, reference, t0, out_dir / "action_traces.png"))
    return paths
