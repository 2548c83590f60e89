"""The operating point from shadow recordings: candidate points replayed, chosen by one fixed rule.

`heisd choose-point --shadow` hands the recorded episodes (the node executing ar, heisd shadowed)
to `choose`. Each candidate (the base point and its variations of min_S, N_max and the
distance-to-verified check, plus the point without skips) is replayed over every episode
(`shadow_replay.replay_episode`), and the rule, fixed before any candidate is seen, is the LIBERO
path's with the success criterion replaced by per-step bounds on the executed trajectory:

- enough evidence: at least `min_episodes` episodes and `min_steps` steps, else the recording is
  refused with the reason;
- over a candidate's skip steps alone (a demonstration's action executed unverified), the 95th
  percentile of the position group's |delta bin| from the executed tokens is at most
  `max_position_p95_bins` and the gripper token differs on at most `max_gripper_disagreement` of
  them (a candidate without skips passes; relaxed tree steps are reported, bounded by acceptance);
- among the eligible, the highest expected speed-up wins: the mean executed step time over the
  mean step time the candidate would have had, each step priced by what the shadow measured for
  its mode (skip: vision and query; retrieval: plus the tree's decode; drafter: vision and the
  drafter's decode).

The speed is an estimate from measured stage times (decisions never read them); the chosen point
is then run in dry run and measured (docs/your_data.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from heisd_ros.core.config import DecoderConfig
from heisd_ros.core.errors import ConfigError
from heisd_ros.core.shadow import LIVE_LAGS, ShadowStep
from heisd_ros.pipeline.shadow_replay import ReplayedStep, replay_episode


@dataclass(frozen=True)
class ShadowRule:
    """The fixed rule (module doc)."""

    max_position_p95_bins: float = 30.0
    max_gripper_disagreement: float = 0.005
    min_episodes: int = 10
    min_steps: int = 500


@dataclass(frozen=True)
class RecordedEpisode:
    """One episode of a shadow recording: per executed step its record and its decode time."""

    instruction: str
    steps: Sequence[ShadowStep]
    executed_ms: Sequence[float]
    source: str = ""
    """Which recorded episode this is (bag and the node's episode counter): a recorded episode with
    unshadowed steps (no slack) comes as several runs of consecutive steps, each replayed afresh."""


MIN_SIMILARITIES = (0.9, 0.95, 0.98, 0.99, 0.995)
MAX_CONSECUTIVE = (1, 2, 3)
BINS_FROM_VERIFIED = (0, 20)


def candidates(base: DecoderConfig) -> dict[str, DecoderConfig]:
    """{label: point}: the base point, its variations, and the base without skips."""
    out = {"base": base, "no_skip": _skip(base, enabled=False)}
    lo, hi = base.verify_skip.min_similarity_bounds
    for s in MIN_SIMILARITIES:
        for n in MAX_CONSECUTIVE:
            for b in BINS_FROM_VERIFIED:
                if lo <= s <= hi:
                    out[f"min_S={s} N_max={n} from_verified={b}"] = _skip(
                        base, min_similarity=s, max_consecutive_skips=n, max_bins_from_verified=b)
    return out


def boundary_off(point: DecoderConfig) -> DecoderConfig:
    """The point with τ 0: what the boundary costs, for the report beside the chosen point. The rule
    never varies τ (it is the calibration's, fitted on where drafts pass); a user weighs this figure
    against what the boundary buys in success (docs/design.md §5)."""
    return dataclasses.replace(point, fused_metric=dataclasses.replace(point.fused_metric, tau=0.0))


def _skip(cfg: DecoderConfig, **changes) -> DecoderConfig:
    return dataclasses.replace(cfg, verify_skip=dataclasses.replace(cfg.verify_skip, **changes))


def _step_ms(step: ShadowStep, replayed: ReplayedStep) -> float:
    if replayed.mode == "skip":
        return step.vision_ms + step.retrieval_ms
    if replayed.mode == "retrieval":
        return step.vision_ms + step.retrieval_ms + step.tree_ms
    return step.vision_ms + step.drafter_ms


def _p95(values: Sequence[float]) -> float:
    return float(np.percentile(values, 95)) if len(values) else math.nan


def evaluate(cfg: DecoderConfig, episodes: Sequence[RecordedEpisode], rule: ShadowRule) -> dict:
    """A candidate's replayed figures and verdict."""
    modes: dict[str, int] = {}
    skip_bins, skip_gripper, relaxed_bins, ms, executed = [], [], [], [], []
    for e in episodes:
        for step, replayed, ex_ms in zip(e.steps, replay_episode(e.steps, cfg), e.executed_ms):
            modes[replayed.mode] = modes.get(replayed.mode, 0) + 1
            ms.append(_step_ms(step, replayed))
            executed.append(ex_ms)
            if replayed.mode == "skip":
                skip_bins.append(replayed.position_bins)
                skip_gripper.append(replayed.gripper_differs)
            elif replayed.mode == "retrieval":
                relaxed_bins.append(replayed.position_bins)
    skip_p95, gripper = _p95(skip_bins), float(np.mean(skip_gripper)) if skip_gripper else 0.0
    why = []
    if cfg.verify_skip.enabled and cfg.verify_skip.max_consecutive_skips > LIVE_LAGS:
        why.append(f"N_max {cfg.verify_skip.max_consecutive_skips} beyond what the records replay ({LIVE_LAGS})")
    if skip_bins and not skip_p95 <= rule.max_position_p95_bins:
        why.append(f"skip steps' position p95 {skip_p95:.1f} bins > {rule.max_position_p95_bins:g}")
    if gripper > rule.max_gripper_disagreement:
        why.append(f"skip steps' gripper disagreement {100 * gripper:.2f} % > {100 * rule.max_gripper_disagreement:g} %")
    total = sum(modes.values())
    return {"steps": total, "mode_mix": modes, "skip_share": modes.get("skip", 0) / total if total else 0.0,
            "skip_position_p95_bins": skip_p95, "skip_gripper_disagreement": gripper,
            "relaxed_position_p95_bins": _p95(relaxed_bins),
            "expected_step_ms": float(np.mean(ms)) if ms else math.nan,
            "executed_step_ms": float(np.mean(executed)) if executed else math.nan,
            "expected_speedup": float(np.mean(executed) / np.mean(ms)) if ms else math.nan,
            "eligible": not why, "why_refused": why}  # fmt: skip


def choose(base: DecoderConfig, episodes: Sequence[RecordedEpisode],
           rule: ShadowRule = ShadowRule()) -> tuple[str, DecoderConfig, dict[str, dict]]:
    """(label, point, every candidate's figures) of the recording; ConfigError when it is too short."""
    steps = sum(len(e.steps) for e in episodes)
    recorded = len({e.source or id(e) for e in episodes})
    if recorded < rule.min_episodes or steps < rule.min_steps:
        raise ConfigError(f"the recording holds {recorded} episodes and {steps} steps; the rule needs at least "
                          f"{rule.min_episodes} episodes and {rule.min_steps} steps (record more shadow episodes)")
    points = candidates(base)
    figures = {label: evaluate(cfg, episodes, rule) for label, cfg in points.items()}
    eligible = [label for label, f in figures.items() if f["eligible"]]
    # ties (to 0.1 %) go to the base point, then to the stricter check: the same speed for less risk
    best = max(eligible, key=lambda label: (round(figures[label]["expected_speedup"], 3), label == "base",
                                            points[label].verify_skip.min_similarity,
                                            -points[label].verify_skip.max_consecutive_skips,
                                            points[label].verify_skip.max_bins_from_verified > 0))  # fmt: skip
    return best, points[best], figures
