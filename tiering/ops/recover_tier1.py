"""What tier 1 tells recovery about a topic: the ledger files the bucket alone cannot know.

A topic's tier-1 directory may hold ledgers that were never offloaded (sealed, or the open one), and copies
of offloaded ledgers not deleted yet. Ignoring them left the topic unwritable: `next_ledger_id` stopped at
the largest offloaded ledger, so the next producer tried to create a file that exists. So, per topic:

- every ledger file (and every tombstone of a deletion in progress) moves `next_ledger_id` past itself,
  whatever else is decided about it: a producer never collides with a file again;
- a sealed file of a ledger the bucket does not hold is adopted as SEALED with `tier1_present`, its entry
  count and payload bytes read from the file's trailer (the reader checks its header, seal flag and
  trailer; every entry's CRC is checked when it is read, as for any tier-1 ledger). Its seal time is the
  file's modification time (sealing writes the file last), so offload-by-age treats it as it would have;
- an open (unsealed) file is sealed first, then adopted the same way. Pulsar's managed ledger does the
  same on recovery (the last ledger is fenced and closed, writes go to a new one): the metadata then
  describes only immutable files, and sealing takes the file's writer lock, so a writer still running on
  it makes the topic fail with a clear error instead of two writers racing. A torn tail is cut first;
- the file of a ledger recovered from the bucket as OFFLOADED is recorded as its tier-1 copy
  (`tier1_present`, so delete-lagged removes it after the lag) when it is sealed with the same entry
  count and payload bytes as the index says; otherwise it is reported and left alone;
- files below the retention trim marker are reported, not adopted (retention had deleted them).

Files of ledgers the database already has are left alone (a rerun changes nothing).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import unquote

from tiering.errors import CorruptObjectError, LedgerStorageError, TieringError
from tiering.tier1 import LedgerFileMissing, LedgerReader, LedgerWriter, Tier1Store, topic_dir_name
from tiering.tier1.ledger_file import would_recover

_DIR_NAME = re.compile(r"^(?P<encoded>[A-Za-z0-9_%-]+)-[0-9a-f]{16}$")


@dataclass(frozen=True)
class Tier1Ledger:
    """A sealed ledger file (sealed now if it was open)."""

    ledger_id: int
    entry_count: int
    size_bytes: int
    sealed_at: datetime
    was_open: bool = False


@dataclass
class Tier1Scan:
    """One topic's ledger files as recovery sees them."""

    ledgers: dict[int, Tier1Ledger] = field(default_factory=dict)  # readable sealed files (open ones sealed)
    unreadable: list[tuple[int, str]] = field(default_factory=list)  # (ledger id, why): not adopted
    top: int = -1  # the largest ledger id of any file or tombstone: next_ledger_id goes past it
    copies: set[int] = field(default_factory=set)  # files that are verified copies of offloaded ledgers

    @property
    def ids(self) -> set[int]:
        return set(self.ledgers)


def topic_of_dir(name: str, tier1: Tier1Store | None = None) -> str | None:
    """The topic whose tier-1 directory is `name`: read from the name when it holds it whole (its encoding
    fits the directory name's readable part), else from the name `tier1` recorded in the directory (a long
    topic's, written beside its first ledger); either only if it makes exactly that directory name. None
    for a name tier 1 did not make, or a long topic's directory without its name file."""
    m = _DIR_NAME.match(name)
    if m is None:
        return None
    try:
        topic = unquote(m["encoded"], errors="strict")
    except UnicodeDecodeError:
        topic = None
    if topic and _makes(topic, name):
        return topic
    topic = tier1.recorded_name(name) if tier1 is not None else None
    return topic if topic and _makes(topic, name) else None


def _makes(topic: str, name: str) -> bool:
    try:
        return topic_dir_name(topic) == name
    except TieringError:
        return False



def topic_dirs(tier1: Tier1Store) -> list[str]:
    """Names of the directories under the tier-1 root (one per topic that has or had files); [] when the
    root does not exist."""
    try:
        with os.scandir(tier1.root) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
    except FileNotFoundError:
        return []


def scan_topic(tier1: Tier1Store, topic: str, known: set[int], seal: bool = True,
               check_entries: bool = False) -> Tier1Scan:
    """Read the topic's ledger files, except those of ledgers in `known` (the database has them: left
    alone), sealing open ones. An open file that cannot be sealed (a live writer holds it, an I/O error)
    raises LedgerStorageError: the topic must not be recovered while something writes to it. A file that
    cannot be read is reported, not adopted. `seal` false (a preview): an open file is left as it is and
    taken with the entries sealing it would keep (a torn tail not counted), the same refusals raised.
    `check_entries`: a sealed file's entries are all read and checked (CRCs, ids, its index), so one with a
    damaged entry is reported as unreadable (an open one's are checked as it is sealed)."""
    scan = Tier1Scan()
    ids = tier1.ledger_ids(topic)
    scan.top = max(ids + tier1.retired_ids(topic), default=-1)
    for lid in ids:
        if lid in known:
            continue
        path = tier1.path(topic, lid)
        try:
            with LedgerReader(path) as r:
                sealed, count, size = r.sealed, r.entry_count, r.size_bytes
                if check_entries and sealed:
                    for _ in r.iter_framed():
                        pass
        except LedgerFileMissing:
            continue  # deleted meanwhile (retention or delete-lagged of a live database): nothing to adopt
        except (CorruptObjectError, LedgerStorageError) as exc:
            scan.unreadable.append((lid, str(exc)))
            continue
        if not sealed:
            try:
                if seal:
                    # cuts a torn tail; fails if a writer holds it
                    with LedgerWriter(path, open_existing=True) as w:
                        info = w.seal()
                else:  # what sealing would keep, and whether a writer holds the file, the file left as it is
                    info = would_recover(path)
            except CorruptObjectError as exc:  # damaged inside, intact entries after: not for a recovery to cut
                scan.unreadable.append((lid, str(exc)))
                continue
            except LedgerStorageError as exc:
                raise LedgerStorageError(f"open ledger {lid} of topic {topic!r} cannot be sealed in tier 1 "
                                         f"({exc}); stop its producer, then rerun the recovery") from None
            count, size = info.entry_count, info.size_bytes
        mtime = os.stat(path).st_mtime
        scan.ledgers[lid] = Tier1Ledger(lid, count, size, datetime.fromtimestamp(mtime, timezone.utc), not sealed)
    return scan


__all__ = ["Tier1Ledger", "Tier1Scan", "scan_topic", "topic_dirs", "topic_of_dir"]
