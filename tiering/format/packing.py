"""Packing entries into PIP-17 blocks (tiering/format/block.py has the layout). Pure, no I/O.

The packer takes **framed runs**: consecutive entries already in the block's entry framing
([i32 len][i64 entry_id][payload] each) in one buffer, with the end of each entry. A block is then the header,
slices of runs and padding, joined once; where blocks and pages are cut is found with numpy over the runs'
end offsets, not by a Python step per entry. Tier 1 hands its sealed files over this way (its frames are this
framing plus a CRC, tiering/tier1/framed.py), so offloading a ledger costs a few operations per megabyte
(16 MiB of 4 KiB entries: 24 ms as (id, payload) pairs, 4 ms as runs, on the VM of docs/performance.md).
A caller holding (entry_id, payload) pairs frames them first (`frame_entries`; `pack_blocks` does both).
"""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Iterable, Iterator, NamedTuple

from tiering.errors import BadInput
from tiering.format.block import (DEFAULT_BLOCK_SIZE, DEFAULT_PAGE_SIZE, ENTRY_HEADER_LEN, HEADER_LEN,
                                  MAX_ENTRY_LEN, MIN_PACK_BLOCK_SIZE, PAD_CHUNK, Block, Buffer, crc32c,
                                  encode_block_header)

if TYPE_CHECKING:
    import numpy as np

__all__ = ["FramedRun", "frame_entries", "pack_runs", "pack_blocks", "RUN_BYTES"]

_ENTRY = struct.Struct(">iq")
_MAX_INT64 = 2**63 - 1
RUN_BYTES = 1 << 20  # how much `frame_entries` gathers into one run (an oversized entry is a run of its own)


class FramedRun(NamedTuple):
    """Entries first_id, first_id + 1, ... framed as in a block, one after the other in `data`; `ends[k]` is
    where entry k ends in `data` (entry 0 starts at 0). Checked by whoever made it: the packer copies it."""

    first_id: int
    data: Buffer
    ends: "np.ndarray"  # int64, increasing


def frame_entries(entries: Iterable[tuple[int, Buffer]], run_bytes: int = RUN_BYTES) -> Iterator[FramedRun]:
    """(entry_id, payload) pairs, checked as the format requires (ids consecutive non-negative int64s, bytes-
    like payloads of at most 2 GiB - 1), framed into runs of about `run_bytes`."""
    import numpy as np  # here, not at import: only packing needs it (the CLI's start stays light)

    pieces: list = []
    ends: list[int] = []
    first = expected = None
    size = 0
    pack = _ENTRY.pack
    for entry_id, payload in entries:
        if isinstance(entry_id, bool) or not isinstance(entry_id, int) or not 0 <= entry_id <= _MAX_INT64:
            raise BadInput(f"entry id must be a non-negative int64, got {entry_id!r}")
        if expected is not None and entry_id != expected:
            raise BadInput(f"entry ids must be consecutive: got {entry_id} after {expected - 1}")
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise BadInput(f"payload of entry {entry_id} must be bytes, got {type(payload).__name__}")
        n = payload.nbytes if isinstance(payload, memoryview) else len(payload)
        if n > MAX_ENTRY_LEN:
            raise BadInput(f"entry {entry_id} has {n} bytes; the format allows at most {MAX_ENTRY_LEN}")
        expected = entry_id + 1
        if first is None:
            first = entry_id
        pieces += (pack(n, entry_id), payload)
        size += ENTRY_HEADER_LEN + n
        ends.append(size)
        if size >= run_bytes:
            yield FramedRun(first, b"".join(pieces), np.array(ends, dtype=np.int64))
            pieces, ends, first, size = [], [], None, 0
    if ends:
        yield FramedRun(first, b"".join(pieces), np.array(ends, dtype=np.int64))


def pack_blocks(entries: Iterable[tuple[int, Buffer]], block_size: int = DEFAULT_BLOCK_SIZE,
                page_size: int = DEFAULT_PAGE_SIZE) -> Iterator[Block]:
    """`pack_runs` of (entry_id, payload) pairs (the sizes checked at the call, the pairs as they come)."""
    return pack_runs(frame_entries(entries), block_size, page_size)


