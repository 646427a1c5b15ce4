"""The bytes of a tier-1 ledger file (big-endian throughout); no policy, only encoding and scanning.

    header   [4s magic b"TLG1"][u8 version=1][u8 flags][u16 reserved=0]          8 bytes
    frame    [u32 len][i64 entry_id][u32 crc][payload]                          16 + len bytes, ids 0,1,2,...
    footer   [i64 offset of frame k] * n                                         only when sealed
    trailer  [i64 entry_count][i64 index_offset][4s b"SEAL"]                    20 bytes, only when sealed

`crc` is the CRC-32 of zlib (`crc32` below) over the frame's first 12 bytes (len, entry_id) and then the payload. Covering the header
matters: a tail that a crash left zero-filled would otherwise parse as a valid empty entry 0 (crc32(b"") == 0).

Flag bit 0 (`SEALED`) is set in the header only after the footer is durable, so it cannot be forged by a
payload that happens to end like a trailer, and a crash mid-seal leaves an open ledger whose footer is a
garbage tail that recovery cuts off.
"""
from __future__ import annotations

import os
import struct
import sys
from array import array
from dataclasses import dataclass

# zlib's CRC-32, the same values, from ISA-L: ~15x zlib's speed on one 8 MiB buffer and ~3x on 4 KiB
# entries (it uses the CPU's carry-less multiply), and every offloaded byte of tier 1 is checked with it
from isal.isal_zlib import crc32

from tiering.errors import CorruptObjectError

MAGIC = b"TLG1"
VERSION = 1
FLAG_SEALED = 0x01
SEAL_MAGIC = b"SEAL"
HEADER = struct.Struct(">4sBBH")
FRAME = struct.Struct(">IqI")
_LEN_ID = struct.Struct(">Iq")
TRAILER = struct.Struct(">qq4s")
OFFSET = struct.Struct(">q")
MAX_PAYLOAD = 2**31 - 1  # PIP-17 (tier 2) stores an entry's length as int32
CHUNK = 1 << 20  # streaming reads never hold more than about this much besides one payload
SKIP_AHEAD = 4096
SCAN_AHEAD = 64 * 1024

_pread = os.pread  # indirection so tests can count the bytes a read really fetches


def header_bytes(sealed: bool) -> bytes:
    return HEADER.pack(MAGIC, VERSION, FLAG_SEALED if sealed else 0, 0)


def frame_crc(length: int, entry_id: int, payload) -> int:
    return crc32(payload, crc32(_LEN_ID.pack(length, entry_id)))


def frame_header(entry_id: int, payload) -> bytes:
    return FRAME.pack(len(payload), entry_id, frame_crc(len(payload), entry_id, payload))


def index_bytes(offsets: array) -> bytes:
    data = array("q", offsets)
    if sys.byteorder == "little":
        data.byteswap()
    return data.tobytes()


def corrupt(path, offset: int, detail: str, what: str = "tier-1 ledger file") -> CorruptObjectError:
    return CorruptObjectError(what, f"{path}@{offset}", detail, tier=1)


def pread_exact(fd: int, n: int, offset: int, path) -> bytes:
    parts = []
    got = 0
    while got < n:
        part = _pread(fd, n - got, offset + got)
        if not part:
            raise corrupt(path, offset + got, f"file ends {n - got} bytes early (truncated?)")
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def write_all(fd: int, buffers, offset: int) -> None:
    """pwritev every byte of `buffers` at `offset` (a regular file may still take a short write)."""
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if len(v)]
    while views:
        n = os.pwritev(fd, views, offset)
        if n <= 0:
            raise OSError(f"pwritev wrote {n} bytes")
        offset += n
        while n:
            if n >= len(views[0]):
                n -= len(views.pop(0))
            else:
                views[0] = views[0][n:]
                n = 0


