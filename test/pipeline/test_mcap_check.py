"""The sizes an MCAP file claims are checked against the file before rosbags allocates them."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from heisd_ros.core.errors import BagError
from heisd_ros.pipeline.bags import read_messages
from heisd_ros.pipeline.mcap_check import MAGIC, MAX_CHUNK_BYTES, OP_CHUNK, OP_CHUNK_INDEX, check_mcap
from heisd_ros.tools.make_bag import MakeBagConfig, make_bag


@pytest.fixture(scope="module")
def mcap_bag(tmp_path_factory) -> Path:
    bag = tmp_path_factory.mktemp("mcap") / "bag"
    make_bag(bag, MakeBagConfig(steps=2, storage="mcap", seed=6))
    return bag


def _records(raw: bytes) -> list[tuple[int, int, int]]:
    """(position, opcode, length) of every top-level record."""
    out, pos = [], len(MAGIC)
    while pos + 9 <= len(raw) - len(MAGIC):
        op, length = raw[pos], struct.unpack_from("<Q", raw, pos + 1)[0]
        out.append((pos, op, length))
        pos += 9 + length
    return out


def _damaged(bag: Path, tmp_path: Path, edit) -> Path:
    src = next(bag.glob("*.mcap"))
    raw = bytearray(src.read_bytes())
    edit(raw, _records(bytes(raw)))
    out = tmp_path / "damaged.mcap"
    out.write_bytes(bytes(raw))
    return out


def test_an_intact_bag_passes_and_reads(mcap_bag):
    check_mcap(next(mcap_bag.glob("*.mcap")))
    assert sum(1 for _ in read_messages(mcap_bag)) > 0


@pytest.mark.parametrize("what, edit, words", [
    ("a record's length past the file",
     lambda raw, recs: struct.pack_into("<Q", raw, recs[-2][0] + 1, 25_769_803_837), "the record at byte"),
    ("a chunk's decompressed size over the cap",
     lambda raw, recs: struct.pack_into("<Q", raw, next(p for p, op, _ in recs if op == OP_CHUNK) + 9 + 16,
                                        MAX_CHUNK_BYTES + 1), "decompressed size"),
    ("an indexed chunk past the file",
     lambda raw, recs: struct.pack_into("<Q", raw, next(p for p, op, _ in recs if op == OP_CHUNK_INDEX) + 9 + 24,
                                        1 << 40), "a chunk indexed at byte"),
])
def test_a_claimed_size_beyond_the_file_is_a_clear_error(mcap_bag, tmp_path, what, edit, words):
    damaged = _damaged(mcap_bag, tmp_path, edit)
    with pytest.raises(BagError, match=words) as info:
        check_mcap(damaged)
    assert str(damaged) in str(info.value), what


def test_a_file_that_is_not_mcap_is_left_to_the_reader(tmp_path):
    junk = tmp_path / "junk.mcap"
    junk.write_bytes(b"not an mcap file")
    check_mcap(junk)  # rosbags' own error names it when it is read
