"""Gripper debounce (`DecoderConfig.gripper_hold_steps`): a change of the executed open/close
command needs that many consecutive steps asking for it; tokens are untouched."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.core.config import DecoderConfig
from heisd_ros.core.engine import HybridDecoder
from heisd_ros.core.errors import ConfigError
from heisd_ros.core.gripper import GripperDebounce
from heisd_ros.core.types import GRIPPER_INDEX, gripper_command
from heisd_ros.pipeline.synthetic_demos import random_observation


def reference(wanted: list[float], hold: int) -> list[float]:
    state, run, out = -1.0, 0, []
    for w in wanted:
        run = run + 1 if w != state else 0
        if w != state and run >= hold:
            state, run = w, 0
        out.append(state)
    return out


def test_a_flip_needs_hold_steps_in_a_row() -> None:
    d = GripperDebounce(3)
    asked = [-1, 1, -1, 1, 1, 1, 1, -1, 1, -1, -1, -1]
    got = [d(v)[0] for v in asked]
    assert got == [-1, -1, -1, -1, -1, 1, 1, 1, 1, 1, 1, -1]
    assert got == reference([float(a) for a in asked], 3)
    d.reset()
    assert d(1.0) == (-1.0, True)  # an episode starts open
    off = GripperDebounce(0)
    assert [off(v)[0] for v in asked] == asked


def test_engine_executes_the_debounced_command_and_keeps_the_tokens(vla) -> None:
    plain = HybridDecoder(vla, DecoderConfig(method="ar"))
    held = HybridDecoder(vla, DecoderConfig(method="ar", gripper_hold_steps=2))
    observations = [random_observation(s) for s in range(40)]  # one instruction: one episode
    wanted, executed, flags = [], [], []
    for obs in observations:
        a, st_a = plain.step(obs)
        b, st_b = held.step(obs)
        assert st_a.tokens == st_b.tokens
        np.testing.assert_array_equal(a[:GRIPPER_INDEX], b[:GRIPPER_INDEX])
        wanted.append(gripper_command(a[GRIPPER_INDEX]))
        executed.append(float(b[GRIPPER_INDEX]))
        flags.append(st_b.gripper_held)
        assert held.gripper.state == executed[-1]
    assert len(set(wanted)) == 2, "the random observations should ask for both gripper states"
    assert executed == reference(wanted, 2)
    assert flags == [e != w for e, w in zip(executed, wanted)]
    assert any(flags)


def test_hold_steps_are_validated() -> None:
    with pytest.raises(ConfigError):
        DecoderConfig(gripper_hold_steps=-1)
