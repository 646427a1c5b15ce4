"""Read an offloaded ledger back from tier 2.

Unlike Pulsar's reader (one 1 MiB buffer, no read-ahead, unbounded offset cache): the index is fetched once
and cached; the block holding an entry is found by floor search; bytes come by ranged GETs that start
small (a cold random read costs one or two requests) and grow, with several in flight for sequential reads;
a bounded cache of entry offsets lets a later read start near its entry instead of at the block's start.
Every entry's framing and id are checked. Ledgers offloaded with a page index (all since it exists) are
read in whole pages, each page's CRC32C checked before any of its entries is returned: a cold random read is
two requests (index, page); a scan is ONE streaming GET of its whole span (growing ranged GETs
reached only ~0.85 of one stream on RGW even without parsing), read group by group (~1 MiB of whole pages)
in the reading thread, each group's pages checked, then parsed a run of pages of one block at a time
(`iter_batches`: a batch of payloads per run, equal-length entries parsed in one vectorised pass, as a list
of bytes or one Arrow array); memory stays within one group.
"""
from __future__ import annotations

import bisect
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from itertools import count
from typing import Iterator

from tiering.errors import CorruptObjectError, EntryNotFound
from tiering.format.block import HEADER_LEN, Entry, NeedMore, parse_block_header, read_entry_at
from tiering.format.index import OffloadIndex, check_page_run
from tiering.format.pages import run_payloads
from tiering.model import Chunk, Ledger
from tiering.tier2.objects import Bucket, RangeStream, get_range, prefetch_ranges
from tiering.tier2.reader_arrays import array_batches, one_array_each, run_payload_array
from tiering.tier2.reader_caches import IndexCache, OffsetCache, ReaderCaches, index_range

FIRST_RANGE = 64 * 1024
MAX_RANGE = 4 * 1024 * 1024
READ_AHEAD = 4
CHECKPOINT_STRIDE = 64
SCAN_GROUP = 1024 * 1024  # bytes of whole pages a scan's streaming GET hands over at a time
# A scan fetches the indexes of ledgers offloaded together (back to back in one index object) in one GET of
# at most this many bytes: a GET costs ~1 ms of client CPU on top of its round trip, more than its bytes.
INDEX_GROUP_BYTES = 1024 * 1024


class _RangeStream:
    """Consecutive ranged GETs of [start, end) of one object, growing from FIRST_RANGE to MAX_RANGE, with up
    to READ_AHEAD requests in flight."""

    def __init__(self, b: Bucket, key: str, start: int, end: int, pool: ThreadPoolExecutor,
                 window: int = READ_AHEAD):
        self.b, self.key, self.end, self.pool, self.window = b, key, end, pool, window
        self.next_start = start
        self.size = FIRST_RANGE
        self.pending: deque = deque()
        self.requests = 0

    def _schedule(self, budget: int) -> None:
        while len(self.pending) < budget and self.next_start < self.end:
            n = min(self.size, self.end - self.next_start)
            self.pending.append(self.pool.submit(get_range, self.b, self.key, self.next_start, n))
            self.requests += 1
            self.next_start += n
            self.size = min(self.size * 2, MAX_RANGE)

    def next(self) -> bytes | None:
        # The first request goes alone (a random read may need nothing more); later ones keep a window.
        self._schedule(1 if self.requests == 0 else self.window)
        if not self.pending:
            return None
        data = self.pending.popleft().result()
        self._schedule(self.window)
        return data

    def close(self) -> None:
        for f in self.pending:
            f.cancel()


