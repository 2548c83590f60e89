"""Training labels for the steps an expert spends waiting on a timer (`heisd train-vla --relabel-grasp-dwell`).

The scripted expert closes the gripper and then holds still for `ExpertConfig.close_steps` (12)
steps before it lifts. The fingers settle on the object after about 6 of them, so the last ~5
steps of every grasp show the same closed, motionless scene labelled "hold", and only the first
lift step (still the same scene: the hand has not moved yet) says "lift". A policy that reads one
image cannot see the timer: in that scene it predicts "hold", the scene does not change, and it
holds forever (benchmarks/NOTES.md 30-31: closed-loop episodes that reached the object froze
there).

`relabel_grasp_dwell` gives those settled dwell steps the action the expert takes when its timer
runs out (the first step of the lift), which is what a state-based expert would command there.
The executed trajectory is unchanged; only the labels of a few steps per episode move.
"""

from __future__ import annotations

import numpy as np

from heisd_ros.core.types import GRIPPER_INDEX

SETTLED_M = 5e-4
"""Finger-gap change per step below which the fingers count as settled (they close ~5-7 mm/step)."""


def relabel_grasp_dwell(
    actions: np.ndarray, gripper_qpos: np.ndarray, settled_m: float = SETTLED_M
) -> tuple[np.ndarray, int]:
    """Raw actions [T, 7] and finger joints [T, 2] -> (actions with every settled grasp-dwell step
    relabelled as the first lift step, number of steps relabelled).

    A grasp dwell is a run of close commands without translation (the three position actions 0;
    the expert may still correct its yaw) right after an open -> close switch, ending in a close
    command that moves the hand (the lift). Within it, a step whose finger gap changed by less
    than `settled_m` since the previous step is settled."""
    a = np.array(actions, dtype=np.float64, copy=True)
    fingers = np.asarray(gripper_qpos, dtype=np.float64)
    if fingers.shape != (len(a), 2):
        raise ValueError(f"gripper_qpos must be [T, 2] for {len(a)} actions, got {fingers.shape}")
    gap = fingers[:, 0] - fingers[:, 1]
    closing = a[:, GRIPPER_INDEX] > 0
    still = np.all(np.abs(a[:, :3]) < 1e-9, axis=1)
    n = 0
    t = 1
    while t < len(a):
        if not (closing[t] and still[t] and not closing[t - 1]):
            t += 1
            continue
        end = t
        while end + 1 < len(a) and closing[end + 1] and still[end + 1]:
            end += 1
        lift = end + 1
        if lift < len(a) and closing[lift]:  # the dwell ends in a moving close command
            for k in range(t + 1, lift):
                if abs(gap[k] - gap[k - 1]) < settled_m:
                    a[k] = a[lift]
                    n += 1
        t = lift
    return a, n
