"""The fused drafter block computes what the transformers block computes (core/drafter_block.py).

The reference is `EagleDrafter.forward`: transformers' LlamaModel, causal over a whole sequence,
no cache. The fused block is fed the same pairs in chunks (a prefill, then commits), and tree rows
that see only their ancestors, whose output must equal the reference over the path as a sequence.
"""

from __future__ import annotations

import pytest
import torch

from heisd_ros.core import onednn
from heisd_ros.core.config import DrafterTreeConfig
from heisd_ros.core.drafter import DrafterSession, EagleDrafter
from heisd_ros.core.drafter_block import (
    DrafterCache,
    FusedDrafterBlock,
    causal_visibility,
)

TOL = 2e-5
KERNELS = ["torch", pytest.param("onednn", marks=pytest.mark.skipif(not onednn.available(), reason="no oneDNN linear"))]


@pytest.fixture(scope="module")
def trained_like(vla):
    """A drafter with non-trivial norms (a fresh one has all-ones norm weights)."""
    torch.manual_seed(3)
    drafter = EagleDrafter(vla.language_model.config).eval()
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return drafter


def _pairs(n: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, hidden, generator=g), torch.randn(n, hidden, generator=g)


def _reference(drafter: EagleDrafter, feats: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return drafter(feats, embeds)[0]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("chunks", [(9,), (5, 3, 1), (1, 1, 1, 1)])
def test_chunked_commits_equal_the_causal_reference(trained_like, chunks, kernel):
    hidden = trained_like.config.hidden_size
    feats, embeds = _pairs(sum(chunks), hidden, seed=len(chunks))
    ref = _reference(trained_like, feats, embeds)
    block = FusedDrafterBlock(trained_like, kernel)
    assert block.packed == (kernel == "onednn")
    cache, start, outs = block.new_cache(), 0, []
    with torch.inference_mode():
        for n in chunks:
            positions = torch.arange(start, start + n)
            outs.append(block(feats[start : start + n], embeds[start : start + n], positions,
                              causal_visibility(start, n, feats.device), cache))
            start += n
    assert cache.length == sum(chunks)
    assert torch.allclose(torch.cat(outs), ref, atol=TOL), float((torch.cat(outs) - ref).abs().max())


@pytest.mark.parametrize("kernel", KERNELS)
def test_tree_rows_equal_their_path_decoded_alone(trained_like, kernel):
    """Two rows in one call, each seeing the committed pairs and its own ancestors only."""
    hidden = trained_like.config.hidden_size
    feats, embeds = _pairs(12, hidden, seed=7)
    committed = 6
    block = FusedDrafterBlock(trained_like, kernel)
    session = DrafterSession(block, torch.nn.Embedding(4, hidden), torch.zeros(256, hidden), first_token_id=0)
    with torch.inference_mode():
        session.extend(feats[:committed], embeds[:committed])
        # level 1: rows 6 and 7 are siblings (slots 6, 7); level 2: row 8 under 6, row 9 under 7
        first = session._run(feats[6:8], embeds[6:8], [[6], [7]], committed)
        second = session._run(feats[8:10], embeds[8:10], [[6, 8], [7, 9]], committed)
    paths = {"6": [6], "7": [7], "6-8": [6, 8], "7-9": [7, 9]}
    got = {"6": first[0], "7": first[1], "6-8": second[0], "7-9": second[1]}
    for name, path in paths.items():
        rows = list(range(committed)) + path
        ref = _reference(trained_like, feats[rows], embeds[rows])[-1]
        assert torch.allclose(got[name], ref, atol=TOL), (name, float((got[name] - ref).abs().max()))


def test_expansion_leaves_only_the_committed_pairs(trained_like, vla):
    """After a tree, the cache holds the committed pairs only: a later commit equals the reference."""
    hidden = trained_like.config.hidden_size
    feats, embeds = _pairs(10, hidden, seed=11)
    session = DrafterSession(FusedDrafterBlock(trained_like), vla.get_input_embeddings(), vla.action_head_weight(),
                             vla.action_tokenizer.first_token_id)
    with torch.inference_mode():
        root = session.extend(feats[:7], embeds[:7])
        tree = session.expand(root, 5, DrafterTreeConfig(depth=5, top_k=3, total_tokens=20, min_path_prob=0.0))
        assert len(tree) > 5 and session.length == 7
        later = session.extend(feats[7:], embeds[7:])
    assert torch.allclose(later, _reference(trained_like, feats, embeds)[-1], atol=TOL)


def test_the_cache_grows_past_its_first_capacity():
    cache = DrafterCache(kv_heads=2, head_dim=4, dtype=torch.float32, device=torch.device("cpu"), capacity=3)
    keys = torch.arange(2 * 5 * 4, dtype=torch.float32).view(2, 5, 4)
    k, v = cache.append(keys[:, :2], -keys[:, :2])
    k, v = cache.append(keys[:, 2:], -keys[:, 2:])
    assert cache.keys.shape[2] >= 5 and k.shape == (1, 2, 5, 4)
    assert torch.equal(k[0], keys) and torch.equal(v[0], -keys)
    cache.crop(1)
    k, _ = cache.append(keys[:, 4:], keys[:, 4:])
    assert torch.equal(k[0], torch.cat([keys[:, :1], keys[:, 4:]], dim=1))


def test_a_position_beyond_the_rotary_table_is_refused(trained_like):
    block = FusedDrafterBlock(trained_like)
    hidden = trained_like.config.hidden_size
    feats, embeds = _pairs(1, hidden, seed=0)
    beyond = torch.tensor([trained_like.config.max_position_embeddings])
    with pytest.raises(ValueError, match="beyond"), torch.inference_mode():
        block(feats, embeds, beyond, causal_visibility(0, 1, feats.device), block.new_cache())


def test_a_bfloat16_drafter_keeps_torchs_kernel(trained_like, vla):
    bf16 = EagleDrafter(vla.language_model.config).to(torch.bfloat16).eval()
    assert not FusedDrafterBlock(bf16, "onednn").packed
    assert not FusedDrafterBlock(bf16, "auto").packed


@pytest.mark.parametrize("margin, packs", [(0.0, False), (1e9, True)])
def test_auto_packs_the_drafter_only_where_onednn_is_measured_faster(trained_like, monkeypatch, margin, packs):
    from heisd_ros.core import onednn

    if not onednn.available():
        pytest.skip("this torch build has no oneDNN linear")
    monkeypatch.setattr(onednn, "_decisions", {})
    monkeypatch.setattr(onednn, "AUTO_MARGIN", margin)
    assert FusedDrafterBlock(trained_like, "auto").packed == packs


def test_a_multi_layer_drafter_is_refused(vla):
    drafter = EagleDrafter(vla.language_model.config)
    drafter.block.layers.append(drafter.block.layers[0])
    with pytest.raises(ValueError, match="exactly one"):
        FusedDrafterBlock(drafter)
