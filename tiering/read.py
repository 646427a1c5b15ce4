"""ReadHandle: read any range of a topic in entry order across both tiers, with explicit gaps.

Per ledger: tier 1 while its copy exists, else tier 2 (the chunk in metadata). A tier-1 copy deleted while
a read is in flight falls back to tier 2 from the next entry without an error; so does an offloaded
ledger's tier-1 copy that fails its checks (a warning is logged; `tiering verify` reports that copy).
Ledgers removed by retention come back as one `TRIMMED` gap per run of ledgers; a ledger metadata says
exists but no tier holds comes back as a `DATALOSS` gap, or raises `DataLossError` when the caller asks for
that (LogDevice's read path: ordered delivery, benign gaps told apart from data loss).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, count, repeat, starmap
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Protocol

from tiering.errors import (BadInput, CorruptObjectError, DataLossError, LedgerStorageError, TieringError,
                            TopicGone, TopicNotFound)
from tiering.metadata.repository import MetadataStore
from tiering.model import INT64_MAX, UNKNOWN_ENTRY_COUNT, Chunk, Ledger, LedgerState, Position
from tiering.tier1 import LedgerFileMissing, Tier1Store

log = logging.getLogger(__name__)
TRIMMED = "TRIMMED"
DATALOSS = "DATALOSS"
# The last entry id a position can name: the end of a DATALOSS gap over a lost ledger whose entry count is
# unknown (Ledger.entries_unknown) when the read runs past that ledger; printed as "the end of ledger L".
LAST_ENTRY = INT64_MAX
TIER1 = "tier1"
TIER2 = "tier2"
# A read takes the topic's chunk rows in one query and reuses them for a while (one query per topic instead of
# one per ledger). A row it holds must never name an object GC collected: objects defrag merged away or
# retention trimmed are kept TIERING_GC_DELAY_SECONDS, so the snapshot's age is derived from that delay (half
# of it, at most CHUNKS_MAX_AGE_S); with no delay, or none given, there is no snapshot: each ledger's row is
# read when the read reaches it (a fixed 60 s would outlive a delay set below it).
CHUNKS_MAX_AGE_S = 60.0
# A scan of small ledgers sends the next ledgers' requests (index, data) while it reads one: a ledger of 256
# KiB is parsed in well under the ~3 ms its GETs wait for the server, so one ledger ahead hid little (1.1x)
# where several do. Ahead of the current ledger: at most SEND_AHEAD_LEDGERS, of at most SEND_AHEAD_BELOW
# payload bytes together, and only while the current one is that small too (a large one's read covers the
# next one's round trips). Each is one open connection of the client's pool until it is read or dropped.
SEND_AHEAD_BELOW = 8 * 1024 * 1024
SEND_AHEAD_LEDGERS = 4
# The indexes of the ledgers after one sent ahead, when they lie back to back in its index object (offloaded
# together), come in its index's GET: at most this many ledgers (tier2/reader.py caps the GET's bytes).
INDEX_GROUP_LEDGERS = 64


def chunks_max_age(gc_delay_seconds: float) -> float:
    """How long a read may reuse its snapshot of chunk rows, given GC's delay: half of it, at most a minute."""
    return max(0.0, min(CHUNKS_MAX_AGE_S, gc_delay_seconds / 2))


class Entry(NamedTuple):
    """One entry of a read. A named tuple, not a frozen dataclass: a catch-up read builds one per entry, and a
    frozen dataclass's __init__ cost twice as much. Immutable either way."""
    ledger_id: int
    entry_id: int
    data: bytes

    @property
    def position(self) -> Position:
        return Position(self.ledger_id, self.entry_id)


class EntryBatch(NamedTuple):
    """Consecutive entries of one ledger from `ReadHandle.read_batches`: `payloads[i]` is entry
    `first_entry_id + i`, all in one Arrow `binary` array (no Python object per entry; pyarrow.compute works
    on it as it is, `payloads.to_pylist()` gives bytes)."""
    ledger_id: int
    first_entry_id: int
    payloads: Any  # pyarrow.BinaryArray (pyarrow is imported only by batch reads)

    @property
    def entry_count(self) -> int:
        return len(self.payloads)

    @property
    def last_entry_id(self) -> int:
        return self.first_entry_id + len(self.payloads) - 1

    def entries(self) -> Iterator[Entry]:
        """The batch's entries one by one, as `read` gives them."""
        return _batch_entries(self.ledger_id, (self.first_entry_id, self.payloads.to_pylist()))


