"""What heisd would have done on a step another method executed: the raw quantities of shadow mode.

On the user's own arm the operating point is chosen from shadow runs (docs/design.md): the node
executes its method (ar, the user's known-good path) and, off the command path, `ShadowDecoder`
computes on the same observation everything heisd's decisions read, so that `heisd choose-point
--shadow` can replay any candidate point offline, with the decisions that depend on the sequence
(consecutive skips, the last verified step, the source costs) replayed too:

- F, the fused metric of the window of executed end-effector positions;
- the Top-K hits, always retrieved whatever F is (the replay applies each candidate's tau): score,
  tokens, end-effector distance, the cosine similarity of each hit's feat_prev to the live feature
  of each of the last executed steps (a replayed skip does not refresh the live feature, so the
  similarity a candidate reads is the one to the last step it verified), and in how many steps the
  demonstration switches the gripper;
- the drafter path's outcome (its LLM forwards; strict, so its tokens are the executed ar tokens)
  and the Top-K tree's (forwards and the tokens relaxed acceptance would execute).

The executed tokens and live feature come from the executing decoder after its step. Deterministic
(no decision reads a clock; the paths' times are measured for choose-point's speed estimate); its
cost is a vision pass over the query views, a query and two decodes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from heisd_ros.core.config import DecoderConfig, require
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.core.errors import UnknownTaskError
from heisd_ros.core.types import Observation, StepStats
from heisd_ros.core.tree import sequence_tree
from heisd_ros.core.verify_skip import cosine_similarity, gripper_switch_in

LIVE_LAGS = 4
"""Similarities are kept to the live feature of the last this many executed steps: a replay after
k consecutive skips reads lag k (0-based), at most N_max - 1, so points up to N_max 4 replay exactly
(choose-point refuses a candidate beyond)."""


@dataclass(frozen=True)
class ShadowHit:
    """One Top-K hit as heisd's skip check and tree would read it."""

    score: float
    tokens: tuple[int, ...]
    distance_m: float
    """End-effector distance to the hit's, metres."""
    similarity: tuple[float, ...]
    """cos(live feature of the executed step t-1-k, hit feat_prev) for k = 0.. (fewer early on)."""
    gripper_switch_in: int
    """Steps after the hit until its demonstration opens or closes the gripper (1-3; 0: not within 3)."""


@dataclass(frozen=True)
class ShadowStep:
    """Everything heisd's decisions read on one executed step."""

    fused_metric: float
    """NaN while the window holds fewer than 3 positions."""
    executed_tokens: tuple[int, ...]
    hits: tuple[ShadowHit, ...]
    drafter_forwards: int
    """LLM forwards of the drafter path (its strict tokens are the executed ar tokens)."""
    tree_forwards: int
    """LLM forwards of the Top-K tree path (0 without hits)."""
    tree_tokens: tuple[int, ...]
    """What the Top-K tree's acceptance would execute (() without hits)."""
    fallback: str = ""
    """Why no hit was retrieved ('' when the database answered)."""
    vision_ms: float = math.nan
    """Measured (never acted on) for the speed estimate: the backbone over the query views,"""
    retrieval_ms: float = math.nan
    """the query,"""
    drafter_ms: float = math.nan
    """the drafter path's decode (projector, prompt, drafting, verification)"""
    tree_ms: float = math.nan
    """and the Top-K tree's (NaN without hits)."""


class ShadowDecoder(HybridDecoder):
    """A heisd decoder that never executes: `shadow(obs, executed_tokens, executed_live)` after each
    step another method executed. It shares that method's model, drafter and database."""

    def __init__(self, vla, cfg: DecoderConfig, store, drafter, state_prior=None) -> None:
        require(cfg.method == "heisd", f"shadow mode computes heisd, got method {cfg.method!r}")
        super().__init__(vla, cfg, store, drafter, state_prior)
        self.lives: deque[np.ndarray] = deque(maxlen=LIVE_LAGS)
        """Live features of the last executed steps, newest first."""

    def reset(self, instruction: str | None = None) -> None:
        super().reset(instruction)
        self.lives = deque(maxlen=LIVE_LAGS)

    def pass_over(self, obs: Observation, executed_live: np.ndarray | None) -> None:
        """A step executed but not shadowed (no time for it): the window and the live features still
        follow the executed trajectory, so the next record reads what heisd would have read."""
        if obs.instruction != self.instruction:
            self.reset(obs.instruction)
        self.metric.push(np.asarray(obs.ee_pos, dtype=np.float64))
        if executed_live is not None:
            self.lives.appendleft(np.asarray(executed_live, dtype=np.float32))

    def shadow(self, obs: Observation, executed_tokens, executed_live: np.ndarray | None) -> ShadowStep:
        """What heisd reads on `obs`, given what the executing method did on it (its tokens and the
        live feature its verified step produced)."""
        self._validate(obs)
        if obs.instruction != self.instruction:
            self.reset(obs.instruction)
        executed = tuple(int(t) for t in executed_tokens)
        st, lat = StepStats(method="heisd"), {}
        ms = {}
        with torch.inference_mode():
            self.metric.push(np.asarray(obs.ee_pos, dtype=np.float64))
            f = self.metric.value()
            query, patches = self._vision(obs, lat, all_views=True)
            try:
                hits = self._maybe_retrieve(obs, query, st, lat)
            except UnknownTaskError:  # the executing method runs on; the record says why it has no hits
                hits, st.fallback = [], "task not in database"
            t0 = time.perf_counter()
            drafted = self._new_decode(obs, patches, lat)
            self._finish(drafted, StepStats(method="heisd"), lat)
            ms["drafter"] = (time.perf_counter() - t0) * 1e3
            tree_forwards, tree_tokens = 0, ()
            if hits:
                t0 = time.perf_counter()
                tree = sequence_tree([tuple(int(t) for t in h.action_tokens) for h in hits],
                                     max_nodes=self.cfg.retrieval.max_tree_nodes)
                decode = self._new_decode(obs, patches, lat)
                decode.forward(tree, self.retrieval_rule, self.vocab_size)
                self._finish(decode, StepStats(method="heisd"), lat)
                tree_forwards, tree_tokens = decode.target.forwards, tuple(decode.tokens)
                ms["tree"] = (time.perf_counter() - t0) * 1e3
        ee = np.asarray(obs.ee_pos, dtype=np.float64)
        seen = tuple(ShadowHit(score=float(h.score), tokens=tuple(int(t) for t in h.action_tokens),
                               distance_m=float(np.linalg.norm(ee - np.asarray(h.ee_pos, dtype=np.float64))),
                               similarity=tuple(cosine_similarity(live, h.feat_prev) for live in self.lives),
                               gripper_switch_in=gripper_switch_in(h))
                     for h in hits)  # fmt: skip
        if executed_live is not None:
            self.lives.appendleft(np.asarray(executed_live, dtype=np.float32))
        return ShadowStep(fused_metric=math.nan if f is None else float(f), executed_tokens=executed, hits=seen,
                          drafter_forwards=drafted.target.forwards, tree_forwards=tree_forwards,
                          tree_tokens=tree_tokens, fallback=st.fallback, vision_ms=lat.get("vision", math.nan),
                          retrieval_ms=lat.get("retrieval", math.nan), drafter_ms=ms["drafter"],
                          tree_ms=ms.get("tree", math.nan))  # fmt: skip
