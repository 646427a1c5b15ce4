"""A read that listed a ledger while it was open and reaches it after the pipeline sealed it, offloaded it
and deleted its tier-1 copy (deletion lag 0) between two of the read's looks at the file: every entry comes
back, from tier 2, none is skipped and no copy is called corrupt."""
from __future__ import annotations

import pytest

from tests.integration.helpers import entries, produce
from tiering.model import LedgerState as S
from tiering.ops.offload import offload_ledger
from tiering.read import Entry, Gap, ReadHandle
from tiering.tier1 import Tier1Store
from tiering.tier2.reader import tier2_opener
from tiering.writer import ManagedLedgerWriter


class RacingTier1(Tier1Store):
    """Tier 1 as the read sees it, where the pipeline finishes with the open ledger right after the read's
    first call of `after` on that ledger's file."""

    def __init__(self, deps, topic, ledger_id, after):
        super().__init__(deps.tier1.root)
        self.deps, self.topic, self.ledger_id, self.after, self.fired = deps, topic, ledger_id, after, False

    def _race(self, topic, ledger_id):
        if self.fired or (topic, ledger_id) != (self.topic, self.ledger_id):
            return
        self.fired = True
        writer = ManagedLedgerWriter(self.deps.meta, self.deps.tier1, topic)
        try:
            writer.seal()
        finally:
            writer.close()
        done = offload_ledger(self.deps, self.deps.meta.get_ledger(topic, ledger_id))
        self.deps.tier1.delete(topic, ledger_id)
        self.deps.meta.mark_tier1_deleted(done)

    def exists(self, topic, ledger_id):
        found = super().exists(topic, ledger_id)
        if self.after == "exists":
            self._race(topic, ledger_id)
        return found

    def written(self, topic, ledger_id):
        got = super().written(topic, ledger_id)
        if self.after == "written":
            self._race(topic, ledger_id)
        return got


@pytest.mark.parametrize("after", ["exists", "written"])
@pytest.mark.parametrize("batches", [False, True], ids=["read", "read_batches"])
def test_the_open_ledger_sealed_offloaded_and_deleted_under_the_read(deps, after, batches):
    expected = produce(deps, "race", [entries("race0", 4, 300)], open_tail=entries("race1", 6, 300))
    assert [led.state for led in deps.meta.list_ledgers("race")] == [S.SEALED, S.OPEN]
    handle = ReadHandle(deps.meta, RacingTier1(deps, "race", 1, after), tier2_opener(deps.bucket))
    reading = handle.read_batches("race") if batches else handle.read("race")
    items = list(reading)
    assert handle.tier1.fired
    assert not [i for i in items if isinstance(i, Gap)]
    got = [e for i in items for e in (i.entries() if batches else [i])]
    assert all(isinstance(e, Entry) for e in got)
    assert {(e.ledger_id, e.entry_id): e.data for e in got} == expected
    assert len(got) == len(expected)


class GoneBeforeCount(RacingTier1):
    """The pipeline is done with the open ledger after the Spark driver's snapshot of the rows and before it
    counts the ledger's file."""

    def written(self, topic, ledger_id):
        self._race(topic, ledger_id)
        return super().written(topic, ledger_id)


def test_the_spark_plan_counts_an_open_ledger_gone_from_tier_1_since_its_snapshot(deps):
    from tiering.read import Run, read_ledger_range
    from tiering.spark.filters import Pushed
    from tiering.spark.plan import plan

    expected = produce(deps, "plan", [entries("plan0", 4, 300)], open_tail=entries("plan1", 6, 300))
    tier1 = GoneBeforeCount(deps, "plan", 1, None)
    parts, _ = plan(deps.meta, tier1, ["plan"], Pushed(), sees_tier1=True)
    assert tier1.fired
    assert [(p.led.ledger_id, p.first, p.last) for p in parts] == [(0, 0, 3), (1, 0, 5)]
    opener = tier2_opener(deps.bucket)
    got = {}
    for p in parts:  # as an executor reads each part
        for run in read_ledger_range(deps.meta, p.led, p.first, p.last, deps.tier1, opener, lambda: p.chunk):
            assert isinstance(run, Run)
            got.update({(p.led.ledger_id, e): data for e, data in run.entries})
    assert got == expected


def test_a_from_inside_an_open_ledger_gone_from_tier_1_since_the_listing_is_not_past_its_end(deps):
    """`tiering read --from L:E` checks the position against the ledger's count: an open ledger the pipeline
    finished with (sealed, offloaded, copy deleted) right after the listing still has its entries."""
    from types import SimpleNamespace

    from tiering.cli.data import check_start
    from tiering.model import Position

    produce(deps, "from", [entries("from0", 4, 300)], open_tail=entries("from1", 6, 300))
    tier1 = GoneBeforeCount(deps, "from", 1, None)
    check_start(SimpleNamespace(meta=deps.meta, tier1=tier1), "from", Position(1, 5))  # no BadInput
    assert tier1.fired