@dataclass(frozen=True)
class Gap:
    kind: str
    start: Position
    end: Position
    cause: str | None = field(default=None, compare=False)  # a DATALOSS gap's why, when known (a missing object)

    @property
    def end_unknown(self) -> bool:
        """The gap runs to the end of a ledger whose entry count nobody knows (`end` is LAST_ENTRY then)."""
        return self.end.entry_id == LAST_ENTRY

    def range_text(self) -> str:
        """Its positions, `L:E..L:E` (or `..the end of ledger L (entry count unknown)`)."""
        end = f"the end of ledger {self.end.ledger_id} (entry count unknown)" if self.end_unknown else self.end
        return f"{self.start}..{end}"

    def entries_text(self) -> str:
        """Its entry ids within its one ledger, `E..E` (or `E..the end (entry count unknown)`), for messages
        that name the ledger already."""
        end = "the end (entry count unknown)" if self.end_unknown else self.end.entry_id
        return f"{self.start.entry_id}..{end}"


class Tier2Ledger(Protocol):
    def iter_entries(self, first: int, last: int) -> Iterator[tuple[int, bytes]]: ...

    def iter_batches(self, first: int, last: int, arrays: bool = False) -> Iterator[tuple[int, list[bytes]]]: ...


# Opens a tier-2 ledger for reading from its chunk; None when tier 2 is not configured.
Tier2Opener = Callable[[Ledger, Chunk], Tier2Ledger]


def open_ledger_now(meta: MetadataStore, tier1: Tier1Store, led: Ledger) -> Ledger:
    """An open ledger as listed, or its row again when its file is gone because it was sealed, offloaded
    and its copy deleted since. Its writer makes the file before the row, so a row still open without a
    file means a wrong tier-1 root or a lost file (LedgerFileMissing): read as empty, the entries written to
    it would silently be missing. The one rule of `read`, `verify` and `status`."""
    if tier1.exists(led.topic, led.ledger_id):
        return led
    tier1.check_place(led.topic, led.ledger_id)  # a directory or FIFO in its place: says so, naming it
    now = meta.get_ledger(led.topic, led.ledger_id)
    if now.state == LedgerState.OPEN and not tier1.exists(led.topic, led.ledger_id):
        raise LedgerFileMissing(f"the open ledger {led.ledger_id} of topic {led.topic!r} has no file at "
                                f"{tier1.path(led.topic, led.ledger_id)}: is TIERING_TIER1_ROOT the root "
                                "its writer uses (the same shared mount on every worker)?")
    return now


def ledger_extent(meta: MetadataStore, tier1: Tier1Store, led: Ledger) -> tuple[Ledger, int]:
    """A listed ledger's row (an open one's as `open_ledger_now` gives it) and its entry count (for a lost
    ledger whose count is unknown, UNKNOWN_ENTRY_COUNT: every position of it is read, as its gap)."""
    if led.entries_unknown:
        return led, UNKNOWN_ENTRY_COUNT
    if led.state != LedgerState.OPEN:
        return led, tier1.extent(led)[0]
    led = open_ledger_now(meta, tier1, led)
    count = tier1.extent(led)[0]
    if led.state == LedgerState.OPEN and count == 0:
        # its file may have gone since it was found (sealed, offloaded, copy deleted): an empty count would
        # then skip entries the row, read again, says are there
        led = open_ledger_now(meta, tier1, led)
        count = tier1.extent(led)[0]
    return led, count