def pack_runs(runs: Iterable[FramedRun], block_size: int = DEFAULT_BLOCK_SIZE,
              page_size: int = DEFAULT_PAGE_SIZE) -> Iterator[Block]:
    """Stream framed runs into blocks: all block_size bytes except the last (exact size) and oversized entries
    (a block of their own, exact size). Holds one block's runs at a time.

    Each block is cut into pages of whole entries of at most page_size bytes (a larger entry is a page of
    its own); the first page includes the header, the last the padding.

    Each yielded Block owns a fresh buffer, so a consumer may keep it while the next one is built.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < MIN_PACK_BLOCK_SIZE:
        raise BadInput(f"block size must be an integer >= {MIN_PACK_BLOCK_SIZE}, got {block_size!r}")
    if block_size > _MAX_INT64:
        raise BadInput(f"block size {block_size} does not fit in an int64")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise BadInput(f"page size must be a positive integer, got {page_size!r}")
    return _pack(runs, block_size, page_size)  # a generator: the sizes above are checked at the call


def _pack(runs: Iterable[FramedRun], block_size: int, page_size: int) -> Iterator[Block]:
    import numpy as np

    room = block_size - HEADER_LEN
    part_id, offset = 1, 0
    # the block being built: slices of runs (joined once, at its end) and its entries' ends in the block
    pieces: list[memoryview] = []
    ends: list[np.ndarray] = []
    used = count = 0
    first = expected = None

    def finish(pad: bool) -> Block:
        nonlocal part_id, offset, pieces, ends, used, count, first
        length = block_size if pad else HEADER_LEN + used
        data = b"".join([encode_block_header(length, first), *pieces, *_padding(length - HEADER_LEN - used)])
        entry_ends = np.concatenate(ends)
        block = Block(part_id, first, count, data, offset, _pages(data, first, entry_ends, page_size))
        part_id += 1
        offset += len(data)
        pieces, ends, used, count, first = [], [], 0, 0, None
        return block

    for run in runs:
        run_ends = run.ends
        n = len(run_ends)
        if n == 0:
            continue
        if expected is not None and run.first_id != expected:
            raise BadInput(f"entry ids must be consecutive: got {run.first_id} after {expected - 1}")
        expected = run.first_id + n
        view = memoryview(run.data)
        k = base = 0  # the run's next entry, and where it starts in the run
        while k < n:
            # entries k..j-1 of the run are those that still fit in the block
            j = int(np.searchsorted(run_ends, base + room - used, side="right"))
            oversized = j == k and count == 0  # larger than a block: a block of its own, unpadded
            if oversized:
                j = k + 1
            if j > k:
                end = int(run_ends[j - 1])
                pieces.append(view[base:end])
                ends.append(run_ends[k:j] + (HEADER_LEN + used - base))
                if first is None:
                    first = run.first_id + k
                used += end - base
                count += j - k
                base, k = end, j
            if oversized:
                yield finish(pad=False)
            elif k < n:
                yield finish(pad=True)  # the run's next entry does not fit: another entry follows
    if count:
        yield finish(pad=False)  # the last block is sized exactly


def _pages(data: bytes, first: int, ends: "np.ndarray", page_size: int) -> tuple[tuple[int, int, int], ...]:
    """(first entry, offset, CRC32C) of each page of a block whose entries end at `ends` (block offsets): a
    page takes entries while it stays within page_size bytes; its first entry alone may exceed it."""
    import numpy as np

    starts, page, lead, n = [(first, 0)], 0, 0, len(ends)
    while True:
        j = max(int(np.searchsorted(ends, page + page_size, side="right")), lead + 1)
        if j >= n:
            break
        page, lead = int(ends[j - 1]), j
        starts.append((first + j, page))
    mv, bounds = memoryview(data), [off for _, off in starts[1:]] + [len(data)]
    return tuple((entry, off, crc32c(mv[off:stop])) for (entry, off), stop in zip(starts, bounds))


def _padding(n: int) -> list[bytes]:
    """n bytes of padding, as pieces of at most len(PAD_CHUNK) (shared, not copied)."""
    full, rest = divmod(n, len(PAD_CHUNK))
    return [PAD_CHUNK] * full + ([PAD_CHUNK[:rest]] if rest else [])
