"""The one wait of the test suite: poll a condition until it holds or a deadline passes.

Tests wait for what they expect (a command, a log line, a state), never for a fixed time; an
"it does not happen" check waits as long as the positive case it is paired with."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(pred: Callable[[], bool], timeout_s: float, poll_s: float = 0.01) -> bool:
    """Whether `pred()` became true within `timeout_s` (checked once more at the deadline)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(poll_s)
    return bool(pred())