class Stream:
    """Sequential reads of the byte range [pos, end) of a file by pread, one chunk at a time.

    Per-iterator state (no shared file position), so several iterators and `read_entry` calls can use one
    descriptor at once.
    """

    def __init__(self, fd: int, pos: int, end: int, path, chunk: int = CHUNK):
        self.fd, self.pos, self.end, self.path, self.chunk = fd, pos, end, path, chunk
        self._buf = b""
        self._off = 0
        self._skipped = False  # the last consume jumped over unread bytes: payloads are being skipped

    def read(self, n: int) -> bytes | None:
        """Exactly n bytes, or None when the range ends first (nothing consumed)."""
        if n > self.end - self.pos:
            return None
        if len(self._buf) - self._off >= n:
            out = self._buf[self._off:self._off + n]
            self._off += n
        else:
            head = self._buf[self._off:]
            at = self.pos + len(head)
            # While skipping payloads (counting frames), read ahead only a little: a frame header.
            ahead = SKIP_AHEAD if self._skipped else self.chunk
            fetch = max(n - len(head), min(ahead, self.end - at))
            self._buf = head + pread_exact(self.fd, fetch, at, self.path)
            out = self._buf[:n]
            self._off = n
        self.pos += n
        return out

    def consume(self, n: int, crc: int | None = None) -> int | None:
        """Advance n bytes: skipped unread, or read in chunks to extend `crc`. None if the range ends first."""
        if n > self.end - self.pos:
            return None
        take = min(n, len(self._buf) - self._off)
        if crc is not None and take:
            crc = crc32(memoryview(self._buf)[self._off:self._off + take], crc)
        self._off += take
        self.pos += take
        rest = n - take
        self._skipped = bool(rest) and crc is None
        if rest:
            self._buf, self._off = b"", 0
        while rest and crc is not None:
            piece = pread_exact(self.fd, min(self.chunk, rest), self.pos, self.path)
            crc = crc32(piece, crc)
            self.pos += len(piece)
            rest -= len(piece)
        self.pos += rest
        return crc if crc is not None else 0


@dataclass
class Scan:
    offsets: array  # file offset of each complete frame
    size_bytes: int  # sum of their payload lengths
    end: int  # offset just after the last complete frame


def scan_frames(fd: int, length: int, path, verify: bool) -> Scan:
    """Walk frames from the header to the first one that is incomplete or wrong (id, and crc if `verify`).

    Without `verify` payloads are skipped unread (counting an open ledger); with it they are streamed through
    the crc (recovery), so memory stays bounded either way.
    """
    offsets = array("q")
    size = 0
    end = HEADER.size
    # Counting reads little ahead (mostly frame headers); verifying reads everything anyway.
    stream = Stream(fd, HEADER.size, length, path, CHUNK if verify else SCAN_AHEAD)
    while True:
        start = stream.pos
        raw = stream.read(FRAME.size)
        if raw is None:
            break
        plen, entry_id, crc = FRAME.unpack(raw)
        if entry_id != len(offsets) or plen > MAX_PAYLOAD:
            break
        # A frame without payload is checked even when counting (its crc costs nothing): an empty ledger's
        # footer, written before the sealed flag, is a trailer alone whose bytes parse as such a frame.
        check = verify or plen == 0
        got = stream.consume(plen, crc32(raw[:_LEN_ID.size]) if check else None)
        if got is None or (check and got != crc):
            break
        offsets.append(start)
        size += plen
        end = stream.pos
    return Scan(offsets, size, end)


@dataclass(frozen=True)
class Trailer:
    entry_count: int
    index_offset: int
    size_bytes: int


def read_trailer(fd: int, length: int, path) -> Trailer:
    """Parse and check a sealed file's trailer against the file's length."""
    if length < HEADER.size + TRAILER.size:
        raise corrupt(path, 0, f"sealed file of {length} bytes is too short for a trailer")
    count, index_offset, magic = TRAILER.unpack(pread_exact(fd, TRAILER.size, length - TRAILER.size, path))
    if magic != SEAL_MAGIC:
        raise corrupt(path, length - TRAILER.size, f"trailer magic {magic!r}, expected {SEAL_MAGIC!r}")
    if count < 0 or index_offset < HEADER.size or index_offset - HEADER.size < count * FRAME.size \
            or index_offset + count * OFFSET.size + TRAILER.size != length:
        raise corrupt(path, length - TRAILER.size,
                      f"trailer (entries {count}, index at {index_offset}) does not fit a {length}-byte file")
    return Trailer(count, index_offset, index_offset - HEADER.size - count * FRAME.size)


def read_header(fd: int, length: int, path) -> tuple[bool, bytes]:
    """(sealed, raw header); raises on a header that is present but not ours."""
    raw = pread_exact(fd, HEADER.size, 0, path)
    magic, version, flags, _ = HEADER.unpack(raw)
    if magic != MAGIC:
        raise corrupt(path, 0, f"magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise corrupt(path, 4, f"format version {version}, this code reads {VERSION}")
    return bool(flags & FLAG_SEALED), raw
