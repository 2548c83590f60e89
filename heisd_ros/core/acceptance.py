"""Acceptance rules and the tree walk that applies them (docs/design.md §7).

Rules compare draft bins with the target's argmax bins (bin = vocab_size - token id, so a bin
distance is an action distance):

- `StrictRule`: exact match. Lossless: the executed tokens equal greedy AR decoding.
- `TokenRelaxedRule(h)`: |draft - target| <= h per token (SpecVLA). Lossy, bounded by h bins.
- `SequenceRelaxedRule`: whole kinematic groups (position, rotation) are accepted when every
  token is within `max_token_bias_bins` and the group's summed bias within
  `max_group_bias_bins`; the gripper must match exactly. Lossy, bounded per group.

A rule sees one *segment* at a time: a single token for token rules, a kinematic group (or the
tail of one) for the sequence rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from heisd_ros.core.config import AcceptanceConfig
from heisd_ros.core.tree import DraftTree
from heisd_ros.core.types import ACTION_DIM, GRIPPER_INDEX, GROUPS


class AcceptanceRule(Protocol):
    lossless: bool

    def segment_end(self, index: int) -> int:
        """End (exclusive) of the segment that starts at action index `index`."""
        ...

    def accepts(self, draft_bins: Sequence[int], target_bins: Sequence[int], start: int) -> tuple[bool, int]:
        """(accepted?, cost) for one segment of bins starting at action index `start`."""
        ...


class StrictRule:
    lossless = True

    def segment_end(self, index: int) -> int:
        return index + 1

    def accepts(self, draft_bins: Sequence[int], target_bins: Sequence[int], start: int) -> tuple[bool, int]:
        return list(draft_bins) == list(target_bins), 0


@dataclass(frozen=True)
class TokenRelaxedRule:
    max_bias_bins: int = 9
    lossless = False

    def segment_end(self, index: int) -> int:
        return index + 1

    def accepts(self, draft_bins: Sequence[int], target_bins: Sequence[int], start: int) -> tuple[bool, int]:
        bias = [abs(int(d) - int(t)) for d, t in zip(draft_bins, target_bins)]
        return all(b <= self.max_bias_bins for b in bias), sum(bias)


@dataclass(frozen=True)
class SequenceRelaxedRule:
    max_token_bias_bins: int = 15
    max_group_bias_bins: int = 30
    lossless = False

    def segment_end(self, index: int) -> int:
        return next(end for start, end in GROUPS if start <= index < end)

    def accepts(self, draft_bins: Sequence[int], target_bins: Sequence[int], start: int) -> tuple[bool, int]:
        bias = [abs(int(d) - int(t)) for d, t in zip(draft_bins, target_bins)]
        if start == GRIPPER_INDEX:
            return bias == [0], 0
        ok = all(b <= self.max_token_bias_bins for b in bias) and sum(bias) <= self.max_group_bias_bins
        return ok, sum(bias)


def make_rule(name: str, cfg: AcceptanceConfig) -> AcceptanceRule:
    """'strict', 'token' (SpecVLA, h = cfg.token_relaxed_bias_bins) or 'sequence'."""
    if name == "strict":
        return StrictRule()
    if name == "token":
        return TokenRelaxedRule(cfg.token_relaxed_bias_bins)
    if name == "sequence":
        return SequenceRelaxedRule(cfg.max_token_bias_bins, cfg.max_group_bias_bins)
    raise ValueError(f"unknown acceptance rule {name!r}")


@dataclass
class TreeAcceptance:
    nodes: list[int]
    """Accepted tree nodes, root's child first (their tokens are executed)."""
    bonus_bin: int | None
    """The target's own bin after the accepted path (None when 7 tokens are already fixed)."""


def walk_tree(
    tree: DraftTree, root_bin: int, node_bins: np.ndarray, draft_bins: np.ndarray, start: int, rule: AcceptanceRule
) -> TreeAcceptance:
    """Greedy depth-first acceptance over `tree` for action indices [start, 7).

    root_bin: the target's argmax bin predicted at the root (for action index `start`).
    node_bins[i]: the target's argmax bin predicted at node i (for the token after node i).
    draft_bins[i]: the bin of node i's own token.
    At each segment, every path of the segment's length below the current node is a candidate;
    among accepted candidates the one with the smallest cost wins (first in tree order on ties).
    """
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    node, index, accepted = -1, start, []
    while index < ACTION_DIM:
        end = rule.segment_end(index)
        best: tuple[int, list[int]] | None = None
        for path in _paths(children, node, end - index):
            targets = [root_bin if node < 0 else int(node_bins[node])]
            targets += [int(node_bins[n]) for n in path[:-1]]
            ok, cost = rule.accepts([int(draft_bins[n]) for n in path], targets, index)
            if ok and (best is None or cost < best[0]):
                best = (cost, path)
        if best is None:
            break
        accepted += best[1]
        node, index = best[1][-1], end
    if index >= ACTION_DIM:
        return TreeAcceptance(accepted, None)
    return TreeAcceptance(accepted, root_bin if node < 0 else int(node_bins[node]))


def _paths(children: dict[int, list[int]], node: int, length: int) -> list[list[int]]:
    if length == 0:
        return [[]]
    out = []
    for c in children.get(node, []):
        out += [[c] + rest for rest in _paths(children, c, length - 1)]
    return out
