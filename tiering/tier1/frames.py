"""The bytes of a tier-1 ledger file (big-endian throughout); no policy, only encoding and scanning.

    header   [4s magic b"TLG1"][u8 version=2][u8 flags][u16 reserved=0]          8 bytes
             [16s identity]                                                      16 bytes (version 2 only)
    frame    [u32 len][i64 entry_id][u32 crc][payload]                          16 + len bytes, ids 0,1,2,...
    footer   [i64 offset of frame k] * n                                         only when sealed
    trailer  [i64 entry_count][i64 index_offset][4s b"SEAL"]                    20 bytes, only when sealed

`crc` is the CRC-32 of zlib (`crc32` below) over the frame's first 12 bytes (len, entry_id) and then the payload. Covering the header
matters: a tail that a crash left zero-filled would otherwise parse as a valid empty entry 0 (crc32(b"") == 0).

`identity` ties the file to the place it was written: the first 16 bytes of SHA-256 over its topic
directory's name and its own file name (`identity_of`), which name the topic and the ledger. Every reader
and writer compares it with the path it opened, so another ledger's file copied or moved into a ledger's place
is refused even when it holds as many entries and bytes as the metadata records (frames carry only their
entry ids, which every ledger numbers from 0). The root is not part of it: a tier-1 root restored elsewhere
reads as before. Version 1 files (8-byte header, no identity) are still read and resumed as they are.

Flag bit 0 (`SEALED`) is set in the header only after the footer is durable, so it cannot be forged by a
payload that happens to end like a trailer, and a crash mid-seal leaves an open ledger whose footer is a
garbage tail that recovery cuts off.
"""
from __future__ import annotations

import hashlib
import os
import struct
import sys
from array import array
from dataclasses import dataclass

# zlib's CRC-32, the same values, from ISA-L: ~15x zlib's speed on one 8 MiB buffer and ~3x on 4 KiB
# entries (it uses the CPU's carry-less multiply), and every offloaded byte of tier 1 is checked with it
from isal.isal_zlib import crc32

from tiering.errors import CorruptObjectError, LedgerStorageError
from tiering.format.block import MAX_ENTRY_LEN

MAGIC = b"TLG1"
VERSION = 2
VERSION_WITHOUT_IDENTITY = 1
FLAG_SEALED = 0x01
SEAL_MAGIC = b"SEAL"
HEADER = struct.Struct(">4sBBH")  # the part every version shares
IDENTITY_LEN = 16
HEADER_LEN = {VERSION_WITHOUT_IDENTITY: HEADER.size, VERSION: HEADER.size + IDENTITY_LEN}  # where frames start
FRAME = struct.Struct(">IqI")
_LEN_ID = struct.Struct(">Iq")
TRAILER = struct.Struct(">qq4s")
OFFSET = struct.Struct(">q")
MAX_PAYLOAD = MAX_ENTRY_LEN  # what tier 2 can hold (its entry length is an int32)
CHUNK = 1 << 20  # streaming reads never hold more than about this much besides one payload
INDEX_SLICE = 8192  # footer index entries read at once by a whole read (64 KiB)
SKIP_AHEAD = 4096
SCAN_AHEAD = 64 * 1024

_pread = os.pread  # indirection so tests can count the bytes a read really fetches


def identity_of(path) -> bytes:
    """The identity a file at `path` must carry: its topic directory's and its own name, hashed."""
    path = os.fsencode(path)
    parent, name = os.path.split(path)
    return hashlib.sha256(b"tiering tier-1 ledger\0" + os.path.basename(parent) + b"/" + name).digest()[:IDENTITY_LEN]


def header_bytes(sealed: bool, path, version: int = VERSION) -> bytes:
    """The header of a file at `path` (a version 1 file keeps its version when sealed)."""
    prefix = HEADER.pack(MAGIC, version, FLAG_SEALED if sealed else 0, 0)
    return prefix if version == VERSION_WITHOUT_IDENTITY else prefix + identity_of(path)


