"""Merged objects (defrag's, and offload batches'): several ledgers' index objects concatenated in one index
object, their data concatenated in one data object. No I/O: the caller fetches the bytes."""
from __future__ import annotations

from typing import Iterable

from tiering.errors import CorruptObjectError
from tiering.format.block import BlockHeader
from tiering.format.index import INDEX_HEADER_LEN, OffloadIndex, decode_index

__all__ = ["block_layout", "ledger_offsets", "split_indexes"]


def split_indexes(buf: bytes | bytearray | memoryview, key: str) -> list[tuple[int, int, OffloadIndex]]:
    """(offset, length, index) of each index object concatenated in `buf`, the bytes of index object `key`
    (each index says its own length)."""
    out, off = [], 0
    while off < len(buf):
        if len(buf) - off < INDEX_HEADER_LEN:
            raise CorruptObjectError("index", f"index object {key} at {off}",
                                     f"{len(buf) - off} trailing bytes, shorter than an index header")
        index_len = int.from_bytes(buf[off + 4:off + 8], "big", signed=True)
        if not INDEX_HEADER_LEN <= index_len <= len(buf) - off:
            raise CorruptObjectError("index", f"index object {key} at {off}",
                                     f"index_len {index_len} does not fit the {len(buf) - off} bytes left")
        out.append((off, index_len, decode_index(buf[off:off + index_len], f"index object {key} at {off}")))
        off += index_len
    return out


def block_layout(ix: OffloadIndex) -> tuple[tuple[int, int, int], ...]:
    """(first entry id, offset, length) of each block of the ledger `ix` describes."""
    return tuple((e.first_entry_id, e.block_offset, ix.block_length(i)) for i, e in enumerate(ix.entries))


def ledger_offsets(headers: Iterable[tuple[int, BlockHeader]], size: int,
                   indexes: list[OffloadIndex]) -> list[int] | None:
    """Where each ledger of `indexes` starts in a merged data object of `size` bytes, from the object's
    block headers in order, (offset, header) each: a ledger's bytes start at a block whose first entry is 0,
    and each run of blocks is matched to the index with the same block layout, so the answer does not
    depend on the concatenation order. None when the blocks cannot be matched one to one with the indexes.
    `headers` is consumed only as far as needed: a caller may fetch them lazily."""
    segments: list[tuple[int, list]] = []
    for off, hdr in headers:
        if off + hdr.block_len > size:
            return None
        if hdr.first_entry_id == 0:
            segments.append((off, []))
        elif not segments:
            return None
        start, blocks = segments[-1]
        blocks.append((hdr.first_entry_id, off - start, hdr.block_len))
    layouts = [block_layout(ix) for ix in indexes]
    offsets: list[int | None] = [None] * len(indexes)
    for start, blocks in segments:
        # identical layouts are interchangeable as far as the headers tell: take them in index order
        j = next((j for j, s in enumerate(layouts) if offsets[j] is None and s == tuple(blocks)), None)
        if j is None:
            return None
        offsets[j] = start
    return None if any(o is None for o in offsets) else offsets
