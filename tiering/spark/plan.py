"""The `tiering` source's plan, made on the driver from one consistent metadata snapshot.

All topics' ledger and chunk rows are read in one REPEATABLE READ transaction, so the plan is one instant
of the metadata even while offload, defrag and retention run. Pushed filters prune ledgers (ledger_id,
sealed_at, offloaded_at) and entry ranges (entry_id) before any byte is read. A ledger becomes one
partition, or several when its bytes to read exceed `split_bytes`: split along its page index (one GET of
its index object, which the executors would fetch anyway) so no page is read by two tasks, or by entry
count for a ledger only tier 1 holds. Trimmed (DELETED) ledgers are counted, not read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tiering.errors import BadInput
from tiering.model import UNKNOWN_ENTRY_COUNT, Chunk, Ledger, LedgerState
from tiering.spark.filters import Pushed

if TYPE_CHECKING:  # for annotations only: the source's filter-pushdown process imports this module
    from tiering.metadata.repository import MetadataStore
    from tiering.tier1 import Tier1Store
    from tiering.tier2.reader import IndexCache

S = LedgerState
DEFAULT_SPLIT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Part:
    """One task's work: entries first..last of one ledger, with the rows the plan saw."""
    led: Ledger
    chunk: Chunk | None
    first: int
    last: int
    nbytes: int  # bytes the plan expects this part to read (exact along pages, else estimated)


@dataclass
class PlanStats:
    topics: int = 0
    ledgers_seen: int = 0
    ledgers_kept: int = 0
    partitions: int = 0
    bytes: int = 0
    trimmed_ledgers: int = 0
    trimmed_entries: int = 0
    filters: str = "none"
    index_fetches: int = 0
    by_tier: dict = field(default_factory=dict)

    def line(self) -> str:
        return (f"tiering source plan: {self.topics} topic(s), {self.ledgers_kept} of {self.ledgers_seen} "
                f"ledger(s) kept, {self.partitions} partition(s), {self.bytes} bytes to read "
                f"({', '.join(f'{k} {v}' for k, v in sorted(self.by_tier.items())) or 'nothing'}); "
                f"trimmed: {self.trimmed_entries} entries in {self.trimmed_ledgers} ledger(s); "
                f"pushed filters: {self.filters}")


def select_topics(meta: MetadataStore, options: dict) -> list[str]:
    """Topic names from `topic`, `topics` (comma list), `topicPattern` (SQL LIKE) or `topicRegex`."""
    given = [k for k in ("topic", "topics", "topicpattern", "topicregex") if options.get(k)]
    if len(given) != 1:
        raise BadInput("the tiering source takes exactly one of the options topic, topics, topicPattern, "
                       f"topicRegex (got {len(given)})")
    key = given[0]
    value = options[key]
    if key == "topic":
        return [value]
    if key == "topics":
        names = [t.strip() for t in value.split(",") if t.strip()]
        if not names:
            raise BadInput("option topics names no topic")
        return list(dict.fromkeys(names))
    if key == "topicpattern":
        # SQL LIKE: % any run, _ one character; everything else literal
        rx = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in value)
    else:
        rx = value
    try:
        pattern = re.compile(rx, re.DOTALL)
    except re.error as exc:
        raise BadInput(f"option {key} is not a valid pattern: {exc}") from None
    return [t.name for t in meta.list_topics() if pattern.fullmatch(t.name)]


def _entry_count(meta: MetadataStore, led: Ledger, tier1: Tier1Store, sees_tier1: bool) -> int:
    if led.entries_unknown and led.state != S.DELETED:
        return UNKNOWN_ENTRY_COUNT  # a lost ledger nobody knows the size of: one part, read as its DATALOSS gap
    if led.state == S.OPEN and not sees_tier1:
        return 0  # an open ledger lives in tier 1 only: the driver must see it to fix its length
    count = tier1.extent(led)[0]  # as ReadHandle counts it: a file gone holds nothing yet; an unreadable one fails
    if led.state == S.OPEN and count == 0 and not tier1.exists(led.topic, led.ledger_id):
        # sealed, offloaded and its copy deleted since the snapshot: its entries are counted in its row now
        # (an executor reads them from tier 2), not skipped as an empty file's
        now = meta.find_ledger(led.topic, led.ledger_id)
        if now is not None and now.state != S.OPEN:
            count = now.entry_count
    return count


