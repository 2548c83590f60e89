"""The policy node's loggers: forwarding of the decoding core's Python warnings to ROS, and a ROS
logger that stays quiet once its context has shut down.

The core logs through Python `logging` under `heisd_ros` (calibration, verify-skip state, database
reconnection); the node installs a `RosLogBridge` so those warnings reach /rosout.
"""

from __future__ import annotations

import logging
from typing import Any

MAX_LINE_CHARS = 1000
"""Longest log line or diagnostic message the node writes: a hostile input's text is quoted, never
copied whole (a 200 kB line per bad frame would flood /rosout and the disk)."""


def clip(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    tail = f"... ({len(text) - limit + 40} more characters)"
    return text[: limit - len(tail)] + tail


class GuardedLogger:
    """A node's ROS logger (`info`, `warning`, `error`) that drops its lines once `context` is shut
    down: a node's logger publishes to /rosout, and between the context's shutdown and the node's
    destruction every line would fail with "Failed to publish log message to rosout"."""

    def __init__(self, ros_logger: Any, context: Any) -> None:
        self._logger, self._context = ros_logger, context

    # rclpy pins one severity per call site: one call per method
    def info(self, text: str) -> None:
        if self._context.ok():
            self._logger.info(clip(text))

    def warning(self, text: str) -> None:
        if self._context.ok():
            self._logger.warning(clip(text))

    def error(self, text: str) -> None:
        if self._context.ok():
            self._logger.error(clip(text))


class RosLogBridge(logging.Handler):
    """A logging handler passing WARNING and above to `ros_logger` (its `warning` and `error`)."""

    def __init__(self, ros_logger: Any) -> None:
        super().__init__(level=logging.WARNING)
        self._logger = ros_logger

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = f"{record.name}: {record.getMessage()}"
        except (TypeError, ValueError):  # a malformed format string must not break the caller
            text = f"{record.name}: {record.msg!r}"
        if record.levelno >= logging.ERROR:
            self._logger.error(clip(text))
        else:
            self._logger.warning(clip(text))
