"""Tier 1: ledgers of topics as files under one root directory (local disk or a shared mount).

Layout: `{root}/{topic dir}/{ledger_id:020d}.ledger` (see `paths.py`). This layer stores bytes only; which
ledgers a topic has, and their states, live in the metadata. The root is created on the first write, not
before, so a read never creates directories (e.g. on an unmounted shared mount).
"""
from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Callable

from tiering.errors import LedgerStorageError
from tiering.model import Ledger, LedgerState
from tiering.tier1.frames import corrupt
from tiering.tier1.ledger_file import (HEADER_GONE, DiscardPlan, LedgerFileExists, LedgerFileMissing, LedgerWriter,
                                       RecoveryInfo, fsync_dir, recover)
from tiering.tier1.ledger_reader import LedgerReader
from tiering.tier1.paths import (LEDGER_FILE, NAME_FILE, NAME_FILE_MAX, ledger_id_of, ledger_path, name_fits,
                                 topic_dir)

_CREATE_ATTEMPTS = 5
RETIRED_SUFFIX = ".retired"
RETIRED_FILE = re.compile(r"^(\d{20})\.ledger\.retired$")


class Tier1Store:
    def __init__(self, root: Path | str):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Tier1Store({str(self.root)!r})"

    def path(self, topic: str, ledger_id: int) -> Path:
        """The file of a ledger (whether or not it exists)."""
        return ledger_path(self.root, topic, ledger_id)

    @staticmethod
    def _missing(topic: str, ledger_id: int) -> LedgerFileMissing:
        return LedgerFileMissing(f"ledger {ledger_id} of topic {topic!r} is not in tier 1")

    def create_ledger(self, topic: str, ledger_id: int) -> LedgerWriter:
        """A writer of a new, empty ledger (LedgerFileExists if it is already there)."""
        path = self.path(topic, ledger_id)
        for _ in range(_CREATE_ATTEMPTS):
            self._ensure_dir(path.parent)
            if not name_fits(topic):
                self._record_name(path.parent, topic)
            try:
                return LedgerWriter(path)
            except LedgerFileMissing:
                continue  # a concurrent delete removed the then-empty topic directory: make it again
            except LedgerFileExists:
                raise LedgerFileExists(f"ledger {ledger_id} of topic {topic!r} already exists in tier 1") from None
        raise LedgerStorageError(f"cannot create ledger {ledger_id} of topic {topic!r}: its directory "
                                 f"{path.parent} keeps disappearing")

    def check_root(self) -> None:
        """Make the root if it is missing; fail if it cannot be a directory (a file in the way). Writers
        call this before changing metadata, so a bad root leaves no ledger row without its file."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LedgerStorageError(f"tier-1 root {str(self.root)!r} is not a usable directory: "
                                     f"{exc.strerror or type(exc).__name__}") from None

    def _ensure_dir(self, directory: Path) -> None:
        if directory.is_dir():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            directory.mkdir()
        except FileExistsError:
            return
        fsync_dir(self.root)  # the new topic directory survives a crash along with its first ledger

    def open_writer(self, topic: str, ledger_id: int, discard_damaged: bool = False,
                    has_row: bool = True, before_discard: Callable[[DiscardPlan], None] | None = None
                    ) -> LedgerWriter:
        """A writer appending to an existing open ledger, after cutting a torn tail (see `.recovery`; a damaged
        entry with intact ones after it only with `discard_damaged`, `before_discard` told first what goes).
        `has_row` False: a file no row names yet (a producer killed between making it and recording it),
        which may lack its header."""
        try:
            return LedgerWriter(self.path(topic, ledger_id), open_existing=True, discard_damaged=discard_damaged,
                                has_row=has_row, before_discard=before_discard)
        except LedgerFileMissing:
            raise self._missing(topic, ledger_id) from None

    def recover(self, topic: str, ledger_id: int) -> RecoveryInfo:
        try:
            return recover(self.path(topic, ledger_id))
        except LedgerFileMissing:
            raise self._missing(topic, ledger_id) from None

    def reader(self, topic: str, ledger_id: int) -> LedgerReader:
        try:
            return LedgerReader(self.path(topic, ledger_id))
        except LedgerFileMissing:
            raise self._missing(topic, ledger_id) from None

    def reader_for(self, led: Ledger) -> LedgerReader:
        """The reader of `led`'s copy, which once the ledger is sealed (any state but OPEN) must hold the entries
        and payload bytes its row records: anything else (a copy cut short or grown) is corrupt
        (CorruptObjectError), and nothing is read from it. Opening checks the header's identity (another
        ledger's file copied here is refused); every frame's id and CRC are checked as it is read; for a file
        written before the identity (format version 1) these totals alone tell a foreign file."""
        reader = self._recorded_reader(led.topic, led.ledger_id)
        if led.state != LedgerState.OPEN and (reader.entry_count, reader.size_bytes) != (led.entry_count,
                                                                                         led.size_bytes):
            reader.close()
            raise corrupt(reader.path, 0, f"it holds {reader.entry_count} entries ({reader.size_bytes} bytes), "
                                          f"metadata says {led.entry_count} ({led.size_bytes})")
        return reader

    def written(self, topic: str, ledger_id: int) -> tuple[int, int]:
        """Entries and payload bytes in the ledger's file so far; (0, 0) when it has no file (gone since it
        was sealed and its copy deleted: callers ask the row again, read.open_ledger_now). A file that is
        there but cannot be opened (permissions, an I/O error, a dead mount) raises LedgerStorageError:
        counted empty, the entries written to it would silently be missing from reads and backlogs."""
        try:
            with self._recorded_reader(topic, ledger_id) as r:  # only an open ledger's is asked: it has a row
                return r.entry_count, r.size_bytes
        except LedgerFileMissing:
            return 0, 0

    def _recorded_reader(self, topic: str, ledger_id: int) -> LedgerReader:
        """The reader of a ledger that has a row. Its writer made the file and fsynced the header before the
        row existed, so a file without one is lost (CorruptObjectError), not one being created."""
        reader = self.reader(topic, ledger_id)
        if reader.headerless:
            reader.close()
            raise corrupt(reader.path, 0, HEADER_GONE)
        return reader

    def extent(self, led: Ledger) -> tuple[int, int]:
        """Entries and payload bytes of a ledger: its row's once sealed, its tier-1 file's while open (the
        metadata learns the counts at seal)."""
        if led.state != LedgerState.OPEN:
            return led.entry_count, led.size_bytes
        return self.written(led.topic, led.ledger_id)

    def exists(self, topic: str, ledger_id: int) -> bool:
        return self.path(topic, ledger_id).is_file()

    def check_place(self, topic: str, ledger_id: int) -> None:
        """Raise the broken copy's error (CorruptObjectError, naming the path) when something that is no
        regular file, a directory or a FIFO, is at the ledger's path; nothing when the path is free or a file."""
        path = self.path(topic, ledger_id)
        if not path.is_file() and os.path.lexists(path):
            self.reader(topic, ledger_id).close()

    def has_topic(self, topic: str) -> bool:
        """Whether this root holds the topic's directory (an empty or unmounted root does not)."""
        return topic_dir(self.root, topic).is_dir()

    def file_size(self, topic: str, ledger_id: int) -> int:
        """Bytes the ledger's file takes (headers, frames and footer included)."""
        try:
            return os.stat(self.path(topic, ledger_id)).st_size
        except FileNotFoundError:
            raise self._missing(topic, ledger_id) from None

    def delete(self, topic: str, ledger_id: int) -> bool:
        """Remove the ledger's file; False if it was already gone. Open readers keep reading it (POSIX)."""
        return self._unlink(self.path(topic, ledger_id))

    def _unlink(self, path: Path) -> bool:
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:  # a directory in a file's place, permissions: the path and why, left alone
            raise LedgerStorageError(f"cannot remove {path}: {exc.strerror or exc}") from None
        try:
            fsync_dir(path.parent)
        except FileNotFoundError:  # the topic's deletion removed the directory meanwhile: it fsyncs the root
            pass
        return True

    def _record_name(self, directory: Path, topic: str) -> None:
        """Write the topic's name to NAME_FILE in its directory unless it is there already: atomically (a
        temporary file renamed over it) and durably, before the topic's first ledger is."""
        # read as recovery reads it: a FIFO planted in its place must not hold the producer for ever; anything
        # but this name there (nothing, a damaged file) is replaced by the rename below, or the rename fails
        if self.recorded_name(directory.name) == topic:
            return
        data, path = topic.encode("utf-8"), directory / NAME_FILE
        tmp = directory / (NAME_FILE + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
            try:
                os.write(fd, data)  # under NAME_FILE_MAX: one write of a regular file takes it whole
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except FileNotFoundError:
            return  # the directory was removed meanwhile: the ledger's creation makes it again and comes back
        except OSError as exc:
            raise LedgerStorageError(f"cannot record the topic's name in {directory}/{NAME_FILE}: "
                                     f"{exc.strerror or type(exc).__name__}") from None
        fsync_dir(directory)

    def recorded_name(self, dir_name: str) -> str | None:
        """The name recorded in the directory `dir_name` under the root (a long topic's NAME_FILE), if it is a
        regular file of UTF-8 of a plausible length; whether it is that directory's topic is the caller's to
        check."""
        try:
            fd = os.open(self.root / dir_name / NAME_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, ValueError):
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO would block a read, a device answer anything
            os.close(fd)
            return None
        with os.fdopen(fd, "rb") as f:
            data = f.read(NAME_FILE_MAX + 1)
        try:
            return data.decode("utf-8") if 0 < len(data) <= NAME_FILE_MAX else None
        except UnicodeDecodeError:
            return None

    def remove_topic_dir(self, topic: str) -> None:
        """Remove the topic's directory once it is empty (the topic's deletion, after its last copy). Removing a
        ledger's copy leaves it: whether a root holds a topic is how a copy removed by hand is told from a
        wrong mount, and that must not change when a run is killed after removing the other copies."""
        directory = topic_dir(self.root, topic)
        for name in (NAME_FILE, NAME_FILE + ".tmp"):  # a long topic's name goes with its directory
            try:
                self._unlink(directory / name)
            except LedgerStorageError:
                pass  # something else in its place: left, and the directory with it (as below)
        try:
            directory.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return  # something not a ledger of ours was left there: kept
            raise LedgerStorageError(f"cannot remove the tier-1 directory {directory}: {exc.strerror}") from None
        fsync_dir(self.root)

    def ledger_ids(self, topic: str) -> list[int]:
        """Ids of the ledger files present for the topic, ascending."""
        directory = topic_dir(self.root, topic)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        return sorted(i for i in (ledger_id_of(LEDGER_FILE, n) for n in names) if i is not None)

    # -- deleting a copy in two steps (delete-lagged, retention) --
    # A missing file must fail the deletion (on a worker that does not see the shared root, "already gone"
    # would be a lie), yet a rerun after a kill between the unlink and the metadata update must succeed.
    # So the file is first renamed to a tombstone: "tombstone there" means "being deleted by us".

    def retired_path(self, topic: str, ledger_id: int) -> Path:
        path = self.path(topic, ledger_id)
        return path.with_name(path.name + RETIRED_SUFFIX)

    def retire(self, topic: str, ledger_id: int) -> None:
        """Rename the ledger's file to its tombstone (atomic, durable). Readers that opened it keep reading.
        LedgerFileMissing, naming the path, when neither the file nor its tombstone is there."""
        path, tomb = self.path(topic, ledger_id), self.retired_path(topic, ledger_id)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):  # renamed, it would be a tombstone nothing can remove
                raise corrupt(path, 0, "not a regular file: a directory, FIFO, device or link is in the ledger "
                                       "file's place; left alone")
            os.rename(path, tomb)
        except FileNotFoundError:
            if tomb.is_file():
                return  # a previous attempt was stopped after this step
            raise LedgerFileMissing(
                f"tier-1 copy of ledger {ledger_id} of topic {topic!r} is not at {path}: is {self.root} the "
                f"tier-1 root it was written to (the same shared mount on every worker)?") from None
        fsync_dir(path.parent)

    def purge_retired(self, topic: str, ledger_id: int) -> bool:
        """Remove the ledger's tombstone (after metadata recorded the deletion); False if there was none."""
        return self._unlink(self.retired_path(topic, ledger_id))

    def retired_ids(self, topic: str) -> list[int]:
        """Ledgers of the topic that have a tombstone, ascending."""
        try:
            names = os.listdir(topic_dir(self.root, topic))
        except FileNotFoundError:
            return []
        return sorted(i for i in (ledger_id_of(RETIRED_FILE, n) for n in names) if i is not None)
