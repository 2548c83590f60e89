"""The policy's action convention, and the checks that a recorded action stream follows it.

heisd stores OpenVLA action tokens (docs/design.md §3), so every demonstration source must give
7-D actions in one convention:

| dim | name | what |
|---|---|---|
| 0-2 | dX dY dZ | end-effector translation of one control step (a delta, not a target pose) |
| 3-5 | drX drY drZ | end-effector rotation of one control step (roll, pitch, yaw deltas) |
| 6 | gripper | -1 open ... +1 close (robosuite / LIBERO) |

The deltas keep the recording's own units; they must be the units of the VLA's action statistics
(its q01/q99, `dataset_statistics.json`), which `check_fits_model` verifies. The gripper is mapped
from the source's declared range and sign (`ActionConvention`) onto [-1, 1], -1 open.

Checks, in the order a source meets them:

- always (`to_policy`, per episode): 7 dimensions, finite values, gripper inside the declared
  range;
- heuristics (`check_dataset`, over every episode; `trust_actions` skips them): with the default
  range [-1, 1], the gripper must not sit at 0 (a 0/1 gripper read as -1/+1); most episodes must
  start with the gripper open (a flipped sign starts them closed); dX..dZ must not track the
  end-effector position (absolute targets rather than deltas);
- against the model (`check_fits_model`, build-db; `trust_actions` skips it): every delta
  dimension must be on the scale of the model's q01..q99 range: not many times wider, not a tiny
  part of it, not centred outside it, not mostly outside it (another unit, a velocity not divided
  by the rate, joint positions rather than deltas).

Every refusal is a `DemoDataError` that names the dimension, the range found and the flag that
declares the convention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from heisd_ros.core.errors import ConfigError, HeisdError
from heisd_ros.core.types import ACTION_DIM, GRIPPER_INDEX

ACTION_NAMES = ("dX", "dY", "dZ", "drX", "drY", "drZ", "gripper")
RANGE_TOLERANCE = 0.02
"""Slack outside the declared gripper range, as a fraction of its width."""
MAX_SPREAD = 3.0
"""Widest a delta dimension's 1st..99th percentile range may be, in units of the model's q01..q99 span."""
MIN_SPREAD = 0.02
"""Narrowest it may be while it varies at all (below, another unit: metres against centimetres...)."""
MAX_CLIPPED = 0.6
"""Largest share of a delta dimension's steps outside the model's q01..q99 (they clip to edge bins)."""
MAX_MID_GRIPPER = 0.1
"""Largest share of gripper values at the middle (0) of the default range."""


class DemoDataError(HeisdError):
    """Demonstrations cannot be found or read, or do not follow the action convention."""


@dataclass(frozen=True)
class ActionConvention:
    """How a source's gripper value maps onto the policy's -1 open / +1 close."""

    gripper_open_positive: bool = False
    """The source's gripper value is larger when open (e.g. 1 open / 0 closed)."""
    gripper_range: tuple[float, float] = (-1.0, 1.0)
    """The source's gripper values from one end to the other, mapped linearly onto [-1, 1]."""
    trust_actions: bool = False
    """Skip the heuristic and model checks (the dimension count, finiteness and range stay checked)."""

    def __post_init__(self) -> None:
        lo, hi = (float(x) for x in self.gripper_range)
        if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
            raise ConfigError(f"gripper_range must be two finite values LO < HI, got {self.gripper_range}")
        object.__setattr__(self, "gripper_range", (lo, hi))

    @property
    def declared_range(self) -> bool:
        return self.gripper_range != (-1.0, 1.0)

    def to_policy(self, actions: np.ndarray, where: str) -> np.ndarray:
        """Raw actions [T, 7] -> the policy's convention [T, 7] (float64); refuses actions that
        cannot be read as the convention at all."""
        a = np.asarray(actions, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != ACTION_DIM:
            got = a.shape[1] if a.ndim == 2 else a.shape
            raise DemoDataError(f"{where}: actions have {got} dimensions; heisd needs {ACTION_DIM}: "
                                f"{', '.join(ACTION_NAMES)} (map a 6-D arm command plus a separate gripper "
                                "with the 'gripper' role)")
        bad = ~np.isfinite(a)
        if bad.any():
            dims = sorted({ACTION_NAMES[j] for j in np.nonzero(bad)[1]})
            raise DemoDataError(f"{where}: non-finite actions in {dims}")
        lo, hi = self.gripper_range
        g = a[:, GRIPPER_INDEX]
        slack = RANGE_TOLERANCE * (hi - lo)
        if len(g) and (g.min() < lo - slack or g.max() > hi + slack):
            raise DemoDataError(f"{where}: gripper values span [{g.min():.4g}, {g.max():.4g}], outside the declared "
                                f"range [{lo:g}, {hi:g}]; declare the source's range with --gripper-range LO,HI "
                                "(and --gripper-open-positive if larger means open)")
        mapped = np.clip(2.0 * (g - lo) / (hi - lo) - 1.0, -1.0, 1.0)
        out = a.copy()
        out[:, GRIPPER_INDEX] = -mapped if self.gripper_open_positive else mapped
        return out

    def check_dataset(self, episodes: Sequence[tuple[str, np.ndarray, np.ndarray]]) -> None:
        """Heuristic checks over (name, policy actions [T, 7], end-effector positions [T, 3]) of every
        episode of a source; refuses a source that most likely breaks the convention."""
        if self.trust_actions or not episodes:
            return
        grip = np.concatenate([a[:, GRIPPER_INDEX] for _, a, _ in episodes])
        mid = float(np.mean(np.abs(grip) < 0.1)) if grip.size else 0.0
        if not self.declared_range and mid > MAX_MID_GRIPPER:
            raise DemoDataError(
                f"{mid:.0%} of the gripper values sit at 0, the middle of the default range [-1, 1]: the "
                "source's gripper looks like 0/1; declare it with --gripper-range 0,1 (and "
                "--gripper-open-positive if 1 means open)")
        closed = [name for name, a, _ in episodes if len(a) and a[0, GRIPPER_INDEX] > 0]
        if 2 * len(closed) > len(episodes):
            sign = "larger means closed" if self.gripper_open_positive else "larger means open"
            flag = "without --gripper-open-positive" if self.gripper_open_positive else "--gripper-open-positive"
            raise DemoDataError(
                f"{len(closed)} of {len(episodes)} episodes start with the gripper closed (e.g. {closed[0]}): "
                f"the source's gripper sign is probably the other one ({sign}: run {flag}); if the "
                "episodes really start closed, --trust-actions skips this check")
        _check_deltas(episodes)

    def check_fits_model(self, actions: np.ndarray, q01: np.ndarray, q99: np.ndarray, mask: np.ndarray,
                         where: str) -> None:
        """Refuse policy actions [N, 7] whose delta dimensions do not fit the model's statistics in
        scale: spread over many times the model's q01..q99 span, or a tiny part of it, centred
        outside it, or mostly outside it. Small mismatches (another operator, a held-out episode) pass."""
        if self.trust_actions or len(actions) == 0:
            return
        problems = []
        for j in range(GRIPPER_INDEX):
            if not mask[j]:
                continue
            x = actions[:, j]
            span = max(float(q99[j] - q01[j]), 1e-12)
            lo, hi = (float(v) for v in np.percentile(x, [1, 99]))
            ratio, centre = (hi - lo) / span, float(np.median(x))
            clipped = float(np.mean((x < q01[j] - 0.05 * span) | (x > q99[j] + 0.05 * span)))
            found = (f"{ACTION_NAMES[j]} spans [{lo:.4g}, {hi:.4g}] (1st-99th percentile), the model's q01..q99 "
                     f"[{q01[j]:.4g}, {q99[j]:.4g}]")
            if ratio > MAX_SPREAD:
                problems.append(f"{found}: {ratio:.1f} times as wide")
            elif 0 < ratio < MIN_SPREAD and float(np.ptp(x)) > 1e-9:
                problems.append(f"{found}: {ratio:.1%} of it")
            elif not q01[j] - 0.5 * span <= centre <= q99[j] + 0.5 * span:
                problems.append(f"{found}: centred at {centre:.4g}, outside it")
            elif clipped > MAX_CLIPPED:
                problems.append(f"{found}: {clipped:.0%} of the steps fall outside it")
        if problems:
            raise DemoDataError(
                f"{where}: the actions do not fit the model's action statistics (its dataset_statistics.json) in "
                "scale: " + "; ".join(problems) + ". Record deltas in the units the model was trained on (or scale "
                "them, e.g. --twist-linear-scale for a TwistStamped action); --trust-actions skips this check")


def _check_deltas(episodes: Sequence[tuple[str, np.ndarray, np.ndarray]]) -> None:
    """Refuse dX..dZ that follow the end-effector position: absolute position targets, not deltas."""
    a = np.concatenate([a[:, :3] for _, a, _ in episodes])
    p = np.concatenate([p[:, :3] for _, _, p in episodes])
    if not len(a):
        return
    reach = float(np.median(np.linalg.norm(p, axis=1)))
    gap = float(np.median(np.linalg.norm(a - p, axis=1)))
    if reach > 0.05 and gap < 0.1 * reach:
        raise DemoDataError(
            f"dX, dY, dZ stay within {gap:.3g} (median) of the end-effector position, {reach:.3g} from the origin: "
            "they look like absolute position targets; heisd needs the translation of each step (a delta). "
            "--trust-actions skips this check")
