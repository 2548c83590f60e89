"""Plain data passed between the components of the decoding core."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

ACTION_DIM = 7
"""X, Y, Z, rX, rY, rZ, G."""
GROUPS: tuple[tuple[int, int], ...] = ((0, 3), (3, 6), (6, 7))
"""Kinematic groups [start, end) over the action tokens: position, rotation, gripper (docs/design.md §7)."""
GRIPPER_INDEX = 6


def gripper_command(value: float) -> float:
    """A gripper action value -> the command it executes: +1.0 close (value > 0), else -1.0 open.
    The one rule for the previous-gripper prompt input (engine, model and demos)."""
    return 1.0 if value > 0 else -1.0


@dataclass
class Observation:
    """Everything the policy sees at one control step.

    images: view name -> RGB uint8 array [H, W, 3] (upright).
    ee_pos: end-effector position [3] in metres (robot base frame).
    task: database partition key; defaults to the instruction.
    gripper_gap: opening between the fingers (m), read only by models with `proprio_gripper_gap`.
    """

    images: dict[str, np.ndarray]
    instruction: str
    ee_pos: np.ndarray
    task: str | None = None
    stamp_s: float = 0.0
    gripper_gap: float | None = None

    @property
    def task_key(self) -> str:
        return self.task if self.task is not None else self.instruction


@dataclass(frozen=True)
class Hit:
    """One retrieved demonstration step (the database payload and named vectors, docs/design.md §4)."""

    score: float
    task: str
    episode: int
    step: int
    action: np.ndarray  # [7] float, unnormalised
    action_tokens: tuple[int, ...]  # 7 token ids
    feat: np.ndarray  # [D_llm] mean lm_head input over the 7 action positions
    feat_prev: np.ndarray  # [D_llm] same for the previous step of the episode
    ee_pos: np.ndarray  # [3] metres
    success: bool = True
    next_actions: tuple[tuple[float, ...], ...] = ()


@dataclass
class StepStats:
    """What one control step did and what it cost (returned, never printed)."""

    mode: str = "ar"
    """'ar', 'drafter', 'retrieval' or 'skip'."""
    method: str = "ar"
    skipped: bool = False
    llm_forwards: int = 0
    tokens_per_forward: list[int] = field(default_factory=list)
    """Tokens fixed by each verification forward (accepted drafts + the target's own token)."""
    latency_ms: dict[str, float] = field(default_factory=dict)
    """Per stage: vision, projector, retrieval, draft, prompt, verify (forwards + acceptance),
    forward (the LLM forwards alone), accept (verify minus forward), detokenize, total."""
    forward_ms: list[float] = field(default_factory=list)
    """Wall time of each LLM forward of the step."""
    fused_metric: float = math.nan
    retrieval_score: float = math.nan
    skip_check: str = ""
    """heisd retrieval steps: the verify-skip verdict of the best hit ('skip', or the veto that kept
    it verified: 'low_similarity', 'too_far', 'gripper_mismatch', ...); '' where no check ran."""
    skip_similarity: float = math.nan
    """cos(f_live, best hit's feat_prev) where the check got that far, else NaN."""
    skip_spread_bins: float = math.nan
    """Median position-group |delta bin| from the checked hit to the other Top-K hits (NaN where not measured)."""
    skip_from_verified_bins: float = math.nan
    """Position-group |delta bin| from the checked hit to the last verified step's tokens (NaN where not measured)."""
    tokens: tuple[int, ...] = ()
    fallback: str = ""
    """Why a mode fell back (e.g. database fault -> drafter), '' when nothing fell back."""
    source_reason: str = ""
    """Why the step drafted from the source it did: 'method', 'no_window', 'below_tau', 'above_tau',
    'learning', 'retrieval_cheaper', 'retrieval_costlier' or 'probe' (core/source_choice.py)."""
    gripper_held: bool = False
    """The executed gripper command is the previous one, not this step's (`gripper_hold_steps`)."""
    strict: bool = False
    """Every token of the step passed a lossless acceptance rule: the tokens equal greedy `ar`'s on
    the same observation (False for a skip and for any relaxed acceptance)."""

    @property
    def decoding_cycles(self) -> int:
        """A cycle is a verification forward or a skip."""
        return self.llm_forwards + (1 if self.skipped else 0)

    @property
    def accept_length(self) -> float:
        """Mean tokens fixed per decoding cycle (7 for a skipped step)."""
        return len(self.tokens) / self.decoding_cycles if self.decoding_cycles else math.nan
