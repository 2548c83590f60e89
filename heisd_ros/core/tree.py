"""Draft trees as explicit data, and the pure functions that build them.

A `DraftTree` hangs below a *root*: the last token whose logits the verification forward will
produce (the pending token, or the prompt's last position in a fused prefill-verify). Node i has
a token, a parent (-1 = the root) and a depth (1 = child of the root). Nodes are stored so that
every parent comes before its children (topological order); node order is also the order of the
nodes in the verification forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from heisd_ros.core.types import ACTION_DIM, GROUPS


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int) -> int:
        """Append a node (its parent must already exist) and return its index."""
        if parent >= len(self.tokens):
            raise ValueError(f"parent {parent} does not exist yet")
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        return len(self.tokens) - 1

    def child(self, parent: int, token: int) -> int:
        """Index of `parent`'s child carrying `token`, adding it if absent (merges duplicates)."""
        for i in self.children(parent):
            if self.tokens[i] == token:
                return i
        return self.add(token, parent)

    def children(self, parent: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == parent]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestor_mask(self) -> np.ndarray:
        """[N, N] bool: node i may attend to node j iff j is i or an ancestor of i."""
        n = len(self.tokens)
        mask = np.zeros((n, n), dtype=bool)
        for i in range(n):
            p = self.parents[i]
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask

    def max_depth(self) -> int:
        return max(self.depths, default=0)


def chain_tree(tokens: list[int] | np.ndarray) -> DraftTree:
    """A single chain (e.g. a Top-1 retrieval draft)."""
    tree = DraftTree()
    parent = -1
    for t in tokens:
        parent = tree.add(int(t), parent)
    return tree


def sequence_tree(drafts: list[tuple[int, ...]], start: int = 0, max_nodes: int = 1024) -> DraftTree:
    """The Top-K sequence tree (docs/design.md §7) for action tokens [start, 7).

    drafts: the K hits' 7 action tokens, best hit first. Structure: root -> distinct position
    groups -> under each, every distinct rotation group of all K hits (groups of different hits
    may combine) -> under each rotation group, the gripper token(s) of the hit(s) that rotation
    group came from (never recombined). Groups are inserted as token chains in a trie, so equal
    groups and equal prefixes are merged. Groups before `start` are dropped; a group cut by
    `start` keeps its tail.

    Under the `max_nodes` cap the tree is filled in priority order, one complete candidate at a
    time: first each hit's own candidate (best hit first), then the recombinations (position
    groups in hit order, each with the other hits' rotation groups); a candidate whose new nodes
    do not fit is passed over. A hit's own candidate is what its demonstration executed, so a
    recombination never takes its place: every own candidate has had its turn before the first
    recombination. A capped tree is made of complete candidates only.
    """
    if not drafts:
        return DraftTree()
    if any(len(d) != ACTION_DIM for d in drafts):
        raise ValueError("every draft must hold 7 action tokens")
    own = [_candidate(d, start) for d in drafts]
    tree = DraftTree()
    for branch in [*dict.fromkeys(own), *_recombinations(drafts, start)]:
        _add_if_fits(tree, list(branch), max_nodes)
    return tree


def _candidate(draft: tuple[int, ...], start: int) -> tuple[int, ...]:
    """The tokens [start, 7) of one hit."""
    return tuple(int(t) for t in draft[start:])


def _recombinations(drafts: list[tuple[int, ...]], start: int) -> list[tuple[int, ...]]:
    """Every candidate of the full tree, position groups in hit order, rotation groups (with the
    gripper(s) drawn with them) in hit order below each. Own candidates are included; adding
    them again is a no-op."""
    (p0, p1), (r0, r1), (g0, _) = GROUPS
    pos = list(dict.fromkeys(tuple(d[max(p0, start) : p1]) for d in drafts)) if start < p1 else [()]
    rot_to_grip: dict[tuple[int, ...], list[int]] = {}
    for d in drafts:
        grips = rot_to_grip.setdefault(tuple(d[max(r0, start) : r1]) if start < r1 else (), [])
        if d[g0] not in grips:
            grips.append(d[g0])
    return [tuple(int(t) for t in (*p, *rot, g)) for p in pos for rot, grips in rot_to_grip.items() for g in grips]


def _add_if_fits(tree: DraftTree, branch: list[int], max_nodes: int) -> None:
    """Add a complete candidate when its new nodes fit under the cap."""
    if _new_nodes(tree, branch) + len(tree) > max_nodes:
        return
    node = -1
    for tok in branch:
        node = tree.child(node, tok)


def _new_nodes(tree: DraftTree, branch: list[int]) -> int:
    node, depth = -1, 0
    for tok in branch:
        nxt = next((i for i in tree.children(node) if tree.tokens[i] == tok), None)
        if nxt is None:
            return len(branch) - depth
        node, depth = nxt, depth + 1
    return 0