class ReadHandle:
    def __init__(self, meta: MetadataStore, tier1: Tier1Store, open_tier2: Tier2Opener | None = None,
                 raise_on_dataloss: bool = False, *, gc_delay_seconds: float = 0, strict_tier1: bool = False):
        """`gc_delay_seconds`: the deployment's TIERING_GC_DELAY_SECONDS (Settings.gc_delay_seconds), from
        which the chunk snapshot's age is derived (0: no snapshot). `strict_tier1`: a tier-1 copy that fails
        its checks raises even when tier 2 holds the ledger (`verify`, which reports that copy)."""
        self.meta = meta
        self.strict_tier1 = strict_tier1
        self.tier1 = tier1
        self.open_tier2 = open_tier2
        self.raise_on_dataloss = raise_on_dataloss
        self.chunks_max_age = chunks_max_age(gc_delay_seconds)
        self._chunks: tuple[str, float, dict[int, Chunk]] | None = None

    def _chunk(self, led: Ledger) -> Chunk | None:
        """The ledger's chunk row: one query per topic (while the snapshot is young) instead of one per ledger."""
        if self.chunks_max_age <= 0:
            return self.meta.get_chunk(led)
        now = time.monotonic()
        if self._chunks is None or self._chunks[0] != led.topic or now - self._chunks[1] > self.chunks_max_age:
            self._chunks = (led.topic, now, self.meta.chunks(led.topic))
        found = self._chunks[2].get(led.ledger_id)
        return found if found is not None else self.meta.get_chunk(led)  # offloaded since the snapshot

    def read(self, topic: str, start: Position | None = None,
             end: Position | None = None) -> "Reading":
        """Entries and gaps of the topic from `start` to `end` (inclusive; None: its first / last entry), in
        order. Lazy: nothing is asked of metadata or either tier before the first item is taken."""
        # The per-entry path is C iterators only (chain, map, zip, tuple.__new__): the generators below step
        # once per run or page and hand over iterators, never once per entry, which in a catch-up read of
        # small entries cost more than fetching and checking the bytes.
        return Reading.of(self._pieces(topic, start, end, False))

    def read_batches(self, topic: str, start: Position | None = None,
                     end: Position | None = None) -> "Reading":
        """What `read` gives, with the entries in `EntryBatch`es (a run of pages from tier 2, up to 4,096
        entries or ~1 MiB from tier 1) instead of one `Entry` each: the same order, gaps, checks and
        fallbacks, for a consumer that works on columns (a scan of tier 2 makes no Python object per entry:
        equal-length payloads go from the checked pages into the batch's array in one C pass)."""
        return Reading.of(self._pieces(topic, start, end, True))

    def _pieces(self, topic: str, start: Position | None, end: Position | None,
                arrays: bool) -> Iterator[Iterable[Entry | EntryBatch | Gap]]:
        if start is not None and end is not None and end < start:
            raise BadInput(f"--to {end} is before --from {start}")
        self._chunks = None  # a snapshot serves one read() call only
        ledgers = self.meta.list_ledgers(topic)
        ahead: dict[int, tuple] = {}  # ledger id -> (chunk, requests) sent ahead of the read
        try:
            yield from self._ledgers_pieces(topic, ledgers, start, end, arrays, ahead)
        except TopicNotFound:  # found at the start, gone since: the read ends, and not as a mistake of its caller
            raise TopicGone(topic, "being read") from None
        finally:
            for sent in ahead.values():
                self._drop(sent)

    def _ledgers_pieces(self, topic: str, ledgers: list[Ledger], start: Position | None, end: Position | None,
                        arrays: bool, ahead: dict[int, tuple]) -> Iterator[Iterable[Entry | EntryBatch | Gap]]:
        pending_gap: Gap | None = None
        for i, led in enumerate(ledgers):
            if end is not None and led.ledger_id > end.ledger_id:
                break  # past the range: nothing of a later ledger (the open one's file) is asked for
            led, count = ledger_extent(self.meta, self.tier1, led)
            span = _span(led, count, start, end)
            if span is None:
                continue
            first, last = span
            if led.state == LedgerState.DELETED:
                gap = Gap(TRIMMED, Position(led.ledger_id, first), Position(led.ledger_id, last))
                pending_gap = gap if pending_gap is None else Gap(TRIMMED, pending_gap.start, gap.end)
                continue
            if pending_gap is not None:
                yield (pending_gap,)
                pending_gap = None
            if led.size_bytes <= SEND_AHEAD_BELOW:
                self._send_ahead(ledgers, i + 1, end, ahead)
            yield from self._ledger_pieces(led, first, last, arrays)
            # not opened (read from tier 1 after all, or its row moved): no longer needed
            self._drop(ahead.pop(led.ledger_id, None))
        if pending_gap is not None:
            yield (pending_gap,)

    def _send_ahead(self, ledgers: list[Ledger], i: int, end: Position | None, ahead: dict[int, tuple]) -> None:
        """A scan of small ledgers: the index and data GET of the ledgers from `ledgers[i]` on (within the
        window) go now, while the current one is read, for those that will be read whole from tier 2
        (offloaded, no tier-1 copy, not marked lost). Only with a chunk snapshot: without one each row is read
        when the read reaches it (no GC delay keeps what an older row names), and asking ahead too would
        double the queries."""
        send = getattr(self.open_tier2, "send_ahead", None)
        if send is None or self.chunks_max_age <= 0:
            return
        budget = SEND_AHEAD_BELOW
        for j in range(i, min(i + SEND_AHEAD_LEDGERS, len(ledgers))):
            led = ledgers[j]
            budget -= led.size_bytes
            if budget < 0 or (end is not None and led.ledger_id > end.ledger_id):
                return
            if led.ledger_id in ahead or not self._whole_from_tier2(led, end):
                continue
            chunk = self._chunk(led)
            sent = None if chunk is None else send(chunk, self._held_chunks(ledgers[j + 1:j + 1 + INDEX_GROUP_LEDGERS],
                                                                            end))
            if sent is not None:
                ahead[led.ledger_id] = (chunk, sent)

    @staticmethod
    def _whole_from_tier2(led: Ledger, end: Position | None) -> bool:
        return led.state == LedgerState.OFFLOADED and not led.tier1_present and led.lost_at is None and \
            led.entry_count > 0 and _span(led, led.entry_count, None, end) == (0, led.entry_count - 1)

    def _held_chunks(self, ledgers: list[Ledger], end: Position | None) -> list[Chunk]:
        """The snapshot's chunk rows of the ledgers, up to the first the read will not take whole from tier 2
        (no query: these only say which indexes may come in one GET)."""
        held = self._chunks[2] if self._chunks is not None else {}
        out = []
        for led in ledgers:
            chunk = held.get(led.ledger_id)
            if chunk is None or not self._whole_from_tier2(led, end):
                break
            out.append(chunk)
        return out

    def _drop(self, sent) -> None:
        if sent is not None:
            self.open_tier2.drop(*sent)

    def _ledger_pieces(self, led: Ledger, first: int, last: int,
                       arrays: bool) -> Iterator[Iterable[Entry | EntryBatch | Gap]]:
        """Each item an iterable of the ledger's entries (or batches) or gaps; read_ledger_range's runs are
        consumed to their end (by chain.from_iterable) before the next item is asked for, as it requires."""
        held = (lambda: self._chunk(led)) if led.state == LedgerState.OFFLOADED else (lambda: None)
        source = None  # the run being read: closed with this generator (a reader stopping early drops its GET)
        to_batch = partial(_entry_batch, led.ledger_id)
        if arrays:
            from tiering.tier2.reader_arrays import array_batches  # here: `read` alone does not import pyarrow
        try:
            for got in read_ledger_range(self.meta, led, first, last, self.tier1, self.open_tier2, held,
                                         arrays=arrays, strict_tier1=self.strict_tier1):
                if isinstance(got, Run) and got.batches is not None:
                    source = got.batches
                    yield map(to_batch, got.batches) if arrays else \
                        chain.from_iterable(map(partial(_batch_entries, led.ledger_id), got.batches))
                elif isinstance(got, Run):
                    source = got.entries
                    yield map(to_batch, array_batches(got.entries)) if arrays else \
                        starmap(partial(Entry, led.ledger_id), got.entries)
                elif got.kind == DATALOSS:
                    yield self._dataloss(led, got.start.entry_id, got.end.entry_id, got.cause)
                else:
                    yield (got,)
        finally:
            if hasattr(source, "close"):
                source.close()

    def _dataloss(self, led: Ledger, first: int, last: int, cause: str | None = None) -> Iterator[Gap]:
        gap = Gap(DATALOSS, Position(led.ledger_id, first), Position(led.ledger_id, last), cause)
        if self.raise_on_dataloss:
            raise DataLossError(f"ledger {led.topic}/{led.ledger_id} entries {gap.entries_text()} are in no tier "
                                f"(state {led.state.value})" + (f": {cause}" if cause else ""))
        yield gap


