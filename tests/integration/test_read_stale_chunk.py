"""A read that holds a chunk row GC has since made stale re-reads the row and goes on (ReadHandle, as the
Spark source): a snapshot of rows taken with a long GC delay, then defrag and GC with none, must not fail
the read with a missing object."""
from __future__ import annotations

from datetime import timedelta

from tests.integration.helpers import MIB, entries, produce
from tiering.model import LedgerState as S
from tiering.ops.defrag import defrag
from tiering.ops.gc import run_gc
from tiering.ops.offload import offload_ledger
from tiering.read import Entry, ReadHandle
from tiering.tier2.reader import tier2_opener


def test_a_snapshot_row_whose_object_gc_collected_is_re_read(deps):
    expected = produce(deps, "stale", [entries(f"stale{i}", 5, 1000) for i in range(3)])
    for led in deps.meta.list_ledgers("stale", [S.SEALED]):
        done = offload_ledger(deps, led)
        deps.tier1.delete("stale", done.ledger_id)
        deps.meta.mark_tier1_deleted(done)
    # the read believes GC keeps objects ten minutes: it holds the topic's rows for a minute
    reading = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket), gc_delay_seconds=600).read("stale")
    first = next(reading)
    assert (first.ledger_id, first.entry_id) == (0, 0)
    assert deps.knobs.gc_delay == timedelta(0)  # while GC here collects at once
    assert defrag(deps, "stale", small_bytes=8 * MIB, max_merged_bytes=64 * MIB).groups == 1
    assert len(run_gc(deps, orphan_grace=timedelta(hours=1)).deleted) == 6
    got = {(first.ledger_id, first.entry_id): first.data}
    got.update({(e.ledger_id, e.entry_id): e.data for e in reading if isinstance(e, Entry)})
    assert got == expected
