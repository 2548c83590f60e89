"""benchmarks/ holds maintained scripts and current reports only: every tracked file there is named
in benchmarks/README.md's tables, so a report nobody maintains (an old run, one side of an A/B) shows
up as a failure rather than as clutter."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def tracked_benchmark_files() -> list[str]:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "benchmarks"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [line.removeprefix("benchmarks/") for line in out.stdout.splitlines() if line != "benchmarks/README.md"]


def test_every_file_in_benchmarks_is_named_in_its_readme() -> None:
    readme = (REPO / "benchmarks" / "README.md").read_text()
    files = tracked_benchmark_files()
    assert len(files) > 10  # the scripts and the LIBERO-Object report at least
    unnamed = [f for f in files if f"`{f}`" not in readme and ("/" in f or f"`{Path(f).name}`" not in readme)]
    assert unnamed == [], "files in benchmarks/ that its README does not describe"
