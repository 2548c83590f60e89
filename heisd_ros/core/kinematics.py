"""Kinematic fused metric F: the first gate on the draft source of each control step (docs/design.md §5;
core/source_choice.py adds the second, what verification has cost this episode).

F = alpha * Norm(R) + (1 - alpha) * Norm(D) over a sliding window of end-effector positions:
R is the curvature radius of the window, D its cumulative displacement. Large F (fast, straight,
coarse motion) prefers retrieval drafts; small F (slow, curved, fine motion) prefers the drafter.

Everything here is NumPy only and cheap enough to run at every control step.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from heisd_ros.core.config import FusedMetricConfig
from heisd_ros.core.errors import InvalidObservationError

MIN_POINTS = 3
"""A circle needs three points; with fewer the metric is undefined (drafter mode)."""
_GN_ITERATIONS = 4
"""Enough on 15-point windows: R within ~1e-4 of the converged fit even on short noisy arcs."""
_GN_STEP_TOL = 1e-6
"""Stop when the centre moves less than this times (1 + |centre|), in units of the window's RMS size."""


def cumulative_displacement(points: np.ndarray) -> float:
    """Sum of the 3-D distances between consecutive points [N, 3], metres (0.0 for N < 2)."""
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != 3:
        raise ValueError(f"points must have shape [N, 3], got {pts.shape}")
    if len(pts) < 2:
        return 0.0
    return float(np.sqrt(np.square(np.diff(pts, axis=0)).sum(axis=1)).sum())


def curvature_radius(points: np.ndarray, cfg: FusedMetricConfig) -> float:
    """Radius of the circle best fitting the window `points` [N, 3] (N >= 3), metres, in (0, r_max_m].

    The points are centred and projected onto their two principal directions; a circle is fitted
    there (algebraic Kåsa fit, refined by Gauss-Newton on the geometric distance) and R is the mean
    distance of the projected points from the fitted centre. Stationary windows (principal extent
    below `stationary_tol_m`), near-collinear ones (second / first singular value below
    `collinear_tol`) and degenerate fits are straight lines: R = `r_max_m`. Callers must not ask
    with fewer than 3 points (ValueError); `FusedMetric` returns None instead.
    """
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != 3:
        raise ValueError(f"points must have shape [N, 3], got {pts.shape}")
    if len(pts) < MIN_POINTS:
        raise ValueError(f"curvature_radius needs at least {MIN_POINTS} points, got {len(pts)}")
    centred = pts - pts.sum(axis=0) * (1.0 / len(pts))
    # Right singular vectors are the principal directions; the SVD of [N, 3] is a few microseconds.
    _, sing, vt = np.linalg.svd(centred, full_matrices=False)
    plane = centred @ vt[:2].T  # [N, 2], zero mean, uncorrelated columns
    extent = float(plane[:, 0].max() - plane[:, 0].min())
    if extent < cfg.stationary_tol_m or sing[1] < cfg.collinear_tol * sing[0]:
        return cfg.r_max_m
    # Fit in units of the window's size so the numbers are well conditioned at any scale.
    scale = float(sing[0]) / math.sqrt(len(pts))
    xy = plane / scale
    centre = _kasa_centre(xy)
    if centre is None:
        return cfg.r_max_m
    centre = _gauss_newton_centre(xy, centre)
    radius = float(np.sqrt(np.square(xy - centre).sum(axis=1)).sum()) / len(xy) * scale
    if not math.isfinite(radius) or radius <= 0.0:
        return cfg.r_max_m
    return min(radius, cfg.r_max_m)


def _solve2(m: np.ndarray, g: np.ndarray) -> tuple[float, float] | None:
    """Solve the symmetric 2x2 system m @ x = g by Cramer's rule (np.linalg costs ~10 us per call)."""
    m00, m01, m11 = float(m[0, 0]), float(m[0, 1]), float(m[1, 1])
    det = m00 * m11 - m01 * m01
    if not det > 1e-12 * max(m00 * m11, 1e-300):
        return None
    g0, g1 = float(g[0]), float(g[1])
    return (m11 * g0 - m01 * g1) / det, (m00 * g1 - m01 * g0) / det


