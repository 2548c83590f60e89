"""Inference watchdog of the policy node (ROS-free, no clocks of its own).

Budget = `factor` x control period. A step whose inference took longer, or an inference still
running past the budget, *trips* the watchdog: no command is published until `recovery_steps`
steps in a row have decoded within the budget. While tripped the node reports ERROR.

Why silence rather than a zero or "hold" command: a node whose timing guarantee is broken should
stop commanding motion altogether and leave the arm to its controller's own command timeout
(MoveIt Servo's `incoming_command_timeout`, a Franka/UR driver's watchdog), exactly as it does for
stale or invalid inputs. A synthetic zero command would still be a command from a node that is
known to be late.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class WatchdogState:
    tripped: bool = False
    ok_steps: int = 0
    """Steps within the budget since the last trip."""
    trips: int = 0
    hang_reported_s: float | None = None
    """Running time at which the current hang was last reported; None while none is reported."""


class Watchdog:
    """Thread-safe; `step` is called by the inference thread, `running` by the control timer."""

    def __init__(self) -> None:
        self.state = WatchdogState()
        self._lock = threading.Lock()

    @property
    def tripped(self) -> bool:
        return self.state.tripped

    def _trip(self) -> None:
        if not self.state.tripped:
            self.state.trips += 1
        self.state.tripped, self.state.ok_steps = True, 0

    def step(self, inference_s: float, budget_s: float, recovery_steps: int) -> tuple[bool, str]:
        """A finished step: (publish it?, why not / '' ). Ends the hang report."""
        with self._lock:
            st = self.state
            st.hang_reported_s = None
            if inference_s > budget_s:
                self._trip()
                return False, (f"watchdog: inference took {inference_s * 1e3:.0f} ms > budget "
                               f"{budget_s * 1e3:.0f} ms; commands withheld")  # fmt: skip
            if not st.tripped:
                return True, ""
            st.ok_steps += 1
            if st.ok_steps < recovery_steps:
                return False, (f"watchdog: {st.ok_steps}/{recovery_steps} steps within the {budget_s * 1e3:.0f} ms "
                               "budget; commands withheld until then")  # fmt: skip
            st.tripped = False
            return True, ""

    def running(self, running_s: float, budget_s: float, repeat_s: float) -> bool:
        """An inference still in progress: trips the watchdog once it overruns the budget. True when
        the hang is to be reported: the first time, then again every `repeat_s` of running time for
        as long as it lasts (a single report can fall in the log's throttle window and be lost)."""
        with self._lock:
            st = self.state
            if running_s <= budget_s:
                return False
            if st.hang_reported_s is not None and running_s - st.hang_reported_s < repeat_s:
                return False
            st.hang_reported_s = running_s
            self._trip()
            return True

    def finished(self) -> None:
        """The inference ended (with or without a result): a later hang is reported afresh."""
        with self._lock:
            self.state.hang_reported_s = None
