"""Sizes an MCAP file claims, checked against the file before a reader trusts them.

rosbags reads an MCAP record by the length in its header and a chunk by the sizes its record and
the summary's chunk index give, allocating what they say first: one flipped byte in a length makes
a read of gigabytes (MemoryError, or a machine with swap thrashing first). `check_mcap` walks the
file's records, reading only their headers and the few fields that size a later read, and refuses
every length, offset or size beyond the file (or, for a chunk's decompressed size, beyond
`MAX_CHUNK_BYTES`) with a BagError naming the file. It reads a handful of bytes per record: a
chunk holds many messages, so a bag of gigabytes has a few thousand records.

Record layout (MCAP spec): magic (8 bytes), then records of opcode (u8), length (u64 LE) and body,
ending with the footer record (opcode 0x02) and the magic again.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from heisd_ros.core.errors import BagError

MAGIC = b"\x89MCAP0\r\n"
MAX_CHUNK_BYTES = 1 << 30
"""Largest decompressed chunk accepted (1 GiB). Writers chunk a few MiB (rosbag2's default
768 KiB); a larger claim is damage, and honouring it would allocate that much."""
OP_FOOTER, OP_CHUNK, OP_CHUNK_INDEX = 0x02, 0x06, 0x08

_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class _Body:
    """The fields of one record body, read in order from the file, never past the body's end."""

    def __init__(self, f: BinaryIO, path: Path, start: int, length: int) -> None:
        self.f, self.path, self.end = f, path, start + length
        f.seek(start)

    def take(self, n: int) -> bytes:
        if self.f.tell() + n > self.end:
            raise BagError(f"bag file {self.path}: a record's field at byte {self.f.tell()} runs past its record")
        return self.f.read(n)

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def u64(self) -> int:
        return _U64.unpack(self.take(8))[0]

    def skip(self, n: int) -> None:
        self.take_bounded(n)
        self.f.seek(n, 1)

    def take_bounded(self, n: int) -> None:
        if self.f.tell() + n > self.end:
            raise BagError(f"bag file {self.path}: a field at byte {self.f.tell()} claims {n} bytes, "
                           f"past its record's end at {self.end}")


def _too_big(path: Path, what: str, value: int, limit: int) -> BagError:
    return BagError(f"bag file {path}: {what} is {value} bytes, more than {limit} (a damaged file)")


def _check_chunk(body: _Body, path: Path) -> None:
    body.skip(16)  # message start and end time
    uncompressed = body.u64()
    body.skip(4)  # crc
    compression = body.take(body.u32())
    records = body.u64()
    body.take_bounded(records)
    if uncompressed > MAX_CHUNK_BYTES:
        raise _too_big(path, "a chunk's decompressed size", uncompressed, MAX_CHUNK_BYTES)
    if not compression and uncompressed != records:
        raise BagError(f"bag file {path}: an uncompressed chunk of {records} bytes claims {uncompressed}")


def _check_chunk_index(body: _Body, path: Path, file_size: int) -> None:
    body.skip(16)  # message start and end time
    start, length = body.u64(), body.u64()
    if start + length > file_size:
        raise _too_big(path, f"a chunk indexed at byte {start}", length, file_size - min(start, file_size))
    offsets = body.u32()
    if offsets % 10:
        raise BagError(f"bag file {path}: a chunk index's offset map of {offsets} bytes is not whole entries")
    for _ in range(offsets // 10):
        entry = body.take(10)
        offset = _U64.unpack_from(entry, 2)[0]
        if offset >= file_size:
            raise _too_big(path, "a message index offset", offset, file_size)
    index_length = body.u64()
    if index_length > file_size:
        raise _too_big(path, "a chunk's message index", index_length, file_size)
    body.take(body.u32())  # compression
    compressed, uncompressed = body.u64(), body.u64()
    if compressed > length:
        raise _too_big(path, "an indexed chunk's compressed size", compressed, length)
    if uncompressed > MAX_CHUNK_BYTES:
        raise _too_big(path, "an indexed chunk's decompressed size", uncompressed, MAX_CHUNK_BYTES)


def check_mcap(path: str | Path) -> None:
    """Raise BagError naming `path` where a size or offset the file claims exceeds the file (or the
    chunk cap). A file that is not MCAP at all is left to the reader's own error."""
    path = Path(path)
    file_size = path.stat().st_size
    with path.open("rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            return
        pos = len(MAGIC)
        end = file_size - len(MAGIC)  # the closing magic
        while pos + 9 <= end:
            f.seek(pos)
            header = f.read(9)
            op, length = header[0], _U64.unpack_from(header, 1)[0]
            if length > end - pos - 9:
                raise _too_big(path, f"the record at byte {pos} (opcode 0x{op:02x})", length, end - pos - 9)
            if op == OP_CHUNK:
                _check_chunk(_Body(f, path, pos + 9, length), path)
            elif op == OP_CHUNK_INDEX:
                _check_chunk_index(_Body(f, path, pos + 9, length), path, file_size)
            pos += 9 + length
            if op == OP_FOOTER:
                break
