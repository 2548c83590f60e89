"""Adaptive verify-skip: use a retrieval hit without a verification forward (docs/design.md §6).

Online, `VerifySkipPolicy.decide` lets a hit skip verification when the live feature of the last
verified step is close to the hit's `feat_prev` (cosine >= min_S), the end effector is close to the
hit's position (<= O_dist), the hit keeps the executed gripper state (and, optionally, its
demonstration does not switch the gripper in the next few actions), fewer than N_max steps in a
row were skipped, and (each optional) the other Top-K hits agree with the hit's motion and the hit's
motion is near the last verified step's. Episode feedback moves min_S and O_dist and persists them atomically.
Offline, `calibrate_thresholds` derives min_S and O_dist from database pairs.

This rule is lossy by design: a skipped step executes a demonstration's tokens that the target
model never checked.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from heisd_ros.core.config import VerifySkipConfig
from heisd_ros.core.errors import ConfigError, InvalidObservationError
from heisd_ros.core.files import read_json
from heisd_ros.core.types import GRIPPER_INDEX, Hit

log = logging.getLogger(__name__)

# Reasons reported by `SkipDecision.reason`, in the order the vetoes are checked.
REASON_SKIP = "skip"
REASON_DISABLED = "disabled"
REASON_NO_LIVE_FEATURE = "no_live_feature"
REASON_MAX_CONSECUTIVE = "max_consecutive_skips"
REASON_GRIPPER = "gripper_mismatch"
REASON_GRIPPER_AHEAD = "gripper_change_ahead"
REASON_SIMILARITY = "low_similarity"
REASON_DISTANCE = "too_far"
REASON_SPREAD = "hits_disagree"
REASON_FROM_VERIFIED = "far_from_verified"

POSITION = slice(0, 3)
"""The position group (X, Y, Z) of an action's 7 tokens."""

_STATE_VERSION = 1


@dataclass(frozen=True)
class SkipDecision:
    """Outcome of `VerifySkipPolicy.decide`; measures are NaN where not evaluated."""

    skip: bool
    reason: str
    similarity: float = math.nan
    distance: float = math.nan
    spread_bins: float = math.nan
    """Median position-group |delta bin| from the hit to the other hits (NaN: no other hit)."""
    from_verified_bins: float = math.nan
    """Position-group |delta bin| from the hit to the last verified step's tokens (NaN: none yet)."""


def position_bins(a, b) -> float:
    """Summed |delta bin| of the position group between two 7-token actions (token ids differ by
    exactly the bins: id = vocab - bin)."""
    # three ints: plain Python beats numpy's per-call overhead on the step's path
    return float(sum(abs(int(x) - int(y)) for x, y in zip(a[POSITION], b[POSITION])))


def hit_spread_bins(hit: Hit, hits: Sequence[Hit]) -> float:
    """Median position-group |delta bin| from `hit` to every other hit of the Top-K (NaN: none)."""
    others = [position_bins(hit.action_tokens, h.action_tokens) for h in hits if h is not hit]
    return float(np.median(others)) if others else math.nan


def gripper_switch_in(hit: Hit) -> int:
    """Actions after `hit` until its demonstration opens or closes the gripper (0: not within the
    stored next actions). Stored gripper actions are in [-1, 1] (build-db normalises other ranges):
    a change is a change of sign."""
    now = float(hit.action[GRIPPER_INDEX]) > 0.0
    for k, a in enumerate(hit.next_actions, start=1):
        if (float(a[GRIPPER_INDEX]) > 0.0) != now:
            return k
    return 0


