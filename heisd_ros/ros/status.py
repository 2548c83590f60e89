"""What the policy node knows about its own steps: problems, throttled warnings, recent figures.

ROS-free. One `NodeStatus` is shared by the inference worker (steps, problems), the control timer
(dropped ticks, input problems) and the diagnostics timer (which takes a snapshot), under its own
lock. A *problem* is a step that produced no command; a *report* is anything worth telling the
operator. Both are logged at most once per `warn_throttle_s` per kind and shown on /diagnostics.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

from heisd_ros.ros.log_bridge import MAX_LINE_CHARS, clip

OK, WARN, ERROR = 0, 1, 2
"""DiagnosticStatus levels (the message holds them as one byte)."""


@dataclass(frozen=True)
class Published:
    """One published step, as the diagnostics summarise it."""

    t: float
    """Monotonic time of publication, s."""
    latency_s: float
    """Frame stamp -> command publication, s (node clock)."""
    decode_ms: float
    """Decoding time the decoder reported."""
    mode: str


@dataclass
class StatusSnapshot:
    """The counters since start-up, the steps of the recent horizon and the problems since the last
    snapshot (each problem is (level, message))."""

    recent: list[Published]
    problems: list[tuple[int, str]]
    modes: dict[str, int]
    rejected: dict[str, int]
    steps: int
    dropped_ticks: int
    clipped: int
    fallbacks: int
    last_error: str
    last_error_age_s: float


@dataclass
class _Counters:
    published: deque = field(default_factory=lambda: deque(maxlen=2000))
    modes: Counter = field(default_factory=Counter)
    steps: int = 0
    rejected: Counter = field(default_factory=Counter)
    """Steps without a command, by kind of problem."""
    dropped_ticks: int = 0
    clipped: int = 0
    fallbacks: int = 0
    """Steps decoded without retrieval (database fault, task not in the database)."""


class NodeStatus:
    """Thread-safe record of the node's steps and problems; logs through `logger` (a ROS or Python
    logger: `warning` and `error`), at most once per `throttle_s()` seconds per kind."""

    def __init__(self, logger: Any, throttle_s: Callable[[], float]) -> None:
        self._logger = logger
        self._throttle_s = throttle_s
        self._lock = threading.Lock()
        self._counts = _Counters()
        self._problems: list[tuple[int, str]] = []  # since the last snapshot
        self._last_error = ("", 0.0)
        self._warned: dict[str, float] = {}

    def problem(self, kind: str, level: int, message: str) -> None:
        """A step that produced no command: counted by kind, logged (throttled), shown on /diagnostics."""
        self.report(kind, level, message, rejected=True)

    def report(self, kind: str, level: int, message: str, rejected: bool = False, throttled: bool = True) -> None:
        """Log + diagnostic; `rejected` counts it as a step without a command. `throttled=False`
        logs every call, for a caller that paces its reports itself (the watchdog's hang report)."""
        now = time.monotonic()
        message = clip(message, MAX_LINE_CHARS - 20)  # room for "no command: "
        with self._lock:
            if rejected:
                self._counts.rejected[kind] += 1
            self._problems.append((level, message))
            self._last_error = (message, now)
            log = not throttled or now - self._warned.get(kind, -1e9) >= self._throttle_s()
            if log:
                self._warned[kind] = now
        text = f"no command: {message}" if rejected else message
        # rclpy pins one severity per call site, hence two calls
        if log and level == ERROR:
            self._logger.error(text)
        elif log:
            self._logger.warning(text)

    def dropped_tick(self) -> None:
        """A control tick found the worker still busy (the tick is dropped, never queued)."""
        with self._lock:
            self._counts.dropped_ticks += 1

    def fallback(self, why: str) -> None:
        """A step decoded without retrieval: published, but the operator must know."""
        with self._lock:
            self._counts.fallbacks += 1
        self.report("fallback", WARN, f"decoded without retrieval: {why}")

    def published(self, latency_s: float, decode_ms: float, mode: str, clipped: bool) -> None:
        with self._lock:
            c = self._counts
            c.steps += 1
            c.modes[mode] += 1
            c.clipped += int(clipped)
            c.published.append(Published(time.monotonic(), latency_s, decode_ms, mode))

    def counts(self) -> dict[str, int]:
        """Steps, dropped ticks, clipped commands and fallback steps since start-up."""
        with self._lock:
            c = self._counts
            return {"steps": c.steps, "dropped_ticks": c.dropped_ticks, "clipped": c.clipped, "fallbacks": c.fallbacks}

    def snapshot(self, horizon_s: float) -> StatusSnapshot:
        """The figures for one diagnostics message; the problems are handed over (and cleared)."""
        now = time.monotonic()
        with self._lock:
            c = self._counts
            problems, self._problems = self._problems, []
            message, t = self._last_error
            return StatusSnapshot(
                recent=[p for p in c.published if now - p.t <= horizon_s], problems=problems,
                modes=dict(c.modes), rejected=dict(c.rejected), steps=c.steps, dropped_ticks=c.dropped_ticks,
                clipped=c.clipped, fallbacks=c.fallbacks, last_error=message, last_error_age_s=now - t,
            )  # fmt: skip
