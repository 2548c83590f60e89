"""Strict decoding returns what transformers' own LLaMA greedy-decodes: a reference that shares
nothing with the engine.

The reference (`greedy_reference`) builds the prompt with the VLA's own backbone, projector and
`prompt_embeds` (the primary view, as the engine's prompt reads it), then for each of the 7
tokens calls `LlamaForCausalLM(inputs_embeds=prompt + tokens so far, use_cache=False)` and takes
the argmax of the last position's logits over the 256 action-token columns (decoding is
constrained to action tokens in every method; the tiny models carry no state prior). No KV cache,
no tree mask, no position ids of ours, no `ar`, no `llama_forward`.

The engine runs its own computation (a 4-D tree mask, a compacted cache, the traced backbone on
a batch of views), so a logit can differ from the reference's in the last bits. Where the
reference's two best action logits are closer than `TIE`, either token is a correct greedy
choice; the reference then continues from the engine's token.

Shapes: ar; drafter SD over EAGLE-2 trees of random depth, width and size; the `retrieval`
baseline's Top-1 chain fused into the prefill; heisd with zero-bias acceptance and verify-skip
off, whose Top-K sequence trees (random K, node cap and position pool) are fused into the
prefill, then drafter trees. Drafts come from a list store answering with corrupted copies of
the reference, so acceptance stops at every depth.
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from heisd_ros.core.config import (
    AcceptanceConfig,
    DecoderConfig,
    DrafterTreeConfig,
    RetrievalConfig,
    VerifySkipConfig,
)
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.core.types import ACTION_DIM, Hit
from heisd_ros.pipeline.synthetic_demos import random_observation as random_obs

if TYPE_CHECKING:
    from collections.abc import Callable

SEEDS = range(50)
TIE = 1e-4
"""Logit gap below which two action tokens are an exact tie up to float rounding."""


@torch.inference_mode()
def reference_prompt(vla, obs) -> torch.Tensor:
    """inputs_embeds [P, D] from the VLA's own modules: backbone -> projector -> prompt_embeds."""
    views = DecoderConfig().views[: vla.prompt_views]
    patches = vla.vision_backbone(vla.preprocess([obs.images[v] for v in views]))
    visual = vla.projector(patches.flatten(0, 1))
    return vla.prompt_embeds(obs.instruction, visual, state=obs.ee_pos, gripper_gap=obs.gripper_gap)[0]


@torch.inference_mode()
def greedy_reference(vla, obs, follow: tuple[int, ...] = ()) -> tuple[int, ...]:
    """The 7 greedy action tokens of plain `LlamaForCausalLM` forwards (see the module doc).

    `follow`: the engine's tokens; at a near-tie (gap < TIE) the reference takes the engine's
    choice and continues from it."""
    lm = vla.language_model
    first, n_bins = vla.action_tokenizer.first_token_id, vla.action_tokenizer.n_bins
    prompt = reference_prompt(vla, obs)
    tokens: list[int] = []
    for i in range(ACTION_DIM):
        embeds = torch.cat([prompt, lm.get_input_embeddings()(torch.tensor(tokens, dtype=torch.long))]) if tokens else prompt
        logits = lm(inputs_embeds=embeds[None], use_cache=False).logits[0, -1, first : first + n_bins].double()
        best = int(logits.argmax())
        theirs = follow[i] - first if i < len(follow) else best
        if theirs != best and 0 <= theirs < n_bins and float(logits[best] - logits[theirs]) < TIE:
            best = theirs
        tokens.append(first + best)
    return tuple(tokens)


@pytest.fixture(scope="module")
def references(vla):
    """seed -> the reference tokens of `random_obs(seed)` (computed once per module)."""
    return {seed: greedy_reference(vla, random_obs(seed)) for seed in SEEDS}


def assert_matches_reference(vla, seed: int, got: tuple[int, ...], ref: tuple[int, ...]) -> None:
    if got != ref:  # either a bug, or a near-tie the reference may follow
        ref = greedy_reference(vla, random_obs(seed), follow=got)
    assert got == ref, f"seed {seed}: engine {got} != transformers greedy {ref}"


def corrupted(ref: tuple[int, ...], rng: random.Random, first: int, good: int | None = None) -> tuple[int, ...]:
    """A draft that matches `ref` for its first `good` tokens (default: random, 0-7), then goes wrong."""
    good = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 7, 7]) if good is None else good
    draft = list(ref[:good])
    for i in range(good, ACTION_DIM):
        wrong = first + (ref[i] - first + rng.randint(1, 255)) % 256
        draft.append(wrong if i == good or rng.random() < 0.5 else ref[i])
    return tuple(draft)