def _split(led: Ledger, ch: Chunk | None, first: int, last: int, split_bytes: int, bucket,
           index_cache: IndexCache | None, stats: PlanStats) -> list[Part]:
    count = max(1, led.entry_count)
    estimate = led.size_bytes * (last - first + 1) // count
    if estimate <= split_bytes:
        return [Part(led, ch, first, last, estimate)]
    if ch is not None and bucket is not None and index_cache is not None:
        before = index_cache.fetches
        index = index_cache.get(bucket() if callable(bucket) else bucket, ch)
        stats.index_fetches += index_cache.fetches - before
        pages = index.pages
        if pages is not None:
            parts, lo, hi = [], pages.find(first), pages.find(last)
            p = lo
            while p <= hi:
                start = index.page_span(p)[0]
                q = p
                while q < hi and index.page_span(q + 1)[1] - start <= split_bytes:
                    q += 1
                a = max(first, pages.first_entries[p])
                z = min(last, pages.last_entry(q, index.entry_count))
                parts.append(Part(led, ch, a, z, index.page_span(q)[1] - start))
                p = q + 1
            return parts
    n = -(-estimate // split_bytes)
    step = -(-(last - first + 1) // n)
    return [Part(led, ch, a, min(last, a + step - 1), estimate * (min(last, a + step - 1) - a + 1)
                 // (last - first + 1)) for a in range(first, last + 1, step)]


def plan(meta: MetadataStore, tier1: Tier1Store, topics: list[str], pushed: Pushed, *, sees_tier1: bool,
         split_bytes: int = DEFAULT_SPLIT_BYTES, bucket=None,
         index_cache: IndexCache | None = None) -> tuple[list[Part], PlanStats]:
    """Partitions of the topics' entries that pass the pushed filters, from one snapshot of the metadata.
    `bucket` is the tier-2 bucket, or a function making it: called only when a ledger is split by its pages."""
    stats = PlanStats(topics=len(topics), filters=pushed.describe())
    ledger_b, sealed_b, offloaded_b = pushed.bound("ledger_id"), pushed.bound("sealed_at"), pushed.bound("offloaded_at")
    lrange, erange = ledger_b.int_range(), pushed.bound("entry_id").int_range()
    entry_values = pushed.bound("entry_id").values
    parts: list[Part] = []
    if lrange is None or erange is None or not topics:
        return parts, stats
    # One transaction for every topic's rows: one instant of the metadata (REPEATABLE READ).
    with meta.engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
        rows = [(t, meta.list_ledgers(t, conn=conn), meta.chunks(t, conn=conn)) for t in topics]
    for _topic, ledgers, chunks in rows:
        for led in ledgers:
            stats.ledgers_seen += 1
            if not ledger_b.allows(led.ledger_id) or not sealed_b.allows(led.sealed_at) or \
                    not offloaded_b.allows(led.offloaded_at):
                continue
            count = _entry_count(meta, led, tier1, sees_tier1)
            first, last = max(0, erange[0]), min(count - 1, erange[1])
            if entry_values is not None and not any(first <= v <= last for v in entry_values):
                continue
            if first > last:
                continue
            if led.state == S.DELETED:
                stats.trimmed_ledgers += 1
                stats.trimmed_entries += last - first + 1
                continue
            ch = chunks.get(led.ledger_id) if led.state == S.OFFLOADED else None
            stats.ledgers_kept += 1
            for part in _split(led, ch, first, last, split_bytes, bucket, index_cache, stats):
                parts.append(part)
                stats.bytes += part.nbytes
                tier = "tier1" if led.tier1_present else "tier2" if ch is not None else "none"
                stats.by_tier[tier] = stats.by_tier.get(tier, 0) + 1
    stats.partitions = len(parts)
    return parts, stats


__all__ = ["DEFAULT_SPLIT_BYTES", "Part", "PlanStats", "plan", "select_topics"]
