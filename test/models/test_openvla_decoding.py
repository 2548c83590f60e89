"""Decoding a native OpenVLA checkpoint (tiny random weights, published layout, padded vocabulary).

OpenVLA's embedding has 32064 rows, its action tokens are 31744-31999: every strict method must
return exactly the AR greedy tokens, the drafter must propose ids in that range (ids read off the
embedding size would be 64 too high), and the relaxed method must still only emit action ids.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from heisd_ros.core.acceptance import StrictRule
from heisd_ros.core.config import (
    AcceptanceConfig,
    DecoderConfig,
    DrafterTreeConfig,
    StoreConfig,
    VerifySkipConfig,
)
from heisd_ros.core.drafter import DrafterSession, EagleDrafter
from heisd_ros.core.drafter_block import FusedDrafterBlock
from heisd_ros.core.engine import HybridDecoder, _StepDecode, embed_views
from heisd_ros.core.verifier import TargetSession
from heisd_ros.models.openvla import load_openvla
from heisd_ros.models.openvla_random import PRESETS, write_random_checkpoint
from heisd_ros.pipeline.synthetic_demos import random_observation

pytestmark = pytest.mark.slow  # end to end: an OpenVLA-shaped checkpoint decoded every way

SEEDS = range(50)
ACTION_IDS = range(31744, 32000)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def vla(tmp_path_factory):
    directory = write_random_checkpoint(tmp_path_factory.mktemp("openvla") / "tiny", PRESETS["tiny"])["directory"]
    return load_openvla(directory, dtype="float32", unnorm_key="bridge_orig")


@pytest.fixture(scope="module")
def drafter(vla):
    torch.manual_seed(0)
    return EagleDrafter(vla.language_model.config).eval()


@pytest.fixture(scope="module")
def reference(vla):
    """The AR greedy tokens of every seed's observation."""
    ar = HybridDecoder(vla, DecoderConfig(method="ar"))
    out = {}
    for seed in SEEDS:
        _, st = ar.step(random_observation(seed))
        assert st.llm_forwards == 7
        out[seed] = st.tokens
    return out


def test_ar_tokens_are_action_ids_and_depend_on_the_frame(reference):
    assert all(t in ACTION_IDS for tokens in reference.values() for t in tokens)
    assert len(set(reference.values())) > 10


def test_drafter_proposes_action_ids_of_the_unpadded_vocabulary(vla, drafter):
    head, first = vla.action_head_weight(), vla.action_tokenizer.first_token_id
    cfg = DrafterTreeConfig(depth=4, top_k=4, total_tokens=40, min_path_prob=0.0)
    seen = set()
    with torch.inference_mode():
        for seed in range(5):
            obs = random_observation(seed)
            _, patches = embed_views(vla, [obs.images["agentview"]])
            prompt = vla.prompt_embeds(obs.instruction, vla.projector(patches[0]))[0]
            session = DrafterSession(FusedDrafterBlock(drafter), vla.get_input_embeddings(), head, first)
            dec = _StepDecode(TargetSession(vla.language_model, head), session, prompt)
            dec.forward(None, StrictRule(), vla.action_tokenizer.vocab_size)
            seen |= set(dec.draft(4, cfg).tokens)
    assert seen and seen <= set(ACTION_IDS)
    assert max(seen) > 31999 - 64  # the old offset would have put these above 31999


def test_strict_drafter_decoding_equals_ar(vla, drafter, reference):
    rng = random.Random(0)
    decoders = []
    for _ in range(8):  # tree shapes, each decoding a share of the seeds
        tree = DrafterTreeConfig(depth=rng.randint(1, 6), top_k=rng.randint(1, 4), total_tokens=rng.choice([6, 12, 40]),
                                 min_path_prob=rng.choice([0.0, 0.05, 0.5]))
        tree = dataclasses.replace(tree, total_tokens=max(tree.total_tokens, tree.depth))
        decoders.append(HybridDecoder(vla, DecoderConfig(method="drafter", drafter_tree=tree), drafter=drafter))
    for seed in SEEDS:
        _, st = decoders[seed % len(decoders)].step(random_observation(seed))
        assert st.tokens == reference[seed], seed


def test_specvla_only_emits_action_ids(vla, drafter):
    dec = HybridDecoder(vla, DecoderConfig(method="specvla"), drafter=drafter)
    for seed in SEEDS:
        _, st = dec.step(random_observation(seed))
        assert all(t in ACTION_IDS for t in st.tokens), (seed, st.tokens)


