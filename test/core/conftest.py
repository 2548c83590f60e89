"""Shared tiny models, a real demo database and helpers for the decoding-core tests (fp32, CPU, fixed seeds)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from heisd_ros.core.config import DecoderConfig, StoreConfig
from heisd_ros.core.drafter import EagleDrafter
from heisd_ros.core.engine import HybridDecoder, embed_views
from heisd_ros.models.loader import tiny_vla
from heisd_ros.pipeline.synthetic_demos import random_observation


class Helpers:
    """Plain helpers, handed out by the `helpers` fixture (importlib mode cannot import conftest)."""

    random_obs = staticmethod(random_observation)

    @staticmethod
    def ar_tokens(ar: HybridDecoder, obs) -> tuple[int, ...]:
        ar.reset()
        _, st = ar.step(obs)
        assert st.llm_forwards == 7  # AR accounting: 1 prefill + 6 decode forwards
        return st.tokens

    @staticmethod
    def query(vla, obs) -> np.ndarray:
        """The retrieval query of `obs` over both views (what a retrieving step searches with)."""
        with torch.inference_mode():
            return embed_views(vla, [obs.images["agentview"], obs.images["wrist"]])[0]

    @staticmethod
    def perturbed(tokens, rng: random.Random, first: int, p_keep: float) -> tuple[int, ...]:
        """A draft: each token kept with probability p_keep, else moved by a few bins."""
        return tuple(
            t if rng.random() < p_keep else min(max(t + rng.choice([-3, -1, 1, 2]), first), first + 255) for t in tokens
        )


@pytest.fixture(scope="session")
def helpers():
    return Helpers


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def vla():
    return tiny_vla(seed=0)


@pytest.fixture(scope="session")
def ar(vla):
    return HybridDecoder(vla, DecoderConfig(method="ar"))


@pytest.fixture(scope="session")
def drafter(vla):
    torch.manual_seed(0)
    return EagleDrafter(vla.language_model.config).eval()


@pytest.fixture(scope="session")
def demo_store(vla, ar):
    """A real Qdrant (qdrant-client local mode) holding the AR tokens of 50 random observations:
    per observation one exact demo and two perturbed ones, all at the observation's pose."""
    from heisd_ros.store.factory import make_store
    from heisd_ros.store.schema import DemoPoint

    dim = vla.vision_backbone.out_dim * 2
    store = make_store(StoreConfig(backend="local"), obs_dim=dim, feat_dim=vla.hidden_size, create=True)
    rng = random.Random(7)
    first = vla.action_tokenizer.first_token_id
    points = []
    for seed in range(50):
        obs = random_observation(seed)
        ref = Helpers.ar_tokens(ar, obs)
        for k in range(3):
            tokens = ref if k == 0 else Helpers.perturbed(ref, rng, first, 0.7)
            feat = np.random.default_rng(seed).normal(size=vla.hidden_size).astype(np.float32)
            points.append(DemoPoint(
                dataset="t", task=obs.instruction, instruction=obs.instruction, episode=seed * 3 + k, step=0,
                obs=Helpers.query(vla, obs) + 0.001 * k, feat=feat, feat_prev=feat, action=np.zeros(7), action_tokens=tokens,
                ee_pos=obs.ee_pos, success=True,
            ))
    store.upsert(points)
    yield store
    store.close()
