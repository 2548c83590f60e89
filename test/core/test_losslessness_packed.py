"""Strict decoding on oneDNN-packed decoder layers returns the tokens of torch's own kernel.

`test_losslessness_reference` holds torch's kernel to transformers' greedy decoding; here the same
tiny model with its decoder layers packed (`decoder.llm_linear` 'onednn', the default on a float32
CPU) decodes every strict shape (ar's one-row forwards stay on torch's kernel, prefills and tree
verifications run packed) and must return the same tokens.
"""

from __future__ import annotations

import random

import pytest

from heisd_ros.core.config import DecoderConfig, DrafterTreeConfig
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.models.loader import tiny_vla
from heisd_ros.models.packed_linear import onednn_linear_available, pack_decoder_layers

pytestmark = pytest.mark.skipif(not onednn_linear_available(), reason="this torch build has no oneDNN linear")

SEEDS = range(30)


@pytest.fixture(scope="module")
def packed_vla():
    vla = tiny_vla(seed=0)  # the same weights as the session's `vla`
    assert pack_decoder_layers(vla.language_model, "cpu", "float32") > 0
    return vla


@pytest.mark.parametrize("seed", SEEDS)
def test_packed_ar_and_drafter_trees_return_torchs_tokens(vla, ar, packed_vla, drafter, helpers, seed):
    obs = helpers.random_obs(seed)
    want = helpers.ar_tokens(ar, obs)
    packed_ar = HybridDecoder(packed_vla, DecoderConfig(method="ar"))
    assert helpers.ar_tokens(packed_ar, obs) == want
    rng = random.Random(seed)
    tree = DrafterTreeConfig(depth=rng.randint(1, 6), top_k=rng.randint(1, 4), total_tokens=rng.randint(6, 40))
    dec = HybridDecoder(packed_vla, DecoderConfig(method="drafter", drafter_tree=tree), drafter=drafter)
    _, st = dec.step(obs)
    assert st.tokens == want and st.strict
