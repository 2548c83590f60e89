"""Temporal image jitter (`heisd train-vla --image-jitter`): the image comes from a nearby step of the
same episode, so only the state token says exactly where the hand is (NOTES 38)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from heisd_ros.core.errors import ConfigError
from heisd_ros.models.loader import tiny_vla, tiny_vla_config
from heisd_ros.pipeline.training import Example, action_logits, jitter_images, teacher_forced, train_vla

CFG = dataclasses.replace(tiny_vla_config(), proprio_dim=3, proprio_mean=(0.0, 0.0, 0.0), proprio_std=(0.1, 0.1, 0.1))


def _episode(first: int, n: int = 20, seed: int = 0) -> list[Example]:
    """An approach along x: the hand moves 1 cm per step from x = -10 cm, and the x token says
    "keep going" (200) until x passes 0, then "stop" (128). Patch row 0 carries the step's x, so the
    current image tells the switch as exactly as the state does; a jittered one does not."""
    rng = np.random.default_rng(seed)
    xs = -0.10 + 0.01 * np.arange(n) + rng.normal(0.0, 0.002)
    patches = rng.normal(0.0, 0.3, (n, 16, 64)).astype(np.float32)
    patches[:, 0, :8] += (xs * 30.0)[:, None]
    out = []
    for t in range(n):
        bins = np.array([200 if xs[t] < 0 else 128, 128, 128, 128, 128, 128, 0])
        out.append(Example([], "pick up the block", first + bins, patches=patches[t],
                           state=np.array([xs[t], 0.0, 0.2]), episode_patches=patches, step=t))
    return out


def test_jittered_patches_come_from_nearby_steps_of_the_same_episode():
    ep = _episode(first=0)
    rng = np.random.default_rng(0)
    for _ in range(20):
        for ex, out in zip(ep, jitter_images(ep, 3, rng)):
            rows = [t for t in range(len(ep)) if np.array_equal(out.patches, ep[t].patches)]
            assert len(rows) == 1 and abs(rows[0] - ex.step) <= 3
            assert out.tokens is ex.tokens and out.state is ex.state  # the labels and state stay
    assert all(out.patches is ex.patches for ex, out in zip(ep, jitter_images(ep, 0, rng)))
    with pytest.raises(ValueError, match="episode features"):
        jitter_images([dataclasses.replace(ep[0], episode_patches=None)], 2, rng)


def _switch_from_state(vla, episodes: list[list[Example]]) -> float:
    """How well the x token follows the state when the image is pinned to the episode's first
    step: share of steps whose x token is right."""
    hits = []
    for ep in episodes:
        batch = [dataclasses.replace(ex, patches=ep[0].patches) for ex in ep]
        with torch.inference_mode():
            hidden, _, p = teacher_forced(vla, batch)
            x = action_logits(vla, hidden[:, p - 1]).argmax(-1).numpy() + vla.action_tokenizer.first_token_id
        hits.extend(x == np.stack([ex.tokens for ex in ep])[:, 0])
    return float(np.mean(hits))


def test_image_jitter_makes_the_policy_read_its_position():
    torch.set_num_threads(1)
    score = {}
    for k in (0, 6):
        vla = tiny_vla(seed=2, cfg=CFG)
        first = vla.action_tokenizer.first_token_id
        train = [ex for s in range(16) for ex in _episode(first, seed=s)]
        train_vla(vla, train, steps=150, batch_size=32, lr=3e-3, seed=0, image_jitter=k)
        score[k] = _switch_from_state(vla, [_episode(first, seed=100 + s) for s in range(4)])
    assert score[6] > 0.9, score
    assert score[6] > score[0] + 0.15, score


def test_image_jitter_is_validated():
    from heisd_ros.tools.train_vla import TrainVLAConfig, build_parser

    assert build_parser().parse_args(["--proprio", "--image-jitter", "4"]).image_jitter == 4
    with pytest.raises(ConfigError, match="image-jitter"):
        TrainVLAConfig(image_jitter=4)  # no state token to read the position from
    with pytest.raises(ConfigError, match="image-jitter"):
        TrainVLAConfig(proprio=True, image_jitter=-1)
