"""Teacher forcing with swapped action-token inputs (`heisd train-vla --prefix-swap`).

With clean teacher forcing the six tokens before the gripper token predict it almost perfectly,
so a model can learn to copy the gripper from them instead of reading the image (NOTES 30). These
tests check the swap itself and that it moves a trained model's gripper token from the prefix to
the image on a small problem built to have exactly that shortcut.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heisd_ros.core.errors import ConfigError
from heisd_ros.models.loader import tiny_vla
from heisd_ros.pipeline.training import Example, action_logits, swap_prefix_tokens, teacher_forced, train_vla


def test_swap_takes_each_swapped_token_from_another_row_of_the_same_column():
    tokens = np.arange(8 * 7).reshape(8, 7) + 1000  # every entry unique
    rng = np.random.default_rng(0)
    assert np.array_equal(swap_prefix_tokens(tokens, 0.0, rng), tokens)
    out = swap_prefix_tokens(tokens, 1.0, rng)
    for i in range(8):
        for j in range(7):
            rows = np.flatnonzero(tokens[:, j] == out[i, j])
            assert rows.size == 1 and rows[0] != i  # same dimension, another example
    half = swap_prefix_tokens(np.repeat(tokens, 50, axis=0), 0.5, np.random.default_rng(1))
    frac = float(np.mean(half != np.repeat(tokens, 50, axis=0)))
    assert 0.4 < frac < 0.6
    # seeded, input untouched, a single example has no donor
    assert np.array_equal(swap_prefix_tokens(tokens, 0.5, np.random.default_rng(3)),
                          swap_prefix_tokens(tokens, 0.5, np.random.default_rng(3)))
    assert tokens[0, 0] == 1000
    assert np.array_equal(swap_prefix_tokens(tokens[:1], 1.0, rng), tokens[:1])


def test_prefix_swap_is_validated():
    from heisd_ros.tools.train_vla import TrainVLAConfig, build_parser

    assert build_parser().parse_args(["--prefix-swap", "0.5"]).prefix_swap == 0.5
    with pytest.raises(ConfigError, match="prefix_swap"):
        TrainVLAConfig(prefix_swap=1.5)


def _shortcut_problem(vla, n: int, seed: int) -> list[Example]:
    """Two phases. The image says the phase only faintly (eight values of one patch offset by
    ±0.5 under unit noise);
    the six tokens before the gripper say it exactly, as a closed gripper's lift does in LIBERO."""
    rng = np.random.default_rng(seed)
    first = vla.action_tokenizer.first_token_id
    out = []
    for k in range(n):
        phase = k % 2
        patches = rng.normal(0.0, 1.0, (16, 64)).astype(np.float32)
        patches[0, :8] += 0.5 if phase else -0.5
        bins = np.array([200, 190, 210, 128, 128, 128, 255]) if phase else np.array([40, 60, 30, 128, 128, 128, 0])
        out.append(Example([], "pick up the block", first + bins, patches=patches))
    return out


def _gripper_follows_image(vla, examples: list[Example]) -> float:
    """Share of examples whose gripper token matches their own image when the six tokens before
    it come from the other phase."""
    tokens = np.stack([ex.tokens for ex in examples])
    swapped = tokens.copy()
    swapped[:, :6] = np.roll(tokens, 1, axis=0)[:, :6]  # neighbours alternate phase
    with torch.inference_mode():
        hidden, _, p = teacher_forced(vla, examples, swapped)
        g = action_logits(vla, hidden[:, p + 5]).argmax(-1).numpy() + vla.action_tokenizer.first_token_id
    return float(np.mean(g == tokens[:, 6]))


def test_swapped_inputs_make_the_gripper_token_read_the_image():
    torch.set_num_threads(1)
    results = {}
    for p in (0.0, 1.0):
        vla = tiny_vla(seed=2)
        train = _shortcut_problem(vla, 256, seed=0)
        train_vla(vla, train, steps=150, batch_size=32, lr=3e-3, seed=0, prefix_swap=p)
        results[p] = _gripper_follows_image(vla, _shortcut_problem(vla, 128, seed=1))
    assert results[0.0] < 0.3, results  # clean teacher forcing: the gripper copies the prefix
    assert results[1.0] > 0.7, results  # swapped inputs: it reads the (faint) image signal
