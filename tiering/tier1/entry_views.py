"""The entries of a tier-1 ledger range for offload's block packer (`LedgerReader.iter_entry_views`).

Iterating gives (entry_id, memoryview) as it always did. The packer (tiering/format/block.py, `pack_frames`)
instead asks for the payload lengths ahead (from the frame offsets: the footer index of a sealed file, the
scan of an open one) and then has whole runs of entries read straight into its block buffer by `readinto`:
one `preadv` per ~500 entries scatters each frame's [len][id] and payload into place and its crc into a
side array, so the payload bytes are copied once by the kernel and never sliced or joined in Python (issue
22). [len:u32][id:i64][payload] is a tier-1 frame without its crc field, and byte for byte a PIP-17 entry.

Every check of the iterator is kept, per entry: its id, its length (the frame's header against the offsets,
so a damaged header or index is caught), and its crc, computed over the 12 header bytes and the payload,
which lie contiguous in the caller's buffer. A failed check raises CorruptObjectError naming the entry.
"""
from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from typing import TYPE_CHECKING, Iterator

from tiering.errors import BadInput
from tiering.tier1 import frames as F

if TYPE_CHECKING:
    from tiering.tier1.ledger_file import LedgerReader

WINDOW = 65536  # frame offsets held at once (512 KiB): bounded whatever the ledger's entry count
_IOV_MAX = 1024  # the Linux limit on buffers of one preadv
_GROUP_ENTRIES = (_IOV_MAX - 1) // 2  # entries read by one preadv (two buffers each, plus one)
_GROUP_BYTES = 512 * 1024  # ... and about this many bytes, so they are checked while in the CPU's cache
_HEADER = struct.Struct(">Iq")  # the header bytes a frame's crc covers, before the crc field itself
_LEN_ID = _HEADER.size


class EntryViews:
    """Entries first..last of a reader, consumed either by iteration or by `lengths` + `readinto`."""

    def __init__(self, reader: LedgerReader, first: int, last: int):
        self._reader = reader
        self._first = first
        self.next_id = first  # the next entry `readinto` reads
        self._last = last
        self._it: Iterator[tuple[int, memoryview]] | None = None
        self._win_first = first
        self._win = array("q")  # file offsets of frames _win_first, _win_first + 1, ...

    # ------------------------------------------------------------------------------------------ iteration
    def __iter__(self) -> EntryViews:
        return self

    def __next__(self) -> tuple[int, memoryview]:
        if self._it is None:
            if self.next_id != self._first:
                raise BadInput("entries already read with readinto cannot also be iterated")
            self._it = self._reader._views(self.next_id, self._last)
        return next(self._it)

    def close(self) -> None:
        if self._it is not None:
            self._it.close()

    # ------------------------------------------------------------------------------------------ readinto
    def lengths(self, first_id: int, n: int) -> list[int]:
        """Payload lengths of entries first_id.. (at most n; fewer at the end of the range, none past it).
        Reads nothing but frame offsets; consumes nothing."""
        if self._it is not None:
            raise BadInput("entries being iterated cannot also be read with readinto")
        stop = min(first_id + n, self._last + 1)
        if stop <= first_id:
            return []
        offs = self._offsets(first_id, stop)
        lens = [b - a - F.FRAME.size for a, b in zip(offs, offs[1:])]
        if min(lens) < 0 or max(lens) > F.MAX_PAYLOAD:
            k = next(k for k, size in enumerate(lens) if not 0 <= size <= F.MAX_PAYLOAD)
            raise F.corrupt(self._reader.path, offs[k], f"frame offsets give entry {first_id + k} a length of "
                                                        f"{lens[k]} bytes", "tier-1 ledger index")
        return lens

    def readinto(self, buf: memoryview, n: int) -> None:
        """Read the next n entries into buf as [len:u32][id:i64][payload] each, back to back; buf must be
        exactly their size. Each entry's id, length and crc are checked before this returns."""
        if n <= 0:
            return
        first = self.next_id
        lens = self.lengths(first, n)
        if len(lens) != n:
            raise BadInput(f"{n} entries asked for from entry {first}, {len(lens)} left in the range")
        if len(buf) != sum(lens) + _LEN_ID * n:
            raise BadInput(f"a buffer of {len(buf)} bytes for {n} entries of {sum(lens) + _LEN_ID * n}")
        path, fd = self._reader.path, self._reader._fd()
        pos = self._offsets(first, first + 1)[0]  # file offset of the group's first frame
        p = j = 0  # offset in buf, index in lens of the group's first entry
        while j < n:
            # a group: one preadv, then its checks while its bytes are still in the CPU's cache
            k, size = j, 0
            while k < n and k - j < _GROUP_ENTRIES and size < _GROUP_BYTES:
                size += _LEN_ID + lens[k]
                k += 1
            _read_group(fd, path, buf, p, pos, first + j, lens[j:k])
            p += size
            pos += size + 4 * (k - j)
            j = k
        self.next_id = first + n

    def _offsets(self, first: int, stop: int) -> array:
        """File offsets of frames first..stop (stop included: the end of frame stop - 1), from the window."""
        lo, hi = first - self._win_first, stop - self._win_first
        if lo < 0 or hi >= len(self._win):
            self._win_first = first
            self._win = self._reader._frame_offsets(first, min(max(stop, first + WINDOW), self._last + 1))
            lo, hi = 0, stop - first
        return self._win[lo:hi + 1]