def _nudged(token: int, rng: random.Random) -> int:
    """The token kept with probability 0.7, else moved by a few bins (within the action ids)."""
    return token if rng.random() < 0.7 else min(max(token + rng.choice([-3, 1, 2]), 31744), 31999)


@pytest.fixture(scope="module")
def store(vla, reference):
    """A real Qdrant (local mode) holding, per observation, its AR tokens and two perturbed copies."""
    from heisd_ros.store.factory import make_store
    from heisd_ros.store.schema import DemoPoint

    db = make_store(StoreConfig(backend="local"), obs_dim=vla.query_dim * 2, feat_dim=vla.hidden_size, create=True)
    rng = random.Random(7)
    points = []
    for seed in SEEDS:
        obs = random_observation(seed)
        with torch.inference_mode():
            query = embed_views(vla, [obs.images["agentview"], obs.images["wrist"]])[0]
        for k in range(3):
            tokens = reference[seed] if k == 0 else tuple(_nudged(t, rng) for t in reference[seed])
            feat = np.random.default_rng(seed).normal(size=vla.hidden_size).astype(np.float32)
            points.append(DemoPoint(dataset="t", task=obs.instruction, instruction=obs.instruction,
                                    episode=seed * 3 + k, step=0, obs=query + 0.001 * k, feat=feat, feat_prev=feat,
                                    action=np.zeros(7), action_tokens=tokens, ee_pos=obs.ee_pos, success=True))
    db.upsert(points)
    yield db
    db.close()


def test_retrieval_and_strict_heisd_equal_ar(vla, drafter, store, reference):
    retrieval = HybridDecoder(vla, DecoderConfig(method="retrieval"), store=store)
    strict = AcceptanceConfig(max_token_bias_bins=0, max_group_bias_bins=0)
    heisd = HybridDecoder(vla, DecoderConfig(
        method="heisd", acceptance=strict, verify_skip=VerifySkipConfig(enabled=False),
        fused_metric=dataclasses.replace(DecoderConfig().fused_metric, tau=-1.0)), store=store, drafter=drafter)
    modes = set()
    for seed in SEEDS:
        obs = random_observation(seed)
        _, st = retrieval.step(obs)
        assert st.mode == "retrieval" and st.tokens == reference[seed], seed
        heisd.reset(obs.instruction)
        for p in range(3):  # three window points so the kinematic boundary can choose retrieval
            obs.ee_pos = np.array([0.1 * p, 0.0, 0.0])
            _, st = heisd.step(obs)
            assert st.tokens == reference[seed], (seed, p, st.mode)
            modes.add(st.mode)
    assert modes == {"drafter", "retrieval"}


def test_a_trained_drafter_is_accepted_beyond_one_token_per_forward(vla, reference, monkeypatch):
    """A drafter trained on the checkpoint's own greedy tokens gets several tokens per forward
    accepted; with the old offset (action ids read off the padded embedding: 64 too high) the
    same drafter's proposals never match, and each forward fixes one token."""
    from heisd_ros.pipeline.training import Example, train_drafter

    seeds = list(SEEDS)[:8]
    examples = [Example(images=[random_observation(s).images["agentview"]], instruction=random_observation(s).instruction,
                        tokens=np.asarray(reference[s])) for s in seeds]
    trained, _ = train_drafter(vla, examples, steps=150, batch_size=8, lr=3e-3, seed=0, feature_noise=0.0)

    def tokens_per_forward() -> float:
        dec = HybridDecoder(vla, DecoderConfig(method="drafter"), drafter=trained)
        stats = [dec.step(random_observation(s))[1] for s in seeds]
        assert all(st.tokens == reference[s] for st, s in zip(stats, seeds))  # lossless either way
        return 7 * len(stats) / sum(st.llm_forwards for st in stats)

    fixed = tokens_per_forward()
    assert fixed > 1.5, fixed
    real_init = DrafterSession.__init__

    def offset_bug(self, block, embed, head, first_token_id, logit_bias=None):
        real_init(self, block, embed, head, embed.num_embeddings - 256, logit_bias)

    monkeypatch.setattr(DrafterSession, "__init__", offset_bug)
    buggy = tokens_per_forward()
    assert buggy < 1.2, buggy
    print(f"tokens per forward: {fixed:.2f} with the action tokenizer ids, {buggy:.2f} with the old offset")
