"""PIP-17 data blocks: a 128-byte header, whole entries, then FE DC DE AD padding. Pure bytes, no I/O.

Block  = [int32 magic][int64 header_len=128][int64 block_len][int64 first_entry_id][zeros to 128]
         [entries][padding to block_len]
Entry  = [int32 len][int64 entry_id][payload]
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable, Iterator, NamedTuple, Union

# CRC32C of the `crc32c` package: hardware-accelerated, takes any buffer without copying, and releases the
# GIL on large buffers (awscrt's holds it), so pages are checked while other threads fetch and parse
from crc32c import crc32c

from tiering.errors import BadInput, CorruptObjectError

BLOCK_MAGIC = 0xFBDBABCB
HEADER_LEN = 128
ENTRY_HEADER_LEN = 12
# The largest entry payload the format stores, checked by tier-1 frames and the packer: an entry's length field is
# an int32 ([int32 length][int64 entry id][payload]). The producer's own limit is lower (tiering/writer.py).
MAX_ENTRY_LEN = 2**31 - 1
PADDING = b"\xFE\xDC\xDE\xAD"
# A block is one S3 part: 8 MiB blocks send a topic's default 64 MiB ledger as eight parts, four in flight, as
# s3transfer's 8 MiB chunks do (64 MiB blocks sent it as one part and a tail: 0.82 of upload_file on RGW), and
# bound an upload's memory at (concurrency + 1) x 8 MiB. Pulsar's default is 64 MiB; any size reads the same.
DEFAULT_BLOCK_SIZE = 8 * 1024 * 1024
MIN_BLOCK_SIZE = 5 * 1024 * 1024  # S3's minimum part size; enforced by uploaders, not by the packer
MIN_PACK_BLOCK_SIZE = HEADER_LEN + ENTRY_HEADER_LEN
DEFAULT_PAGE_SIZE = 64 * 1024  # target bytes of a page (tiering/format/pages.py): one ranged GET per random read

_HEADER = struct.Struct(">Iqqq")  # magic, header_len, block_len, first_entry_id
_ENTRY = struct.Struct(">iq")
# Padding is written and checked 64 KiB at a time so a large tail never needs a second buffer of its size.
PAD_CHUNK = PADDING * 16384

Buffer = Union[bytes, bytearray, memoryview]


def _at(where: str, offset: int) -> str:
    return f"{where}, offset {offset}" if where else f"offset {offset}"


@dataclass(frozen=True)
class BlockHeader:
    header_len: int
    block_len: int
    first_entry_id: int


@dataclass
class Block:
    """One packed block = one multipart part. `offset` is where it starts in the data object."""

    part_id: int
    first_entry_id: int
    entry_count: int
    data: bytes
    offset: int
    # (first entry id, offset in the block, CRC32C) of each page: the page index's share of this block
    pages: tuple[tuple[int, int, int], ...] = ()

    @property
    def length(self) -> int:
        return len(self.data)

    @property
    def last_entry_id(self) -> int:
        return self.first_entry_id + self.entry_count - 1


class Entry(NamedTuple):
    """A decoded entry. `payload` is a view into the caller's buffer: copy it before resizing a bytearray."""

    entry_id: int
    payload: memoryview
    end: int  # offset just after the entry, in the buffer's coordinates


class NeedMore(NamedTuple):
    """The buffer ends inside an entry: `needed` bytes from the entry's offset are required."""

    offset: int
    needed: int


class EndOfEntries(NamedTuple):
    """No entry at `offset`: the block's padding starts there, or the block ends there."""

    offset: int


def encode_block_header(block_len: int, first_entry_id: int) -> bytes:
    return _HEADER.pack(BLOCK_MAGIC, HEADER_LEN, block_len, first_entry_id).ljust(HEADER_LEN, b"\0")


def parse_block_header(buf: Buffer, where: str = "", base: int = 0) -> BlockHeader:
    """Decode and check the header at buf[0:128]; `base` is buf's offset in the object (for messages)."""
    buf = memoryview(buf)
    if len(buf) < HEADER_LEN:
        raise CorruptObjectError("block header", _at(where, base),
                                 f"short header: {len(buf)} bytes, need {HEADER_LEN}")
    magic, header_len, block_len, first = _HEADER.unpack_from(buf, 0)
    if magic != BLOCK_MAGIC:
        raise CorruptObjectError("block header", _at(where, base),
                                 f"bad magic 0x{magic:08X}, expected 0x{BLOCK_MAGIC:08X}")
    if header_len != HEADER_LEN:
        raise CorruptObjectError("block header", _at(where, base + 4),
                                 f"header_len {header_len}, expected {HEADER_LEN}")
    if block_len < MIN_PACK_BLOCK_SIZE:
        raise CorruptObjectError("block header", _at(where, base + 12),
                                 f"block_len {block_len} is less than header plus one entry header")
    if first < 0:
        raise CorruptObjectError("block header", _at(where, base + 20), f"negative first_entry_id {first}")
    if any(buf[_HEADER.size:HEADER_LEN]):
        raise CorruptObjectError("block header", _at(where, base + _HEADER.size), "header padding is not zero")
    return BlockHeader(header_len, block_len, first)


