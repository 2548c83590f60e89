"""The policy's own closed-loop motion, read from an `heisd-libero eval-libero` log: its end-effector
trajectories and the fused metric F along them (docs/design.md §5).

Offline, F's normalisation and tau come from the demonstrations; a policy in closed loop moves
differently (it pauses, creeps, corrects), so the boundary can be normalised on the policy's own
windows and its tau candidates placed at quantiles of the F it actually produces.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from heisd_ros.core.config import FusedMetricConfig
from heisd_ros.core.errors import ConfigError
from heisd_ros.core.kinematics import FusedMetric
from heisd_ros.pipeline.log_files import READ_ERRORS, open_log

F_QUANTILES = (0.25, 0.5, 0.75, 0.9)
"""Where `f_summary` reports the closed-loop F (the tau candidates of a calibration run)."""


def read_trajectories(path: str | Path, method: str = "ar") -> list[np.ndarray]:
    """The end-effector path [N, 3] of every `method` episode of an eval-libero log (.jsonl / .jsonl.xz / .jsonl.gz)."""
    p = Path(path)
    out = []
    try:
        with open_log(p) as f:
            for line in f:
                rec = json.loads(line)
                if rec.get("kind") == "episode" and rec.get("method") == method:
                    out.append(np.array([s["ee"] for s in rec["steps"]], dtype=np.float64).reshape(-1, 3))
    except (*READ_ERRORS, json.JSONDecodeError, KeyError, ValueError) as err:
        raise ConfigError(f"{p}: not a readable eval-libero log ({err})") from err
    if not out:
        raise ConfigError(f"{p}: no {method} episodes")
    return out


def fused_values(trajectories: Sequence[np.ndarray], fused: FusedMetricConfig) -> np.ndarray:
    """F at every step of every trajectory, as the live metric computes it (steps before its window
    has enough points have none)."""
    values = []
    for traj in trajectories:
        metric = FusedMetric(fused)
        for pos in traj:
            metric.push(pos)
            v = metric.value()
            if v is not None:
                values.append(v)
    return np.asarray(values, dtype=np.float64)


def f_summary(values: np.ndarray) -> dict:
    """Steps, share exactly 0, mean, the `F_QUANTILES` of F values and of the values above 0 (a
    still hand gives F = 0 exactly; tau 0 and any tau above it split those steps alike, so distinct
    tau candidates sit at quantiles of the positive values)."""
    if values.size == 0:
        return {"steps": 0}
    positive = values[values > 0.0]
    return {"steps": int(values.size), "zero_share": float(np.mean(values == 0.0)), "mean": float(values.mean()),
            "quantiles": {f"{q:g}": float(np.quantile(values, q)) for q in F_QUANTILES},
            "positive_quantiles": {f"{q:g}": float(np.quantile(positive, q)) for q in F_QUANTILES}
            if positive.size else {}}
