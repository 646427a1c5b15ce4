"""Reading one ledger file, sealed or open (writing, sealing and recovery are `ledger_file.py`'s; the byte
format is in `frames.py`).

Readers need no lock. A reader keeps its file descriptor open, so on POSIX it goes on reading a file that is
deleted (unlinked) meanwhile. A reader of an open ledger sees the entries complete when it was opened.
"""
from __future__ import annotations

import operator
import os
from array import array
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from tiering.errors import BadInput, EntryNotFound, LedgerStorageError
from tiering.tier1 import frames as F
from tiering.tier1.ledger_file import open_ledger_file

if TYPE_CHECKING:
    from tiering.format.packing import FramedRun


class LedgerReader:
    """Reads a ledger file, sealed (one seek per entry through the footer index) or open (scanned once).

    Entries are read with pread through the reader's own descriptor, so it keeps working after the file
    is unlinked, and several iterators may run at once. Every payload's crc is checked.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self._file = open_ledger_file(self.path, os.O_RDONLY)
        try:
            fd = self._file.fileno()
            length = os.fstat(fd).st_size
            self.file_bytes = length
            self._offsets: array | None = None
            head = F.header_state(fd, length, self.path)
            self.headerless = head is None
            if head is None:  # being created right now: an open ledger with no entries yet
                self.sealed, self._count, self.size_bytes = False, 0, 0
                self._start = self._end = F.HEADER_LEN[F.VERSION]
                self._offsets = array("q")
                return
            self.sealed, self._start = head.sealed, head.start
            if self.sealed:
                # the writer sets the flag only after its footer is written: the length taken before the
                # header may be an open ledger's, from before a seal, whose last bytes are no trailer
                length = self.file_bytes = os.fstat(fd).st_size
                t = F.read_trailer(fd, length, self.path, self._start)
                self._count, self.size_bytes, self._end = t.entry_count, t.size_bytes, t.index_offset
            else:  # headers only; a frame a live writer is still writing is not yet counted
                scan = F.scan_frames(fd, length, self.path, verify=False, start=self._start)
                # not a frame a live writer is still writing: one is damaged and intact ones follow it
                if (damage := F.damage_inside(fd, length, scan, self.path)) is not None:
                    raise damage
                self._offsets, self._count, self.size_bytes, self._end = \
                    scan.offsets, len(scan.offsets), scan.size_bytes, scan.end
        except BaseException:
            self._file.close()
            raise

    @property
    def entry_count(self) -> int:
        return self._count

    def _fd(self) -> int:
        if self._file.closed:
            raise LedgerStorageError(f"reader of ledger file {self.path} is closed")
        return self._file.fileno()

    def _offset(self, i: int) -> int:
        """File offset of frame i, or the end of the frames for i == entry_count."""
        if i == self._count:
            return self._end
        if self._offsets is not None:
            return self._offsets[i]
        at = self._end + i * F.OFFSET.size
        (offset,) = F.OFFSET.unpack(F.pread_exact(self._fd(), F.OFFSET.size, at, self.path))
        if not self._start <= offset <= self._end - F.FRAME.size:
            raise F.corrupt(self.path, at, f"index entry {i} points at {offset}, outside the frames")
        if i == 0 and offset != self._start:  # else the bytes skipped (a payload holding a frame) pass unread
            raise F.corrupt(self.path, at, f"index entry 0 points at {offset}, but the frames start at {self._start}")
        return offset

    def _check_id(self, i: object) -> int:
        try:
            i = operator.index(i)
        except TypeError:
            raise BadInput(f"entry id must be an integer, got {i!r}") from None
        if not 0 <= i < self._count:
            raise EntryNotFound(f"entry {i} is not in ledger file {self.path} ({self._count} entries)")
        return i

    def _decode(self, i: int, offset: int, raw: bytes, payload_of) -> bytes:
        plen, entry_id, crc = F.FRAME.unpack(raw)
        if entry_id != i:
            raise F.corrupt(self.path, offset, f"frame holds entry {entry_id}, expected {i}", "tier-1 ledger entry")
        if plen > F.MAX_PAYLOAD:  # no writer makes one: tier 2's framing could not hold it
            raise F.corrupt(self.path, offset, f"entry {i} claims {plen} bytes, more than an entry may hold",
                            "tier-1 ledger entry")
        payload = payload_of(plen)
        if payload is None:
            raise F.corrupt(self.path, offset, f"entry {i} of {plen} bytes overruns its frame", "tier-1 ledger entry")
        if F.frame_crc(plen, entry_id, payload) != crc:
            raise F.corrupt(self.path, offset, f"entry {i} fails its crc check", "tier-1 ledger entry")
        return payload

    def read_entry(self, i: int) -> bytes:
        """The payload of entry i (EntryNotFound outside 0..entry_count-1)."""
        i = self._check_id(i)
        fd = self._fd()
        offset = self._offset(i)
        limit = self._offset(i + 1) if self._offsets is not None else self._end
        raw = F.pread_exact(fd, F.FRAME.size, offset, self.path)

        def payload_of(plen: int) -> bytes | None:
            if offset + F.FRAME.size + plen > limit:
                return None
            return F.pread_exact(fd, plen, offset + F.FRAME.size, self.path)
        return self._decode(i, offset, raw, payload_of)

    def iter_entries(self, first: int = 0, last: int | None = None) -> Iterator[tuple[int, bytes]]:
        """Yield (entry_id, payload) for first..last inclusive (last defaults to the final entry), streaming.

        The range is checked now (EntryNotFound); an empty range is first == last + 1.
        """
        return self._stream(*self._range(first, last))

    def _range(self, first: int, last: int | None) -> tuple[int, int]:
        """first..last checked (EntryNotFound); last defaults to the final entry."""
        first = operator.index(first)
        last = self._count - 1 if last is None else operator.index(last)
        if first < 0 or last >= self._count or first > last + 1:
            raise EntryNotFound(f"entries {first}..{last} are not in ledger file {self.path} "
                                f"({self._count} entries)")
        return first, last

    iter_payloads_with_ids = iter_entries

    def iter_framed(self, first: int = 0, last: int | None = None) -> Iterator["FramedRun"]:
        """Entries first..last as framed runs for the block packer (tiering/tier1/framed.py): read a run of
        frames at a time, every frame's id, extent and crc checked, each payload copied once into its run."""
        from tiering.tier1 import framed  # here, not at import: numpy only for an offload (the CLI starts light)
        first, last = self._range(first, last)
        return framed.runs(self._fd(), self.path, first, last, self._bounds, self._start, self._end,
                           self._stream)

    def _bounds(self, i: int, n: int):
        """The file offsets of frames i..i+n as int64s (n + 1 values; frame `entry_count` is the frames' end)."""
        import numpy as np
        if self._offsets is not None:  # an open file's, from its scan
            got = np.frombuffer(self._offsets, np.int64)[i:i + n + 1]
        else:
            k = min(n + 1, self._count - i)  # index entries from i
            raw = F.pread_exact(self._fd(), k * F.OFFSET.size, self._end + i * F.OFFSET.size, self.path)
            got = np.frombuffer(F.index_offsets(raw), np.int64)
        return got if len(got) == n + 1 else np.append(got, self._end)

    def _index_check(self, first: int):
        """A check of each frame's offset, as entries first.. are read in order, against the footer index of a
        sealed file (None for an open one: its offsets come from the scan). Random reads go through the index,
        so an index entry flipped in place fails the read of that entry; a whole read, and verify, would pass
        it unchecked. The index is read a slice at a time. (`iter_framed` reads frames through the index.)"""
        if self._offsets is not None:
            return None
        fd, path, count, at = self._fd(), self.path, self._count, self._end
        base, vals = first, array("q")  # the slice of the index read last, from entry `base`

        def check(i: int, offset: int) -> None:
            nonlocal base, vals
            if i - base >= len(vals):
                n = min(F.INDEX_SLICE, count - i)
                base, vals = i, F.index_offsets(F.pread_exact(fd, n * F.OFFSET.size, at + i * F.OFFSET.size, path))
            if vals[i - base] != offset:
                raise F.corrupt(path, at + i * F.OFFSET.size, f"index entry {i} says {vals[i - base]}, but entry "
                                                              f"{i}'s frame is at {offset}")
        return check

    def _stream(self, first: int, last: int) -> Iterator[tuple[int, bytes]]:
        if first > last:
            return
        fd = self._fd()
        check = self._index_check(first)
        stream = F.Stream(fd, self._offset(first), self._offset(last + 1), self.path)
        for i in range(first, last + 1):
            offset = stream.pos
            if check is not None:
                check(i, offset)
            raw = stream.read(F.FRAME.size)
            if raw is None:
                raise F.corrupt(self.path, offset, f"entry {i} is missing: frames end early", "tier-1 ledger entry")
            yield i, self._decode(i, offset, raw, stream.read)
        if stream.pos != stream.end:
            raise F.corrupt(self.path, stream.pos, f"{stream.end - stream.pos} unexpected bytes after entry {last}")

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "LedgerReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LedgerReader({str(self.path)!r}, entries={self._count}, sealed={self.sealed})"
