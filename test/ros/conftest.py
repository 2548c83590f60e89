"""Shared fixtures of the node tests: the files of an untrained tiny policy, written in seconds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from node_rig import NodeRig

from heisd_ros.core.config import StoreConfig
from heisd_ros.store.schema import DemoPoint

TASK = "pick up the red bowl"


def random_demo_points(n: int, obs_dim: int, feat_dim: int, first_token: int, task: str = TASK) -> list:
    """`n` database points of one episode of `task` with random vectors and action tokens."""
    rng = np.random.default_rng(0)
    return [DemoPoint("unit", task, task, 0, k, rng.normal(size=obs_dim), rng.normal(size=feat_dim),
                      rng.normal(size=feat_dim), np.zeros(7), tuple(int(t) for t in rng.integers(first_token, first_token + 256, 7)),
                      rng.uniform(-0.1, 0.1, 3)) for k in range(n)]  # fmt: skip


@pytest.fixture(scope="module")
def ctx(request):
    """An rclpy context of the test module's own, on its DOMAIN_ID (modules run apart on the wire)."""
    import rclpy

    c = rclpy.Context()
    rclpy.init(context=c, domain_id=request.module.DOMAIN_ID)
    yield c
    rclpy.shutdown(context=c)


@pytest.fixture(scope="module")
def untrained_policy(tmp_path_factory):
    """model/ drafter/ db/ calibration.json of an untrained tiny policy. The calibration puts every
    step in retrieval mode with verify-skip off, so every step runs the language model."""
    import torch

    from heisd_ros.core.drafter import EagleDrafter
    from heisd_ros.models.loader import tiny_vla
    from heisd_ros.store import make_store

    root = tmp_path_factory.mktemp("policy")
    vla = tiny_vla(seed=0)
    vla.save_pretrained(root / "model")
    torch.manual_seed(0)
    EagleDrafter(vla.language_model.config).save(root / "drafter")
    with make_store(StoreConfig(backend="edge", path=str(root / "db")), 128, vla.hidden_size, create=True) as s:
        s.upsert(random_demo_points(6, 128, vla.hidden_size, vla.action_tokenizer.first_token_id))
    (root / "calibration.json").write_text(json.dumps({"fused_metric": {"tau": -1.0}, "verify_skip": {"enabled": False}}))
    return root


@pytest.fixture(scope="module")
def node_rig(request):
    """A NodeRig on the test module's DOMAIN_ID."""
    pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")
    r = NodeRig(request.module.DOMAIN_ID)
    yield r
    r.close()


@pytest.fixture(scope="module")
def node_rig_on():
    """node_rig_on(domain_id) -> a NodeRig on another domain (e.g. a policy_node subprocess's);
    closed with the module."""
    pytest.importorskip("heisd_ros.msg", reason="interfaces not built (make setup)")
    made = []

    def make(domain_id: int) -> NodeRig:
        made.append(NodeRig(domain_id))
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.fixture
def policy(rig):
    """The test module's `rig` with its node started (the scripted decoder), stopped after the test."""
    node = rig.start()
    yield node
    rig.stop()
