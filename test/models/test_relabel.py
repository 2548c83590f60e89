"""Relabelling the expert's settled grasp dwell (`heisd train-vla --relabel-grasp-dwell`)."""

from __future__ import annotations

import numpy as np
import pytest

from heisd_ros.pipeline.features import training_actions
from heisd_ros.pipeline.episodes import DemoEpisode
from heisd_ros.models.relabel import relabel_grasp_dwell

OPEN, CLOSE = -1.0, 1.0


def _grasp_episode():
    """descend (2 steps) -> close and hold (8 steps; the fingers settle after 4) -> lift (2) ->
    release hold (3) -> retreat (1), with the expert's yaw correction inside the hold."""
    rows = [[0, 0, -0.5, 0, 0, 0, OPEN]] * 2
    rows += [[0, 0, 0, 0, 0, 0, CLOSE]] * 8
    rows[5] = [0, 0, 0, 0, 0, -0.07, CLOSE]  # a yaw correction does not end the dwell
    rows += [[0.1, 0, 1.0, 0, 0, 0, CLOSE]] * 2
    rows += [[0, 0, 0, 0, 0, 0, OPEN]] * 3
    rows += [[0, 0, 1.0, 0, 0, 0, OPEN]]
    gap = [0.08, 0.08, 0.08, 0.074, 0.066, 0.058, 0.053, 0.0531, 0.0531, 0.0531, 0.0531, 0.0531,
           0.0531, 0.0531, 0.06, 0.07]
    fingers = np.stack([np.array(gap) / 2, -np.array(gap) / 2], axis=1)
    return np.array(rows, dtype=np.float64), fingers


def test_settled_dwell_steps_take_the_first_lift_action_and_nothing_else_moves():
    actions, fingers = _grasp_episode()
    out, n = relabel_grasp_dwell(actions, fingers)
    settled = [7, 8, 9]  # finger gap changed < 0.5 mm since the step before (step 6 still moved 5 mm)
    assert n == len(settled)
    for t in range(len(actions)):
        if t in settled:
            assert np.array_equal(out[t], actions[10]), t
        else:
            assert np.array_equal(out[t], actions[t]), t
    assert not np.array_equal(out, actions) and actions[7, 2] == 0  # input untouched
    # the release hold (open, motionless, fingers static) is not a grasp dwell
    assert np.array_equal(out[12:15], actions[12:15])


def test_a_dwell_that_never_lifts_is_left_alone_and_shapes_are_checked():
    actions, fingers = _grasp_episode()
    cut = actions[:10]  # episode ends inside the hold
    out, n = relabel_grasp_dwell(cut, fingers[:10])
    assert n == 0 and np.array_equal(out, cut)
    with pytest.raises(ValueError, match="gripper_qpos"):
        relabel_grasp_dwell(actions, fingers[:5])


def test_training_actions_relabel_only_when_asked_and_when_fingers_are_recorded():
    actions, fingers = _grasp_episode()
    ep = DemoEpisode("d", "t", "t", 0, "src", actions, np.zeros((len(actions), 3)), {}, True, fingers)
    assert training_actions(ep, False) is actions
    assert not np.array_equal(training_actions(ep, True), actions)
    bag = DemoEpisode("d", "t", "t", 0, "src", actions, np.zeros((len(actions), 3)))
    assert training_actions(bag, True) is actions
