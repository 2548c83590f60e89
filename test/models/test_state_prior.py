"""The proprioceptive action prior (models/state_prior.py): it learns a state rule, it travels with
the model directory, the decoder that holds it changes the policy, and speculative decoding stays
lossless under it."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from heisd_ros.core.acceptance import StrictRule
from heisd_ros.core.config import DecoderConfig, DrafterTreeConfig
from heisd_ros.core.drafter import EagleDrafter
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.core.errors import InvalidObservationError
from heisd_ros.core.tree import sequence_tree
from heisd_ros.models.loader import load_policy_model, tiny_vla
from heisd_ros.models.state_prior import StatePriorConfig, fit_state_prior, load_state_prior, task_key
from heisd_ros.pipeline.synthetic_demos import TASKS, random_observation

GAP = 0.04


def rule_columns(x: float, task: int) -> np.ndarray:
    """The synthetic expert: every dimension's column is set by the sign of x, mirrored per task."""
    high = (x > 0) != bool(task)
    return np.array([200 - 7 * d if high else 20 + 9 * d for d in range(7)])


def synthetic_episodes(n: int = 400, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    data = {}
    for task, name in enumerate(TASKS[:2]):
        pos = rng.uniform(-0.3, 0.3, (n, 3))
        state = np.hstack([pos, np.full((n, 1), GAP)])
        cols = np.stack([rule_columns(p[0], task) for p in pos])
        data[task_key(name)] = [(state, cols)]
    return data


@pytest.fixture(scope="module")
def prior():
    torch.manual_seed(0)
    p, report = fit_state_prior(synthetic_episodes(), StatePriorConfig(hidden=64, steps=300, seed=0))
    assert set(report) == {task_key(t) for t in TASKS[:2]}
    return p


def test_the_prior_learns_the_state_rule_per_task(prior):
    rng = np.random.default_rng(1)
    for task, name in enumerate(TASKS[:2]):
        for x in rng.uniform(-0.3, 0.3, 20):
            if abs(x) < 0.03:
                continue  # the boundary itself is not learned to the millimetre
            bias = prior.bias(name, [x, 0.0, 0.1], GAP)
            assert bias.shape == (7, 256)
            assert np.array_equal(bias.argmax(-1).numpy(), rule_columns(x, task)), (task, x)
    # log-probabilities: every row sums to one in probability
    assert torch.allclose(prior.bias(TASKS[0], [0.1, 0, 0], GAP).exp().sum(-1), torch.ones(7), atol=1e-4)


def test_unknown_task_gives_no_bias_and_bad_state_a_clear_error(prior):
    assert prior.bias("put the moon in the basket", [0, 0, 0], GAP) is None
    assert prior.knows(TASKS[0].upper() + ".")  # keys ignore case and a final full stop
    for gap in (None, float("nan"), -0.01, 0.5):
        with pytest.raises(InvalidObservationError, match="finger gap"):
            prior.bias(TASKS[0], [0, 0, 0], gap)
    with pytest.raises(InvalidObservationError, match="end-effector position"):
        prior.bias(TASKS[0], [0, float("inf"), 0], GAP)


def test_prior_travels_with_the_model_directory(prior, tmp_path):
    from safetensors.torch import load_file

    vla = tiny_vla(seed=0)
    vla.save_pretrained(tmp_path / "with")
    prior.save(tmp_path / "with")
    assert not any("prior" in k or k.startswith("nets") for k in load_file(str(tmp_path / "with" / "model.safetensors")))
    loaded = load_policy_model(tmp_path / "with")
    assert loaded.state_prior is not None and not hasattr(loaded.vla, "state_prior")
    for x in (-0.2, 0.05, 0.25):
        a, b = loaded.state_prior.bias(TASKS[1], [x, 0.1, 0], GAP), prior.bias(TASKS[1], [x, 0.1, 0], GAP)
        assert torch.equal(a.argmax(-1), b.argmax(-1))  # bfloat16 on disk moves probabilities, not the argmax
        assert torch.allclose(a.exp(), b.exp(), atol=0.02)
    vla.save_pretrained(tmp_path / "without")
    assert load_policy_model(tmp_path / "without").state_prior is None
    assert load_state_prior(tmp_path / "without") is None


def test_a_corrupt_prior_file_is_a_load_error(prior, tmp_path):
    from heisd_ros.core.errors import ModelLoadError

    prior.save(tmp_path)
    (tmp_path / "state_prior.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError, match="corrupt state prior"):
        load_state_prior(tmp_path)


@pytest.fixture(scope="module")
def guided(prior):
    """A tiny VLA, its AR decoder holding the prior, and a drafter."""
    vla = tiny_vla(seed=0)
    torch.manual_seed(0)
    drafter = EagleDrafter(vla.language_model.config).eval()
    return vla, HybridDecoder(vla, DecoderConfig(method="ar"), state_prior=prior), drafter


def perturbed(tokens, rng: random.Random, first: int, p_keep: float) -> tuple[int, ...]:
    """A retrieval-like draft: each token kept with probability p_keep, else moved a few bins."""
    return tuple(t if rng.random() < p_keep else min(max(t + rng.choice([-3, -1, 1, 2]), first), first + 255)
                 for t in tokens)


def obs_with_gap(seed: int):
    obs = random_observation(seed)
    obs.gripper_gap = GAP
    return obs


def test_the_prior_changes_the_policy(guided):
    vla, ar, _ = guided
    plain = HybridDecoder(tiny_vla(seed=0), DecoderConfig(method="ar"))
    assert ar.reads_finger_gap and not plain.reads_finger_gap
    first = vla.action_tokenizer.first_token_id
    changed = followed = 0
    for seed in range(10):
        obs = obs_with_gap(seed)
        ar.reset()
        plain.reset()
        _, st = ar.step(obs)
        _, st_plain = plain.step(obs)
        changed += st.tokens != st_plain.tokens
        followed += int(np.sum(np.array(st.tokens) - first == rule_columns(obs.ee_pos[0], 0)))
    assert changed >= 8  # a peaked prior moves the tiny model's argmax almost everywhere
    assert followed >= 60  # of 70 tokens; the VLA's own logits still decide where the prior is unsure


def test_missing_finger_gap_is_rejected_by_a_model_with_a_prior(guided):
    _, ar, _ = guided
    ar.reset()
    with pytest.raises(InvalidObservationError, match="finger gap"):
        ar.step(random_observation(0))  # gripper_gap None


@pytest.mark.parametrize("seed", range(20))
def test_drafter_sd_under_the_prior_is_lossless(guided, prior, seed):
    vla, ar, drafter = guided
    rng = random.Random(seed)
    tree = DrafterTreeConfig(depth=rng.randint(1, 6), top_k=rng.randint(1, 4), total_tokens=12,
                             min_path_prob=rng.choice([0.0, 0.1]))
    dec = HybridDecoder(vla, DecoderConfig(method="drafter", drafter_tree=tree), drafter=drafter, state_prior=prior)
    obs = obs_with_gap(seed)
    ar.reset()
    _, ref = ar.step(obs)
    _, st = dec.step(obs)
    assert st.tokens == ref.tokens
    assert sum(st.tokens_per_forward) == 7


@pytest.mark.parametrize("seed", range(20))
def test_fused_tree_verification_under_the_prior_is_lossless(guided, prior, seed):
    """A Top-K retrieval tree around the prior-guided AR tokens, verified in the prefill forward."""
    from heisd_ros.core.engine import _StepDecode, embed_views
    from heisd_ros.core.verifier import TargetSession

    vla, ar, _ = guided
    obs = obs_with_gap(seed)
    ar.reset()
    _, ref = ar.step(obs)
    rng = random.Random(seed)
    first = vla.action_tokenizer.first_token_id
    drafts = [perturbed(ref.tokens, rng, first, p_keep=rng.choice([0.5, 1.0])) for _ in range(rng.randint(1, 5))]
    vocab = vla.action_tokenizer.vocab_size
    with torch.inference_mode():
        _, patches = embed_views(vla, [obs.images["agentview"]])
        prompt = vla.prompt_embeds(obs.instruction, vla.projector(patches[0]))[0]
        bias = prior.bias(obs.instruction, obs.ee_pos, obs.gripper_gap)
        dec = _StepDecode(TargetSession(vla.language_model, vla.action_head_weight(), logit_bias=bias), None, prompt)
        tree = sequence_tree(drafts, max_nodes=64)
        dec.forward(tree, StrictRule(), vocab)
        while dec.remaining:
            dec.forward(None, StrictRule(), vocab)
    assert tuple(dec.tokens) == ref.tokens
    node = -1  # is the greedy path's first six tokens a path of the tree?
    for tok in ref.tokens[:6]:
        node = next((c for c in tree.children(node) if tree.tokens[c] == tok), None)
        if node is None:
            break
    assert (dec.target.forwards == 1) == (node is not None)


def test_training_rejects_malformed_data():
    with pytest.raises(ValueError, match="action columns"):
        fit_state_prior({"t": [(np.zeros((5, 4)), np.full((5, 7), 300))]}, StatePriorConfig(steps=1))
    with pytest.raises(ValueError, match="states"):
        fit_state_prior({"t": [(np.zeros((5, 3)), np.zeros((5, 7)))]}, StatePriorConfig(steps=1))


def test_offline_greedy_decoding_follows_the_prior_like_the_engine(guided, prior):
    """train-drafter's relabelled targets and calibrate's live features come from `greedy_decode`;
    with a prior they must be the tokens the engine executes."""
    from heisd_ros.pipeline.training import Example, greedy_decode

    vla, ar, _ = guided
    examples, refs = [], []
    for seed in range(6):
        obs = obs_with_gap(seed)
        ar.reset()
        refs.append(ar.step(obs)[1].tokens)
        examples.append(Example([obs.images["agentview"]], obs.instruction, np.zeros(7, np.int64),
                                state=obs.ee_pos, gripper_gap=GAP))
    for batch_size, use_cache in ((1, False), (4, True)):
        tokens, _ = greedy_decode(vla, examples, batch_size=batch_size, use_cache=use_cache, state_prior=prior)
        assert [tuple(t) for t in tokens] == refs
