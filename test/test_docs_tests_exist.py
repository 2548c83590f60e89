"""Every test the documentation names exists: a `test/<file>.py::<name>` reference (and the
`::<name>` references that follow it in the same line) points at a file and a test function in it,
so a renamed or removed test does not leave docs/reliability.md citing evidence that is gone."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
REFERENCE = re.compile(r"`(test/[\w/]+\.py)?::(\w+)(?:\[[^\]]*\])?`|`(test/[\w/]+\.py)`")


def cited_tests() -> list[tuple[str, str, str]]:
    """(doc, file, test name) of every cited test."""
    out = []
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            current = None
            for m in REFERENCE.finditer(line):
                file_with_name, name, bare_file = m.groups()
                if bare_file:
                    current = bare_file
                    out.append((doc.name, bare_file, ""))
                    continue
                current = file_with_name or current
                if current is not None:
                    out.append((doc.name, current, name))
    return out


def test_every_test_the_docs_name_exists() -> None:
    cited = cited_tests()
    assert len(cited) > 50  # docs/reliability.md alone cites more
    missing = []
    for doc, file, name in cited:
        path = REPO / file
        if not path.is_file():
            missing.append(f"{doc}: {file} (no such file)")
        elif name and not re.search(rf"^\s*(async )?def {name}\(", path.read_text(), re.M):
            missing.append(f"{doc}: {file}::{name}")
    assert not missing, "tests the docs cite that do not exist:\n" + "\n".join(missing)
