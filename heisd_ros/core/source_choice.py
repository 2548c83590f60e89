"""Where a heisd step's drafts come from: the kinematic boundary, then what verification has cost
(docs/design.md §5).

The boundary is the first gate: a step whose fused metric F is undefined or below tau uses the
drafter. Above it, the kinematics say retrieval should work, but only the database can say whether
it does: drafts from another operator's demonstrations are often rejected, and a verified
retrieval step then costs a drafter step plus the query, the extra views and a wider forward.
`SourceChoice` therefore keeps, per episode, an exponential average of the cost of retrieval-mode
steps (a skipped step counts, at its small cost) and of drafter-mode steps, and lets a step with
F >= tau retrieve only while retrieval's average is no higher than the drafter's. While it routes
steps away it still retrieves on every `probe_every_steps`-th of them, so a database that starts
matching is noticed.

It only chooses the draft source; acceptance decides what is executed, so strict decoding stays
lossless whichever source is chosen. Deterministic: no randomness and no clock; a step's cost is
counted in LLM forwards, so the same inputs give the same routing on any machine under any load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from heisd_ros.core.config import SourceChoiceConfig
from heisd_ros.core.types import StepStats

# `SourceDecision.reason`, also reported as `StepStats.source_reason`.
REASON_METHOD = "method"
"""The method has one draft source (ar, drafter, specvla, retrieval)."""
REASON_NO_WINDOW = "no_window"
"""F is undefined (fewer than 3 positions in the window): drafter."""
REASON_BELOW_TAU = "below_tau"
"""F < tau: drafter."""
REASON_ABOVE_TAU = "above_tau"
"""F >= tau and the adaptive choice is off: retrieval."""
REASON_LEARNING = "learning"
"""F >= tau, too few steps of this episode to compare costs yet: retrieval."""
REASON_CHEAPER = "retrieval_cheaper"
"""F >= tau and retrieval has cost no more than the drafter recently: retrieval."""
REASON_COSTLIER = "retrieval_costlier"
"""F >= tau but retrieval has cost more than the drafter recently: drafter."""
REASON_PROBE = "probe"
"""Retrieval costs more, but this step retrieves to see whether it still does."""

RETRIEVAL_MODES = ("retrieval", "skip")


@dataclass(frozen=True)
class SourceDecision:
    retrieval: bool
    """True: query the database (retrieval mode, possibly a skip); False: drafter mode."""
    reason: str


class ExpAverage:
    """Exponential moving average; None until the first sample."""

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing
        self.value: float | None = None
        self.count = 0

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.smoothing * (x - self.value)
        self.count += 1


class SourceChoice:
    """Per-episode cost and acceptance averages of the two draft sources and the routing rule."""

    def __init__(self, cfg: SourceChoiceConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else SourceChoiceConfig()
        self.reset()

    def reset(self) -> None:
        """Forget the episode: a new scene may match the database where the last did not."""
        s = self.cfg.smoothing
        self.cost = {"retrieval": ExpAverage(s), "drafter": ExpAverage(s)}
        """Cost of a step in either mode, in LLM forwards (`step_cost`)."""
        self.acceptance = {"retrieval": ExpAverage(s), "drafter": ExpAverage(s)}
        """Tokens fixed per decoding cycle (a skip is one cycle of 7), for reports."""
        self.routed_away = 0
        """Steps with F >= tau sent to the drafter since the last retrieval-mode decision."""

    def decide(self, f: float | None, tau: float) -> SourceDecision:
        """The source of a heisd step whose window gives fused metric `f` (None: undefined)."""
        if f is None or math.isnan(f):
            return SourceDecision(False, REASON_NO_WINDOW)
        if f < tau:
            return SourceDecision(False, REASON_BELOW_TAU)
        if not self.cfg.enabled:
            return SourceDecision(True, REASON_ABOVE_TAU)
        r, d = self.cost["retrieval"], self.cost["drafter"]
        if r.count < self.cfg.min_retrieval_steps or d.value is None:
            return self._retrieve(REASON_LEARNING)
        if r.value <= d.value:
            return self._retrieve(REASON_CHEAPER)
        self.routed_away += 1
        if self.routed_away >= self.cfg.probe_every_steps:
            return self._retrieve(REASON_PROBE)
        return SourceDecision(False, REASON_COSTLIER)

    def _retrieve(self, reason: str) -> SourceDecision:
        self.routed_away = 0
        return SourceDecision(True, reason)

    def record(self, st: StepStats) -> None:
        """Learn from a finished step. A step that fell back (database fault, task not in the
        database) says nothing about either source and is ignored."""
        if st.fallback:
            return
        if st.mode in RETRIEVAL_MODES:
            source = "retrieval"
        elif st.mode == "drafter":
            source = "drafter"
        else:
            return
        self.cost[source].add(self.step_cost(st))
        if st.decoding_cycles:
            self.acceptance[source].add(st.accept_length)

    def step_cost(self, st: StepStats) -> float:
        """The cost of a finished step, counted in verification forwards (`SourceChoiceConfig`)."""
        c = self.cfg
        if st.skipped:
            return c.skip_cost_forwards
        cost = st.llm_forwards + (c.prefill_extra_forwards if st.llm_forwards else 0.0)
        if st.mode == "retrieval":
            return cost + c.retrieval_overhead_forwards
        return cost + c.drafter_overhead_forwards

    def estimates(self) -> dict[str, float | None]:
        """The current averages: {retrieval,drafter}_cost and {retrieval,drafter}_accept_length."""
        out: dict[str, float | None] = {}
        for source in ("retrieval", "drafter"):
            out[f"{source}_cost"] = self.cost[source].value
            out[f"{source}_accept_length"] = self.acceptance[source].value
        return out