def _kasa_centre(xy: np.ndarray) -> np.ndarray | None:
    """Algebraic (Kåsa) circle fit of zero-mean points xy [N, 2]; centre [2], or None if singular.

    Least squares on x^2 + y^2 = 2a x + 2b y + c. With zero-mean x, y the normal equations of
    (a, b) decouple from c: 2 (X^T X) [a, b] = X^T z with z = x^2 + y^2.
    """
    z = np.square(xy).sum(axis=1)  # [N]
    sol = _solve2(2.0 * (xy.T @ xy), xy.T @ z)
    if sol is None or not (math.isfinite(sol[0]) and math.isfinite(sol[1])):
        return None
    return np.array(sol)


def _gauss_newton_centre(xy: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Refine the centre [2] by Gauss-Newton on the geometric residuals |p_i - c| - mean_j |p_j - c|.

    The radius is eliminated (it is the mean distance for any centre), leaving a 2x2 system per
    iteration. Kåsa is biased towards small radii on short noisy arcs; a few geometric iterations
    remove most of that. A step that produces non-finite numbers ends the refinement.
    """
    a, b = float(centre[0]), float(centre[1])
    inv_n = 1.0 / len(xy)  # sum * inv_n: ndarray.mean() costs ~10 us of overhead on tiny arrays
    for _ in range(_GN_ITERATIONS):
        delta = xy - (a, b)  # [N, 2]
        dist = np.sqrt(np.square(delta).sum(axis=1))  # [N]
        dist = np.maximum(dist, 1e-12)  # a point on the centre has no gradient direction
        unit = delta / dist[:, None]
        unit -= unit.sum(axis=0) * inv_n  # d(resid_i)/d(a, b) = -(unit_i - mean unit)
        resid = dist - dist.sum() * inv_n
        step = _solve2(unit.T @ unit, unit.T @ resid)
        if step is None or not (math.isfinite(step[0]) and math.isfinite(step[1])):
            break
        a, b = a + step[0], b + step[1]
        if abs(step[0]) + abs(step[1]) <= _GN_STEP_TOL * (1.0 + abs(a) + abs(b)):
            break
    return np.array((a, b))


def normalise(value: float, lo: float, hi: float) -> float:
    """Min-max normalisation of `value` to [0, 1], clipped (values beyond `hi`, e.g. the p95, give 1)."""
    if not hi > lo:
        raise ValueError(f"normalise needs hi > lo, got lo={lo}, hi={hi}")
    if math.isnan(value):
        raise ValueError("normalise got NaN")
    return min(1.0, max(0.0, (value - lo) / (hi - lo)))


class FusedMetric:
    """Sliding window of end-effector positions and the fused metric F over it.

    Call `push(ee_pos)` once per control step, then `value()` / `prefers_retrieval()`. R, D and F
    are computed lazily once per push and cached.
    """

    def __init__(self, cfg: FusedMetricConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else FusedMetricConfig()
        self._buf = np.zeros((self.cfg.window_steps, 3), dtype=np.float64)  # oldest first
        self._count = 0
        self._cache: tuple[float, float, float] | None = None  # (R, D, F)

    def __len__(self) -> int:
        return self._count

    def push(self, ee_pos: np.ndarray | Sequence[float]) -> None:
        """Append one end-effector position [3] (metres); the oldest drops out of a full window.

        Raises InvalidObservationError (window unchanged) for a wrong shape or non-finite value.
        """
        try:
            p = np.asarray(ee_pos, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise InvalidObservationError(f"ee_pos is not numeric: {ee_pos!r}") from err
        if p.shape != (3,):
            raise InvalidObservationError(f"ee_pos must have shape [3], got {p.shape}")
        if not np.all(np.isfinite(p)):
            raise InvalidObservationError(f"ee_pos must be finite, got {p.tolist()}")
        if self._count < len(self._buf):
            self._buf[self._count] = p
            self._count += 1
        else:
            self._buf[:-1] = self._buf[1:]
            self._buf[-1] = p
        self._cache = None

    def reset(self) -> None:
        """Forget the window (call at episode start)."""
        self._count = 0
        self._cache = None

    def window(self) -> np.ndarray:
        """The positions in the window, oldest first [n, 3] (a copy)."""
        return self._buf[: self._count].copy()

    def _compute(self) -> tuple[float, float, float] | None:
        if self._count < MIN_POINTS:
            return None
        if self._cache is None:
            pts = self._buf[: self._count]
            r = curvature_radius(pts, self.cfg)
            d = cumulative_displacement(pts)
            c = self.cfg
            f = c.alpha * normalise(r, c.r_min_m, c.r_p95_m) + (1.0 - c.alpha) * normalise(
                d, c.d_min_m, c.d_p95_m
            )
            self._cache = (r, d, f)
        return self._cache

    def radius(self) -> float | None:
        """Curvature radius R of the window, metres (None with fewer than 3 points)."""
        out = self._compute()
        return None if out is None else out[0]

    def displacement(self) -> float | None:
        """Cumulative displacement D of the window, metres (None with fewer than 3 points)."""
        out = self._compute()
        return None if out is None else out[1]

    def value(self) -> float | None:
        """Fused metric F in [0, 1] (None with fewer than 3 points: the caller uses the drafter)."""
        out = self._compute()
        return None if out is None else out[2]

    def prefers_retrieval(self) -> bool:
        """F >= tau; False while the window holds fewer than 3 points."""
        f = self.value()
        return f is not None and f >= self.cfg.tau


def fit_normalisation(
    trajectories: Sequence[np.ndarray],
    window_steps: int,
    cfg: FusedMetricConfig | None = None,
) -> dict[str, float]:
    """Normalisation statistics of R and D from demonstration trajectories (calibration tool).

    trajectories: end-effector paths, each [N, 3] metres. Every step t >= 2 contributes the window
    the online metric would see there, points[max(0, t - w + 1) : t + 1] (so the short windows of
    an episode's start are included, as they are online). `cfg` supplies r_max_m and the
    collinear/stationary tolerances (defaults if None).

    Returns r_min_m, r_p95_m, d_min_m, d_p95_m (minimum and 95th percentile). A p95 that does not
    exceed its minimum (e.g. every window straight) is raised to minimum + 1e-6 m so the result
    always builds a valid FusedMetricConfig.
    """
    if window_steps < MIN_POINTS:
        raise ValueError(f"window_steps must be >= {MIN_POINTS}, got {window_steps}")
    cfg = cfg if cfg is not None else FusedMetricConfig()
    radii: list[float] = []
    disps: list[float] = []
    for k, traj in enumerate(trajectories):
        pts = np.asarray(traj, dtype=np.float64)
        if pts.ndim != 2 or pts.shape[1] != 3:
            raise ValueError(f"trajectory {k} must have shape [N, 3], got {pts.shape}")
        if not np.all(np.isfinite(pts)):
            raise ValueError(f"trajectory {k} contains non-finite positions")
        # D of every window at once: a running sum of the step lengths.
        csum = np.concatenate(([0.0], np.cumsum(np.sqrt(np.square(np.diff(pts, axis=0)).sum(axis=1)))))
        for t in range(MIN_POINTS - 1, len(pts)):
            start = max(0, t - window_steps + 1)
            radii.append(curvature_radius(pts[start : t + 1], cfg))
            disps.append(float(csum[t] - csum[start]))
    if not radii:
        raise ValueError(f"no trajectory has the {MIN_POINTS} points a window needs")
    r = np.asarray(radii)
    d = np.asarray(disps)
    r_min, d_min = float(r.min()), float(d.min())
    return {
        "r_min_m": r_min,
        "r_p95_m": max(float(np.percentile(r, 95)), r_min + 1e-6),
        "d_min_m": d_min,
        "d_p95_m": max(float(np.percentile(d, 95)), d_min + 1e-6),
    }
