"""PIP-17 index object: where each block of a data object starts, plus the ledger's metadata. No I/O.

[int32 magic 0xDE47DE47][int32 index_len][int64 data_object_len][int64 data_header_len=128]
[int32 entry_count][int32 metadata_len][metadata][entry_count x (int64 first_entry_id, int32 part_id,
int64 block_offset)] -- entry_count counts index entries (blocks), not ledger entries.
"""
from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from crc32c import crc32c

from tiering.errors import BadInput, CorruptObjectError, EntryNotFound
from tiering.format.block import ENTRY_HEADER_LEN, HEADER_LEN, Block
from tiering.format.metadata import LedgerOffloadMetadata, decode_metadata, decode_metadata_and_crc
from tiering.format.pages import PageIndex, check_page, pages_problem

INDEX_MAGIC = 0xDE47DE47
_HEADER = struct.Struct(">Iiqqii")
_ENTRY = struct.Struct(">qiq")
INDEX_HEADER_LEN = _HEADER.size  # 32
INDEX_ENTRY_LEN = _ENTRY.size  # 20
_MAX_INT32 = 2**31 - 1
# The metadata's last field, index_crc32c (field 12, fixed32): its tag, then the CRC32C of the whole index
# object computed with its 4 value bytes zero. Pages check the data; this checks every byte of the index,
# the fields no other check covers too (the offload uuid, the seal time that recovery brings back).
_CRC_TAG = bytes([(12 << 3) | 5])
_CRC_FIELD_LEN = len(_CRC_TAG) + 4


@dataclass(frozen=True)
class IndexEntry:
    first_entry_id: int
    part_id: int
    block_offset: int

    @classmethod
    def of(cls, block: Block) -> "IndexEntry":
        return cls(block.first_entry_id, block.part_id, block.offset)


def block_pages(block: Block) -> list[tuple[int, int, int]]:
    """A packed block's pages as (first entry, offset in the ledger's data, CRC32C)."""
    return [(first, block.offset + off, crc) for first, off, crc in block.pages]


def page_index(pages: Sequence[tuple[int, int, int]], page_size: int) -> PageIndex:
    """The page index from block_pages() rows of every block, in order."""
    return PageIndex(page_size, tuple(p[0] for p in pages), tuple(p[1] for p in pages), tuple(p[2] for p in pages))


def _layout_problem(entries: Sequence[IndexEntry], data_object_len: int, entry_count: int) -> str | None:
    """Why these index entries cannot describe a ledger of `entry_count` entries in `data_object_len` bytes."""
    if data_object_len < 0:
        return f"negative data_object_len {data_object_len}"
    if not entries:
        return None if entry_count == 0 and data_object_len == 0 else \
            f"no blocks for {entry_count} entries in {data_object_len} bytes"
    if entries[0].first_entry_id != 0 or entries[0].block_offset != 0:
        return f"first block must start at entry 0, offset 0; got {entries[0]}"
    for i, e in enumerate(entries):
        if not 1 <= e.part_id <= _MAX_INT32:
            return f"index entry {i}: part id {e.part_id} is not positive"
        nxt_first, nxt_off = (entries[i + 1].first_entry_id, entries[i + 1].block_offset) \
            if i + 1 < len(entries) else (entry_count, data_object_len)
        # Every block holds at least one entry, and each entry takes at least its 12-byte frame.
        if nxt_first <= e.first_entry_id:
            return f"index entry {i}: first entry ids not increasing ({e.first_entry_id} then {nxt_first})"
        if nxt_off - e.block_offset < HEADER_LEN + ENTRY_HEADER_LEN * (nxt_first - e.first_entry_id):
            return (f"index entry {i}: block at offset {e.block_offset} is {nxt_off - e.block_offset} bytes, "
                    f"too small for entries {e.first_entry_id}..{nxt_first - 1}")
    return None


