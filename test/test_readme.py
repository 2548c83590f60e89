"""The README is the front page: short enough to read in one sitting (what a figure means and how it was
measured lives in docs/ and benchmarks/)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 120


def test_the_readme_stays_under_its_length() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES}): move detail into docs/"