def skip_verdict(cfg: VerifySkipConfig, min_similarity: float, max_distance_m: float, *, gripper_kept: bool,
                 switch_in: int, similarity: float, distance: float, spread: float, from_verified: float) -> str:
    """The skip check on a hit's measures, at thresholds (min_S, O_dist): REASON_SKIP or why not.
    One rule for the decoder and for `heisd choose-point --shadow`'s offline replay.

    A skip keeps the gripper, and none is taken where the demonstration switches it within
    `gripper_lookahead_steps`: there the policy usually switches a step or two earlier or later,
    so a skip would hold the gripper against the model."""
    if not gripper_kept:
        return REASON_GRIPPER
    if 0 < switch_in <= cfg.gripper_lookahead_steps:
        return REASON_GRIPPER_AHEAD
    if similarity < min_similarity:
        return REASON_SIMILARITY
    if distance > max_distance_m:
        return REASON_DISTANCE
    # NaN (no other hit, no verified step yet) fails an enabled check: no evidence, no skip
    if cfg.max_hit_spread_bins and not spread <= cfg.max_hit_spread_bins:
        return REASON_SPREAD
    if cfg.max_bins_from_verified and not from_verified <= cfg.max_bins_from_verified:
        return REASON_FROM_VERIFIED
    return REASON_SKIP


def cosine_similarity(a: np.ndarray, b: np.ndarray) -> float:
    """cos(a, b) of two vectors [D] in float64; 0.0 if either has zero norm."""
    a64 = np.asarray(a, dtype=np.float64).ravel()
    b64 = np.asarray(b, dtype=np.float64).ravel()
    denom = float(np.linalg.norm(a64)) * float(np.linalg.norm(b64))
    if denom == 0.0:
        return 0.0
    return float(np.dot(a64, b64)) / denom