def encode_index(entries: Iterable[IndexEntry], data_object_len: int, metadata: bytes) -> bytes:
    """Build an index object; `metadata` is encode_metadata()'s output for the same ledger."""
    entries = list(entries)
    metadata = bytes(metadata)
    try:
        meta = decode_metadata(metadata, "metadata given to encode_index")
    except CorruptObjectError as exc:
        raise BadInput(f"cannot encode index: {exc}") from None
    problem = _layout_problem(entries, data_object_len, meta.entry_count)
    if problem is None and meta.data_object_len != data_object_len:
        problem = f"metadata says data_object_len {meta.data_object_len}, given {data_object_len}"
    if problem is None and meta.pages is not None:
        problem = pages_problem(meta.pages, [(e.first_entry_id, e.block_offset) for e in entries],
                                data_object_len, meta.entry_count)
    if problem:
        raise BadInput(f"cannot encode index: {problem}")
    metadata += _CRC_TAG + bytes(4)
    index_len = INDEX_HEADER_LEN + len(metadata) + INDEX_ENTRY_LEN * len(entries)
    if index_len > _MAX_INT32:
        raise BadInput(f"index of {index_len} bytes does not fit an int32 length")
    out = bytearray(_HEADER.pack(INDEX_MAGIC, index_len, data_object_len, HEADER_LEN, len(entries), len(metadata)))
    out += metadata
    for e in entries:
        out += _ENTRY.pack(e.first_entry_id, e.part_id, e.block_offset)
    at = INDEX_HEADER_LEN + len(metadata) - 4
    out[at:at + 4] = crc32c(out).to_bytes(4, "little")
    return bytes(out)


def _crc_problem(buf: memoryview, meta_len: int, stored: int) -> str | None:
    """Why the index fails its own CRC32C (None: it passes, or it was written before it had one). `stored`:
    the index_crc32c the metadata parsed to (0 also when absent: then the tail tells)."""
    end = INDEX_HEADER_LEN + meta_len
    tail = bytes(buf[end - _CRC_FIELD_LEN:end]) if meta_len >= _CRC_FIELD_LEN else b""
    present = tail[:1] == _CRC_TAG and int.from_bytes(tail[1:], "little") == stored
    if not present:
        return None if stored == 0 else "index_crc32c is not the metadata's last field"
    copy = bytearray(buf)
    copy[end - 4:end] = bytes(4)
    actual = crc32c(copy)
    return None if actual == stored else f"CRC32C 0x{actual:08x}, the index says 0x{stored:08x}"


@dataclass(frozen=True)
class OffloadIndex:
    entries: tuple[IndexEntry, ...]
    data_object_len: int
    data_header_len: int
    metadata_bytes: bytes
    metadata: LedgerOffloadMetadata
    _firsts: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_firsts", [e.first_entry_id for e in self.entries])

    @property
    def entry_count(self) -> int:
        """Entries of the ledger (not blocks)."""
        return self.metadata.entry_count

    def find(self, entry_id: int) -> int:
        """Position in `entries` of the block holding entry_id (floor search)."""
        if isinstance(entry_id, bool) or not isinstance(entry_id, int) or not 0 <= entry_id < self.entry_count:
            m = self.metadata
            have = f"entries 0..{m.entry_count - 1}" if m.entry_count else "no entries"
            raise EntryNotFound(f"entry {entry_id!r} is not in ledger {m.ledger_id} of topic {m.topic!r} ({have})")
        return bisect.bisect_right(self._firsts, entry_id) - 1

    def lookup(self, entry_id: int) -> IndexEntry:
        return self.entries[self.find(entry_id)]

    def block_length(self, i: int) -> int:
        nxt = self.entries[i + 1].block_offset if i + 1 < len(self.entries) else self.data_object_len
        return nxt - self.entries[i].block_offset

    @property
    def pages(self) -> PageIndex | None:
        return self.metadata.pages

    def page_span(self, i: int) -> tuple[int, int]:
        """[start, end) of page i in the ledger's data."""
        return self.metadata.pages.offsets[i], self.metadata.pages.end(i, self.data_object_len)

    def block_last_entry(self, i: int) -> int:
        return (self.entries[i + 1].first_entry_id if i + 1 < len(self.entries) else self.entry_count) - 1

    def mismatch(self, topic: str, ledger_id: int, entry_count: int, data_object_len: int) -> str | None:
        """Why this index does not describe that ledger, or None. The topic counts too: ledger ids restart
        in every topic, so another topic's intact pair of the same shape would pass every other check
        (its own CRCs included) and be served as this ledger's bytes."""
        m = self.metadata
        if (m.topic, m.ledger_id, m.entry_count, self.data_object_len) == (topic, ledger_id, entry_count,
                                                                            data_object_len):
            return None
        return (f"describes ledger {m.ledger_id} of topic {m.topic!r} with {m.entry_count} entries in "
                f"{self.data_object_len} bytes; metadata says ledger {ledger_id} of topic {topic!r} with "
                f"{entry_count} entries in {data_object_len} bytes")