def _read_group(fd: int, path, buf: memoryview, p: int, pos: int, first: int, lens: list[int]) -> None:
    """Entries first.. (of payload lengths `lens`), whose frames start at file offset `pos`, into buf at p."""
    n = len(lens)
    crc_raw = bytearray(4 * n)
    crcv = memoryview(crc_raw)
    # The file holds [len id][crc][payload][len id][crc][payload]...: each payload is followed by the next
    # frame's [len id], and the two are contiguous in buf too, so one buffer each; the crcs go aside.
    iov = [buf[p:p + _LEN_ID]]
    q = p
    for j, size in enumerate(lens):
        iov.append(crcv[4 * j:4 * j + 4])
        q += _LEN_ID
        iov.append(buf[q:q + size + (_LEN_ID if j + 1 < n else 0)])
        q += size
    _preadv_exact(fd, iov, pos, path)
    crcs = array("I", crc_raw)
    if sys.byteorder == "little":
        crcs.byteswap()
    unpack, crc32 = _HEADER.unpack_from, zlib.crc32
    for j, size in enumerate(lens):
        plen, entry_id = unpack(buf, p)
        i = first + j
        if entry_id != i:
            raise F.corrupt(path, pos, f"frame holds entry {entry_id}, expected {i}", "tier-1 ledger entry")
        if plen != size:
            raise F.corrupt(path, pos, f"entry {i} of {plen} bytes overruns its frame", "tier-1 ledger entry")
        if crc32(buf[p:p + _LEN_ID + size]) != crcs[j]:
            raise F.corrupt(path, pos, f"entry {i} fails its crc check", "tier-1 ledger entry")
        p += _LEN_ID + size
        pos += F.FRAME.size + size


def _preadv_exact(fd: int, views: list, offset: int, path) -> None:
    """Fill every view from the file at `offset` on, IOV_MAX buffers per call; a file that ends first is
    corrupt (truncated)."""
    k = 0
    while k < len(views):
        batch = views[k:k + _IOV_MAX]
        want = sum(map(len, batch))
        got = os.preadv(fd, batch, offset)
        if got == 0 and want:
            raise F.corrupt(path, offset, f"file ends {want} bytes early (truncated?)")
        offset += got
        if got == want:
            k += len(batch)
            continue
        # a short read (rare on a regular file): skip the buffers filled, trim the one filled in part
        while got >= len(views[k]):
            got -= len(views[k])
            k += 1
        views[k] = views[k][got:]
