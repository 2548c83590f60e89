"""Gripper command debounce: the executed open/close state changes only after the policy asked
for the change on `hold_steps` consecutive control steps.

Why: a VLA whose gripper token flips between open and close from one step to the next (the mini
VLA off its demonstrations: 16-115 flips per failed LIBERO episode, against 2 in every demo,
benchmarks/NOTES.md entry 28) can never keep a grasp. A real gripper also needs several control
steps to close. 0 turns it off (OpenVLA executes every step's own command).
"""

from __future__ import annotations

from heisd_ros.core.types import gripper_command


class GripperDebounce:
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
        if self.hold_steps == 0 or wanted == self.state:
            self.state, self.votes = wanted, 0
            return wanted, False
        self.votes += 1
        if self.votes >= self.hold_steps:
            self.state, self.votes = wanted, 0
            return wanted, False
        return self.state, True