class VerifySkipPolicy:
    """min_S / O_dist thresholds, the consecutive-skip counter and their episode feedback.

    State persisted at `cfg.state_path` (JSON) is loaded on construction when it was adapted from
    the same configured thresholds; a corrupt file, or one adapted from other thresholds (the
    configuration or calibration changed since), is ignored with a warning.
    """

    def __init__(self, cfg: VerifySkipConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else VerifySkipConfig()
        self.min_similarity = self.cfg.min_similarity
        self.max_distance_m = self.cfg.max_distance_m
        self.consecutive_skips = 0
        if self.cfg.state_path and self.cfg.online:  # without the online stage the point's thresholds run
            self._load(Path(self.cfg.state_path))

    # ------------------------------------------------------------------ online rule

    def decide(
        self,
        f_live: np.ndarray | None,
        hit: Hit,
        ee_pos: np.ndarray,
        last_gripper_token: int | None,
        hits: Sequence[Hit] = (),
        last_verified_tokens: Sequence[int] | None = None,
    ) -> SkipDecision:
        """Whether `hit` may be executed without verification. Does not change any state.

        f_live: [D] feature of the most recent verified step (None before the first one).
        ee_pos: [3] current end-effector position, metres.
        last_gripper_token: gripper token of the last executed action (None if none yet).
        hits: the step's Top-K (`hit` among them), for the agreement check.
        last_verified_tokens: the 7 tokens the last verified step executed (None if none yet).
        Raises InvalidObservationError if f_live and hit.feat_prev differ in shape or either
        input is non-finite (a model/database mismatch must not pass silently as "no skip").
        """
        if not self.cfg.enabled:
            return SkipDecision(False, REASON_DISABLED)
        if f_live is None:
            return SkipDecision(False, REASON_NO_LIVE_FEATURE)
        if self.consecutive_skips >= self.cfg.max_consecutive_skips:
            return SkipDecision(False, REASON_MAX_CONSECUTIVE)
        similarity, distance = self._measure(f_live, hit, ee_pos)
        spread = hit_spread_bins(hit, hits)
        from_verified = math.nan if last_verified_tokens is None else position_bins(hit.action_tokens,
                                                                                     last_verified_tokens)
        gripper_kept = last_gripper_token is not None and int(hit.action_tokens[GRIPPER_INDEX]) == int(last_gripper_token)
        reason = skip_verdict(self.cfg, self.min_similarity, self.max_distance_m, gripper_kept=gripper_kept,
                              switch_in=gripper_switch_in(hit), similarity=similarity, distance=distance,
                              spread=spread, from_verified=from_verified)  # fmt: skip
        return SkipDecision(reason == REASON_SKIP, reason, similarity, distance, spread, from_verified)

    @staticmethod
    def _measure(f_live: np.ndarray, hit: Hit, ee_pos: np.ndarray) -> tuple[float, float]:
        f = np.asarray(f_live, dtype=np.float64)
        g = np.asarray(hit.feat_prev, dtype=np.float64)
        if f.shape != g.shape:
            raise InvalidObservationError(
                f"live feature shape {f.shape} != hit feat_prev shape {g.shape} (model/database mismatch?)"
            )
        p = np.asarray(ee_pos, dtype=np.float64)
        q = np.asarray(hit.ee_pos, dtype=np.float64)
        if p.shape != (3,) or q.shape != (3,):
            raise InvalidObservationError(f"ee_pos shapes must be [3], got {p.shape} and {q.shape}")
        if not (np.all(np.isfinite(f)) and np.all(np.isfinite(p)) and np.all(np.isfinite(q))):
            raise InvalidObservationError("non-finite live feature or end-effector position")
        return cosine_similarity(f, g), float(np.linalg.norm(p - q))

    def record(self, skipped: bool) -> None:
        """Count the step just executed: a skip extends the run, a verified step ends it."""
        self.consecutive_skips = self.consecutive_skips + 1 if skipped else 0

    def reset_episode(self) -> None:
        """Start of an episode: no skips in a row yet (thresholds are kept)."""
        self.consecutive_skips = 0

    def restore_configured(self) -> None:
        """The configured min_S and O_dist, as before any feedback (the persisted state is not touched)."""
        self.min_similarity = self.cfg.min_similarity
        self.max_distance_m = self.cfg.max_distance_m

    # ------------------------------------------------------------------ feedback and persistence

    def feedback(self, success: bool) -> None:
        """Episode result: success lowers min_S by Δ (skip more); failure raises it and shrinks O_dist.

        Both are clamped to their configured bounds and, with a state_path, persisted atomically.
        A failed write is logged and the in-memory state kept (a feedback callback must not crash).
        """
        c = self.cfg
        if success:
            self.min_similarity -= c.feedback_step
        else:
            self.min_similarity += c.feedback_step
            self.max_distance_m *= c.distance_shrink
        self.min_similarity = float(np.clip(self.min_similarity, *c.min_similarity_bounds))
        self.max_distance_m = float(np.clip(self.max_distance_m, *c.max_distance_bounds_m))
        if c.state_path:
            try:
                self.save(c.state_path)
            except OSError as err:
                log.warning("verify-skip: cannot persist state to %s: %s", c.state_path, err)

    def state_dict(self) -> dict[str, Any]:
        """Current thresholds and counter, plus the configured thresholds they were adapted from."""
        return {
            "version": _STATE_VERSION,
            "min_similarity": self.min_similarity,
            "max_distance_m": self.max_distance_m,
            "consecutive_skips": self.consecutive_skips,
            "base_min_similarity": self.cfg.min_similarity,
            "base_max_distance_m": self.cfg.max_distance_m,
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the state as JSON atomically: a temp file in the same directory, then os.replace."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.state_dict(), fh, indent=2)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _load(self, path: Path) -> None:
        if not path.exists():
            return
        try:
            data = read_json(path, ConfigError)  # a ValueError: over the cap is ignored as corrupt
            min_s = float(data["min_similarity"])
            max_d = float(data["max_distance_m"])
            base = (float(data["base_min_similarity"]), float(data["base_max_distance_m"]))
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("verify-skip: ignoring corrupt state file %s (%s); using config defaults", path, err)
            return
        if not (math.isfinite(min_s) and math.isfinite(max_d)):
            log.warning("verify-skip: ignoring non-finite thresholds in %s; using config defaults", path)
            return
        if base != (self.cfg.min_similarity, self.cfg.max_distance_m):
            log.warning(
                "verify-skip: state in %s was adapted from thresholds %s, config now has %s; "
                "starting from the config",
                path, base, (self.cfg.min_similarity, self.cfg.max_distance_m),
            )
            return
        self.min_similarity = float(np.clip(min_s, *self.cfg.min_similarity_bounds))
        self.max_distance_m = float(np.clip(max_d, *self.cfg.max_distance_bounds_m))
        log.info(
            "verify-skip: resumed min_S=%.4f O_dist=%.4f m from %s", self.min_similarity, self.max_distance_m, path
        )


# ---------------------------------------------------------------------------------------------
# offline calibration


@dataclass(frozen=True)
class SkipCurve:
    """Similarity binned against mean distance and pass rate, for the calibration plot. Shapes [B]."""

    bin_edges: np.ndarray  # [B + 1] similarity
    count: np.ndarray  # [B] pairs per bin
    mean_distance_m: np.ndarray  # [B] NaN for empty bins
    pass_rate: np.ndarray  # [B] NaN for empty bins

    def to_dict(self) -> dict[str, list[float]]:
        return {f.name: np.asarray(getattr(self, f.name)).tolist() for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class SkipCalibration:
    """Result of `calibrate_thresholds`.

    qualified is False when no similarity reaches the target pass rate; then min_similarity is 1.0
    (never skip) and the calibration tool should write `enabled: false` rather than min_S = 1.0,
    which lies outside the default min_similarity_bounds.
    """

    min_similarity: float
    max_distance_m: float
    qualified: bool
    n_pairs: int
    pass_rate_at_min: float
    """Pass rate of the pairs with S >= min_similarity (NaN if not qualified)."""
    curve: SkipCurve


def calibrate_thresholds(
    similarity: np.ndarray,
    distance: np.ndarray,
    passed: np.ndarray,
    target_pass_rate: float = 0.95,
    n_bins: int = 20,
) -> SkipCalibration:
    """min_S and O_dist from database pairs (the offline stage of verify-skip).

    similarity [M]: cos(feat_i, feat_j); distance [M]: |p_i - p_j| in metres; passed [M]: whether
    j's tokens pass the sequence-relaxed check against i's. min_S is the smallest similarity s with
    pass rate >= target among the pairs with S >= s (ties included); O_dist is the 95th percentile
    of distance over the passing pairs with S >= min_S.
    """
    s = np.asarray(similarity, dtype=np.float64).ravel()
    d = np.asarray(distance, dtype=np.float64).ravel()
    ok = np.asarray(passed, dtype=bool).ravel()
    if not (len(s) == len(d) == len(ok)):
        raise ValueError(f"length mismatch: similarity {len(s)}, distance {len(d)}, passed {len(ok)}")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(d))):
        raise ValueError("similarity and distance must be finite")
    if not 0.0 < target_pass_rate <= 1.0:
        raise ValueError(f"target_pass_rate must be in (0, 1], got {target_pass_rate}")
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    curve = _curve(s, d, ok, n_bins)

    # Pass rate of {S >= s} for every unique s: sort descending, cumulate, read at the end of each tie run.
    order = np.argsort(-s, kind="stable")
    s_sorted = s[order]
    cum_pass = np.cumsum(ok[order])
    n_at_or_above = np.arange(1, len(s) + 1)
    last_of_run = np.ones(len(s), dtype=bool)
    last_of_run[:-1] = s_sorted[1:] != s_sorted[:-1]
    rates = cum_pass[last_of_run] / n_at_or_above[last_of_run]
    thresholds = s_sorted[last_of_run]  # descending
    good = np.flatnonzero(rates >= target_pass_rate)
    if good.size == 0:
        return SkipCalibration(1.0, 0.0, False, len(s), math.nan, curve)
    k = int(good[-1])  # the smallest qualifying similarity
    min_s = float(thresholds[k])
    sel = (s >= min_s) & ok
    return SkipCalibration(min_s, float(np.percentile(d[sel], 95)), True, len(s), float(rates[k]), curve)


def _curve(s: np.ndarray, d: np.ndarray, ok: np.ndarray, n_bins: int) -> SkipCurve:
    lo, hi = (float(s.min()), float(s.max())) if len(s) else (0.0, 1.0)
    if hi <= lo:
        hi = lo + 1e-9
    edges = np.linspace(lo, hi, n_bins + 1)
    idx = np.clip(np.searchsorted(edges, s, side="right") - 1, 0, n_bins - 1)
    count = np.bincount(idx, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_d = np.bincount(idx, weights=d, minlength=n_bins) / count
        rate = np.bincount(idx, weights=ok.astype(np.float64), minlength=n_bins) / count
    return SkipCurve(edges, count, mean_d, rate)
