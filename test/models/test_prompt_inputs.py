"""The mini VLA's extra prompt inputs: the wrist view's patches and a state token (end-effector
position, optionally the finger gap).

OpenVLA reads one view and no robot state; the mini VLA may read both views (`prompt_views`), the
end-effector position (`proprio_dim`) and the finger gap (`proprio_gripper_gap`). These tests
check that the prompt grows as configured, that the state reaches the LLM, that it survives
save/load, that the engine hands it to the model and stays lossless, and that the feature cache
keeps one file per prompt view.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from heisd_ros.core.config import ConfigError, DecoderConfig
from heisd_ros.core.drafter import EagleDrafter
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.core.errors import InvalidObservationError, ModelLoadError
from heisd_ros.models.loader import load_vla, tiny_vla, tiny_vla_config
from heisd_ros.pipeline.synthetic_demos import random_observation

INSTRUCTION = "pick up the red block"


def _cfg(prompt_views: int = 2, proprio: bool = True):
    extra = dict(proprio_dim=3, proprio_mean=(0.1, 0.0, 0.3), proprio_std=(0.2, 0.2, 0.1)) if proprio else {}
    return dataclasses.replace(tiny_vla_config(), prompt_views=prompt_views, **extra)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_vla(seed=1, cfg=_cfg())


def test_prompt_holds_every_prompt_view_and_one_state_token(model):
    plain = tiny_vla(seed=1)
    n = 16  # tiny: 64 px / 16 px patches = 4 x 4
    text = len(model._prompt_ids(INSTRUCTION))
    with torch.inference_mode():
        one = plain.prompt_embeds(INSTRUCTION, torch.zeros(n, plain.hidden_size))
        both = model.prompt_embeds(INSTRUCTION, torch.zeros(2 * n, model.hidden_size), state=[0.1, 0.0, 0.3])
    assert one.shape[1] == text + n
    assert both.shape[1] == text + 2 * n + 1


def test_state_token_moves_the_prompt_and_is_required(model):
    visual = torch.zeros(32, model.hidden_size)
    with torch.inference_mode():
        a = model.prompt_embeds(INSTRUCTION, visual, state=[0.1, 0.0, 0.3])
        b = model.prompt_embeds(INSTRUCTION, visual, state=[0.1, 0.05, 0.3])
    state_row = 1 + 32
    assert not torch.equal(a[0, state_row], b[0, state_row])
    assert torch.equal(a[0, :state_row], b[0, :state_row]) and torch.equal(a[0, state_row + 1:], b[0, state_row + 1:])
    with pytest.raises(InvalidObservationError, match="end-effector"):
        model.prompt_embeds(INSTRUCTION, visual)
    with pytest.raises(InvalidObservationError, match="finite"):
        model.prompt_embeds(INSTRUCTION, visual, state=[np.nan, 0.0, 0.0])


def test_bad_proprio_config_is_refused():
    with pytest.raises(ModelLoadError, match="proprio"):
        dataclasses.replace(tiny_vla_config(), proprio_dim=3, proprio_mean=(0.0,), proprio_std=(1.0,))
    with pytest.raises(ModelLoadError, match="prompt_views"):
        dataclasses.replace(tiny_vla_config(), prompt_views=0)


def test_save_load_keeps_prompt_inputs(model, tmp_path):
    model.save_pretrained(tmp_path / "m")
    back = load_vla(tmp_path / "m")
    assert back.cfg.prompt_views == 2 and back.cfg.proprio_mean == model.cfg.proprio_mean
    with torch.inference_mode():
        assert torch.equal(model.state_token([0.3, -0.1, 0.2]), back.state_token([0.3, -0.1, 0.2]))


def test_engine_reads_the_wrist_view_and_the_pose(model):
    """The LLM's features (f_live) change with the wrist image and with the pose alone."""
    ar = HybridDecoder(model, DecoderConfig(method="ar"))

    def f_live(obs):
        ar.reset()
        ar.step(obs)
        return ar.f_live.copy()

    base = f_live(random_observation(3))
    assert np.array_equal(base, f_live(random_observation(3)))
    other_wrist = random_observation(3)
    other_wrist.images["wrist"] = random_observation(100).images["wrist"]
    assert not np.allclose(base, f_live(other_wrist), atol=1e-4)
    other_pose = random_observation(3)
    other_pose.ee_pos = other_pose.ee_pos + np.array([0.05, 0.0, 0.0])
    assert not np.allclose(base, f_live(other_pose), atol=1e-4)


def test_engine_refuses_fewer_views_than_the_prompt_reads(model):
    with pytest.raises(ConfigError, match="prompt reads 2 views"):
        HybridDecoder(model, DecoderConfig(method="ar", views=("agentview",)))


@pytest.mark.parametrize("seed", range(8))
def test_drafter_decoding_with_prompt_inputs_is_lossless(model, seed):
    torch.manual_seed(0)
    drafter = EagleDrafter(model.language_model.config).eval()
    ar = HybridDecoder(model, DecoderConfig(method="ar"))
    dec = HybridDecoder(model, DecoderConfig(method="drafter"), drafter=drafter)
    obs = random_observation(seed)
    assert dec.step(obs)[1].tokens == ar.step(obs)[1].tokens


