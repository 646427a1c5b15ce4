"""A read's snapshot of chunk rows never outlives GC's delay: its age is derived from
TIERING_GC_DELAY_SECONDS (half of it, at most 60 s; none when the delay is 0), so a row the read holds never
names an object GC already collected."""
from __future__ import annotations

from datetime import timedelta

import pytest

from tests.integration.helpers import MIB, entries, produce
from tiering.model import LedgerState as S
from tiering.ops.defrag import defrag
from tiering.ops.gc import run_gc
from tiering.ops.offload import offload_ledger
from tiering.read import CHUNKS_MAX_AGE_S, Entry, ReadHandle, chunks_max_age
from tiering.tier2.reader import tier2_opener


def test_the_snapshot_age_is_derived_from_the_gc_delay():
    assert chunks_max_age(600) == CHUNKS_MAX_AGE_S == 60  # the default delay: a minute
    assert chunks_max_age(30) == 15
    assert chunks_max_age(0) == 0


def offloaded_in_tier2_only(deps, topic, n=3):
    expected = produce(deps, topic, [entries(f"{topic}{i}", 5, 1000) for i in range(n)])
    for led in deps.meta.list_ledgers(topic, [S.SEALED]):
        done = offload_ledger(deps, led)
        deps.tier1.delete(topic, done.ledger_id)
        deps.meta.mark_tier1_deleted(done)
    return expected


@pytest.mark.parametrize("how", ["default", "gc-delay-0"])
def test_a_read_outlives_a_defrag_and_gc_with_no_delay(deps, how):
    """GC delay 0 (the tests' setting, allowed in production): defrag merges and GC collects the old objects
    while a read is between ledgers; the read must take the new rows, not a minute-old snapshot."""
    assert deps.knobs.gc_delay == timedelta(0)
    expected = offloaded_in_tier2_only(deps, "snap")
    kwargs = {} if how == "default" else {"gc_delay_seconds": 0}
    reading = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket), **kwargs).read("snap")
    first = next(reading)
    assert (first.ledger_id, first.entry_id) == (0, 0)
    assert defrag(deps, "snap", small_bytes=8 * MIB, max_merged_bytes=64 * MIB).groups == 1
    assert len(run_gc(deps, orphan_grace=timedelta(hours=1)).deleted) == 6  # the three old object pairs
    got = {(first.ledger_id, first.entry_id): first.data}
    got.update({(e.ledger_id, e.entry_id): e.data for e in reading if isinstance(e, Entry)})
    assert got == expected


class CountingMeta:
    """The metadata store, counting the chunk-row queries a read makes."""

    def __init__(self, meta):
        self._meta, self.calls = meta, {"chunks": 0, "get_chunk": 0}

    def __getattr__(self, name):
        attr = getattr(self._meta, name)
        if name in self.calls:
            def counted(*args, **kwargs):
                self.calls[name] += 1
                return attr(*args, **kwargs)
            return counted
        return attr


@pytest.mark.parametrize("delay,calls", [(600, {"chunks": 1, "get_chunk": 0}), (0, {"chunks": 0, "get_chunk": 3})])
def test_with_a_delay_one_query_per_topic_without_one_per_ledger(deps, delay, calls):
    expected = offloaded_in_tier2_only(deps, "count")
    meta = CountingMeta(deps.meta)
    got = ReadHandle(meta, deps.tier1, tier2_opener(deps.bucket), gc_delay_seconds=delay).read("count")
    assert {(e.ledger_id, e.entry_id): e.data for e in got if isinstance(e, Entry)} == expected
    assert meta.calls == calls
