"""Forwarding of the decoding core's Python warnings to a ROS logger.

The core logs through Python `logging` under `heisd_ros` (calibration, verify-skip state, database
reconnection); the node installs a `RosLogBridge` so those warnings reach /rosout.
"""

from __future__ import annotations

import logging
from typing import Any


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
            self._logger.error(text)
        else:
            self._logger.warning(text)
