"""Modality dropout (`heisd train-vla --image-dropout`): blanked visual tokens make the state token
carry the action (NOTES 35: the policy trained without it ignored its end-effector position)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from heisd_ros.core.errors import ConfigError
from heisd_ros.models.loader import tiny_vla, tiny_vla_config
from heisd_ros.pipeline.training import Example, action_logits, prompt_batch, teacher_forced, train_vla

CFG = dataclasses.replace(tiny_vla_config(), proprio_dim=3, proprio_mean=(0.0, 0.0, 0.0), proprio_std=(0.1, 0.1, 0.1))


def _problem(vla, n: int, seed: int) -> list[Example]:
    """The x token is 200 when the hand is at x = +5 cm and 50 at -5 cm; the image says the same
    (a strong offset of one patch), so either input alone predicts it."""
    rng = np.random.default_rng(seed)
    first = vla.action_tokenizer.first_token_id
    out = []
    for k in range(n):
        side = k % 2
        patches = rng.normal(0.0, 1.0, (16, 64)).astype(np.float32)
        patches[0, :8] += 3.0 if side else -3.0
        bins = np.array([200 if side else 50, 128, 128, 128, 128, 128, 0])
        state = np.array([0.05 if side else -0.05, 0.0, 0.2]) + rng.normal(0.0, 0.005, 3)
        out.append(Example([], "pick up the block", first + bins, patches=patches, state=state))
    return out


def _x_token_from_state_alone(vla, examples: list[Example]) -> float:
    """Share of examples whose x token is right with every visual token blanked."""
    with torch.inference_mode():
        hidden, _, p = teacher_forced(vla, examples, drop_image=np.ones(len(examples), bool))
        x = action_logits(vla, hidden[:, p - 1]).argmax(-1).numpy() + vla.action_tokenizer.first_token_id
    return float(np.mean(x == np.stack([ex.tokens for ex in examples])[:, 0]))


def test_dropped_rows_get_zero_visual_tokens_and_the_rest_are_untouched():
    torch.set_num_threads(1)
    vla = tiny_vla(seed=1, cfg=CFG)
    batch = _problem(vla, 4, seed=0)
    with torch.inference_mode():
        full = prompt_batch(vla, batch)
        some = prompt_batch(vla, batch, np.array([True, False, True, False]))
    visual = slice(1, 17)  # BOS, then 16 patch tokens
    assert torch.equal(some[1], full[1]) and torch.equal(some[3], full[3])
    assert torch.count_nonzero(some[0, visual]) == 0 and torch.count_nonzero(some[2, visual]) == 0
    assert torch.equal(some[0, 17:], full[0, 17:])  # state and text tokens stay


def test_image_dropout_teaches_the_state_token():
    torch.set_num_threads(1)
    share = {}
    for p in (0.0, 0.5):
        vla = tiny_vla(seed=2, cfg=CFG)
        train_vla(vla, _problem(vla, 256, seed=0), steps=120, batch_size=32, lr=3e-3, seed=0, image_dropout=p)
        share[p] = _x_token_from_state_alone(vla, _problem(vla, 128, seed=1))
    assert share[0.0] < 0.7, share  # the image alone was enough: the state token was never needed
    assert share[0.5] > 0.9, share


def test_image_dropout_is_validated():
    from heisd_ros.tools.train_vla import TrainVLAConfig, build_parser

    assert build_parser().parse_args(["--proprio", "--image-dropout", "0.5"]).image_dropout == 0.5
    with pytest.raises(ConfigError, match="image-dropout"):
        TrainVLAConfig(image_dropout=0.5)  # nothing but the image to act on
    with pytest.raises(ConfigError, match="image-dropout"):
        TrainVLAConfig(proprio=True, image_dropout=1.0)
