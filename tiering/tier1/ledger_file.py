"""One file per ledger: write, seal and recover it (reading is `ledger_reader.py`'s; the byte format is in
`frames.py`).

Durability: `append` returns once the frame is in the OS (a killed process loses nothing it was told was
appended; a machine crash may lose unsynced entries, which recovery then cuts off cleanly). `flush()` fsyncs;
`seal()` fsyncs the file and its directory.

One writer per ledger (and a writer object has one owner: it is not thread-safe): it holds an exclusive
`flock` on its file until closed or sealed (the kernel releases it when the process dies), so a second
writer, or a recovery, of the same file fails instead of racing. Readers need no lock.
"""
from __future__ import annotations

import errno
import fcntl
import io
import os
import stat
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tiering.errors import BadInput, LedgerStorageError
from tiering.tier1 import frames as F


class LedgerFileExists(LedgerStorageError):
    """Creating a ledger file that already exists."""


class LedgerFileMissing(LedgerStorageError):
    """Opening a ledger file that does not exist."""


@dataclass(frozen=True)
class SealInfo:
    entry_count: int
    size_bytes: int  # sum of payload bytes
    file_bytes: int


@dataclass(frozen=True)
class RecoveryInfo:
    entry_count: int
    size_bytes: int
    truncated_bytes: int  # torn tail removed (0 for a clean or sealed file)


