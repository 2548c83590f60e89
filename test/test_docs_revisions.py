"""Every git revision the documentation cites (a backquoted hex id of 7-40 digits in README.md,
docs/*.md and benchmarks/README.md) is a commit of this repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REVISION = re.compile(r"`([0-9a-f]{7,40})`")


def cited_revisions() -> dict[str, str]:
    """revision -> the first file citing it."""
    out: dict[str, str] = {}
    for path in [REPO / "README.md", REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for rev in REVISION.findall(path.read_text()):
            out.setdefault(rev, str(path.relative_to(REPO)))
    return out


def test_every_cited_revision_resolves() -> None:
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True, text=True)
    if shallow.returncode != 0:
        pytest.skip("not a git checkout")
    if shallow.stdout.strip() == "true":
        pytest.skip("a shallow clone holds only the newest commits")
    cited = cited_revisions()
    assert len(cited) > 20  # the history cites dozens
    missing = {rev: where for rev, where in cited.items()
               if subprocess.run(["git", "rev-parse", "-q", "--verify", f"{rev}^{{commit}}"], cwd=REPO,
                                 capture_output=True).returncode != 0}
    assert missing == {}, "revisions cited in the docs that this repository does not hold"