class OffloadedLedger:
    """One offloaded ledger, read through its chunk row (the data and index may lie inside merged objects)."""

    def __init__(self, b: Bucket, led: Ledger, ch: Chunk, caches: ReaderCaches, pool: ThreadPoolExecutor,
                 sent: "SentAhead | None" = None):
        """`sent`: the ledger's index fetch and data GET a scan sent before it reached the ledger (this
        ledger owns the GET from here: a read that is not of the whole ledger drops it)."""
        self.b, self.led, self.ch, self.caches, self.pool = b, led, ch, caches, pool
        self.requests = 0
        self._sent = sent

    def index(self) -> OffloadIndex:
        if self._sent is not None and self._sent.index is not None:
            fetched, self._sent.index = self._sent.index, None
            wait([fetched])  # into the cache; when it is not there, `get` fetches it and raises its own error
        index = self.caches.index.get(self.b, self.ch)
        problem = index.mismatch(self.led.topic, self.led.ledger_id, self.led.entry_count, self.ch.data_length)
        if problem:
            raise CorruptObjectError("index object", self.ch.index_key, problem)
        return index

    def iter_entries(self, first: int, last: int) -> Iterator[tuple[int, bytes]]:
        for start, payloads in self.iter_batches(first, last):
            yield from zip(count(start), payloads)

    def iter_batches(self, first: int, last: int, arrays: bool = False) -> Iterator[tuple[int, list[bytes]]]:
        """Entries first..last in order as batches (first entry id, payloads) of consecutive entries, one run of
        pages at a time: a scan's consumer then pays per page, not per entry (ReadHandle, the Spark source).
        Payloads are a list of bytes, or with `arrays` one Arrow `binary` array per batch (no Python object
        per entry: `ReadHandle.read_batches`, the Spark source)."""
        early = self._whole_ledger_stream(first, last)  # [the GET's future] until the scan takes it
        try:
            index = self.index()
            if first > last:
                return
            index.find(last)  # out of range -> EntryNotFound before any data request
            if index.pages is not None:
                parse = run_payload_array if arrays else run_payloads
                batches = self._read_pages(index, first, last, parse, early)
                yield from (one_array_each(batches) if arrays else batches)
                return
            if early and _blocks_fill(index, self.ch.data_length):  # written before page indexes, read whole
                yield from self._blocks_from_stream(early.pop(), index, first, last, arrays)
                return
        finally:
            if early:  # not taken: the index failed, the caller stopped first, or blocks that leave gaps
                early.pop().add_done_callback(_close_stream)
        # Written before page indexes: no checksum to check, only the framing (tiering verify says so).
        block_no = index.find(first)
        while True:
            entries = self._read_block(index, block_no, first, last)
            yield from (array_batches(entries) if arrays else ((e, [payload]) for e, payload in entries))
            if index.block_last_entry(block_no) >= last:
                return
            block_no += 1
            first = index.entries[block_no].first_entry_id

    def _whole_ledger_stream(self, first: int, last: int) -> list[Future]:
        """A read of the whole ledger whose index is not cached yet: its data GET (the chunk row gives the
        span: the first page starts the data, the last ends it) is sent now, from a pool thread, and the index
        fetched beside it, instead of after it: the server's time to the first byte of the data (~30 ms for
        64 MiB on RGW) then covers the index's round trip and decoding (~5-10 ms, a tenth of such a scan).
        Nothing is read from the stream before the index is decoded and checked against the chunk row. A GET
        a scan sent before it reached this ledger (`LedgerOpener.send_ahead`) is taken instead."""
        whole = first == 0 and last == self.led.entry_count - 1
        if self._sent is not None:
            if whole:
                data, self._sent.data = self._sent.data, None
                return [data]
            self._sent.drop()
        if not whole or self.ch in self.caches.index:
            return []
        self.requests += 1
        return [self.pool.submit(RangeStream, self.b, self.ch.data_key, self.ch.data_offset, self.ch.data_length)]

    def _read_pages(self, index: OffloadIndex, first: int, last: int, parse,
                    early: list[Future] | None = None) -> Iterator[tuple[int, list[bytes]]]:
        """Entries first..last, fetched in whole pages, each page's CRC32C checked before any of its entries
        is returned. A point read is one GET of one page; a scan is one streaming GET of its pages (`early`:
        that GET already sent, for the whole ledger). `parse`: run_payloads or run_payload_array."""
        pages = index.pages
        lo, hi = pages.find(first), pages.find(last)
        offsets, firsts = pages.offsets, pages.first_entries
        # the pages that start a block (each block starts one: checked when the index was decoded)
        block_pages = [bisect.bisect_left(offsets, e.block_offset) for e in index.entries]
        block_set = set(block_pages)
        where, base = f"data object {self.ch.data_key}", self.ch.data_offset
        if early:
            groups = self._scan(index, lo, hi, where, base, early)
        elif lo == hi:
            start, end = index.page_span(lo)
            groups = iter([(lo, hi, start, self._fetch_checked(index, lo, hi, start, end, where, base))])
            self.requests += 1
        else:
            groups = self._scan(index, lo, hi, where, base)
        for a, b_, start, data in groups:  # every page of the group was checked before it was handed over
            for r_first, r_last in _block_runs(block_pages, a, b_):  # one parsing pass per run of one block
                r_end = index.page_span(r_last)[1]
                p_first, p_last = firsts[r_first], pages.last_entry(r_last, index.entry_count)
                payloads = parse(data, [o - start for o in offsets[r_first:r_last + 1]], r_end - start,
                                 firsts[r_first:r_last + 1], p_last,
                                 block_start=r_first in block_set,
                                 block_end=r_end == index.data_object_len or r_last + 1 in block_set,
                                 where=where, base=base + start)
                if p_first < first or p_last > last:  # the range's first or last run: only its part
                    payloads = payloads[max(0, first - p_first):max(0, last - p_first + 1)]
                    p_first = max(p_first, first)
                if len(payloads):
                    yield p_first, payloads

    def _scan(self, index: OffloadIndex, lo: int, hi: int, where: str, base: int,
              early: list[Future] | None = None) -> Iterator[tuple]:
        """Pages lo..hi as checked groups (first page, last page, start offset, bytes), in order, from one
        streaming GET read in the caller's thread. A pool thread reading ahead through a queue was measured
        slower on 2 shared cores (0.55 against 0.74 of a raw GET at load 6, 62 against 81 MiB/s for 100-byte
        entries): each hand-over woke a thread and the two fought for the GIL after every socket read, while
        the socket's receive buffer already lets the server send on while a group is parsed. A caller that
        stops early closes the generator: the GET is dropped at once."""
        groups = list(_page_runs(index, lo, hi, first=SCAN_GROUP, grow=False))
        start = index.page_span(groups[0][0])[0]
        length = index.page_span(groups[-1][1])[1] - start
        sent = early.pop() if early else None  # from here this generator owns the GET sent ahead
        if sent is not None and (start, length) == (0, self.ch.data_length):  # the span it asked for
            try:
                stream = sent.result()
            except BaseException:
                sent.add_done_callback(_close_stream)
                raise
        else:
            if sent is not None:
                sent.add_done_callback(_close_stream)
            self.requests += 1
            stream = RangeStream(self.b, self.ch.data_key, base + start, length)
        try:
            for a, b_ in groups:
                g_start, g_end = index.page_span(a)[0], index.page_span(b_)[1]
                data = stream.read(g_end - g_start)
                check_page_run(index, a, b_, data, g_start, where, base)
                yield a, b_, g_start, data
        finally:
            stream.close()

    def _fetch_checked(self, index: OffloadIndex, a: int, b_: int, start: int, end: int, where: str,
                       base: int) -> bytes:
        """Pages a..b_ ([start, end) of the ledger) in one ranged GET, each page's CRC32C checked here, in the
        fetching thread (the CRC releases the GIL), while the reading thread parses the previous run."""
        data = get_range(self.b, self.ch.data_key, base + start, end - start)
        check_page_run(index, a, b_, data, start, where, base)
        return data

    def _blocks_from_stream(self, sent: Future, index: OffloadIndex, first: int, last: int,
                            arrays: bool) -> Iterator[tuple[int, list]]:
        """A whole ledger written before page indexes, block after block from the one GET of its span sent
        before its index was read (instead of dropping that GET and asking for each block again)."""
        try:
            stream = sent.result()
        except BaseException:
            sent.add_done_callback(_close_stream)
            raise
        try:
            for block_no in range(len(index.entries)):
                piece = _StreamSlice(stream, index.block_length(block_no))
                entries = self._read_block(index, block_no, first, last, piece)
                yield from (array_batches(entries) if arrays else ((e, [payload]) for e, payload in entries))
                piece.skip_rest()  # the block's padding
        finally:
            stream.close()

    def _read_block(self, index: OffloadIndex, i: int, first: int, last: int,
                    piece: _StreamSlice | None = None) -> Iterator[tuple[int, bytes]]:
        """Entries of block i from `first` to `last` (or the block's end): from `piece` (the block's bytes of a
        whole-ledger GET) when given, else by ranged GETs from the block's start or a cached offset."""
        entry = index.entries[i]
        block_start = self.ch.data_offset + entry.block_offset
        block_end = block_start + index.block_length(i)
        cache_key = (self.ch.data_key, block_start)
        # A point read fetches one growing range at a time (no bytes far past the entry); a scan reads ahead.
        window = 1 if first == last else READ_AHEAD
        point = None if piece is not None else self.caches.offsets.floor(cache_key, first)
        where = f"data object {self.ch.data_key}"
        if piece is not None:
            expected, pos, stream = entry.first_entry_id, block_start, piece
            buf, base = bytearray(), block_start
        elif point is not None and point[0] >= entry.first_entry_id:
            expected, pos = point
            stream = _RangeStream(self.b, self.ch.data_key, pos, block_end, self.pool, window)
            buf, base = bytearray(), pos
        else:
            expected, pos = entry.first_entry_id, block_start
            stream = _RangeStream(self.b, self.ch.data_key, block_start, block_end, self.pool, window)
            buf, base = bytearray(), block_start
        try:
            if pos == block_start:
                while len(buf) < HEADER_LEN:
                    if not self._pull(stream, buf):
                        raise CorruptObjectError("block", f"{where} offset {block_start}", "object ends in the header")
                header = parse_block_header(buf, where, base)
                if header.first_entry_id != entry.first_entry_id or header.block_len != block_end - block_start:
                    raise CorruptObjectError("block header", f"{where} offset {block_start}",
                                             f"block of entries from {header.first_entry_id}, {header.block_len} "
                                             f"bytes; the index says from {entry.first_entry_id}, "
                                             f"{block_end - block_start} bytes")
                pos = block_start + HEADER_LEN
            while expected <= last:
                got = read_entry_at(buf, pos - base, where, block_end=block_end - base, base=base)
                if isinstance(got, NeedMore):
                    del buf[:pos - base]
                    base = pos
                    if not self._pull(stream, buf):
                        raise CorruptObjectError("entry", f"{where} offset {pos}", "object ends inside an entry")
                    continue
                if not isinstance(got, Entry):
                    raise CorruptObjectError("block", f"{where} offset {pos}",
                                             f"padding where entry {expected} should be")
                if got.entry_id != expected:
                    raise CorruptObjectError("entry", f"{where} offset {pos + 4}",
                                             f"entry id {got.entry_id}, expected {expected}")
                if expected % CHECKPOINT_STRIDE == 0 or expected == first:
                    self.caches.offsets.add(cache_key, expected, pos)
                if expected >= first:
                    yield expected, bytes(got.payload)
                pos = base + got.end
                expected += 1
                if expected > index.block_last_entry(i):
                    return
        finally:
            stream.close()
            self.requests += stream.requests

    def _pull(self, stream: _RangeStream, buf: bytearray) -> bool:
        data = stream.next()
        if data is None:
            return False
        buf += data
        return True


