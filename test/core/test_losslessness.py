"""Strict speculative decoding must return exactly the AR greedy tokens (docs/design.md §2 invariant).

This is what proves tree masks, tree position ids and KV-cache compaction right: any error in
them changes a logit and, over 50 seeds and many tree shapes, a token.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from heisd_ros.core.acceptance import StrictRule, make_rule
from heisd_ros.core.config import AcceptanceConfig, DecoderConfig, DrafterTreeConfig, VerifySkipConfig
from heisd_ros.core.drafter import DrafterSession
from heisd_ros.core.drafter_block import FusedDrafterBlock
from heisd_ros.core.engine import HybridDecoder, _StepDecode, embed_views
from heisd_ros.core.tree import DraftTree, sequence_tree
from heisd_ros.core.verifier import TargetSession
from heisd_ros.pipeline.synthetic_demos import random_observation as random_obs

SEEDS = range(50)


def new_decode(vla, obs, drafter=None) -> _StepDecode:
    _, patches = embed_views(vla, [obs.images["agentview"], obs.images["wrist"]])
    prompt = vla.prompt_embeds(obs.instruction, vla.projector(patches[0]))[0]
    session = DrafterSession(FusedDrafterBlock(drafter), vla.get_input_embeddings(), vla.action_head_weight(),
                             vla.action_tokenizer.first_token_id) if drafter else None
    return _StepDecode(TargetSession(vla.language_model, vla.action_head_weight()), session, prompt)


@pytest.mark.parametrize("seed", SEEDS)
def test_fused_prefill_verify_over_topk_sequence_trees_is_lossless(vla, ar, helpers, seed):
    """Prefill + a Top-K sequence tree in one forward, strict acceptance, AR for the rest."""
    obs = random_obs(seed)
    ref = helpers.ar_tokens(ar, obs)
    rng = random.Random(seed)
    k = rng.randint(1, 6)
    first = vla.action_tokenizer.first_token_id
    drafts = [helpers.perturbed(ref, rng, first, p_keep=rng.choice([0.5, 0.8, 1.0])) for _ in range(k)]
    tree = sequence_tree(drafts, max_nodes=rng.choice([7, 20, 128]))
    with torch.inference_mode():
        dec = new_decode(vla, obs)
        dec.forward(tree, StrictRule(), vla.action_tokenizer.vocab_size)
        while dec.remaining:
            dec.forward(None, StrictRule(), vla.action_tokenizer.vocab_size)
    assert tuple(dec.tokens) == ref
    if _contains_path(tree, ref[:6]):  # six accepted drafts + the target's own 7th token
        assert dec.target.forwards == 1  # a fully accepted retrieval step is one forward
    else:
        assert dec.target.forwards > 1


def _contains_path(tree: DraftTree, tokens) -> bool:
    node = -1
    for tok in tokens:
        node = next((c for c in tree.children(node) if tree.tokens[c] == tok), None)
        if node is None:
            return False
    return True


@pytest.mark.parametrize("seed", SEEDS)
def test_multi_round_tree_verification_and_cache_compaction_is_lossless(vla, ar, helpers, seed):
    """Several verify rounds over random trees that contain the greedy path at random depth.

    Each round accepts a random number of tokens, so the KV cache is compacted to paths that
    are not the first branch of the tree; a wrong compaction changes later tokens.
    """
    obs = random_obs(seed)
    ref = helpers.ar_tokens(ar, obs)
    rng = random.Random(1000 + seed)
    first = vla.action_tokenizer.first_token_id
    vocab = vla.action_tokenizer.vocab_size
    with torch.inference_mode():
        dec = new_decode(vla, obs)
        dec.forward(None, StrictRule(), vocab)  # prefill
        while dec.remaining:
            depth = rng.randint(1, dec.remaining)
            good = rng.randint(0, depth)  # how deep the true path goes in this tree
            tree = DraftTree()
            for _ in range(rng.randint(0, 4)):  # decoy branches first, so accepted nodes are not nodes 0..n
                node = -1
                for d in range(rng.randint(1, depth)):
                    node = tree.child(node, first + rng.randrange(256))
            node = -1
            for d in range(depth):
                i = len(dec.tokens) + d
                tok = ref[i] if d < good else first + (ref[i] - first + 7) % 256
                node = tree.child(node, tok)
            dec.forward(tree, StrictRule(), vocab)
    assert tuple(dec.tokens) == ref


@pytest.mark.parametrize("seed", SEEDS)
def test_drafter_speculative_decoding_is_lossless(vla, ar, drafter, helpers, seed):
    rng = random.Random(seed)
    tree_cfg = DrafterTreeConfig(depth=rng.randint(1, 6), top_k=rng.randint(1, 5), total_tokens=rng.choice([6, 12, 40]),
                                 min_path_prob=rng.choice([0.0, 0.0, 0.05, 0.5, 0.99]))
    cfg = DecoderConfig(method="drafter", drafter_tree=dataclasses.replace(tree_cfg, total_tokens=max(tree_cfg.total_tokens, tree_cfg.depth)))
    dec = HybridDecoder(vla, cfg, drafter=drafter)
    obs = random_obs(seed)
    _, st = dec.step(obs)
    assert st.tokens == helpers.ar_tokens(ar, obs)
    assert 2 <= st.llm_forwards <= 7
    assert sum(st.tokens_per_forward) == 7


def test_full_hybrid_decoder_with_skip_disabled_and_strict_acceptance_is_lossless(vla, ar, drafter, demo_store, helpers):
    """heisd with zero-bias sequence acceptance (= strict) and no skip, retrieval forced on."""
    strict = AcceptanceConfig(max_token_bias_bins=0, max_group_bias_bins=0)
    cfg = DecoderConfig(method="heisd", acceptance=strict, verify_skip=VerifySkipConfig(enabled=False),
                        fused_metric=dataclasses.replace(DecoderConfig().fused_metric, tau=-1.0))
    dec = HybridDecoder(vla, cfg, store=demo_store, drafter=drafter)
    modes = set()
    for seed in SEEDS:
        obs = random_obs(seed)
        ref = helpers.ar_tokens(ar, obs)
        dec.reset(obs.instruction)
        for p in range(3):  # 3 window points so the boundary can choose retrieval
            obs.ee_pos = np.array([0.1 * p, 0.0, 0.0])
            _, st = dec.step(obs)
            assert st.tokens == ref, (seed, p, st.mode)
            modes.add(st.mode)
    assert modes == {"drafter", "retrieval"}


@pytest.mark.parametrize("rule, lossless", [("strict", True), ("sequence", False)])
def test_heisd_with_the_strict_retrieval_rule_is_the_boundary_alone(vla, ar, drafter, demo_store, helpers, rule,
                                                                    lossless):
    """acceptance.retrieval_rule 'strict' (the ablation "boundary only"): every step strict and ar's tokens;
    the default sequence-wise rule on the same inputs accepts lossy retrieval steps (the control)."""
    cfg = DecoderConfig(method="heisd", acceptance=AcceptanceConfig(retrieval_rule=rule),
                        verify_skip=VerifySkipConfig(enabled=False),
                        fused_metric=dataclasses.replace(DecoderConfig().fused_metric, tau=-1.0))
    dec = HybridDecoder(vla, cfg, store=demo_store, drafter=drafter)
    strict_steps, equal, retrieval = 0, 0, 0
    for seed in SEEDS:
        obs = random_obs(seed)
        ref = helpers.ar_tokens(ar, obs)
        dec.reset(obs.instruction)
        for p in range(3):
            obs.ee_pos = np.array([0.1 * p, 0.0, 0.0])
            _, st = dec.step(obs)
            strict_steps += st.strict
            equal += st.tokens == ref
            retrieval += st.mode == "retrieval"
    n = len(SEEDS) * 3
    assert retrieval > 0
    if lossless:
        assert strict_steps == n and equal == n
    else:
        assert strict_steps < n


def test_retrieval_baseline_is_lossless(vla, ar, demo_store, helpers):
    dec = HybridDecoder(vla, DecoderConfig(method="retrieval"), store=demo_store)
    fully = 0
    for seed in SEEDS:
        obs = random_obs(seed)
        _, st = dec.step(obs)
        assert st.mode == "retrieval"
        assert st.tokens == helpers.ar_tokens(ar, obs)
        fully += st.llm_forwards == 1
    assert fully > 0  # exact demos exist, so some steps are one fused forward


def test_sequence_rule_with_zero_bias_equals_strict():
    rule = make_rule("sequence", AcceptanceConfig(max_token_bias_bins=0, max_group_bias_bins=0))
    assert rule.accepts([5, 6, 7], [5, 6, 7], 0) == (True, 0)
    assert not rule.accepts([5, 6, 8], [5, 6, 7], 0)[0]


def test_an_unknown_retrieval_rule_is_refused():
    from heisd_ros.core.errors import ConfigError

    with pytest.raises(ConfigError, match="retrieval_rule"):
        AcceptanceConfig(retrieval_rule="loose")
    assert AcceptanceConfig(retrieval_rule="token").retrieval_rule == "token"
