"""Topics as Iceberg tables on the project's RGW and PostgreSQL: the table read back with pyiceberg equals
`tiering read` for tier-1-only, tier-2-only and mixed topics; a run stopped between its Iceberg commit and its
row update, then rerun, gives every entry once; two syncs of one round commit once; retention follows."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tiering.metadata.table_sync import TableRows
from tiering.ops.delete_lagged import delete_copy
from tiering.ops.offload import offload_ledger
from tiering.read import ReadHandle
from tiering.tables.catalog import catalog
from tiering.tables.files import local_writer
from tiering.tables.sync import Limits, TableSync, sync_tables
from tiering.tier2.reader import tier2_opener


@pytest.fixture
def cat(settings, db):
    c = catalog(settings)
    with db.begin() as conn:  # the bucket is emptied per test: forget the previous tests' tables
        conn.execute(text("DELETE FROM iceberg_tables"))
    return c


def _read(deps, topic):
    h = ReadHandle(deps.meta, deps.tier1, open_tier2=tier2_opener(deps.bucket))
    return {(e.ledger_id, e.entry_id): e.data for e in h.read(topic) if hasattr(e, "data")}


def _table_rows(cat, identifier):
    t = cat.load_table(identifier).scan().to_arrow()
    keys = list(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist()))
    assert len(keys) == len(set(keys)), "a row appears twice"
    return dict(zip(keys, t["payload"].to_pylist())), t


def _sync(deps, settings, cat, topic=None, **kw):
    s = TableSync(deps.meta.engine, settings, cat, **kw)
    return sync_tables(s, local_writer(deps, settings), topic)


def test_mixed_topic_equals_read(deps, settings, cat):
    produce(deps, "mixed", [entries("a", 5, 100), entries("b", 3, 50), [], entries("c", 4, 10)],
            open_tail=entries("d", 2, 10))
    for led in deps.meta.list_ledgers("mixed")[:2]:
        delete_copy(deps, offload_ledger(deps, led))  # ledgers 0-1 in tier 2 only
    TableRows(deps.meta.engine).set_policy("mixed", "ns.mixed", "follow")
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced", r.error
    assert r.ledgers == [0, 1, 3] and r.passed == [2]  # the empty ledger passed over, the open one not taken
    got, t = _table_rows(cat, "ns.mixed")
    expected = {k: v for k, v in _read(deps, "mixed").items() if k[0] != 4}
    assert got == expected
    assert set(t["topic"].to_pylist()) == {"mixed"}
    state = TableRows(deps.meta.engine).get("mixed")
    assert (state.synced_through, state.ledgers_committed, state.entries_committed) == (3, 3, 12)
    assert state.metadata_location == cat.load_table("ns.mixed").metadata_location
    [again] = _sync(deps, settings, cat)
    assert again.status == "up_to_date" and again.ledgers == []
    assert _table_rows(cat, "ns.mixed")[0] == expected

