"""The topic_usage triggers lock a topic's totals row at the end of each changing statement. A transaction
of several statements (retention's delete_ledgers, defrag's replace_chunks, a batch's undo) must therefore
take its row locks before its first change, or it deadlocks with a one-statement writer of the same topic:
the multi-statement one holds the totals row and waits for a ledger row, the other holds that ledger row and
waits for the totals row. PostgreSQL."""
from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import event, text

from tests.integration.helpers import entries, produce, race_paused_at, wait_until_waiting_on_lock
from tiering.errors import ConditionalUpdateFailed
from tiering.model import LedgerState as S
from tiering.ops.offload import offload_many


def test_retention_and_a_one_statement_writer_of_the_same_topic_do_not_deadlock(deps, db):
    produce(deps, "dl", [entries(f"dl{i}", 2, 50) for i in range(2)])
    assert offload_many(deps, deps.meta.list_ledgers("dl", [S.SEALED])).failed == {}
    first, second = deps.meta.list_ledgers("dl", [S.OFFLOADED])

    paused, go = threading.Event(), threading.Event()
    retention_thread = []

    def after(conn, cursor, statement, *_a, **_kw):
        # pause retention's transaction right after its first change (the first chunk row deleted)
        if threading.get_ident() in retention_thread and statement.startswith("DELETE FROM tiering.chunk") \
                and not paused.is_set():
            paused.set()
            go.wait(30)

    event.listen(db, "after_cursor_execute", after)
    outcome = {}

    def retention():
        retention_thread.append(threading.get_ident())
        try:
            deps.meta.delete_ledgers([first, second], "retention", timedelta(0))
            outcome["retention"] = "done"
        except ConditionalUpdateFailed:
            outcome["retention"] = "lost its compare-and-set"
        except Exception as exc:  # noqa: BLE001 - the deadlock this test is about
            outcome["retention"] = f"{type(exc).__name__}: {exc}"

    t = threading.Thread(target=retention)
    t.start()
    try:
        assert paused.wait(30)
        # a one-statement writer of the second ledger (delete-lagged's mark), in a transaction of its own
        writer = db.connect()
        tx = writer.begin()
        marker = "usage-lock-order-test"
        w = threading.Thread(target=lambda: writer.execute(text(
            f"UPDATE tiering.ledger /* {marker} */ SET tier1_present = false, tier1_deleted_at = now(), "
            "version = version + 1 WHERE topic_id = :t AND ledger_id = :l"),
            {"t": second.topic_id, "l": second.ledger_id}))
        w.start()
        wait_until_waiting_on_lock(db, marker, w.is_alive)
        go.set()  # retention goes on to the second ledger while the writer waits
        w.join(30)
        t.join(30)
        tx.commit()
        writer.close()
    finally:
        go.set()
        event.remove(db, "after_cursor_execute", after)
    # retention either finished first or lost its compare-and-set to the writer: never a deadlock
    assert outcome["retention"] in ("done", "lost its compare-and-set"), outcome


def test_a_topic_delete_and_an_offload_committing_in_it_do_not_deadlock(deps, db):
    # the offload's commit holds its ledger rows, then its chunk insert's totals trigger checks the topic row
    # (FOR KEY SHARE); the delete must not hold that row against it while waiting for those ledger rows
    from tiering.ops.topics import delete_topic

    produce(deps, "dd", [entries(f"dd{i}", 2, 50) for i in range(2)])
    sealed = deps.meta.list_ledgers("dd", [S.SEALED])
    # the offload's commit paused after its ledger rows changed, before its chunk rows
    offloaded, deleted = race_paused_at(db, "before_cursor_execute",
                                        lambda statement: statement.startswith("INSERT INTO tiering.chunk"),
                                        lambda: offload_many(deps, sealed), lambda: delete_topic(deps, "dd"),
                                        "tiering.ledger.ledger_id FOR UPDATE")
    assert not isinstance(offloaded, str), offloaded
    assert not isinstance(deleted, str), deleted
    assert deleted.ledgers_deleted == 2
    assert [t.name for t in deps.meta.list_topics()] == []


def test_a_trims_row_locks_take_the_chunks_sharing_its_ledgers_data_object(db, s3_client, bucket, tier1_root):
    """Deleting or moving one chunk of a shared data object makes the data_alone recount (migration 0007)
    update the other chunks of that object, after the totals row is held: those rows are locked first too,
    or a writer holding one of them and waiting for the totals row would deadlock with the trim."""
    from tests.integration.helpers import make_deps
    from tiering.model import MIB

    deps = make_deps(db, s3_client, bucket, tier1_root, batch_small_bytes=8 * MIB)
    produce(deps, "sh", [entries(f"sh{i}", 2, 50) for i in range(3)])
    assert offload_many(deps, deps.meta.list_ledgers("sh", [S.SEALED])).failed == {}
    chunks = deps.meta.chunks("sh")
    assert len({c.data_key for c in chunks.values()}) == 1  # one shared object
    first = deps.meta.get_ledger("sh", 0)
    with db.begin() as conn:
        deps.meta.lock_rows(conn, [first], chunks=True)
        with db.connect() as other:
            for ledger_id in (1, 2):
                with pytest.raises(Exception, match="lock timeout"):
                    with other.begin():
                        other.execute(text("SET LOCAL lock_timeout = '200ms'"))
                        other.execute(text("SELECT 1 FROM tiering.chunk WHERE ledger_id = :l AND topic_id = "
                                           ":t FOR UPDATE"), {"l": ledger_id, "t": first.topic_id})
            # the other ledgers' ledger rows are not taken
            with other.begin():
                other.execute(text("SELECT 1 FROM tiering.ledger WHERE ledger_id = 1 AND topic_id = :t FOR UPDATE"),
                              {"t": first.topic_id})
