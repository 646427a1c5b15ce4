"""A topic's table sync meeting a lost ledger (no tier holds a good copy) on RGW and PostgreSQL: the round
fails naming DATALOSS and commits nothing, so the table never silently misses entries, and a `truncate` past
the ledger lets the sync go on; the same for a ledger of unknown size (recovery found its id, no index)."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tests.integration.test_tables import _read, _sync, _table_rows, cat  # noqa: F401 (the fixture)
from tiering.metadata.table_sync import TableRows
from tiering.model import Position
from tiering.ops.delete_lagged import delete_copy
from tiering.ops.offload import offload_ledger
from tiering.ops.retention import truncate


def _lose(deps, topic: str, ledger_id: int, unknown_size: bool) -> None:
    """Ledger `ledger_id` marked lost as recovery records it: its objects gone, no chunk row; of unknown
    size (entry count 0) or with the count its index still said."""
    chunk = deps.meta.get_chunk(deps.meta.get_ledger(topic, ledger_id))
    for key in (chunk.data_key, chunk.index_key):
        deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=key)
    size = ", entry_count = 0, size_bytes = 0" if unknown_size else ""
    with deps.meta.engine.begin() as conn:
        t = conn.execute(text("SELECT topic_id FROM tiering.topic WHERE name = :n"), {"n": topic}).scalar_one()
        conn.execute(text("DELETE FROM tiering.chunk WHERE topic_id = :t AND ledger_id = :l"),
                     {"t": t, "l": ledger_id})
        conn.execute(text(f"UPDATE tiering.ledger SET lost_at = now(), lost_reason = 'recovery: no copy'{size} "
                          "WHERE topic_id = :t AND ledger_id = :l"), {"t": t, "l": ledger_id})
    assert deps.meta.get_ledger(topic, ledger_id).lost


@pytest.mark.parametrize("unknown_size", [False, True], ids=["known-size", "unknown-size"])
def test_a_lost_ledger_stops_the_sync_until_truncated_past(deps, settings, cat, unknown_size):  # noqa: F811
    produce(deps, "l", [entries(f"l{i}", 4, 50) for i in range(3)])
    for led in deps.meta.list_ledgers("l"):
        delete_copy(deps, offload_ledger(deps, led))  # tier 2 only
    _lose(deps, "l", 1, unknown_size)
    TableRows(deps.meta.engine).set_policy("l", "ns.l", "follow")
    [r] = _sync(deps, settings, cat)
    assert r.status == "failed" and "ledger l/1 entries 0.." in r.error and "are in no tier" in r.error, r.error
    assert ("entry count unknown" in r.error) == unknown_size
    assert TableRows(deps.meta.engine).get("l").synced_through == -1  # the round committed nothing
    [again] = _sync(deps, settings, cat)  # and it stays so: nothing is passed over silently
    assert again.status == "failed" and TableRows(deps.meta.engine).get("l").synced_through == -1
    truncate(deps, "l", Position(2, 0), force=True)
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.ledgers == [2], r.error
    got, _ = _table_rows(cat, "ns.l")
    assert got == _read(deps, "l") and {lid for lid, _ in got} == {2}
