"""Command-line argument parsing shared by the tools."""

from __future__ import annotations

from heisd_ros.core.errors import ConfigError


def parse_range(text: str) -> tuple[int, ...]:
    """'0-9' / '0,3,5-7' -> (0, 1, ..., 9) / (0, 3, 5, 6, 7); duplicates dropped, order kept."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError as err:
        raise ConfigError(f"bad index range {text!r}; use e.g. 0-9 or 0,2,5-7") from err
    return tuple(dict.fromkeys(out))


def parse_tasks(text: str | None) -> tuple[int, ...] | None:
    """A task range, or None (all tasks) for an empty or missing flag."""
    return parse_range(text) if text else None
