"""Merged objects (defrag's, and offload batches'): several ledgers' index objects concatenated in one index
object, their data concatenated in one data object. No I/O: the caller fetches the bytes."""
from __future__ import annotations

from typing import Iterable

from tiering.errors import CorruptObjectError
from tiering.format.block import BlockHeader
from tiering.format.index import INDEX_HEADER_LEN, OffloadIndex, decode_index

__all__ = ["block_layout", "ledger_offsets", "offsets_before_break", "split_indexes"]


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
    segments = _segments(headers, size)
    if segments is None:
        return None
    layouts = [block_layout(ix) for ix in indexes]
    offsets: list[int | None] = [None] * len(indexes)
    for start, blocks in segments:
        j = _same(layouts, offsets, blocks)
        if j is None:
            return None
        offsets[j] = start
    return None if any(o is None for o in offsets) else offsets


def offsets_before_break(headers: Iterable[tuple[int, BlockHeader]], indexes: list[OffloadIndex], *, cut: bool,
                         checked: bool) -> list[int | None]:
    """The ledgers a walk of the block headers places before it breaks (a header that does not parse ended
    it: `cut`; or one that parses but names the wrong entry, so the runs stop matching), None for the rest.

    The run where matching stops holds a ledger's blocks followed by the broken ones (or, `cut`, may end
    inside a longer ledger). The longest ledger whose layout begins that run is placed there when nothing
    else could be: no ledger left whose layout begins the same way and goes on (it may be the one the run
    holds, its later header broken). With `checked` (the caller checks the placed ledger's pages, which
    tell a wrong place) it is placed regardless."""
    segments = _segments(headers, None) or []
    layouts = [block_layout(ix) for ix in indexes]
    offsets: list[int | None] = [None] * len(indexes)
    for k, (start, blocks) in enumerate(segments):
        blocks = tuple(blocks)
        j = None if cut and k == len(segments) - 1 else _same(layouts, offsets, blocks)
        if j is not None:
            offsets[j] = start
            continue
        fits = [i for i, s in enumerate(layouts) if offsets[i] is None and s == blocks[:len(s)]]
        if fits:
            j = max(fits, key=lambda i: (len(layouts[i]), -i))  # of identical layouts, the first index
            head = layouts[j]
            if checked or not any(offsets[i] is None and len(s) > len(head) and s[:len(head)] == head
                                  for i, s in enumerate(layouts)):
                offsets[j] = start
        break
    return offsets


def _segments(headers: Iterable[tuple[int, BlockHeader]], size: int | None) -> list[tuple[int, list]] | None:
    """The runs of blocks, each from a block whose first entry is 0: (start, [(first entry, offset in the
    run, length)]). None when a block runs past `size` or the first block does not start a ledger."""
    segments: list[tuple[int, list]] = []
    for off, hdr in headers:
        if (size is not None and off + hdr.block_len > size) or (hdr.first_entry_id != 0 and not segments):
            return None
        if hdr.first_entry_id == 0:
            segments.append((off, []))
        start, blocks = segments[-1]
        blocks.append((hdr.first_entry_id, off - start, hdr.block_len))
    return segments


def _same(layouts: list[tuple], offsets: list[int | None], blocks) -> int | None:
    """The first index not placed yet with exactly this block layout (identical layouts are interchangeable
    as far as the headers tell: taken in index order)."""
    blocks = tuple(blocks)
    return next((j for j, s in enumerate(layouts) if offsets[j] is None and s == blocks), None)
