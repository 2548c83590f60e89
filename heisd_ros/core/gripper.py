"""Gripper command debounce: the executed open/close state changes only after the policy asked
for the change on `hold_steps` consecutive control steps.

Why: a VLA whose gripper token flips between open and close from one step to the next can never
keep a grasp, and a real gripper needs several control steps to close. 0 turns it off (OpenVLA
executes every step's own command).
"""

from __future__ import annotations

import numpy as np

from heisd_ros.core.types import gripper_command


PANDA_FINGER_JOINTS = ("panda_finger_joint1", "panda_finger_joint2")
"""The finger joints of a Franka hand in joint_states (and in the bags `heisd-libero gen-demos` exports)."""


def finger_gap(finger_positions) -> float:
    """Finger joint positions (m, two prismatic fingers) -> the opening between the fingers (m).

    Absolute values, so both conventions give the gap: robosuite / LIBERO report the Panda's fingers
    as (+q, -q), a real Panda's joint_states as (+q, +q)."""
    q = np.asarray(finger_positions, dtype=np.float64).reshape(-1)
    if q.shape != (2,) or not np.all(np.isfinite(q)):
        raise ValueError(f"expected two finite finger positions, got {finger_positions!r}")
    return float(np.abs(q).sum())


class GripperDebounce:
    """The executed gripper command (+1 close, -1 open), changed after `hold_steps` asks in a row."""

    def __init__(self, hold_steps: int, initial: float = -1.0) -> None:
        if hold_steps < 0:
            raise ValueError("hold_steps must be >= 0")
        self.hold_steps = hold_steps
        self.initial = initial
        self.reset()

    def reset(self) -> None:
        self.state = self.initial  # LIBERO and the demos start with the gripper open
        self.votes = 0

    def __call__(self, value: float) -> tuple[float, bool]:
        """(executed command +1 close / -1 open, whether the policy's own command was held back)."""
        wanted = gripper_command(value)
        held = self.hold_steps > 0 and wanted != self.state and self.votes + 1 < self.hold_steps
        if held:
            self.votes += 1
            executed = self.state
        else:
            self.votes = 0
            executed = wanted
        self.state = executed
        return executed, held
