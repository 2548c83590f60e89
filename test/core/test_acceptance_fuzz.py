"""Property tests of the acceptance rules and trees on random inputs: no crash, every accepted path is a
real path of the tree that the rule allows, and the action decoded from it is never NaN."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from heisd_ros.core.acceptance import SequenceRelaxedRule, StrictRule, TokenRelaxedRule, walk_tree
from heisd_ros.core.action_tokenizer import ActionTokenizer, NormStats
from heisd_ros.core.tree import DraftTree, sequence_tree
from heisd_ros.core.types import ACTION_DIM, GRIPPER_INDEX, GROUPS

VOCAB = 640
TOK = ActionTokenizer(VOCAB)
BIN = st.integers(1, 256)  # bin = vocab_size - token id, for action tokens


@st.composite
def trees(draw):
    """A random DraftTree (parents before children) with the bins the target predicts at each node."""
    n = draw(st.integers(0, 40))
    tree = DraftTree()
    for i in range(n):
        tree.add(VOCAB - draw(BIN), draw(st.integers(-1, i - 1)))
    node_bins = np.array(draw(st.lists(BIN, min_size=n, max_size=n)), dtype=np.int64)
    return tree, node_bins


RULES = st.one_of(
    st.just(StrictRule()),
    st.builds(TokenRelaxedRule, st.integers(0, 255)),
    st.builds(SequenceRelaxedRule, st.integers(0, 255), st.integers(0, 765)),
)
STATS = st.builds(
    lambda lo, span, mask: NormStats(q01=np.array(lo), q99=np.array(lo) + np.array(span), mask=np.array(mask)),
    st.lists(st.floats(-1e4, 1e4), min_size=7, max_size=7),
    st.lists(st.floats(0.0, 1e4), min_size=7, max_size=7),
    st.lists(st.booleans(), min_size=7, max_size=7),
)


def _segments_ok(rule, path_bins, target_bins, start):
    """Re-check an accepted path segment by segment with the rule (an independent reading of walk_tree)."""
    index, k = start, 0
    while k < len(path_bins):
        end = rule.segment_end(index)
        seg = slice(k, k + end - index)
        if not rule.accepts(path_bins[seg], target_bins[seg], index)[0]:
            return False
        k, index = k + end - index, end
    return True


@settings(max_examples=400, deadline=None)
@given(tt=trees(), root_bin=BIN, start=st.integers(0, ACTION_DIM - 1), rule=RULES, prefix=st.lists(BIN, min_size=7, max_size=7),
       stats=STATS)  # fmt: skip
def test_walk_tree_accepts_only_valid_paths_and_the_action_is_finite(tt, root_bin, start, rule, prefix, stats):
    tree, node_bins = tt
    draft_bins = VOCAB - np.asarray(tree.tokens, dtype=np.int64)
    acc = walk_tree(tree, root_bin, node_bins, draft_bins, start, rule)
    # a path from the root, within the remaining action positions, ending in whole segments
    assert len(acc.nodes) <= ACTION_DIM - start
    parent = -1
    for n in acc.nodes:
        assert 0 <= n < len(tree) and tree.parents[n] == parent
        parent = n
    assert (acc.bonus_bin is None) == (len(acc.nodes) == ACTION_DIM - start)
    # every accepted segment passes the rule against the target's predictions along the path
    targets = ([root_bin] + [int(node_bins[n]) for n in acc.nodes])[: len(acc.nodes)]
    assert _segments_ok(rule, [int(draft_bins[n]) for n in acc.nodes], targets, start)
    if isinstance(rule, StrictRule):
        assert [int(draft_bins[n]) for n in acc.nodes] == targets
    if isinstance(rule, SequenceRelaxedRule) and start + len(acc.nodes) == ACTION_DIM:
        assert draft_bins[acc.nodes[-1]] == targets[-1]  # the gripper is never relaxed
    # the step's 7 tokens: earlier ones, the accepted path, the target's bonus token, then (if the
    # step continues) anything: decoding and un-normalisation stay finite
    bins = prefix[:start] + [int(draft_bins[n]) for n in acc.nodes]
    if acc.bonus_bin is not None:
        bins.append(acc.bonus_bin)
    bins += prefix[len(bins):]
    action = stats.unnormalise(TOK.decode(VOCAB - np.array(bins[:ACTION_DIM])))
    assert action.shape == (ACTION_DIM,) and np.all(np.isfinite(action))
    assert action[GRIPPER_INDEX] in (-1.0, 1.0) or stats.mask[GRIPPER_INDEX]


@settings(max_examples=300, deadline=None)
@given(drafts=st.lists(st.lists(BIN, min_size=7, max_size=7), max_size=8), start=st.integers(0, ACTION_DIM - 1),
       max_nodes=st.integers(1, 200))  # fmt: skip
def test_sequence_tree_of_random_hits_is_well_formed(drafts, start, max_nodes):
    tokens = [tuple(VOCAB - b for b in d) for d in drafts]
    tree = sequence_tree(tokens, start=start, max_nodes=max_nodes)
    assert len(tree) <= max_nodes
    assert all(p < i for i, p in enumerate(tree.parents))
    leaves = [i for i in range(len(tree)) if not tree.children(i)]
    for leaf in leaves:  # a capped tree still holds only complete candidates
        path = tree.path_to(leaf)
        assert len(path) == ACTION_DIM - start
        cand = [tree.tokens[n] for n in path]
        # the gripper always comes from a hit whose rotation group it was drawn with
        (r0, r1), g = GROUPS[1], GRIPPER_INDEX
        rot = tuple(cand[max(r0, start) - start : r1 - start]) if start < r1 else ()
        assert any(d[g] == cand[-1] and tuple(d[max(r0, start) : r1]) == rot for d in tokens)
    mask = tree.ancestor_mask()
    assert mask.shape == (len(tree), len(tree)) and all(mask[i, i] for i in range(len(tree)))


def _paths(tree: DraftTree) -> set[tuple[int, ...]]:
    return {tuple(tree.tokens[n] for n in tree.path_to(i)) for i in range(len(tree)) if not tree.children(i)}


def _trie_size(cands: list[tuple[int, ...]]) -> int:
    return len({c[:k] for c in cands for k in range(1, len(c) + 1)})


# a small token alphabet so that hits share groups and prefixes, as neighbouring demo steps do
SMALL = st.integers(1, 4)


@settings(max_examples=400, deadline=None)
@given(drafts=st.lists(st.lists(SMALL, min_size=7, max_size=7), min_size=1, max_size=8),
       start=st.integers(0, ACTION_DIM - 1), max_nodes=st.integers(1, 64))  # fmt: skip
def test_sequence_tree_under_a_cap_keeps_every_hit_first(drafts, start, max_nodes):
    """Hits are kept best first: the own candidates of hits 1..k are all in the tree whenever
    they fit under the cap together; an own candidate is missing only when it did not fit beside
    the better hits' own candidates (never because of a recombination); with room for everything
    the tree is the full recombination tree."""
    hits = [tuple(d) for d in drafts]
    tree = sequence_tree(hits, start=start, max_nodes=max_nodes)
    paths = _paths(tree)
    own = [h[start:] for h in hits]
    assert len(tree) <= max_nodes
    for k in range(1, len(own) + 1):
        if _trie_size(own[:k]) <= max_nodes:
            assert set(own[:k]) <= paths
    kept: list[tuple[int, ...]] = []
    for cand in own:  # own candidates alone, greedily, best hit first
        if _trie_size(kept + [cand]) <= max_nodes:
            kept.append(cand)
    assert set(own) & paths == set(kept)
    full = _paths(sequence_tree(hits, start=start, max_nodes=1024))
    assert paths <= full
    if _trie_size(list(full)) <= max_nodes:
        assert paths == full
