"""What every tool writes beside its results: atomic JSON files, the git revision, file digests,
and a progress bar on stderr. One home, so every report records its revision the same way."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from pathlib import Path


def git_revision() -> str:
    """The checkout's HEAD commit, or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def source_revision() -> str:
    """`git_revision()`, with "+dirty" when tracked files differ from it: the code that runs."""
    rev = git_revision()
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                             text=True, check=True, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.CalledProcessError):
        return rev
    return rev + "+dirty" if out.stdout.strip() else rev


def file_digest(name: str) -> str:
    """Content digest of a model/drafter directory (its .json/.safetensors/.pt files) or a file."""
    if not name:
        return "none"
    path = Path(name)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in (".json", ".safetensors", ".pt"))
    else:
        files = [path] if path.is_file() else []
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16] if files else "missing"


def cpu_model() -> str:
    """The processor's model name (from /proc/cpuinfo on Linux): step times are comparable within one
    machine only, so a run records what it ran on."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def write_json(path: str | Path, data: dict) -> None:
    """Write `data` as JSON through a temporary file, so a reader never sees half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(p)


def progress_bar(total: int, desc: str, enabled: bool = True, unit: str = "it"):
    """A tqdm bar on stderr counting `unit`s (silent when not enabled)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, mininterval=1.0)


def hash_file(path: str | Path, h=None):
    """`h` (a new sha256 by default) updated with the file's bytes, read in 4 MiB chunks."""
    h = h if h is not None else hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h