def _check_padding(buf: memoryview, start: int, end: int, where: str, base: int) -> None:
    """buf[start:end] must be the padding pattern, phased from `start` (where the padding begins)."""
    pos = start
    while pos < end:
        n = min(len(PAD_CHUNK), end - pos)
        if buf[pos:pos + n] != PAD_CHUNK[:n]:
            bad = next(i for i in range(n) if buf[pos + i] != PAD_CHUNK[i])
            raise CorruptObjectError("block padding", _at(where, base + pos + bad),
                                     f"byte 0x{buf[pos + bad]:02X} is not the FE DC DE AD pattern")
        pos += n


def read_entry_at(buf: Buffer, offset: int, where: str = "", *, block_end: int | None = None,
                  base: int = 0) -> Entry | NeedMore | EndOfEntries:
    """Decode the entry at buf[offset:].

    A buffer that stops mid-entry gives NeedMore (a ranged GET may simply be short). `block_end`, where the
    block ends in buf's coordinates, if known, makes an entry running past it corruption and caps NeedMore
    at it. `base` (buf's offset in the object) only feeds error messages. Padding at `offset` is checked
    up to the end of what buf holds, then EndOfEntries is returned.
    """
    if offset < 0:
        raise BadInput(f"entry offset must be non-negative, got {offset}")
    buf = memoryview(buf)
    limit = len(buf) if block_end is None else min(len(buf), block_end)
    if block_end is not None and offset >= block_end:
        return EndOfEntries(offset)
    # Near a known block end fewer than 12 bytes decide it (they must be padding), so ask for no more.
    header_need = ENTRY_HEADER_LEN if block_end is None else min(ENTRY_HEADER_LEN, block_end - offset)
    if offset >= len(buf):
        return NeedMore(offset, header_need)
    # An entry's length is a non-negative int32, so its first byte is < 0x80; 0xFE can only start padding.
    if buf[offset] == PADDING[0]:
        _check_padding(buf, offset, limit, where, base)
        return EndOfEntries(offset)
    if offset + ENTRY_HEADER_LEN > limit:
        if block_end is not None and offset + ENTRY_HEADER_LEN > block_end:
            raise CorruptObjectError("entry", _at(where, base + offset),
                                     f"{block_end - offset} bytes left in the block: neither an entry nor padding")
        return NeedMore(offset, header_need)
    length, entry_id = _ENTRY.unpack_from(buf, offset)
    if length < 0:
        raise CorruptObjectError("entry", _at(where, base + offset), f"negative entry length {length}")
    if entry_id < 0:
        raise CorruptObjectError("entry", _at(where, base + offset + 4), f"negative entry id {entry_id}")
    end = offset + ENTRY_HEADER_LEN + length
    if block_end is not None and end > block_end:
        raise CorruptObjectError("entry", _at(where, base + offset),
                                 f"entry {entry_id} of {length} bytes runs past the block end at {base + block_end}")
    if end > len(buf):
        return NeedMore(offset, ENTRY_HEADER_LEN + length)
    return Entry(entry_id, buf[offset + ENTRY_HEADER_LEN:end], end)


def iter_block_entries(buf: Buffer, start: int = HEADER_LEN, where: str = "", *,
                       first_entry_id: int | None = None, block_end: int | None = None,
                       base: int = 0) -> Iterator[Entry]:
    """Yield the entries of buf from `start`, checking ids are consecutive (from `first_entry_id` if given).

    Stops cleanly at padding, at `block_end`, or where buf ends mid-entry; call read_entry_at at the last
    `end` to learn which (NeedMore vs EndOfEntries).
    """
    expected = first_entry_id
    offset = start
    while True:
        got = read_entry_at(buf, offset, where, block_end=block_end, base=base)
        if not isinstance(got, Entry):
            return
        if expected is not None and got.entry_id != expected:
            raise CorruptObjectError("entry", _at(where, base + offset + 4),
                                     f"entry id {got.entry_id} out of sequence, expected {expected}")
        expected = got.entry_id + 1
        yield got
        offset = got.end


def decode_block(buf: Buffer, where: str = "", base: int = 0) -> tuple[BlockHeader, list[Entry]]:
    """Strictly decode one whole block: header, at least one entry, padding (if any) to exactly block_len."""
    header = parse_block_header(buf, where, base)
    if len(buf) != header.block_len:
        raise CorruptObjectError("block", _at(where, base + 12),
                                 f"block_len {header.block_len} but the block holds {len(buf)} bytes")
    entries = list(iter_block_entries(buf, HEADER_LEN, where, first_entry_id=header.first_entry_id,
                                      block_end=header.block_len, base=base))
    if not entries:
        raise CorruptObjectError("block", _at(where, base + HEADER_LEN), "block holds no entry")
    return header, entries


def entries_size(payload_lengths: Iterable[int]) -> int:
    """Bytes the entries take inside a block (framing included)."""
    return sum(ENTRY_HEADER_LEN + n for n in payload_lengths)