def decode_index(buf: bytes | bytearray | memoryview, where: str = "index") -> OffloadIndex:
    """Decode and cross-check a whole index object (buf must be exactly index_len bytes)."""
    buf = memoryview(buf)

    def corrupt(offset: int, detail: str) -> CorruptObjectError:
        return CorruptObjectError("index", f"{where}, offset {offset}" if where else f"offset {offset}", detail)

    if len(buf) < INDEX_HEADER_LEN:
        raise corrupt(0, f"truncated: {len(buf)} bytes, the header alone is {INDEX_HEADER_LEN}")
    magic, index_len, data_len, data_header_len, count, meta_len = _HEADER.unpack_from(buf, 0)
    if magic != INDEX_MAGIC:
        raise corrupt(0, f"bad magic 0x{magic:08X}, expected 0x{INDEX_MAGIC:08X}")
    if index_len != len(buf):
        raise corrupt(4, f"index_len {index_len} but the object holds {len(buf)} bytes")
    if data_len < 0:
        raise corrupt(8, f"negative data_object_len {data_len}")
    if data_header_len != HEADER_LEN:
        raise corrupt(16, f"data_header_len {data_header_len}, expected {HEADER_LEN}")
    if count < 0:
        raise corrupt(24, f"negative index entry count {count}")
    if not 0 <= meta_len <= len(buf) - INDEX_HEADER_LEN:
        raise corrupt(28, f"metadata_len {meta_len} out of range for a {len(buf)}-byte index")
    expected = INDEX_HEADER_LEN + meta_len + INDEX_ENTRY_LEN * count
    if expected != index_len:
        raise corrupt(24, f"{count} entries and {meta_len} metadata bytes need {expected} bytes, index_len is "
                          f"{index_len}")
    metadata_bytes = bytes(buf[INDEX_HEADER_LEN:INDEX_HEADER_LEN + meta_len])
    meta, stored_crc = decode_metadata_and_crc(metadata_bytes, f"{where}, offset {INDEX_HEADER_LEN}" if where else
                                               f"offset {INDEX_HEADER_LEN}")
    problem = _crc_problem(buf, meta_len, stored_crc)
    if problem:
        raise corrupt(0, problem)
    if meta.data_object_len != data_len:
        raise corrupt(8, f"data_object_len {data_len} but the metadata says {meta.data_object_len}")
    start = INDEX_HEADER_LEN + meta_len
    entries = tuple(IndexEntry(*_ENTRY.unpack_from(buf, start + i * INDEX_ENTRY_LEN)) for i in range(count))
    problem = _layout_problem(entries, data_len, meta.entry_count)
    if problem:
        raise corrupt(start, problem)
    if meta.pages is not None:
        problem = pages_problem(meta.pages, [(e.first_entry_id, e.block_offset) for e in entries], data_len,
                                meta.entry_count)
        if problem:
            raise corrupt(INDEX_HEADER_LEN, problem)
    return OffloadIndex(entries, data_len, data_header_len, metadata_bytes, meta)


def check_ledger_pages(index: OffloadIndex, data: bytes | bytearray | memoryview, where: str, base: int = 0) -> bool:
    """Check every page CRC of a whole ledger's data (`base`: where data starts in its object, for messages).
    False when the index has no page index (an object written before them): nothing could be checked."""
    pages = index.pages
    if pages is None:
        return False
    if len(data) != index.data_object_len:
        raise CorruptObjectError("data", f"{where}, offset {base}",
                                 f"{len(data)} bytes where the index says {index.data_object_len}")
    check_page_run(index, 0, len(pages) - 1, data, 0, where, base)
    return True


def check_page_run(index: OffloadIndex, first: int, last: int, data: bytes | bytearray | memoryview, start: int,
                   where: str, base: int = 0) -> None:
    """Check the CRC32C of pages first..last of the ledger, whose bytes `data` are, from the ledger's offset
    `start` on (`base`: where the ledger's data starts in its object, for messages). The index has pages."""
    pages, mv = index.pages, memoryview(data)
    ends = pages.offsets[first + 1:last + 2]
    if len(ends) <= last - first:  # the run ends with the ledger's last page
        ends += (index.data_object_len,)
    # the pages' spans straight from the offsets (a scan checks ~1,000 pages per 64 MiB)
    for p, p_start, p_end in zip(range(first, last + 1), pages.offsets[first:last + 1], ends):
        check_page(pages, p, mv[p_start - start:p_end - start], where, base + p_start)
