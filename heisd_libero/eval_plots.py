"""Plots of a `heisd-libero eval-libero` report (matplotlib, headless Agg backend, small PNGs).

step_latency.png     step latency per method: distribution (box, mean marked) and mean time per stage
accept_length.png    tokens fixed per decoding cycle (histogram; a skip is a 7-token cycle)
mode_timeline.png    one heisd trajectory: end-effector path coloured by decode mode, and F over time
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from heisd_libero.eval_report import STAGES, cycle_lengths

MODE_COLOURS = {"ar": "#7f7f7f", "drafter": "#1f77b4", "retrieval": "#ff7f0e", "skip": "#2ca02c"}
DPI = 90


def _methods(report: dict[str, Any]) -> list[str]:
    return [m for m in report if not m.startswith("_") and report[m]["steps"]]


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return str(path)


def write_plots(report: dict[str, Any], episodes: list[dict[str, Any]], out_dir: str | Path) -> list[str]:
    """Write the PNGs under `out_dir`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    methods = _methods(report)
    if not methods:
        return []
    # success (with its interval) and forwards per step are in the report's table already
    files = [_latency(plt, report, methods, episodes, out / "step_latency.png"),
             _accept(plt, report, methods, episodes, out / "accept_length.png")]
    timeline = _timeline(plt, report, episodes, out / "mode_timeline.png")
    return files + ([timeline] if timeline else [])


def _latency(plt, report, methods, episodes, path: Path) -> str:
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    data = [[s["ms"]["total"] for e in episodes if e["method"] == m for s in e["steps"]] for m in methods]
    a.boxplot(data, showfliers=False, showmeans=True)
    a.set_xticks(range(1, len(methods) + 1), methods)
    for i, m in enumerate(methods):
        a.text(i + 1, report[m]["mean_step_ms"], f" mean {report[m]['mean_step_ms']:.0f}", fontsize=8, va="bottom")
    a.set_ylabel("step latency (ms)")
    a.set_title("HybridDecoder.step wall time (box: quartiles, triangle: mean)", fontsize=10)
    bottom = np.zeros(len(methods))
    for stage in STAGES:
        vals = np.array([report[m]["stage_mean_ms"][stage] for m in methods], dtype=float)
        if np.nansum(vals) <= 0:
            continue
        b.bar(methods, vals, bottom=bottom, label=stage)
        bottom += np.nan_to_num(vals)
    b.set_ylabel("mean ms per step")
    b.set_title("Mean time per stage", fontsize=10)
    b.legend(fontsize=7)
    return _save(fig, path)


def _accept(plt, report, methods, episodes, path: Path) -> str:
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        cycles = [c for e in episodes if e["method"] == m for s in e["steps"] for c in cycle_lengths(s)]
        counts = np.bincount(cycles, minlength=8)[1:8]
        frac = counts / max(counts.sum(), 1)
        # the mean of these cycle lengths is the paper's accept length
        mean = report[m]["accept_length"]
        mean = math.nan if mean is None else mean
        ax.bar(np.arange(1, 8) + (i - (len(methods) - 1) / 2) * width, frac, width, label=f"{m} (mean {mean:.2f})")
    ax.set_xlabel("tokens fixed per decoding cycle (forward or skip)")
    ax.set_ylabel("fraction of cycles")
    ax.set_xticks(range(1, 8))
    ax.legend(fontsize=7)
    ax.set_title("Accept length", fontsize=10)
    return _save(fig, path)


def _pick_trajectory(episodes: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first successful heisd episode with the most distinct modes (else any heisd episode)."""
    cands = [e for e in episodes if e["method"] == "heisd"] or [e for e in episodes if e["method"] != "ar"]
    if not cands:
        return None
    return max(cands, key=lambda e: (e["success"], len({s["mode"] for s in e["steps"]}), -e["task"], -e["init_state"]))


def _timeline(plt, report, episodes, path: Path) -> str | None:
    ep = _pick_trajectory(episodes)
    if ep is None or not ep["steps"]:
        return None
    ee = np.array([s["ee"] for s in ep["steps"]])
    modes = [s["mode"] for s in ep["steps"]]
    colours = [MODE_COLOURS.get(m, "k") for m in modes]
    sizes = [28 if m in ("retrieval", "skip") else 8 for m in modes]  # the rarer modes stay visible
    t = np.arange(len(modes))
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.5, 3.8))
    a.plot(ee[:, 0], ee[:, 1], color="#cccccc", lw=1, zorder=1)
    a.scatter(ee[:, 0], ee[:, 1], c=colours, s=sizes, zorder=2)
    a.set_xlabel("x (m)")
    a.set_ylabel("y (m)")
    a.set_aspect("equal", adjustable="datalim")
    a.set_title(f"{ep['method']}: task {ep['task']}, init {ep['init_state']} "
                f"({'success' if ep['success'] else 'failure'}), top view", fontsize=9)
    b.scatter(t, ee[:, 2], c=colours, s=sizes, zorder=2)
    b.set_xlabel("control step")
    b.set_ylabel("end-effector z (m)")
    f = np.array([np.nan if s["F"] is None else s["F"] for s in ep["steps"]], dtype=float)
    c = b.twinx()
    c.plot(t, f, color="k", lw=0.8, alpha=0.6)
    tau = (report["_meta"].get("model", {}).get("decoder_config", {}).get("fused_metric", {}) or {}).get("tau")
    if tau is not None:
        c.axhline(tau, color="k", ls="--", lw=0.8)
    c.set_ylabel("fused metric F (line), tau (dashed)")
    handles = [plt.Line2D([], [], marker="o", ls="", color=col, label=m) for m, col in MODE_COLOURS.items() if m in modes]
    a.legend(handles=handles, fontsize=7, loc="best")
    b.set_title("mode along the trajectory", fontsize=9)
    return _save(fig, path)
