"""The action convention check: what it maps, what it refuses and what each refusal names."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.core.errors import ConfigError
from heisd_ros.pipeline.action_convention import ActionConvention, DemoDataError

T = 20


def deltas(seed: int, grip: np.ndarray | None = None) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = np.where(np.arange(T) < T // 2, -1.0, 1.0) if grip is None else grip
    return np.concatenate([0.01 * rng.normal(size=(T, 3)), 0.02 * rng.normal(size=(T, 3)), g[:, None]], axis=1)


def positions(actions: np.ndarray) -> np.ndarray:
    return np.array([0.5, 0.0, 0.3]) + np.cumsum(actions[:, :3], axis=0)


def source(n: int = 4, **kw) -> list:
    return [(f"ep{i}", a, positions(a)) for i, a in ((i, deltas(i, **kw)) for i in range(n))]


def test_to_policy_maps_the_declared_gripper_range_and_sign() -> None:
    raw = deltas(0, grip=np.where(np.arange(T) < T // 2, 1.0, 0.0))  # 1 open, 0 closed
    out = ActionConvention(gripper_open_positive=True, gripper_range=(0.0, 1.0)).to_policy(raw, "x")
    assert out[: T // 2, 6].tolist() == [-1.0] * (T // 2) and out[T // 2 :, 6].tolist() == [1.0] * (T // 2)
    np.testing.assert_array_equal(out[:, :6], raw[:, :6])
    width = ActionConvention(gripper_range=(0.0, 0.08)).to_policy(np.array([[0] * 6 + [0.02]], float), "x")
    assert width[0, 6] == pytest.approx(-0.5)
    np.testing.assert_array_equal(ActionConvention().to_policy(deltas(1), "x"), deltas(1))


@pytest.mark.parametrize("actions, match", [
    (np.zeros((3, 6)), r"ep: actions have 6 dimensions; heisd needs 7: dX, dY, dZ, drX, drY, drZ, gripper"),
    (np.zeros((3, 14)), "14 dimensions"),
    (np.array([[0, 0, np.nan, 0, np.inf, 0, 1.0]]), r"non-finite actions in \['dZ', 'drY'\]"),
    (np.array([[0] * 6 + [2.0]], float),
     r"gripper values span \[2, 2\], outside the declared range \[-1, 1\]; declare the source's range with "
     r"--gripper-range"),
])
def test_to_policy_refuses_what_cannot_be_the_convention(actions, match) -> None:
    with pytest.raises(DemoDataError, match=match):
        ActionConvention().to_policy(actions, "ep")


def test_declared_range_must_be_ordered() -> None:
    with pytest.raises(ConfigError, match="LO < HI"):
        ActionConvention(gripper_range=(1.0, 0.0))


def test_dataset_check_passes_deltas_and_refuses_a_flipped_sign() -> None:
    ActionConvention().check_dataset(source())
    flipped = [(n, a * np.r_[np.ones(6), -1.0], p) for n, a, p in source()]
    with pytest.raises(DemoDataError, match=r"4 of 4 episodes start with the gripper closed.*--gripper-open-positive"):
        ActionConvention().check_dataset(flipped)
    ActionConvention(trust_actions=True).check_dataset(flipped)  # episodes that really start closed
    # one episode starting closed (it began holding the object) is no sign of a flipped convention
    ActionConvention().check_dataset(flipped[:1] + source()[1:])


def test_dataset_check_refuses_a_01_gripper_read_as_minus_1_plus_1() -> None:
    zero_one = source(grip=np.where(np.arange(T) < T // 2, 0.0, 1.0))
    with pytest.raises(DemoDataError, match=r"sit at 0.*--gripper-range 0,1"):
        ActionConvention().check_dataset(zero_one)
    # a declared range maps the values first and is trusted
    mapped = [(n, ActionConvention(gripper_range=(0.0, 1.0)).to_policy(a, n), p) for n, a, p in zero_one]
    ActionConvention(gripper_range=(0.0, 1.0)).check_dataset(mapped)


def test_dataset_check_refuses_absolute_position_targets() -> None:
    absolute = [(n, np.concatenate([p, a[:, 3:]], axis=1), p) for n, a, p in source()]
    with pytest.raises(DemoDataError, match="look like absolute position targets"):
        ActionConvention().check_dataset(absolute)


def _stats(actions: np.ndarray):
    from heisd_ros.core.action_tokenizer import NormStats

    return NormStats.fit(actions)


@pytest.mark.parametrize("scale, offset, match", [
    (10.0, 0.0, r"dX spans .* \d\.\d times as wide"),  # a twist in m/s, not divided by a 10 Hz rate
    (0.001, 0.0, r"dX spans .* 0\.\d% of it"),
    (1.0, 0.5, r"dX spans .*centred at 0\.\d+, outside it"),
    (1.0, 0.07, r"dX spans .*\d+% of the steps fall outside it"),
])
def test_model_check_refuses_another_scale(scale, offset, match) -> None:
    train = np.concatenate([a for _, a, _ in source(8)])
    s = _stats(train)
    other = train.copy()
    other[:, 0] = other[:, 0] * scale + offset
    with pytest.raises(DemoDataError, match="do not fit the model's action statistics.*" + match):
        ActionConvention().check_fits_model(other, s.q01, s.q99, s.mask, "demos")
    ActionConvention(trust_actions=True).check_fits_model(other, s.q01, s.q99, s.mask, "demos")


def test_model_check_passes_another_operators_data_and_constant_dimensions() -> None:
    s = _stats(np.concatenate([a for _, a, _ in source(8)]))
    other = np.concatenate([deltas(100 + i) for i in range(4)]) * 1.5
    other[:, 3:6] = 0.0  # a teleoperation without rotation
    other[:, 6] = np.sign(other[:, 6])
    ActionConvention().check_fits_model(other, s.q01, s.q99, s.mask, "demos")