def _span(led: Ledger, count: int, start: Position | None, end: Position | None) -> tuple[int, int] | None:
    """The entries (first, last) of a ledger of `count` entries that a read from `start` to `end` takes, or
    None when it takes none."""
    if count == 0 or (start is not None and led.ledger_id < start.ledger_id) or \
            (end is not None and led.ledger_id > end.ledger_id):
        return None
    first = start.entry_id if start is not None and start.ledger_id == led.ledger_id else 0
    last = min(end.entry_id if end is not None and end.ledger_id == led.ledger_id else count - 1, count - 1)
    return None if first > last else (first, last)


class Reading(chain):
    """What `ReadHandle.read` returns: an iterator of entries and gaps (a chain, so taking the next entry runs
    no Python code) that can be closed like a generator: `close()` ends the read at once, dropping a tier-2
    GET or a tier-1 file it holds open."""

    @classmethod
    def of(cls, pieces: Iterator[Iterable[Entry | Gap]]) -> "Reading":
        reading = cls.from_iterable(pieces)
        reading._pieces = pieces
        return reading

    def close(self) -> None:
        self._pieces.close()


_ENTRY_TYPES = repeat(Entry)


def _batch_entries(ledger_id: int, batch: tuple[int, list[bytes]]) -> Iterator[Entry]:
    first, payloads = batch
    # tuple.__new__(Entry, (ledger_id, entry_id, data)) per entry: no Python frame (as Entry(...) would run),
    # and map calls it directly (a partial in between cost ~40 ns an entry)
    return map(tuple.__new__, _ENTRY_TYPES, zip(repeat(ledger_id), count(first), payloads))


