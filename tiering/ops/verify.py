"""Verify a topic: read every ledger as readers do (tier 1 while its copy exists, else tier 2) and, for an
offloaded ledger that still has its tier-1 copy, its tier-2 copy too; compare counts, bytes and contents.
Returns a report (the CLI renders it); nothing is written."""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Callable

from tiering.errors import CorruptObjectError, DataLossError, EntryNotFound, LedgerStorageError
from tiering.metadata.repository import MetadataStore
from tiering.model import Ledger, LedgerState, Position
from tiering.read import DATALOSS, LAST_ENTRY, Gap, ReadHandle
from tiering.tier1 import Tier1Store

REPAIRABLE = " (repairable: `tiering repair` re-makes the tier-2 copy from the verified tier-1 copy)"
DIFFERS = "differs from the tier-1 copy"
# both copies pass every check of their own (each CRC, counts and bytes as metadata says): nothing tells which
# holds the ledger, so neither is re-made from the other (`tiering repair` finds no fault in either)
BOTH_SOUND = (" (not repairable by `tiering repair`: each copy passes its own checks, so which one holds the "
              "ledger cannot be told; compare them and delete the wrong one by hand)")
NOT_REPAIRABLE = " (not repairable: no verified copy in another tier)"
# an offloaded ledger's tier-1 copy failing while its tier-2 copy verifies: reads go on from tier 2 already
TIER1_SPARE = (" (reads use the verified tier-2 copy; `tiering repair` deletes the corrupt tier-1 copy, as "
               "delete-lagged would after the deletion lag)")
_FRAME = struct.Struct(">qq")

# (ledger, chunk) -> a tier-2 ledger reader (tiering.tier2.reader.tier2_opener's)
Tier2Opener = Callable


@dataclass
class VerifyReport:
    topic: str
    ledgers: int = 0
    entries: int = 0
    bytes: int = 0
    tier2_copies_checked: int = 0
    no_page_index: list[int] = field(default_factory=list)  # offloaded before page checksums
    gaps: list[Gap] = field(default_factory=list)  # adjacent gaps of one kind merged
    problems: list[str] = field(default_factory=list)  # each ends saying whether `tiering repair` fixes it
    # ledgers `tiering repair` fixes: a tier-2 copy re-made from tier 1, or a corrupt tier-1 copy deleted
    repairable: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class _Scan:
    """Entries of one ledger read in order: count, bytes, a digest, gaps, and whether ids were contiguous."""

    def __init__(self):
        self.entries = self.bytes = 0
        self.digest = hashlib.blake2b(digest_size=16)
        self.gaps: list = []
        self.problem: str | None = None

    def short_of(self, led: Ledger) -> str | None:
        """Why the entries read are not what metadata says the ledger holds (count and bytes), or None."""
        if (self.entries, self.bytes) == (led.entry_count, led.size_bytes):
            return None
        return (f"read {self.entries} entries ({self.bytes} bytes), metadata says {led.entry_count} "
                f"({led.size_bytes} bytes)")

    def add(self, entry_id: int, data: bytes) -> None:
        if entry_id != self.entries and self.problem is None:
            self.problem = f"entry {entry_id} came where entry {self.entries} was expected"
        self.entries += 1
        self.bytes += len(data)
        self.digest.update(_FRAME.pack(entry_id, len(data)))
        self.digest.update(data)


def live_entries(ledgers: list[Ledger]) -> int:
    """The entries verify reads (a progress bar's total)."""
    return sum(led.entry_count for led in ledgers if led.state != LedgerState.DELETED)


