"""Text and JSON files a user names, read only after their size is checked.

`json.loads(path.read_text())` reads the whole file first, whatever its size: a damaged file, a
weights file named where a point file belongs, or a device or pipe (whose size reads 0 and which
never ends) is read into memory until MemoryError, or swap, stops it. `read_json` and
`read_capped_bytes` refuse a file over `MAX_JSON_BYTES` with the caller's error type, naming the
file and both sizes, before reading it; the read itself stops one byte past the cap, so a file
that grows or lies about its size is refused the same way.

JSON text that does not decode, and JSON nested deeper than the parser's recursion limit (which
raised RecursionError past every caller's handler), are `json.JSONDecodeError`s (`parse_json`):
damaged JSON, which each caller already turns into its own error (or, for a file it may ignore,
a warning).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

MAX_JSON_BYTES = 64 << 20
"""Largest JSON, JSON Lines or YAML file read (64 MiB). What heisd reads this way is far smaller:
operating-point and calibration files, a model's config.json, dataset_statistics.json,
preprocessor and tokenizer configs, a sharded checkpoint's index and the database's metadata are
kilobytes, a tokenizer.json a few MiB (LLaMA-2's: 1.8 MB); a build-db manifest grows about 30 bytes per episode and a LeRobot episodes.jsonl about
150 (64 MiB is some 400,000 episodes). Parsed, a JSON file takes up to some 25 times its size in
Python objects (`[{}, {}, ...]`), so the cap also bounds that to under 2 GiB."""

ErrorType = Callable[[str], Exception]


def check_size(path: str | Path, error: ErrorType, limit: int = MAX_JSON_BYTES) -> None:
    """`error(message)` when `path` is over `limit` bytes: for a file a library reads whole after
    this. OSError (missing, unreadable) propagates."""
    size = Path(path).stat().st_size
    if size > limit:
        raise _too_big(error, Path(path), f"is {size} bytes", limit)


def read_capped_bytes(path: str | Path, error: ErrorType, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of `path`; `error(message)` when it is over `limit` bytes. OSError (missing,
    unreadable) propagates, for the caller's own message."""
    path = Path(path)
    with path.open("rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise _too_big(error, path, f"is {size} bytes", limit)
        raw = f.read(limit + 1)
    if len(raw) > limit:  # a file whose size did not say it (a device, a pipe, one still growing)
        raise _too_big(error, path, f"reads on past {limit} bytes (its size says {size})", limit)
    return raw


def read_capped_text(path: str | Path, error: ErrorType, limit: int = MAX_JSON_BYTES) -> str:
    """The UTF-8 text of `path`, read as `read_capped_bytes` reads; UnicodeDecodeError propagates."""
    return read_capped_bytes(path, error, limit).decode("utf-8")


def parse_json(raw: bytes | str) -> Any:
    """`json.loads(raw)`, with text that does not decode and nesting too deep to parse raised as
    json.JSONDecodeError (they were UnicodeDecodeError and RecursionError)."""
    try:
        return json.loads(raw)
    except UnicodeDecodeError as err:
        raise json.JSONDecodeError(f"not UTF-8 text ({err.reason} at byte {err.start})", "", 0) from err
    except RecursionError as err:
        raise json.JSONDecodeError("nested too deeply to parse", "", 0) from err


def read_json(path: str | Path, error: ErrorType, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in `path`: `read_capped_bytes` (`error(message)` over `limit`), then
    `parse_json`. OSError and json.JSONDecodeError propagate, for the caller's own message."""
    return parse_json(read_capped_bytes(path, error, limit))


def _too_big(error: ErrorType, path: Path, size: str, limit: int) -> Exception:
    return error(f"{path} {size}: a file read whole may have {limit} bytes at most (a damaged file, "
                 "or not the file meant)")