def test_feature_cache_keeps_one_file_per_prompt_view(model, tmp_path):
    from heisd_ros.pipeline.features import FeatureCache
    from heisd_ros.pipeline.episodes import DemoEpisode, EpisodeRef

    rng = np.random.default_rng(0)
    T = 3
    images = {v: rng.integers(0, 255, (T, 64, 64, 3), dtype=np.uint8) for v in ("agentview", "wrist")}
    ref = EpisodeRef(kind="hdf5", path=str(tmp_path / "x.hdf5"), demo="demo_0", dataset="d", task=INSTRUCTION,
                     episode=0, length=T)
    ep = DemoEpisode(dataset="d", task=INSTRUCTION, instruction=INSTRUCTION, episode=0, source="x.hdf5:demo_0",
                     actions=np.zeros((T, 7)), ee_pos=np.zeros((T, 3)), images=images)
    cache = FeatureCache(tmp_path / "cache", model)
    feats = cache.get(ref, ep)
    assert feats.shape == (T, 32, model.vision_backbone.out_dim)
    assert cache.path(ref, 0).is_file() and cache.path(ref, 1).is_file() and cache.is_complete(ref)
    again = cache.get(ref)  # from disk, no episode needed
    assert np.array_equal(again, feats) and cache.hits == 2
    with torch.inference_mode():
        wrist = model.vision_backbone(model.preprocess(list(images["wrist"]))).float().numpy()
    np.testing.assert_allclose(feats[:, 16:], wrist, atol=1e-2)


# -- the opening between the fingers (proprio_gripper_gap) ---------------------------------------
@pytest.fixture(scope="module")
def gap_model():
    torch.set_num_threads(1)
    return tiny_vla(seed=5, cfg=dataclasses.replace(_cfg(prompt_views=1), proprio_gripper_gap=True))


def test_finger_gap_reads_both_joint_conventions():
    from heisd_ros.core.gripper import finger_gap

    assert finger_gap([0.039, -0.039]) == pytest.approx(0.078)  # robosuite / LIBERO: (+q, -q)
    assert finger_gap([0.02, 0.02]) == pytest.approx(0.04)  # a real Panda's joint_states: (+q, +q)
    for bad in ([0.01], [0.01, float("nan")], [0.01, 0.02, 0.03]):
        with pytest.raises(ValueError, match="finger positions"):
            finger_gap(bad)


def test_gap_moves_only_the_state_token_and_is_required(gap_model):
    m = gap_model
    visual = torch.zeros(16, m.hidden_size)
    kw = dict(state=[0.1, 0.0, 0.3])
    with torch.inference_mode():
        rows = [m.prompt_embeds(INSTRUCTION, visual, gripper_gap=g, **kw)[0] for g in (0.08, 0.079, 0.02)]
    row = 1 + 16
    assert not torch.equal(rows[0][row], rows[1][row]) and not torch.equal(rows[1][row], rows[2][row])
    assert torch.equal(rows[0][:row], rows[2][:row]) and torch.equal(rows[0][row + 1:], rows[2][row + 1:])
    np.testing.assert_allclose(m.state_features([0.1, 0.0, 0.3], gripper_gap=0.08)[-1], 2.0)  # gap / 0.04 m
    for bad in (None, float("nan"), -0.01, 0.5):
        with pytest.raises(InvalidObservationError, match="finger gap"):
            m.prompt_embeds(INSTRUCTION, visual, gripper_gap=bad, **kw)
    with pytest.raises(ModelLoadError, match="proprio_gripper_gap"):
        dataclasses.replace(_cfg(prompt_views=1, proprio=False), proprio_gripper_gap=True)


def test_engine_hands_the_observed_gap_to_the_model(gap_model, tmp_path):
    ar = HybridDecoder(gap_model, DecoderConfig(method="ar", views=("agentview",)))
    assert ar.reads_finger_gap and not HybridDecoder(tiny_vla(seed=0), DecoderConfig(method="ar")).reads_finger_gap
    seen = []
    real = gap_model.prompt_embeds

    def spy(*args, **kwargs):
        seen.append(kwargs["gripper_gap"])
        return real(*args, **kwargs)

    gap_model.prompt_embeds = spy
    try:
        for gap in (0.08, 0.031):
            ar.step(dataclasses.replace(random_observation(3), gripper_gap=gap))
        with pytest.raises(InvalidObservationError, match="finger gap"):
            ar.step(random_observation(4))  # an observation without the gap is refused, not guessed
    finally:
        del gap_model.prompt_embeds
    assert seen == [0.08, 0.031, None]
    gap_model.save_pretrained(tmp_path / "g")
    assert load_vla(tmp_path / "g").cfg.proprio_gripper_gap


def test_training_examples_carry_the_demo_finger_gap(gap_model):
    from heisd_ros.pipeline.features import finger_gaps
    from heisd_ros.pipeline.episodes import DemoEpisode

    actions = np.zeros((3, 7))
    ep = DemoEpisode("d", INSTRUCTION, INSTRUCTION, 0, "x", actions, np.zeros((3, 3)),
                     gripper_qpos=np.array([[0.04, -0.04], [0.03, -0.03], [0.01, -0.01]]))
    np.testing.assert_allclose(finger_gaps(ep), [0.08, 0.06, 0.02])
    assert finger_gaps(dataclasses.replace(ep, gripper_qpos=None)) == [None] * 3  # a bag: the model refuses it


@pytest.mark.parametrize("seed", range(3))
def test_drafter_decoding_with_the_finger_gap_is_lossless(gap_model, seed):
    torch.manual_seed(0)
    drafter = EagleDrafter(gap_model.language_model.config).eval()
    ar = HybridDecoder(gap_model, DecoderConfig(method="ar", views=("agentview",)))
    dec = HybridDecoder(gap_model, DecoderConfig(method="drafter", views=("agentview",)), drafter=drafter)
    for step in range(3):
        obs = dataclasses.replace(random_observation(seed * 10 + step), gripper_gap=0.08 - 0.02 * step)
        assert dec.step(obs)[1].tokens == ar.step(obs)[1].tokens
