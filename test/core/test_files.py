"""Files read whole are size-checked first: over MAX_JSON_BYTES is the caller's error naming the
file, never a read of whatever size the file has; damaged JSON is always a JSONDecodeError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from heisd_ros.core.errors import CalibrationError, ModelLoadError
from heisd_ros.core.files import MAX_JSON_BYTES, check_size, read_capped_text, read_json


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk space (zeros, never written)."""
    with path.open("wb") as f:
        f.truncate(size)
    return path


@pytest.mark.parametrize("error", [ModelLoadError, CalibrationError])
def test_a_file_over_the_cap_is_the_callers_error_naming_it_and_both_sizes(tmp_path, error):
    big = sparse(tmp_path / "point.json", MAX_JSON_BYTES + 1)
    for read in (read_json, read_capped_text, check_size):
        with pytest.raises(error) as info:
            read(big, error)
        assert str(big) in str(info.value)
        assert f"{MAX_JSON_BYTES + 1} bytes" in str(info.value) and str(MAX_JSON_BYTES) in str(info.value)


def test_a_file_at_the_cap_is_read_and_one_byte_more_is_not(tmp_path):
    path = tmp_path / "ok.json"
    path.write_text('{"a": [1, 2]}')
    assert read_json(path, ModelLoadError, limit=13) == {"a": [1, 2]}
    with pytest.raises(ModelLoadError, match="is 13 bytes"):
        read_json(path, ModelLoadError, limit=12)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_a_file_whose_size_does_not_say_it_is_cut_at_the_cap():
    """/dev/zero's size reads 0 and it never ends: the read stops one byte past the cap."""
    with pytest.raises(ModelLoadError, match="/dev/zero reads on past 4096 bytes"):
        read_json("/dev/zero", ModelLoadError, limit=4096)


def test_missing_files_raise_oserror_for_the_callers_message(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "none.json", ModelLoadError)


@pytest.mark.parametrize("raw, words", [
    (b'{"a": "\xff"}', "not UTF-8"),
    (b"[" * 200_000, "nested too deeply"),  # RecursionError from the parser before
])
def test_damaged_json_is_a_decode_error(tmp_path, raw, words):
    path = tmp_path / "damaged.json"
    path.write_bytes(raw)
    with pytest.raises(json.JSONDecodeError, match=words):
        read_json(path, ModelLoadError)


@settings(max_examples=60, deadline=None)
@given(raw=st.one_of(st.binary(max_size=64), st.text(max_size=64).map(str.encode),
                     st.integers(0, 300_000).map(lambda n: b"{" * n + b'"a":' + b"[" * n)))
@example(raw=b"[" * 100_000)
@example(raw=b'"\xc3"')
def test_any_content_reads_or_is_a_decode_error(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("any") / "f.json"
    path.write_bytes(raw)
    try:
        read_json(path, ModelLoadError)
    except json.JSONDecodeError:
        pass
