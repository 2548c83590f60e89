"""`compact_cache` moves only the accepted nodes that are not in place; the result must equal a
full gather of the kept positions (what compaction means), for any keep / extra sets."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from heisd_ros.core.verifier import compact_cache

CONFIG = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3)


def filled_cache(length: int, seed: int) -> DynamicCache:
    """A cache of `length` random positions in every layer (distinct values per position)."""
    gen = torch.Generator().manual_seed(seed)
    cache = DynamicCache(config=CONFIG)
    for layer in range(CONFIG.num_hidden_layers):
        k, v = (torch.randn(1, 2, length, 8, generator=gen) for _ in range(2))
        cache.update(k, v, layer)
    return cache


def gathered(cache: DynamicCache, keep: int, extra: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The reference: every layer's positions [0, keep) + extra, gathered into new tensors."""
    index = torch.tensor(list(range(keep)) + extra, dtype=torch.long)
    return [(layer.keys.index_select(2, index), layer.values.index_select(2, index)) for layer in cache.layers]


def assert_compacts_like_gather(length: int, keep: int, extra: list[int], seed: int) -> None:
    cache = filled_cache(length, seed)
    want = gathered(cache, keep, extra)
    compact_cache(cache, keep, extra)
    for layer, (k, v) in zip(cache.layers, want):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    assert cache.get_seq_length() == keep + len(extra)


@pytest.mark.parametrize("seed", range(200))
def test_compaction_equals_a_full_gather_for_random_keep_and_extra(seed):
    rng = random.Random(seed)
    keep = rng.randint(0, 40)
    tree = rng.randint(0, 40)  # tree nodes after the kept positions
    # some paths start in place (the first branch), then jump; some are anywhere in the tree
    extra = sorted(rng.sample(range(keep, keep + tree), rng.randint(0, tree)))
    if rng.random() < 0.5:
        lead = rng.randint(0, tree)
        extra = list(range(keep, keep + lead)) + [p for p in extra if p >= keep + lead]
    assert_compacts_like_gather(keep + tree, keep, extra, seed)


@pytest.mark.parametrize("keep,length,extra", [
    (10, 14, [10, 11, 12, 13]),  # no-op: the path is already contiguous right after keep
    (10, 16, [10, 11]),  # in place, the rest of the tree dropped
    (10, 16, []),  # nothing accepted
    (10, 10, []),  # nothing to drop
    (10, 16, [11, 12, 13]),  # a contiguous tail overlapping its destination
    (10, 16, [13, 14, 15]),  # a contiguous tail clear of its destination
    (10, 16, [10, 12, 15]),  # in place, then scattered
    (0, 5, [1, 3]),  # nothing kept before the tree
])
def test_compaction_edge_cases(keep, length, extra):
    assert_compacts_like_gather(length, keep, extra, seed=keep + length)


def test_in_place_path_copies_nothing():
    """A path already in place leaves every layer's storage untouched: the cache becomes a view."""
    cache = filled_cache(16, seed=1)
    before = [(layer.keys.data_ptr(), layer.keys.clone()) for layer in cache.layers]
    compact_cache(cache, 10, [10, 11, 12])
    for layer, (ptr, full) in zip(cache.layers, before):
        assert layer.keys.data_ptr() == ptr
        assert torch.equal(layer.keys, full[:, :, :13])


def test_a_compacted_cache_grows_like_a_fresh_one():
    """The next forward appends after the compacted length (the view is extended, not overwritten)."""
    cache = filled_cache(20, seed=2)
    want = gathered(cache, 8, [9, 12, 17])
    compact_cache(cache, 8, [9, 12, 17])
    new_k, new_v = torch.ones(1, 2, 3, 8), torch.zeros(1, 2, 3, 8)
    cache.update(new_k, new_v, 0)
    assert torch.equal(cache.layers[0].keys, torch.cat([want[0][0], new_k], dim=2))
    assert torch.equal(cache.layers[0].values, torch.cat([want[0][1], new_v], dim=2))