def frame_crc(length: int, entry_id: int, payload) -> int:
    return crc32(payload, crc32(_LEN_ID.pack(length, entry_id)))


def frame_header(entry_id: int, payload) -> bytes:
    return FRAME.pack(len(payload), entry_id, frame_crc(len(payload), entry_id, payload))


def index_bytes(offsets: array) -> bytes:
    data = array("q", offsets)
    if sys.byteorder == "little":
        data.byteswap()
    return data.tobytes()


def index_offsets(raw: bytes) -> array:
    """The frame offsets a slice of the footer index holds (`index_bytes` read back)."""
    data = array("q", raw)
    if sys.byteorder == "little":
        data.byteswap()
    return data


def corrupt(path, offset: int, detail: str, what: str = "tier-1 ledger file") -> CorruptObjectError:
    return CorruptObjectError(what, f"{path}@{offset}", detail, tier=1)


def pread_exact(fd: int, n: int, offset: int, path) -> bytes:
    parts = []
    got = 0
    while got < n:
        try:
            part = _pread(fd, n - got, offset + got)
        except OSError as exc:  # an I/O error, a dead mount: the path and the reason, as opening says them
            raise LedgerStorageError(f"ledger file {path} cannot be read at byte {offset + got}: "
                                     f"{exc.strerror or exc}") from None
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


def scan_frames(fd: int, length: int, path, verify: bool, start: int, first_id: int = 0) -> Scan:
    """Walk frames from `start` (the header's end, or a frame of entry `first_id`) to the first one that is
    incomplete or wrong (id, and crc if `verify`).

    Without `verify` payloads are skipped unread (counting an open ledger); with it they are streamed through
    the crc (recovery), so memory stays bounded either way.
    """
    offsets = array("q")
    size = 0
    end = start
    # Counting reads little ahead (mostly frame headers); verifying reads everything anyway.
    stream = Stream(fd, start, length, path, CHUNK if verify else SCAN_AHEAD)
    while True:
        start = stream.pos
        raw = stream.read(FRAME.size)
        if raw is None:
            break
        plen, entry_id, crc = FRAME.unpack(raw)
        if entry_id != first_id + len(offsets) or plen > MAX_PAYLOAD:
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


