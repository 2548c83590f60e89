"""The test suite's one fake decoder implements the Decoder protocol the node, replay and the
evaluation are typed against, as the real HybridDecoder does; no other test decoder exists."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
from fake_decoder import FakeDecoder

from heisd_ros.core.model_api import Decoder, DecoderInputs
from heisd_ros.core.types import Observation

TESTS = Path(__file__).resolve().parent


def test_the_fake_and_the_engine_implement_the_protocol():
    from heisd_ros.core.config import DecoderConfig
    from heisd_ros.core.engine import HybridDecoder
    from heisd_ros.models.loader import tiny_vla

    fake = FakeDecoder(modes=("retrieval", "drafter"), forwards=2, ms_per_forward=3.0, known_tasks=["t"])
    assert isinstance(fake, Decoder) and isinstance(HybridDecoder(tiny_vla(seed=0), DecoderConfig(method="ar")), Decoder)
    assert isinstance(fake.inputs, DecoderInputs) and fake.inputs.views == ("agentview", "wrist")
    obs = Observation({v: np.zeros((8, 8, 3), np.uint8) for v in ("agentview", "wrist")}, "t", np.array([0.1, 0.2, 0.3]))
    fake.reset("t")
    action, first = fake.step(obs)
    _, second = fake.step(obs)
    np.testing.assert_allclose(action, [0.1, 0.2, 0.3, 0.1, 0.2, 0.3, 1.0])
    assert (first.mode, second.mode, first.tokens_per_forward, first.latency_ms["total"]) == ("drafter", "retrieval", [4, 3], 6.0)
    assert fake.known_tasks() == ["t"] and fake.reset_steps == [0] and fake.health() == (True, "ok")


def test_no_other_decoder_class_in_the_tests():
    """A class with a `step` method and a `reset` that takes an instruction is a decoder (an env's
    reset takes an init state); only fake_decoder.py may define one."""
    found = []
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
                reset = methods.get("reset")
                if "step" in methods and reset is not None and \
                        any(a.arg == "instruction" for a in reset.args.args + reset.args.kwonlyargs):
                    found.append(f"{path.relative_to(TESTS)}:{node.name}")
    assert found == ["fake_decoder.py:FakeDecoder"]