def _entry_batch(ledger_id: int, batch: tuple[int, Any]) -> EntryBatch:
    return EntryBatch(ledger_id, batch[0], batch[1])


def _batch_pairs(first: int, payloads: list[bytes]) -> Iterator[tuple[int, bytes]]:
    return zip(count(first), payloads)


def _array_pairs(first: int, payloads: Any) -> Iterator[tuple[int, bytes]]:
    return zip(count(first), payloads.to_pylist())


class Run(NamedTuple):
    """Consecutive entries of a ledger from one tier (TIER1 or TIER2), as (entry_id, data) pairs; from tier 2
    also as `batches` (first entry id, payloads: a list, or an Arrow array when read with `arrays`) of one run
    of pages each. `entries` and `batches` draw from the same source: a consumer reads one of them, not both."""
    tier: str
    entries: Iterator[tuple[int, bytes]]
    batches: Iterator[tuple[int, list[bytes]]] | None = None


class _At:
    """The next entry a ledger-range read has to deliver, advanced as its runs are consumed."""
    __slots__ = ("next", "trimmed", "lost")

    def __init__(self, first: int):
        self.next = first
        self.trimmed = False
        self.lost: str | None = None  # why its tier-2 copy is gone (the row still names it): a DATALOSS gap


def read_ledger_range(meta: MetadataStore, led: Ledger, first: int, last: int, tier1: Tier1Store | None,
                      open_tier2: Tier2Opener | None,
                      held_chunk: Callable[[], Chunk | None], *, arrays: bool = False,
                      strict_tier1: bool = False) -> Iterator[Run | Gap]:
    """Entries first..last of a listed ledger, in order, from the tier that holds each: runs of entries (each
    read to its end before the next item is asked for) and gaps. The one cross-tier read of a ledger range,
    for ReadHandle and the Spark source.

    Tier 1 while its copy exists (`tier1` None: not read, this process does not see it); from the first
    entry it did not give, tier 2 from `held_chunk()`, the chunk row the caller holds, or when it holds none
    the ledger's current row (offloaded or trimmed since it was listed). A held row may be stale (defrag
    moved the ledger and GC collected the object it names): when reading it fails, the row is re-read once
    and the read goes on from the next entry with the new one. A corrupt page is never read around. A ledger
    trimmed meanwhile ends in a TRIMMED gap; one no tier holds (or tier 2 not configured) in a DATALOSS gap, and
    one marked lost is a DATALOSS gap whole, without a request. An offloaded ledger's tier-1 copy that fails
    its checks (CorruptObjectError) is read from tier 2 from the entry it could not give, unless
    `strict_tier1`; any other ledger's has no second copy and raises. `arrays`: a tier-2 run's batches hold
    Arrow binary arrays instead of payload lists (`OffloadedLedger.iter_batches`)."""
    if led.lost_at is not None:  # marked lost by `tiering repair`: no tier holds a good copy, no GET to fail
        yield Gap(DATALOSS, Position(led.ledger_id, first), Position(led.ledger_id, last))
        return
    at = _At(first)
    if tier1 is not None and led.tier1_present:
        spare = led.state == LedgerState.OFFLOADED and not strict_tier1  # a checked tier-2 copy to go on with
        try:
            reader = tier1.reader_for(led)
        except LedgerStorageError:
            reader = None  # deleted since it was listed: tier 2 below
        except CorruptObjectError as exc:  # its header or trailer, or totals not its row's
            if not spare:
                raise
            _tier1_failed(led, first, exc)
            reader = None
        if reader is not None:
            yield Run(TIER1, _tier1_entries(reader, first, last, at, led if spare else None))
            if at.next > last:
                return
    chunk = held_chunk()
    if chunk is None:
        # the row now, not the one listed: a ledger listed open has its counts, which tier 2's index is
        # checked against, only from its seal
        current = led = meta.get_ledger(led.topic, led.ledger_id)
        if current.state == LedgerState.OFFLOADED:  # offloaded since it was listed
            chunk = meta.get_chunk(current)
        elif current.state == LedgerState.DELETED:
            yield Gap(TRIMMED, Position(led.ledger_id, at.next), Position(led.ledger_id, last))
            return
    if chunk is None or open_tier2 is None:
        yield Gap(DATALOSS, Position(led.ledger_id, at.next), Position(led.ledger_id, last))
        return
    batches = _tier2_batches(meta, led, chunk, last, open_tier2, at, arrays)
    yield Run(TIER2, chain.from_iterable(starmap(_array_pairs if arrays else _batch_pairs, batches)), batches)
    if at.trimmed:
        yield Gap(TRIMMED, Position(led.ledger_id, at.next), Position(led.ledger_id, last))
    elif at.lost:
        yield Gap(DATALOSS, Position(led.ledger_id, at.next), Position(led.ledger_id, last), at.lost)


