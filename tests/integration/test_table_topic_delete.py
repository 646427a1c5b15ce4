"""A topic delete and its table's sync: the delete marks every ledger DELETED, which a sync that had read the
table row would take for retention's and, with retention 'follow', delete from the table: every row. So the
delete's step drops the table row with the ledgers, under the table's lock (it waits for a running sync or
maintenance), and a sync or maintenance finding the row gone does nothing. Real PostgreSQL, RGW and pyiceberg."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import timedelta

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tests.integration.test_cli import _on_a_terminal, cli  # noqa: F401  (the fixture)
from tests.integration.test_tables import cat  # noqa: F401  (the catalog, emptied of earlier tests' tables)
from tiering.errors import TieringError
from tiering.metadata.table_sync import TableRows, exclusive, quiet_for_delete
from tiering.model import LedgerState as S
from tiering.ops.topics import delete_topic
from tiering.tables.files import local_writer
from tiering.tables.maintenance import maintain_topic
from tiering.tables.sync import TableSync
from tiering.writer import ManagedLedgerWriter


@contextmanager
def held_by_another_thread(lock, release_after: float):
    """`lock` (a context manager taking a lock) taken by another thread before the block runs, and let go
    `release_after` seconds later, while the block waits for it."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock as got:
            if got is False:  # a try-lock refused
                return
            holding.set()
            release.wait(60)

    th = threading.Thread(target=hold)
    th.start()
    assert holding.wait(30), "the lock was not taken"
    threading.Timer(release_after, release.set).start()
    try:
        yield
    finally:
        th.join(30)


def rows_of(cat, identifier: str) -> list[tuple[int, int]]:
    t = cat.load_table(identifier).scan().to_arrow()
    return sorted(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist()))


def synced_topic(deps, settings, cat, name: str) -> TableSync:
    """`name` with a 'follow' table holding its three ledgers, and two more sealed ledgers not synced yet."""
    produce(deps, name, [entries(f"{name}{i}", 3, 20) for i in range(3)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy(name, f"ns.{name}", "follow")
    sync = TableSync(deps.meta.engine, settings, cat)
    assert sync.sync_topic(rows.get(name), local_writer(deps, settings)).status == "synced"
    writer = ManagedLedgerWriter(deps.meta, deps.tier1, name)
    for i in range(3, 5):
        for data in entries(f"{name}{i}", 3, 20):
            writer.append(data)
        writer.seal()
    writer.close()
    return sync


def test_a_topic_delete_during_a_sync_waits_for_it_and_the_table_keeps_its_rows(deps, settings, cat, monkeypatch):
    sync = synced_topic(deps, settings, cat, "dr")
    state = TableRows(deps.meta.engine).get("dr")
    waited, done = [], []

    def delete() -> None:
        done.append(delete_topic(deps, "dr", force=True))

    real = TableSync.follow_retention

    def delete_meanwhile(self, st, table):
        # the delete starts after this sync has read the row under its lock, before it follows retention
        th = threading.Thread(target=delete)
        th.start()
        th.join(3)
        waited.append(th.is_alive())
        follow_thread.append(th)
        return real(self, st, table)

    follow_thread: list[threading.Thread] = []
    monkeypatch.setattr(TableSync, "follow_retention", delete_meanwhile)
    r = sync.sync_topic(state, local_writer(deps, settings))
    follow_thread[0].join(60)
    assert waited == [True]  # the delete waited for the sync's lock
    assert r.status == "synced" and r.deleted == [] and r.ledgers == [3, 4], r.error
    assert done and done[0].ledgers_deleted == 5
    # every entry the topic had, none deleted by the topic's deletion
    assert rows_of(cat, "ns.dr") == [(lid, e) for lid in range(5) for e in range(3)]
    with deps.meta.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.topic_table")).scalar_one() == 0


def test_a_sync_or_maintenance_after_the_step_finds_no_row_and_leaves_the_table(deps, settings, cat):
    # a delete killed right after its step: ledgers DELETED, the table row gone with them, the topic left
    sync = synced_topic(deps, settings, cat, "half")
    stale = TableRows(deps.meta.engine).get("half")
    deps.meta.trims.delete_all_ledgers("half", timedelta(0))
    assert {led.state for led in deps.meta.list_ledgers("half")} == {S.DELETED}
    r = sync.sync_topic(stale, local_writer(deps, settings))
    assert r.status == "failed" and "'half' was deleted meanwhile: nothing synced" in r.error
    m = maintain_topic(sync, stale, timedelta(0), orphan_grace=timedelta(0))
    assert m.errors == ["topic 'half' was deleted meanwhile: nothing done; its table stays as it was"]
    assert rows_of(cat, "ns.half") == [(lid, e) for lid in range(3) for e in range(3)]


def test_a_delete_waits_for_a_running_sync_only_so_long(deps, settings, cat):
    synced_topic(deps, settings, cat, "busy")
    topic_id = deps.meta.get_topic("busy").topic_id
    with exclusive(deps.meta.engine, topic_id) as held:  # as a sync holds it for its run
        assert held
        told = []  # the operator is told once that the delete waits, not at every poll
        with pytest.raises(TieringError, match=r"table ran on past the 0.5 s a topic delete waits for it: nothing "
                                               r"deleted; run topic delete again"):
            deps.meta.trims.delete_all_ledgers("busy", timedelta(0), table_wait_seconds=0.5,
                                               on_wait=lambda: told.append(1))
        assert told == [1]
    assert S.DELETED not in {led.state for led in deps.meta.list_ledgers("busy")}
    assert TableRows(deps.meta.engine).get("busy") is not None
    assert delete_topic(deps, "busy", force=True, on_wait=lambda: told.append(2)).ledgers_deleted == 5
    assert told == [1]  # once the sync let go: no wait, nothing said


def test_a_sync_meeting_a_delete_s_step_waits_for_it_rather_than_report_another_sync(deps, settings, cat):
    """The step held the sync's own lock unmarked: a sync meeting it said "skipped: another sync of this topic
    is running", exit 0, though none was (and the delete could still fail, leaving the ledgers unsynced)."""
    sync = synced_topic(deps, settings, cat, "meet")
    state = TableRows(deps.meta.engine).get("meet")
    with held_by_another_thread(quiet_for_delete(deps.meta.engine, "meet", state.topic_id, 5), 1.5):
        r = sync.sync_topic(state, local_writer(deps, settings))  # the delete's step then failed: nothing deleted
    assert r.status == "synced" and r.ledgers == [3, 4], (r.status, r.error)


def test_an_operator_at_a_terminal_is_told_the_delete_waits(deps, cli):
    """Waiting up to 10 minutes for a sync would look like a hang: on a terminal the delete says why, once."""
    produce(deps, "told", [entries("told0", 3, 20)])
    topic_id = deps.meta.get_topic("told").topic_id
    with held_by_another_thread(exclusive(deps.meta.engine, topic_id), 3):  # as a sync holds it for its run
        code, out, shown = _on_a_terminal(cli, "topic", "delete", "told", "--force")
    assert code == 0 and b"deleted topic 'told'" in out
    assert shown.count(b"topic delete waits for a sync or maintenance of the Iceberg table of topic 'told' to "
                       b"end (up to 600 s)") == 1
    assert "told" not in {t.name for t in deps.meta.list_topics()}