class _StreamSlice:
    """One block's bytes of a whole-ledger streaming GET, handed over as `_RangeStream.next` does; the GET
    itself is its owner's to close."""

    requests = 0

    def __init__(self, stream: RangeStream, length: int):
        self.stream, self.left = stream, length

    def next(self) -> bytes | None:
        if not self.left:
            return None
        data = self.stream.read(min(self.left, SCAN_GROUP))
        self.left -= len(data)
        return data

    def skip_rest(self) -> None:
        while self.next() is not None:
            pass

    def close(self) -> None:
        pass


def _blocks_fill(index: OffloadIndex, length: int) -> bool:
    """Whether the index's blocks lie back to back from the ledger's first byte to its last."""
    at = 0
    for i, entry in enumerate(index.entries):
        if entry.block_offset != at:
            return False
        at += index.block_length(i)
    return at == length


def _close_stream(f: Future) -> None:
    """A GET sent ahead that the read no longer needs (its index failed, the caller stopped): dropped once
    its headers are in, without waiting for them."""
    if not f.cancelled() and f.exception() is None:
        f.result().close()


def _page_runs(index: OffloadIndex, lo: int, hi: int, first: int = 1, grow: bool = True) -> Iterator[tuple[int, int]]:
    """Pages lo..hi in runs of consecutive pages: the first run up to `first` bytes (at least one page),
    each next one twice as many bytes, up to MAX_RANGE (`grow`), or every run up to `first` bytes. Each run's
    end is found by bisection of the page offsets (a scan of 64 MiB has ~1,000 pages)."""
    offsets, total = index.pages.offsets, index.data_object_len
    last_page = len(offsets) - 1
    target, p = first, lo
    while p <= hi:
        start = offsets[p]
        limit = start + target
        # the last page whose end (the next page's offset, or the data's end) is within the limit
        q = bisect.bisect_right(offsets, limit, p + 1) - 2
        if q == last_page - 1 and total <= limit:
            q = last_page
        q = min(max(q, p), hi)
        yield p, q
        if grow:
            target = min(max(target, index.page_span(q)[1] - start) * 2, MAX_RANGE)
        p = q + 1