def intact_after(fd: int, length: int, end: int, next_id: int, path) -> int | None:
    """Where an intact frame of a later entry (id above `next_id`) starts after `end`, where a scan stopped
    at entry `next_id`, or None. A crash tears only what was written last (a frame cut short, a zero-filled or
    garbage tail), after which no intact frame of a later entry follows; one that does means the frames at
    `end` were damaged inside the ledger (flipped bits, a zeroed page), and cutting there would discard the
    intact entries after it. Every offset is a candidate: the id a frame would hold there is read for all of
    them at once (numpy, eight strided views of big-endian int64), and only ids in range (each frame takes at
    least 16 bytes) are checked by their CRC. A chunk at a time, so memory stays bounded."""
    import numpy as np  # only here: a recovery that found more than a torn frame

    top = next_id + (length - end) // FRAME.size
    pos = end + 1
    while pos + FRAME.size <= length:
        data = pread_exact(fd, min(CHUNK + FRAME.size, length - pos), pos, path)
        hits = []
        for k in range(8):
            vals = np.frombuffer(data, dtype=">i8", offset=k, count=(len(data) - k) // 8)
            found = np.flatnonzero((vals > next_id) & (vals <= top))
            hits += [(pos + k + 8 * int(j) - 4, int(vals[j])) for j in found]  # the id is 4 bytes into its frame
        for start, entry_id in sorted(hits):
            if start > end and _is_frame(fd, length, start, entry_id, path):
                return start
        pos += CHUNK  # the next chunk overlaps this one by a frame header
    return None


def last_intact_after(fd: int, length: int, scan: Scan, path) -> int | None:
    """The id of the last intact entry after where `scan` stopped at a damaged frame (runs of intact frames
    found one after another by `intact_after`), or None when none follows (a torn tail): the entries a cut
    at the damage would discard end there, at least."""
    end, next_id, last = scan.end, len(scan.offsets), None
    while end < length and (start := intact_after(fd, length, end, next_id, path)) is not None:
        first = FRAME.unpack(pread_exact(fd, FRAME.size, start, path))[1]
        run = scan_frames(fd, length, path, verify=True, start=start, first_id=first)
        last = first + len(run.offsets) - 1
        end, next_id = run.end, last + 1
    return last


def damage_inside(fd: int, length: int, scan: Scan, path, advice: str = "") -> CorruptObjectError | None:
    """The error for an open file whose scan stopped before its end at a damaged frame with an intact later
    entry after it (`intact_after`), `advice` appended, or None when what follows the scan is a torn tail (or
    nothing)."""
    if scan.end >= length:
        return None
    later = intact_after(fd, length, scan.end, len(scan.offsets), path)
    if later is None:
        return None
    return corrupt(path, scan.end, f"entry {len(scan.offsets)} is damaged and an intact later entry follows at "
                                   f"offset {later}{advice}")


def _is_frame(fd: int, length: int, start: int, entry_id: int, path) -> bool:
    if start + FRAME.size > length:
        return False
    plen, got, crc = FRAME.unpack(pread_exact(fd, FRAME.size, start, path))
    if got != entry_id or plen > MAX_PAYLOAD or start + FRAME.size + plen > length:
        return False
    stream = Stream(fd, start + FRAME.size, start + FRAME.size + plen, path)
    return stream.consume(plen, crc32(_LEN_ID.pack(plen, got))) == crc


@dataclass(frozen=True)
class Trailer:
    entry_count: int
    index_offset: int
    size_bytes: int


def read_trailer(fd: int, length: int, path, start: int) -> Trailer:
    """Parse and check a sealed file's trailer against the file's length (frames from `start`)."""
    if length < start + TRAILER.size:
        raise corrupt(path, 0, f"sealed file of {length} bytes is too short for a trailer")
    count, index_offset, magic = TRAILER.unpack(pread_exact(fd, TRAILER.size, length - TRAILER.size, path))
    if magic != SEAL_MAGIC:
        raise corrupt(path, length - TRAILER.size, f"trailer magic {magic!r}, expected {SEAL_MAGIC!r}")
    if count < 0 or index_offset < start or index_offset - start < count * FRAME.size \
            or index_offset + count * OFFSET.size + TRAILER.size != length:
        raise corrupt(path, length - TRAILER.size,
                      f"trailer (entries {count}, index at {index_offset}) does not fit a {length}-byte file")
    return Trailer(count, index_offset, index_offset - start - count * FRAME.size)


@dataclass(frozen=True)
class Header:
    sealed: bool
    version: int
    start: int  # where the first frame starts


def header_state(fd: int, length: int, path) -> Header | None:
    """The file's header, or None when it has none yet: a file no longer than a header whose header is cut
    short or zero-filled (a writer made it and crashed before the header reached the disk: no entry follows).
    Raises on a header that is present but not ours, or not this path's (`identity_of`)."""
    raw = pread_exact(fd, min(length, HEADER_LEN[VERSION]), 0, path)
    headerless = length <= HEADER_LEN[VERSION]
    if len(raw) < HEADER.size or (headerless and not any(raw[:HEADER.size])):
        return None
    magic, version, flags, _ = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise corrupt(path, 0, f"magic {magic!r}, expected {MAGIC!r}")
    if version not in HEADER_LEN:
        raise corrupt(path, 4, f"format version {version}, this code reads {sorted(HEADER_LEN)}")
    identity = raw[HEADER.size:HEADER_LEN[version]]
    if len(raw) < HEADER_LEN[version] or (headerless and identity and not any(identity)):
        return None
    if version != VERSION_WITHOUT_IDENTITY and identity != identity_of(path):
        raise corrupt(path, HEADER.size, "the file belongs to another ledger (its identity is not this path's): "
                                         "another ledger's file was copied or moved here")
    return Header(bool(flags & FLAG_SEALED), version, HEADER_LEN[version])
