"""Opening an `heisd-libero eval-libero` log in any of the forms it is kept in.

A run writes plain `.jsonl` (appended episode by episode, so a killed run keeps what it finished);
a committed log is compressed: `.jsonl.xz` for the current LIBERO report (xz stores the per-step
records in about 60 % of gzip's bytes, and the repository's size is capped), `.jsonl.gz` for the
older committed logs. Every reader of a log opens it here so all three forms read the same.
"""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path
from typing import IO

READ_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, UnicodeDecodeError, lzma.LZMAError)
"""What opening or reading a damaged or mislabelled log raises (gzip.BadGzipFile is an OSError)."""


def open_log(path: str | Path) -> IO[str]:
    """A text stream over the log at `path`, decompressed by its suffix (.xz, .gz, or none)."""
    p = Path(path)
    if p.suffix == ".xz":
        return lzma.open(p, "rt", encoding="utf-8")
    if p.suffix == ".gz":
        return gzip.open(p, "rt", encoding="utf-8")
    return p.open("r", encoding="utf-8")


def read_log_text(path: str | Path) -> str:
    """The whole log at `path` as text."""
    with open_log(path) as f:
        return f.read()
