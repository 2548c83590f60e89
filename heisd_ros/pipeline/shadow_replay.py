"""heisd at a candidate operating point, replayed over shadow records of steps another method executed.

`PointReplay(cfg).step(record)` (and `replay_episode(records, cfg)` over a whole episode) walks one episode's `ShadowStep`s (heisd_ros/core/shadow.py) in
order and makes heisd's decisions at `cfg` as the decoder makes them, with the decisions that
depend on the sequence carried along: the kinematic boundary and the source costs
(`SourceChoice`, fed the replayed steps' costs in LLM forwards), the consecutive-skip counter,
the live feature of the last verified step (a hit's similarity is read at the lag of the skips
since it), the last verified tokens and the last executed gripper token. Each replayed step says
what it would have executed and how far that is from what was executed (position-group |delta bin|
and the gripper token), the deviation `heisd choose-point --shadow` holds to the point's bound.

One approximation, stated in docs/your_data.md: a verified step of the replay takes its live
feature from the executed step (ar's tokens); where the replay's relaxed tree accepted other
tokens, heisd's own feature would differ slightly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from heisd_ros.core.config import DecoderConfig
from heisd_ros.core.shadow import ShadowHit, ShadowStep
from heisd_ros.core.source_choice import SourceChoice
from heisd_ros.core.types import GRIPPER_INDEX, StepStats
from heisd_ros.core.verify_skip import (
    REASON_DISABLED,
    REASON_MAX_CONSECUTIVE,
    REASON_NO_LIVE_FEATURE,
    REASON_SKIP,
    position_bins,
    skip_verdict,
)


@dataclass(frozen=True)
class ReplayedStep:
    """What heisd at the candidate point would have done on one recorded step."""

    mode: str
    """'drafter', 'retrieval' (the Top-K tree, relaxed) or 'skip' (a hit executed unverified)."""
    cost_forwards: float
    """The step's cost in LLM forwards, as the source choice counts it (`SourceChoice.step_cost`)."""
    position_bins: float
    """Position-group |delta bin| of what it would execute against what was executed."""
    gripper_differs: bool
    skip_check: str = ""
    """The top hit's verdict where the step retrieved ('' otherwise)."""


def _spread(hit: ShadowHit, hits: Sequence[ShadowHit]) -> float:
    others = [position_bins(hit.tokens, h.tokens) for h in hits if h is not hit]
    return float(np.median(others)) if others else math.nan


class PointReplay:
    """heisd's decisions at `cfg`, one recorded step at a time, with the sequence carried along (the
    node's shadow summary applies it as records are made; `replay_episode` over a whole episode)."""

    def __init__(self, cfg: DecoderConfig) -> None:
        self.cfg = cfg
        self._choice = SourceChoice(cfg.source_choice)
        self._skips_in_a_row = 0
        self._last_verified: tuple[int, ...] | None = None
        self._last_gripper: int | None = None

    def step(self, r: ShadowStep) -> ReplayedStep:
        cfg, vs = self.cfg, self.cfg.verify_skip
        f = None if math.isnan(r.fused_metric) else r.fused_metric
        mode, tokens, forwards, verdict = "drafter", r.executed_tokens, r.drafter_forwards, ""
        wants_retrieval = self._choice.decide(f, cfg.fused_metric.tau).retrieval
        if wants_retrieval and r.hits:
            mode, tokens, forwards = "retrieval", r.tree_tokens, r.tree_forwards
            for i, hit in enumerate(r.hits):
                reason = _verdict(vs, hit, r.hits, self._skips_in_a_row, self._last_verified, self._last_gripper)
                if i == 0 or reason == REASON_SKIP:
                    verdict = reason
                if reason == REASON_SKIP:
                    mode, tokens, forwards = "skip", hit.tokens, 0
                    break
        st = StepStats(mode=mode, method="heisd", skipped=mode == "skip", llm_forwards=forwards)
        st.tokens = tuple(tokens)
        # a step that wanted retrieval and had no hits fell back, as the decoder's did (the source
        # choice learns nothing from it)
        st.fallback = r.fallback if wants_retrieval and not r.hits else ""
        self._choice.record(st)
        if mode == "skip":
            self._skips_in_a_row += 1
        else:
            self._skips_in_a_row, self._last_verified = 0, tuple(tokens)
        self._last_gripper = int(tokens[GRIPPER_INDEX])
        return ReplayedStep(mode=mode, cost_forwards=self._choice.step_cost(st),
                            position_bins=position_bins(tokens, r.executed_tokens),
                            gripper_differs=tokens[GRIPPER_INDEX] != r.executed_tokens[GRIPPER_INDEX],
                            skip_check=verdict)  # fmt: skip


def replay_episode(records: Sequence[ShadowStep], cfg: DecoderConfig) -> list[ReplayedStep]:
    """heisd's decisions at `cfg` over one episode's records, in order."""
    replay = PointReplay(cfg)
    return [replay.step(r) for r in records]


def _verdict(vs, hit: ShadowHit, hits: Sequence[ShadowHit], skips_in_a_row: int,
             last_verified: tuple[int, ...] | None, last_gripper: int | None) -> str:
    """The decoder's skip check (VerifySkipPolicy.decide) on a recorded hit."""
    if not vs.enabled:
        return REASON_DISABLED
    # the live feature is the last verified step's: `skips_in_a_row` executed steps back
    if skips_in_a_row >= len(hit.similarity):
        return REASON_NO_LIVE_FEATURE
    if skips_in_a_row >= vs.max_consecutive_skips:
        return REASON_MAX_CONSECUTIVE
    return skip_verdict(vs, vs.min_similarity, vs.max_distance_m,
                        gripper_kept=last_gripper is not None and hit.tokens[GRIPPER_INDEX] == last_gripper,
                        switch_in=hit.gripper_switch_in, similarity=hit.similarity[skips_in_a_row],
                        distance=hit.distance_m, spread=_spread(hit, hits),
                        from_verified=math.nan if last_verified is None else position_bins(hit.tokens, last_verified))  # fmt: skip