def verify_topic(meta: MetadataStore, tier1: Tier1Store, opener: Tier2Opener, topic: str,
                 ledgers: list[Ledger] | None = None, on_entry: Callable[[], None] | None = None, *,
                 gc_delay_seconds: float = 0) -> VerifyReport:
    """`opener` opens tier-2 copies (one cache shared by the read and the comparison); `ledgers`: the topic's
    ledgers if the caller listed them already (to size a progress bar); `on_entry` is called for each entry
    read through the reader (progress); `gc_delay_seconds`: the settings' GC delay (ReadHandle's)."""
    if ledgers is None:
        ledgers = meta.list_ledgers(topic)  # an unknown topic fails here
    # strict: a corrupt tier-1 copy is reported, not read around through tier 2 as readers do
    handle = ReadHandle(meta, tier1, open_tier2=opener, gc_delay_seconds=gc_delay_seconds, strict_tier1=True)
    report = VerifyReport(topic, ledgers=len(ledgers))
    problems = report.problems
    for led in ledgers:
        scan = _Scan()
        try:
            for item in handle.read(topic, Position(led.ledger_id, 0), Position(led.ledger_id, LAST_ENTRY)):
                if isinstance(item, Gap):
                    scan.gaps.append(item)
                else:
                    scan.add(item.entry_id, item.data)
                    if on_entry:
                        on_entry()
        except (DataLossError, CorruptObjectError, EntryNotFound, LedgerStorageError) as exc:
            if _spare_in_tier2(exc, led):
                report.tier2_copies_checked += 1
                problem = _check_tier2(meta, opener, led, None)
                if problem is None:
                    problems.append(f"ledger {led.ledger_id}: tier-1 copy: {exc}{TIER1_SPARE}")
                    report.repairable.append(led.ledger_id)
                    report.entries += led.entry_count
                    report.bytes += led.size_bytes
                else:
                    problems.append(f"ledger {led.ledger_id}: tier-1 copy: {exc}; tier-2 copy: {problem}"
                                    f"{NOT_REPAIRABLE}")
                continue
            problems.append(f"ledger {led.ledger_id}: {exc}{NOT_REPAIRABLE}")
            continue
        for gap in scan.gaps:
            if gap.kind == DATALOSS:
                problems.append(f"ledger {led.ledger_id}: entries {gap.range_text()} are in no tier (DATALOSS"
                                f"{', marked lost' if led.lost else ''}{': ' + gap.cause if gap.cause else ''})"
                                f"{NOT_REPAIRABLE}")
            _add_gap(report.gaps, gap)
        lost_copy = any(gap.kind == DATALOSS and gap.cause for gap in scan.gaps)  # its cause is said above
        if scan.problem:
            problems.append(f"ledger {led.ledger_id}: {scan.problem}{NOT_REPAIRABLE}")
        report.entries += scan.entries
        report.bytes += scan.bytes
        # One problem per cause and ledger: a lost tier-2 index is this ledger's tier-2 copy problem when that
        # copy is compared below, else reported on its own (never both: a shared object's first ledger would report it twice).
        index_problem = None
        if led.state == LedgerState.OFFLOADED:
            has_pages, index_problem = _page_index(meta, opener, led)
            if not has_pages:
                report.no_page_index.append(led.ledger_id)
        if led.state in (LedgerState.OPEN, LedgerState.DELETED) or scan.gaps:
            pass
        elif short := scan.short_of(led):
            problems.append(f"ledger {led.ledger_id}: {short}{NOT_REPAIRABLE}")
        elif led.state == LedgerState.OFFLOADED and led.tier1_present and led.entry_count:
            report.tier2_copies_checked += 1
            problem = _check_tier2(meta, opener, led, scan)
            if problem and problem.startswith(DIFFERS):
                problems.append(f"ledger {led.ledger_id}: tier-2 copy: {problem}{BOTH_SOUND}")
            elif problem:  # tier 1 was just read whole, every CRC checked, counts and bytes as metadata says
                problems.append(f"ledger {led.ledger_id}: tier-2 copy: {problem}{REPAIRABLE}")
                report.repairable.append(led.ledger_id)
            continue
        if index_problem and not lost_copy:
            problems.append(f"ledger {led.ledger_id}: tier-2 copy: {index_problem}{NOT_REPAIRABLE}")
    return report


def _add_gap(gaps: list, gap) -> None:
    """Merge a gap into the previous one when they are of the same kind and adjacent ledgers."""
    prev = gaps[-1] if gaps else None
    if prev is not None and prev.kind == gap.kind and prev.end.ledger_id + 1 >= gap.start.ledger_id:
        gaps[-1] = Gap(gap.kind, prev.start, gap.end)
    else:
        gaps.append(gap)


def _page_index(meta: MetadataStore, opener: Tier2Opener, led) -> tuple[bool, str | None]:
    """Whether the ledger's tier-2 index carries page checksums (the index is cached by the read above), and
    why it could not be read, if it could not."""
    chunk = meta.get_chunk(led)
    if chunk is None:
        return True, None  # reported by the comparison
    try:
        return opener(led, chunk).index().pages is not None, None
    except (CorruptObjectError, DataLossError) as exc:
        return True, str(exc)


def _spare_in_tier2(exc: Exception, led: Ledger) -> bool:
    """Whether `exc` is an offloaded ledger's tier-1 copy failing its checks (its tier-2 copy may be sound)."""
    return isinstance(exc, CorruptObjectError) and exc.tier == 1 and led.state == LedgerState.OFFLOADED and \
        led.tier1_present and led.entry_count > 0


def _check_tier2(meta: MetadataStore, opener: Tier2Opener, led, scan: _Scan | None) -> str | None:
    """Why the ledger's tier-2 copy is not sound: read whole, every page checked, and compared with `scan`
    (tier 1's read), or without one against metadata's count and bytes."""
    chunk = meta.get_chunk(led)
    problem = _compare_tier2(opener, led, chunk, scan)
    if problem is not None and chunk is not None:
        # Defrag or repair may have moved the ledger while it was read, and GC collected the objects read:
        # that says nothing of the copy the row names now, which is compared in turn.
        now = meta.get_chunk(led)
        if now is not None and chunk.moved(now):
            problem = _compare_tier2(opener, led, now, scan)
    return problem


def _compare_tier2(opener: Tier2Opener, led, chunk, scan: _Scan) -> str | None:
    if chunk is None:
        return "metadata has no chunk for an offloaded ledger"
    other = _Scan()
    try:
        for entry_id, data in opener(led, chunk).iter_entries(0, led.entry_count - 1):
            other.add(entry_id, data)
    except (DataLossError, CorruptObjectError, EntryNotFound) as exc:
        return str(exc)
    if other.problem:
        return other.problem
    if scan is None:
        return other.short_of(led)
    if (other.entries, other.bytes, other.digest.digest()) != (scan.entries, scan.bytes, scan.digest.digest()):
        return f"{DIFFERS} ({other.entries} entries, {other.bytes} bytes)"
    return None