def _block_runs(block_pages: list[int], a: int, b_: int) -> Iterator[tuple[int, int]]:
    """Pages a..b_ cut where a block starts (`block_pages`: sorted, the pages that start one): runs of
    consecutive pages inside one block."""
    run = a
    for p in block_pages[bisect.bisect_right(block_pages, a):bisect.bisect_right(block_pages, b_)]:
        yield run, p - 1
        run = p
    yield run, b_


def check_stored_pages(b: Bucket, key: str, base: int, index: OffloadIndex, window: int = READ_AHEAD) -> bool:
    """Download one ledger's data (at `base` in object `key`) in runs of pages and check every page's
    CRC32C; memory stays within `window` runs. False when the index has no page index (nothing checked)."""
    pages = index.pages
    if pages is None:
        return False
    runs = list(_page_runs(index, 0, len(pages) - 1, first=MAX_RANGE))
    spans = [(index.page_span(a)[0], index.page_span(z)[1]) for a, z in runs]
    ranges = ((key, base + start, end - start) for start, end in spans)
    for (a, z), (start, _), data in zip(runs, spans, prefetch_ranges(b, ranges, window)):
        check_page_run(index, a, z, data, start, f"data object {key}", base)
    return True


class SentAhead:
    """A ledger's index fetch and whole-data GET, sent before a scan reaches it (`LedgerOpener.send_ahead`)."""
    __slots__ = ("index", "data")

    def __init__(self, index: Future, data: Future):
        self.index: Future | None = index
        self.data: Future | None = data

    def drop(self) -> None:
        """Not read after all (the scan stopped first): its GET is closed once its headers are in."""
        data, self.data = self.data, None
        if data is not None:
            data.add_done_callback(_close_stream)