class ListStore:
    """The database surface the engine reads; every query is answered with the hits of a fresh
    `draw()` of drafts (best first)."""

    def __init__(self, draw: Callable[[], list[tuple[int, ...]]], rng: random.Random, feat_dim: int) -> None:
        self.draw, self.rng, self.feat_dim = draw, rng, feat_dim

    def search(self, query, task: str, k: int) -> list[Hit]:
        zeros = np.zeros(self.feat_dim, np.float32)
        hits = [Hit(score=1.0 - 0.01 * i, task=task, episode=i, step=0, action=np.zeros(ACTION_DIM), action_tokens=d,
                    feat=zeros, feat_prev=zeros, ee_pos=np.array([self.rng.uniform(-0.3, 0.3) for _ in range(3)]))
                for i, d in enumerate(self.draw())]
        return hits[:k]

    def search_near(self, query, task: str, k: int, ee_pos, pool: int, timing_ms=None) -> list[Hit]:
        from heisd_ros.store.base import nearest_first

        hits = self.search(query, task, pool)
        return [hits[i] for i in nearest_first([h.ee_pos for h in hits], ee_pos)[:k]]

    def has_task(self, task: str) -> bool:
        return True

    def tasks(self) -> list[str]:
        return []

    def health(self) -> tuple[bool, str]:
        return True, "list store"

    def close(self) -> None:
        pass


@pytest.mark.parametrize("seed", SEEDS)
def test_ar_equals_transformers_greedy(vla, ar, references, seed):
    ar.reset()
    _, st = ar.step(random_obs(seed))
    assert_matches_reference(vla, seed, st.tokens, references[seed])


@pytest.mark.parametrize("seed", SEEDS)
def test_drafter_trees_equal_transformers_greedy(vla, drafter, references, seed):
    rng = random.Random(seed)
    depth = rng.randint(1, 6)
    tree = DrafterTreeConfig(depth=depth, top_k=rng.randint(1, 5), total_tokens=max(depth, rng.choice([6, 12, 40])),
                             min_path_prob=rng.choice([0.0, 0.0, 0.05, 0.5]))
    dec = HybridDecoder(vla, DecoderConfig(method="drafter", drafter_tree=tree), drafter=drafter)
    _, st = dec.step(random_obs(seed))
    assert sum(st.tokens_per_forward) == ACTION_DIM
    assert_matches_reference(vla, seed, st.tokens, references[seed])


@pytest.mark.parametrize("seed", SEEDS)
def test_top1_retrieval_chain_equals_transformers_greedy(vla, references, seed):
    rng = random.Random(100 + seed)
    first = vla.action_tokenizer.first_token_id
    drafts = [corrupted(references[seed], rng, first) for _ in range(rng.randint(1, 3))]
    store = ListStore(lambda: drafts, rng, vla.hidden_size)
    dec = HybridDecoder(vla, DecoderConfig(method="retrieval"), store=store)
    _, st = dec.step(random_obs(seed))
    assert st.mode == "retrieval"
    assert_matches_reference(vla, seed, st.tokens, references[seed])
    if drafts[0] == references[seed]:
        assert st.llm_forwards == 1  # a fully accepted chain is the prefill alone


@pytest.mark.parametrize("seed", SEEDS)
def test_heisd_topk_sequence_trees_equal_transformers_greedy(vla, drafter, references, seed):
    """Zero-bias sequence acceptance (= strict), no verify-skip, the boundary always open (tau -1):
    an episode's first two steps draft (the window needs 3 points), later ones retrieve, each
    step from a new set of hits.

    Odd seeds give the hits worst first, none complete, so the accepted path leaves the tree's
    first branch: its nodes must move in the KV cache before the forwards that complete the step
    read them. Even seeds give hits in random order, complete ones included, and may re-rank
    them by position."""
    rng = random.Random(200 + seed)
    first = vla.action_tokenizer.first_token_id
    ref = references[seed]
    worst_first = seed % 2 == 1
    k = rng.randint(2, 6) if worst_first else rng.randint(1, 6)
    pool = 0 if worst_first else rng.choice([0, k, k + 3])
    cap = rng.choice([32, 128] if worst_first else [7, 12, 20, 32, 128])  # worst first: room past the first hits

    def draw() -> list[tuple[int, ...]]:
        if worst_first:
            goods = [0] + sorted(rng.randint(1, 5) for _ in range(k - 1))  # the first branch is wrong at once
            return [corrupted(ref, rng, first, good) for good in goods]
        return [corrupted(ref, rng, first) for _ in range(k + 3)]

    cfg = DecoderConfig(
        method="heisd", acceptance=AcceptanceConfig(max_token_bias_bins=0, max_group_bias_bins=0),
        verify_skip=VerifySkipConfig(enabled=False),
        fused_metric=dataclasses.replace(DecoderConfig().fused_metric, tau=-1.0),
        retrieval=RetrievalConfig(top_k=k, max_tree_nodes=cap, position_pool=pool),
        drafter_tree=DrafterTreeConfig(depth=rng.randint(1, 6), top_k=rng.randint(1, 3), total_tokens=12, min_path_prob=0.0),
    )
    store = ListStore(draw, rng, vla.hidden_size)
    dec = HybridDecoder(vla, cfg, store=store, drafter=drafter)
    obs = random_obs(seed)
    modes = []
    for p in range(8):
        obs.ee_pos = np.array([0.05 * p, 0.02 * p * p, 0.0])
        _, st = dec.step(obs)
        modes.append(st.mode)
        assert_matches_reference(vla, seed, st.tokens, ref)
    assert modes[:3] == ["drafter", "drafter", "retrieval"]
