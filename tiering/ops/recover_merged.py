"""Where each ledger of a shared data object (defrag's merge, an offload batch) starts, for a recovery that has
only the bucket: the object's block headers walked from its start and matched to its indexes' block layouts
(format/merged.py).

A corrupt block header stops that walk, and the ledgers behind it would be lost with the one it belongs to
although their bytes are intact, and may be the only copies left. So the walk keeps the ledgers it matched
before the break, and the ones after it are found from the object's end backwards: the last ledger ends
where the object ends, so it starts its length before that, which its own block headers (each where its
index says, with the first entry and length it says) confirm; then the one before it, and so on, until a
ledger is not where one would start (the broken one). A ledger found neither way is reported, not guessed.
"""
from __future__ import annotations

from typing import Iterator

from tiering.errors import CorruptObjectError
from tiering.format.block import HEADER_LEN, BlockHeader, parse_block_header
from tiering.format.index import OffloadIndex
from tiering.format.merged import ledger_offsets, offsets_before_break
from tiering.tier2.objects import Bucket, get_range

WINDOW = 1024 * 1024  # bytes read at once when walking the block headers of a shared object


def merged_offsets(b: Bucket, key: str, size: int, indexes: list[OffloadIndex],
                   check_pages: bool) -> list[int | None]:
    """Where each ledger of `indexes` starts in data object `key` of `size` bytes; None for a ledger that
    could not be placed (its own block header is corrupt, or one before it and one after it are).
    `check_pages`: the caller checks each ledger's pages where it is placed, so the ledger whose run a
    break follows is placed even where another ledger could be there (format/merged.offsets_before_break)."""
    walked: list[tuple[int, BlockHeader]] = []
    cut = False
    try:
        for off, hdr in block_headers(b, key, size):
            if off + hdr.block_len > size:  # a length that parsed but is wrong
                cut = True
                break
            walked.append((off, hdr))
    except CorruptObjectError:
        cut = True
    offsets = None if cut else ledger_offsets(walked, size, indexes)
    if offsets is not None:
        return offsets
    # (a header that parses but names the wrong entry leaves runs that match no index: a break too)
    offsets = offsets_before_break(walked, indexes, cut=cut, checked=check_pages)
    floor = max((o + ix.data_object_len for o, ix in zip(offsets, indexes) if o is not None), default=0)
    _place_from_the_end(b, key, size, indexes, offsets, floor)
    return offsets


def block_headers(b: Bucket, key: str, end: int, start: int = 0) -> Iterator[tuple[int, BlockHeader]]:
    """(offset, header) of each block of data object `key` from `start` to `end`, each block's length
    leading to the next, fetched as they are asked for; a header that does not parse raises
    CorruptObjectError."""
    off, last_len = start, None
    buf, buf_at = b"", start
    while off < end:
        if not buf_at <= off <= buf_at + len(buf) - HEADER_LEN:
            # A run of small blocks (a batch of small ledgers) is read in one window instead of one GET per
            # block; after a large block only its successor's header is fetched.
            small = last_len is None or last_len < WINDOW // 4
            buf, buf_at = get_range(b, key, off, min(end - off, WINDOW if small else HEADER_LEN)), off
        hdr = parse_block_header(memoryview(buf)[off - buf_at:off - buf_at + HEADER_LEN], f"data object {key}", off)
        yield off, hdr
        last_len = hdr.block_len
        off += hdr.block_len


def _place_from_the_end(b: Bucket, key: str, size: int, indexes: list[OffloadIndex], offsets: list[int | None],
                        floor: int) -> None:
    """Fill in `offsets` of the ledgers that lie back to back from the object's end down to the first one
    not found (at or above `floor`, where the ledgers the walk placed end), the last first. Ledgers of one
    layout are interchangeable as far as headers tell: the later index is taken for the later place, as the
    walk takes them in index order."""
    end = size
    while True:
        for j in reversed(range(len(indexes))):
            start = end - indexes[j].data_object_len
            if offsets[j] is None and start >= floor and _blocks_at(b, key, start, indexes[j]):
                offsets[j], end = start, start
                break
        else:
            return


def _blocks_at(b: Bucket, key: str, start: int, index: OffloadIndex) -> bool:
    """Whether the ledger `index` describes lies at `start`: every one of its blocks has its header where the
    index says, naming the first entry and the length the index gives it (read as the walk reads them,
    stopping at the first that does not)."""
    end = start + index.data_object_len
    expected = [(start + e.block_offset, e.first_entry_id, index.block_length(i)) for i, e in enumerate(index.entries)]
    found = block_headers(b, key, end, start=start)
    matched = 0
    try:
        for want, (off, hdr) in zip(expected, found):
            if (off, hdr.first_entry_id, hdr.block_len) != want:
                return False
            matched += 1
    except CorruptObjectError:
        return False
    finally:
        found.close()
    return matched == len(expected)