class LedgerOpener:
    """A ReadHandle's `open_tier2`: opens offloaded ledgers with one shared cache and pool. A scan of many
    small ledgers tells it the ledger it reads next (`send_ahead`): that ledger's index and data GET are on
    their way while the current one is parsed, so the scan does not wait a round trip per ledger."""

    def __init__(self, b: Bucket, caches: ReaderCaches, pool: ThreadPoolExecutor):
        self.b, self.caches, self.pool = b, caches, pool
        self._sent: dict[Chunk, SentAhead] = {}
        self._indexes: dict[tuple, Future] = {}  # index ranges -> the fetch on its way that brings them
        self._lock = threading.RLock()  # a fetch done already runs its callback (which takes it) at once

    def __call__(self, led: Ledger, ch: Chunk) -> OffloadedLedger:
        with self._lock:
            sent = self._sent.pop(ch, None)
        return OffloadedLedger(self.b, led, ch, self.caches, self.pool, sent)

    def send_ahead(self, ch: Chunk, following: list[Chunk] = ()) -> SentAhead | None:
        """Fetch the chunk's index and send the GET of its whole data now; the next open of that chunk takes
        them. The caller drops what it did not open (`drop`). None when that chunk is already sent.
        `following`: the chunks the scan reads after this one; the indexes among them that lie right after
        this one's in the same index object (ledgers offloaded together) come in the same GET."""
        with self._lock:
            if ch in self._sent:
                return None
            sent = self._sent[ch] = SentAhead(self._fetch_index(ch, following),
                                              self.pool.submit(RangeStream, self.b, ch.data_key, ch.data_offset,
                                                               ch.data_length))
        return sent

    def _fetch_index(self, ch: Chunk, following: list[Chunk]) -> Future:
        """The fetch that brings the chunk's index into the cache: one already on its way for an earlier
        chunk's group, or a new one for this chunk and those after it in its index object (under the lock)."""
        pending = self._indexes.get(index_range(ch))
        if pending is not None:
            return pending
        if ch in self.caches.index:
            pending = Future()
            pending.set_result(None)
            return pending
        group, end = [ch], ch.index_offset + ch.index_length
        for other in following:
            if other.index_key != ch.index_key or other.index_offset != end or \
                    end + other.index_length - ch.index_offset > INDEX_GROUP_BYTES or other in self.caches.index:
                break
            group.append(other)
            end += other.index_length
        fetch = self.pool.submit(self.caches.index.prefetch, self.b, group)
        ranges = [index_range(c) for c in group]
        for r in ranges:
            self._indexes[r] = fetch

        def done(_):
            with self._lock:
                for r in ranges:
                    if self._indexes.get(r) is fetch:
                        del self._indexes[r]
        fetch.add_done_callback(done)
        return fetch

    def drop(self, ch: Chunk, sent: SentAhead) -> None:
        """Forget what `send_ahead` sent for the chunk, unless a ledger opened it meanwhile (then it is that
        ledger's to close)."""
        with self._lock:
            if self._sent.get(ch) is not sent:
                return
            del self._sent[ch]
        sent.drop()


def tier2_opener(b: Bucket, caches: ReaderCaches | None = None, pool: ThreadPoolExecutor | None = None) -> LedgerOpener:
    """A ReadHandle's `open_tier2`: one shared cache and pool for all ledgers it opens."""
    return LedgerOpener(b, caches or ReaderCaches.new(), pool or ThreadPoolExecutor(READ_AHEAD,
                                                                                    thread_name_prefix="tier2-read"))


__all__ = ["array_batches", "check_stored_pages", "LedgerOpener", "OffloadedLedger", "SentAhead", "ReaderCaches",
           "IndexCache", "OffsetCache", "run_payload_array", "tier2_opener", "EntryNotFound"]
