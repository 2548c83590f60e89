"""The index ranges every tool's --tasks / --init-states flags take."""

from __future__ import annotations

import pytest

from heisd_ros.core.errors import ConfigError
from heisd_ros.tools.args import parse_range, parse_tasks


def test_parse_range_expands_lists_and_spans_in_order() -> None:
    assert parse_range("0-3") == (0, 1, 2, 3)
    assert parse_range("7") == (7,)
    assert parse_range("5-6,0,3") == (5, 6, 0, 3)
    assert parse_range("0,3,5-6,3") == (0, 3, 5, 6)  # duplicates dropped, first place kept


@pytest.mark.parametrize("text", ["a-b", "", "0,,2", "3-x", "0-2-4"])
def test_parse_range_refuses_a_bad_range(text: str) -> None:
    with pytest.raises(ConfigError, match="bad index range"):
        parse_range(text)


def test_parse_tasks_is_none_for_all_tasks() -> None:
    assert parse_tasks(None) is None
    assert parse_tasks("") is None
    assert parse_tasks("2-4") == (2, 3, 4)
    with pytest.raises(ConfigError):
        parse_tasks("two")