def fsync_dir(path: Path | str) -> None:
    """fsync a directory so a file's creation, rename or removal in it is durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise  # some file systems cannot fsync a directory; their metadata is synchronous anyway
    finally:
        os.close(fd)


def open_ledger_file(path: Path, flags: int) -> io.FileIO:
    """The ledger file's descriptor, which must be a regular file's: a directory, FIFO or device put in its
    place is a broken copy (CorruptObjectError, as a damaged file is: reads go on from tier 2 where there is a
    copy), never read or written. O_NONBLOCK so that opening a FIFO does not wait for a writer for ever (it
    changes nothing for a regular file)."""
    # FileIO owns the descriptor so a forgotten close is still closed (with a ResourceWarning) by the GC.
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except FileExistsError:
        raise LedgerFileExists(f"ledger file {path} already exists") from None
    except FileNotFoundError:
        raise LedgerFileMissing(f"ledger file {path} does not exist") from None
    except IsADirectoryError:
        raise F.corrupt(path, 0, _NOT_A_FILE) from None
    except OSError as exc:  # permissions, a dangling mount: the path and the reason, never a bare errno
        raise LedgerStorageError(f"ledger file {path} cannot be opened: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise F.corrupt(path, 0, _NOT_A_FILE)
    return io.FileIO(fd, "r+" if flags & os.O_RDWR else "r", closefd=True)


_NOT_A_FILE = "not a regular file: a directory, FIFO or device is in the ledger file's place"
_NOT_CUT = (": not a torn tail, nothing cut (sealing the ledger before it discards the intact entries after it: "
            "`tiering seal --discard-damaged`, an operator's decision)")


def _lock(file: io.FileIO, path: Path, shared: bool = False) -> None:
    try:
        fcntl.flock(file.fileno(), (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LedgerStorageError(f"ledger file {path} is being written by another writer") from None


@dataclass
class _State:
    count: int
    offsets: array  # frame offsets of an open file (a sealed file has its index on disk)
    size_bytes: int
    end: int
    sealed: bool
    truncated: int
    file_bytes: int
    version: int  # of the file's format: a resumed version 1 file stays one


def _recover_fd(fd: int, path: Path, discard_damaged: bool = False, has_row: bool = False,
                write: bool = True, before_discard: Callable[[DiscardPlan], None] | None = None) -> _State:
    """The state recovery leaves an open file in, cutting its torn tail (or writing the header a crash
    left out); `write` false: the same state, the file left as it is (would_recover). `before_discard` is
    told, before the cut, what `discard_damaged` cuts when that is more than a torn tail (intact entries
    after a damaged one): what readers lose is recorded first, so a kill after the cut loses no record."""
    length = os.fstat(fd).st_size
    head = F.header_state(fd, length, path)
    if head is None and has_row:
        raise F.corrupt(path, 0, HEADER_GONE)
    if head is None:
        # Crashed between creating the file and the header reaching the disk: an empty ledger.
        if write:
            os.ftruncate(fd, 0)
            F.write_all(fd, [F.header_bytes(False, path)], 0)
            os.fsync(fd)
        start = F.HEADER_LEN[F.VERSION]
        return _State(0, array("q"), 0, start, False, length, start, F.VERSION)
    if head.sealed:  # immutable: checked (every frame and the index), never changed
        t = F.read_trailer(fd, length, path, head.start)
        scan = F.scan_frames(fd, t.index_offset, path, verify=True, start=head.start)
        index = F.pread_exact(fd, length - F.TRAILER.size - t.index_offset, t.index_offset, path)
        if scan.end != t.index_offset or F.index_bytes(scan.offsets) != index:
            raise F.corrupt(path, scan.end, f"sealed file's frames and index disagree ({len(scan.offsets)} "
                                            f"readable of {t.entry_count} entries)")
        return _State(t.entry_count, array("q"), t.size_bytes, t.index_offset, True, 0, length, head.version)
    scan = F.scan_frames(fd, length, path, verify=True, start=head.start)
    if scan.end < length:
        damage = None if discard_damaged else F.damage_inside(fd, length, scan, path, _NOT_CUT)
        if damage is not None:
            raise damage
        if write and before_discard is not None:
            last = F.last_intact_after(fd, length, scan, path)
            if last is not None:
                cut = length - scan.end - F.FRAME.size * (last - len(scan.offsets) + 1)
                before_discard(DiscardPlan(len(scan.offsets), max(0, cut), last))
        if write:
            os.ftruncate(fd, scan.end)
            os.fsync(fd)
    return _State(len(scan.offsets), scan.offsets, scan.size_bytes, scan.end, False, length - scan.end, scan.end,
                  head.version)


def would_recover(path: Path | str) -> RecoveryInfo:
    """What `recover` (and so a seal of the file) would leave of an open ledger's file, the file unchanged:
    its entries before a torn tail, CorruptObjectError for damage it would refuse to cut, LedgerStorageError
    when a live writer holds the file (found by taking its lock shared, and giving it back at once: held
    for the scan, it would refuse a producer opening the file meanwhile; one appending during the scan
    only adds a tail the scan does not count)."""
    path = Path(path)
    with open_ledger_file(path, os.O_RDONLY) as file:
        _lock(file, path, shared=True)
        fcntl.flock(file.fileno(), fcntl.LOCK_UN)
        st = _recover_fd(file.fileno(), path, write=False)
    return RecoveryInfo(st.count, st.size_bytes, st.truncated)


@dataclass(frozen=True)
class DiscardPlan:
    """What `discard_damaged` cuts of an open file, told before the cut (`before_discard`)."""
    kept: int  # entries before the damage
    # payload bytes of the entries cut, as near as a damaged file tells: its bytes from the damage on less a
    # frame's header per entry (retention counts a loss in payload bytes too)
    payload_bytes: int
    last_intact: int | None  # the last intact entry after the damage (None: a torn tail, nothing intact cut)


# A writer makes a ledger's file and fsyncs its header before the ledger's row exists (writer.py): a file
# without a header under a row was cut short or replaced, and starting it afresh would hand out its
# positions a second time.
HEADER_GONE = "its header is gone (cut short or replaced) though its ledger is recorded: its entries are lost"


def recover(path: Path | str, discard_damaged: bool = False) -> RecoveryInfo:
    """Cut an open ledger's torn tail (partial frame, bad crc, garbage) after its last complete entry.

    A damaged frame with an intact later entry after it is corruption, not a torn tail: CorruptObjectError,
    nothing cut, unless `discard_damaged` (the intact entries after it go too). A sealed file is checked and
    left as is. Fails if a live writer holds the file.
    """
    path = Path(path)
    with open_ledger_file(path, os.O_RDWR) as file:
        _lock(file, path)
        st = _recover_fd(file.fileno(), path, discard_damaged)
    return RecoveryInfo(st.count, st.size_bytes, st.truncated)


class LedgerWriter:
    """Appends entries to one ledger file, then seals it.

    `LedgerWriter(path)` creates the file (LedgerFileExists if it exists); `open_existing=True` opens an
    existing one (LedgerFileMissing if absent) after recovering its torn tail (`.recovery` says what was cut;
    a damaged entry with intact ones after it is cut only with `discard_damaged`, see `recover`; `has_row`:
    the ledger is recorded, so a file without a header is not a crashed creation but a lost one).
    Opening a sealed file gives a writer with `sealed == True` whose `seal()` returns the file's SealInfo and
    whose `append` fails (a crash between sealing the file and recording it in the metadata leaves that).
    """

    def __init__(self, path: Path | str, *, open_existing: bool = False, discard_damaged: bool = False,
                 has_row: bool = False, before_discard: Callable[[DiscardPlan], None] | None = None):
        self.path = Path(path)
        self.recovery: RecoveryInfo | None = None
        flags = os.O_RDWR if open_existing else os.O_RDWR | os.O_CREAT | os.O_EXCL
        self._file = open_ledger_file(self.path, flags)
        made = False  # a file this writer created and locked while still empty: its own to remove on failure
        try:
            _lock(self._file, self.path)
            fd = self._file.fileno()
            if open_existing:
                st = _recover_fd(fd, self.path, discard_damaged, has_row, before_discard=before_discard)
            else:
                # Between the exclusive create and the lock, another writer may have taken the new, empty file
                # for a crashed writer's leftover (open_existing), written its header and entries, and even
                # sealed and closed it: the file is that writer's, and writing a header would undo its seal.
                if os.fstat(fd).st_size:
                    raise LedgerStorageError(f"ledger file {self.path} is being written by another writer")
                made = True
                F.write_all(fd, [F.header_bytes(False, self.path)], 0)
                os.fsync(fd)  # the header is durable before anyone relies on the file
                fsync_dir(self.path.parent)
                start = F.HEADER_LEN[F.VERSION]
                st = _State(0, array("q"), 0, start, False, 0, start, F.VERSION)
        except BaseException:
            self._file.close()
            if made:  # don't leave a headerless file that blocks a retry; never remove another writer's file
                self.path.unlink(missing_ok=True)
            raise
        self._offsets = st.offsets
        self._version = st.version
        self._size = st.size_bytes
        self._end = st.end
        self._broken: str | None = None
        self._seal_info = None
        if st.sealed:
            self._seal_info = SealInfo(st.count, st.size_bytes, st.file_bytes)
            self._file.close()  # immutable: nothing to write, no lock needed
        if open_existing:
            self.recovery = RecoveryInfo(self.entry_count, self._size, st.truncated)

    @property
    def entry_count(self) -> int:
        return self._seal_info.entry_count if self._seal_info else len(self._offsets)

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def file_bytes(self) -> int:
        return self._seal_info.file_bytes if self._seal_info else self._end

    @property
    def sealed(self) -> bool:
        return self._seal_info is not None

    @property
    def closed(self) -> bool:
        return self._file.closed

    def _check_writable(self, what: str) -> None:
        if self._file.closed:
            raise LedgerStorageError(f"cannot {what} ledger file {self.path}: writer is closed")
        if self._broken:
            raise LedgerStorageError(f"cannot {what} ledger file {self.path}: an earlier write failed "
                                     f"({self._broken}); reopen it to recover")

    def append(self, payload: bytes | bytearray | memoryview) -> int:
        """Write one entry; returns its id once the frame is in the OS (not yet fsynced)."""
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise BadInput(f"an entry must be bytes, got {type(payload).__name__}")
        data = payload if isinstance(payload, bytes) else bytes(payload)  # a copy cannot change mid-write
        if len(data) > F.MAX_PAYLOAD:
            raise BadInput(f"entry of {len(data)} bytes exceeds the maximum of {F.MAX_PAYLOAD}")
        if self.sealed:
            raise LedgerStorageError(f"cannot append to sealed ledger file {self.path}")
        self._check_writable("append to")
        entry_id = len(self._offsets)
        try:
            F.write_all(self._file.fileno(), [F.frame_header(entry_id, data), data], self._end)
        except OSError as e:
            self._undo(e)
            raise LedgerStorageError(f"append to ledger file {self.path} failed: {e}") from e
        self._offsets.append(self._end)
        self._end += F.FRAME.size + len(data)
        self._size += len(data)
        return entry_id

    def _undo(self, error: OSError) -> None:
        # A partial frame may be on disk; cut it so the next append starts at a frame boundary.
        try:
            os.ftruncate(self._file.fileno(), self._end)
        except OSError:
            self._broken = str(error)  # recovery on reopen will cut it instead

    def flush(self) -> None:
        """Make every appended entry durable (fsync); a no-op once sealed."""
        if self.sealed:
            return
        self._check_writable("flush")
        os.fsync(self._file.fileno())

    def seal(self) -> SealInfo:
        """Write the offset index and trailer, fsync file and directory, close the file. Idempotent."""
        if self._seal_info is not None:
            return self._seal_info
        self._check_writable("seal")
        fd = self._file.fileno()
        count = len(self._offsets)
        footer = [F.index_bytes(self._offsets), F.TRAILER.pack(count, self._end, F.SEAL_MAGIC)]
        file_bytes = self._end + count * F.OFFSET.size + F.TRAILER.size
        try:
            F.write_all(fd, footer, self._end)
            os.fsync(fd)  # the footer is durable before the flag that says it is valid
            F.write_all(fd, [F.header_bytes(True, self.path, self._version)], 0)
            os.fsync(fd)
            fsync_dir(self.path.parent)
        except OSError as e:
            self._broken = str(e)
            raise LedgerStorageError(f"sealing ledger file {self.path} failed: {e}") from e
        self._seal_info = SealInfo(count, self._size, file_bytes)
        self._offsets = array("q")  # no longer needed
        self._file.close()  # a sealed file is immutable: release the descriptor and the lock now
        return self._seal_info

    def close(self) -> None:
        """Release the file (and its lock) without sealing. Idempotent."""
        self._file.close()

    def __enter__(self) -> "LedgerWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LedgerWriter({str(self.path)!r}, entries={self.entry_count}, sealed={self.sealed})"