def _tier1_entries(reader, first: int, last: int, at: _At, spare_for: Ledger | None = None
                   ) -> Iterator[tuple[int, bytes]]:
    """The tier-1 copy's entries; `spare_for`: the ledger, offloaded, whose copy failing its checks (or
    failing to be read: an I/O error) ends the run at the entry it could not give (tier 2 goes on from
    there) instead of raising."""
    # An open file descriptor keeps reading even if the copy is unlinked meanwhile.
    with reader:
        try:
            for entry_id, data in reader.iter_entries(first, last):
                yield entry_id, data
                at.next = entry_id + 1
        except (CorruptObjectError, LedgerStorageError) as exc:
            if spare_for is None:
                raise
            _tier1_failed(spare_for, at.next, exc)


def _tier1_failed(led: Ledger, entry_id: int, exc: TieringError) -> None:
    log.warning("ledger %s/%d: its tier-1 copy %s (%s); reading it from tier 2 from entry %d", led.topic,
                led.ledger_id, "fails its checks" if isinstance(exc, CorruptObjectError) else "cannot be read", exc,
                entry_id)


def _tier2_batches(meta: MetadataStore, led: Ledger, chunk: Chunk, last: int, open_tier2: Tier2Opener,
                   at: _At, arrays: bool) -> Iterator[tuple[int, list[bytes]]]:
    for attempt in range(2):
        try:
            for batch in open_tier2(led, chunk).iter_batches(at.next, last, arrays):
                yield batch
                at.next = batch[0] + len(batch[1])  # resumed: the consumer took the whole batch
            return
        except CorruptObjectError:
            raise  # the bytes are wrong: never read around them
        except Exception as exc:
            current = meta.get_ledger(led.topic, led.ledger_id)
            if current.state == LedgerState.DELETED:
                at.trimmed = True
                return
            fresh = meta.get_chunk(current) if current.state == LedgerState.OFFLOADED else None
            if attempt or fresh is None or fresh == chunk:
                # the object the current row names is gone: no tier holds the rest of the ledger (a DATALOSS
                # gap, or an error when asked); a row that moved again meanwhile is no proof of that
                if isinstance(exc, DataLossError) and (fresh is None or fresh == chunk):
                    at.lost = str(exc)
                    return
                raise
            chunk = fresh
