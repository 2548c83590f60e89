"""The helpers every tool writes its results with: atomic JSON, the git revision, file digests."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import threading
from pathlib import Path

import pytest

from heisd_ros.pipeline import outputs
from heisd_ros.pipeline.outputs import git_revision, hash_file, progress_bar, write_json


def test_write_json_creates_parents_and_round_trips(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "report.json"
    write_json(target, {"x": 1, "y": [1.5, None]})
    assert json.loads(target.read_text()) == {"x": 1, "y": [1.5, None]}
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]  # no temporary file left behind


def test_write_json_failure_leaves_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    write_json(target, {"version": 1})
    with pytest.raises(TypeError):
        write_json(target, {"version": 2, "bad": object()})  # not JSON: fails before the target is touched
    assert json.loads(target.read_text()) == {"version": 1}


def test_write_json_readers_see_the_old_content_or_the_new(tmp_path: Path) -> None:
    """A reader racing the writer never sees a partial file: every read parses to one version."""
    target = tmp_path / "report.json"
    payload = ["x" * 64] * 20_000  # about 1.3 MB, so a plain write would be seen half done
    write_json(target, {"version": 0, "payload": payload})
    seen: set[int] = set()
    stop = threading.Event()
    failures: list[str] = []

    def read() -> None:
        while not stop.is_set():
            text = target.read_text()
            try:
                seen.add(json.loads(text)["version"])
            except json.JSONDecodeError:
                failures.append(f"partial read of {len(text)} characters")
                return

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for version in range(1, 30):
            write_json(target, {"version": version, "payload": payload})
    finally:
        stop.set()
        reader.join()
    assert not failures
    assert seen <= set(range(30))
    assert json.loads(target.read_text())["version"] == 29


def test_git_revision_is_the_checkout_head() -> None:
    repo = Path(outputs.__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=repo).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("heisd_ros is not inside a git checkout here")
    rev = git_revision()
    assert re.fullmatch(r"[0-9a-f]{40}", rev) and rev == head


def test_git_revision_without_git_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(outputs.subprocess, "run", no_git)
    assert git_revision() == "unknown"


def test_hash_file_matches_sha256(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40_000  # spans several read chunks
    path = tmp_path / "blob.bin"
    path.write_bytes(data)
    assert hash_file(path).hexdigest() == hashlib.sha256(data).hexdigest()
    h = hashlib.sha256(b"prefix")
    assert hash_file(path, h) is h and h.hexdigest() == hashlib.sha256(b"prefix" + data).hexdigest()


def test_progress_bar_counts_in_its_unit_and_can_be_silent() -> None:
    bar = progress_bar(3, "test", unit="ep")
    bar.update(2)
    assert bar.n == 2 and bar.total == 3 and bar.unit == "ep"
    bar.close()
    assert progress_bar(3, "test", enabled=False).disable
