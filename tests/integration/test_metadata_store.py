"""Every ledger transition and attribute verb against the real PostgreSQL."""
from __future__ import annotations

import time
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DataError, IntegrityError

from tiering.errors import ConditionalUpdateFailed, LedgerNotFound, TopicExists, TopicNotFound
from tiering.metadata.attributes import Attributes, AttributeUpdate, Verb
from tiering.metadata.migrations import upgrade
from tiering.metadata.repository import MetadataStore
from tiering.model import Chunk, LedgerState as S, TopicPolicy

GC_DELAY = timedelta(minutes=30)


@pytest.fixture
def meta(db):
    return MetadataStore(db)


def _chunk(led, attempt):
    return Chunk(f"p/t/{attempt}-ledger-{led.ledger_id}", 0, 100, f"p/t/{attempt}-ledger-{led.ledger_id}-index",
                 0, 50, 0, led.entry_count - 1)


def _sealed(meta, name="t", entries=10):
    led = meta.open_ledger(name)
    return meta.seal_ledger(led, entries, entries * 100)


def _gc_keys(db):
    with db.connect() as conn:
        return sorted(conn.execute(text("SELECT key FROM tiering.gc_task")).scalars())


def test_upgrade_is_idempotent(db):
    result = upgrade(db)
    assert result.applied == [] and "0001_initial.sql" in result.already
    assert "tiering.tier_usage" in result.views


def test_topic_create_get_duplicate_unknown(meta):
    t = meta.create_topic("orders", TopicPolicy(offload_after_seconds=60))
    assert meta.get_topic("orders") == t
    assert t.policy.deletion_lag_seconds == 4 * 3600 and t.policy.retention_seconds == -1
    with pytest.raises(TopicExists):
        meta.create_topic("orders")
    with pytest.raises(TopicNotFound):
        meta.get_topic("nope")
    with pytest.raises(TopicNotFound):
        meta.list_ledgers("nope")


def test_set_policy_is_conditional(meta):
    t = meta.create_topic("p")
    t2 = meta.set_policy("p", t.version, TopicPolicy(retention_seconds=5))
    assert t2.policy.retention_seconds == 5 and t2.version == t.version + 1
    with pytest.raises(ConditionalUpdateFailed, match=f"expected version {t.version}, found version {t2.version}"):
        meta.set_policy("p", t.version, TopicPolicy())


def test_ledger_life_open_sealed_offloading_offloaded_tier1_deleted_deleted(meta, db):
    meta.create_topic("t")
    led = meta.open_ledger("t")
    assert (led.ledger_id, led.state, led.version) == (0, S.OPEN, 0)
    sealed = meta.seal_ledger(led, 10, 1000)
    assert (sealed.state, sealed.entry_count, sealed.size_bytes, sealed.version) == (S.SEALED, 10, 1000, 1)
    assert sealed.sealed_at is not None
    attempt = str(uuid.uuid4())
    ch = _chunk(sealed, attempt)
    off = meta.begin_offload(sealed, attempt, [ch.data_key, ch.index_key], GC_DELAY)
    assert off.state == S.OFFLOADING and off.offload_uuid == attempt
    assert _gc_keys(db) == sorted([ch.data_key, ch.index_key])  # queued before the upload starts
    done = meta.complete_offload(off, attempt, ch)
    assert done.state == S.OFFLOADED and done.offloaded_at is not None
    assert meta.get_chunk(done) == ch
    assert _gc_keys(db) == []  # dequeued by the commit that references them
    gone = meta.mark_tier1_deleted(done)
    assert gone.tier1_present is False
    [deleted] = meta.delete_ledgers([gone], "retention", timedelta(0))
    assert deleted.state == S.DELETED and meta.get_chunk(deleted) is None
    assert _gc_keys(db) == sorted([ch.data_key, ch.index_key])
    assert meta.open_ledger("t").ledger_id == 1


def test_stale_version_fails_with_expected_and_found(meta):
    meta.create_topic("t")
    led = meta.open_ledger("t")
    meta.seal_ledger(led, 1, 1)
    with pytest.raises(ConditionalUpdateFailed) as err:
        meta.seal_ledger(led, 2, 2)
    assert "expected version 0 in OPEN" in str(err.value) and "found version 1 in SEALED" in str(err.value)


def test_one_open_ledger_per_topic(meta):
    meta.create_topic("t")
    meta.open_ledger("t")
    with pytest.raises(ConditionalUpdateFailed, match="OPEN ledger"):
        meta.open_ledger("t")


def test_abort_returns_to_sealed_and_keeps_or_drops_gc_keys(meta, db):
    meta.create_topic("t")
    led = _sealed(meta)
    a1 = str(uuid.uuid4())
    off = meta.begin_offload(led, a1, ["k1", "k2"], GC_DELAY)
    back = meta.abort_offload(off, a1, objects_deleted=False)
    assert back.state == S.SEALED and back.offload_uuid is None
    assert _gc_keys(db) == ["k1", "k2"]  # not cleaned by the attempt: GC collects them
    a2 = str(uuid.uuid4())
    off2 = meta.begin_offload(back, a2, ["k3"], GC_DELAY)
    meta.abort_offload(off2, a2, objects_deleted=True)
    assert _gc_keys(db) == ["k1", "k2"]


def test_takeover_of_stale_attempt_and_old_attempt_cannot_commit(meta, db):
    meta.create_topic("t")
    led = _sealed(meta)
    with meta.new_attempt() as old:  # its worker alive: its lock held
        off = meta.begin_offload(led, old, ["old-d", "old-i"], GC_DELAY)
        with pytest.raises(ConditionalUpdateFailed, match="older than"):
            meta.begin_offload(off, str(uuid.uuid4()), ["x"], GC_DELAY, stale_after=timedelta(hours=1))
        new = str(uuid.uuid4())
    taken = meta.begin_offload(off, new, ["new-d", "new-i"], GC_DELAY, stale_after=timedelta(0))
    assert taken.offload_uuid == new and taken.version == off.version + 1
    with pytest.raises(ConditionalUpdateFailed, match=f"with attempt {old}"):
        meta.complete_offload(taken, old, Chunk("old-d", 0, 1, "old-i", 0, 1, 0, 9))
    meta.complete_offload(taken, new, Chunk("new-d", 0, 1, "new-i", 0, 1, 0, 9))
    assert _gc_keys(db) == ["old-d", "old-i"]  # the dead attempt's objects are collected


def _wait_until_backend_exits(db, pid, timeout=30.0):
    """The server ends a closed session's backend (and frees its advisory locks) after the
    client has gone, not before close() returns: wait for that, as the next run would."""
    deadline = time.monotonic() + timeout
    with db.connect() as conn:
        while conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"),
                           {"p": pid}).scalar():
            assert time.monotonic() < deadline, f"backend {pid} still alive after {timeout} s"
            time.sleep(0.02)
            conn.rollback()


def test_an_attempt_whose_worker_died_is_taken_over_at_once(meta, db):
    """An attempt's lock lives as long as its worker's connection; the offload timeout
    (an hour here) is only the fallback for workers that may still be alive."""
    meta.create_topic("t")
    led = _sealed(meta)
    hour = timedelta(hours=1)
    worker = db.connect().execution_options(isolation_level="AUTOCOMMIT")  # the worker's own session
    attempt = str(uuid.uuid4())
    assert worker.execute(text("SELECT pg_try_advisory_lock(x'6f66666c'::int, hashtext(:a))"),
                          {"a": attempt}).scalar()
    off = meta.begin_offload(led, attempt, ["d", "i"], GC_DELAY)
    assert meta.stale_offloads(hour) == []  # alive: neither planned nor taken over
    with pytest.raises(ConditionalUpdateFailed, match="its worker alive"):
        meta.begin_offload(off, str(uuid.uuid4()), ["x"], GC_DELAY, stale_after=hour)
    pid = worker.execute(text("SELECT pg_backend_pid()")).scalar()
    worker.invalidate()  # the worker dies: its connection closes
    worker.close()
    _wait_until_backend_exits(db, pid)
    assert [x.ledger_id for x in meta.stale_offloads(hour)] == [led.ledger_id]
    with meta.new_attempt() as new:
        taken = meta.begin_offload(off, new, ["d2", "i2"], GC_DELAY, stale_after=hour)
        assert taken.offload_uuid == new
        assert meta.stale_offloads(hour) == []  # the new attempt's worker (this process) is alive
    # the planner's check takes no lock it keeps: a live attempt stays alive after being looked at
    with meta.new_attempt() as a2:
        meta.stale_offloads(hour)
        with db.connect() as other:
            assert not other.execute(text("SELECT pg_try_advisory_lock(x'6f66666c'::int, hashtext(:a))"),
                                     {"a": a2}).scalar()


def test_complete_fails_whole_when_gc_collected_a_key(meta, db):
    meta.create_topic("t")
    led = _sealed(meta)
    a = str(uuid.uuid4())
    off = meta.begin_offload(led, a, ["d", "i"], GC_DELAY)
    with db.begin() as conn:
        conn.execute(text("DELETE FROM tiering.gc_task WHERE key = 'i'"))
    with pytest.raises(ConditionalUpdateFailed, match="collected"):
        meta.complete_offload(off, a, Chunk("d", 0, 1, "i", 0, 1, 0, 9))
    after = meta.get_ledger("t", led.ledger_id)
    assert after.state == S.OFFLOADING and meta.get_chunk(after) is None and _gc_keys(db) == ["d"]


def test_tier1_copy_only_deleted_after_offload(meta):
    meta.create_topic("t")
    led = _sealed(meta)
    with pytest.raises(ConditionalUpdateFailed):
        meta.mark_tier1_deleted(led)


def test_impossible_states_are_rejected_by_the_schema(meta, db):
    meta.create_topic("t")
    led = _sealed(meta)
    bad = [
        "UPDATE tiering.ledger SET state = 'OFFLOADED', offload_uuid = gen_random_uuid(), offloaded_at = now()",
        "UPDATE tiering.ledger SET entry_count = -1",
        "UPDATE tiering.ledger SET tier1_present = false, tier1_deleted_at = now()",
        "UPDATE tiering.ledger SET state = 'OFFLOADING'",
        f"INSERT INTO tiering.ledger (topic_id, ledger_id) VALUES ({led.topic_id}, {led.ledger_id})",
        "UPDATE tiering.ledger SET state = 'BOGUS'",
    ]
    for stmt in bad:
        with pytest.raises((IntegrityError, DataError)):
            with db.begin() as conn:
                conn.execute(text(stmt))
    assert meta.get_ledger("t", led.ledger_id) == led


def test_unknown_ledger(meta):
    meta.create_topic("t")
    with pytest.raises(LedgerNotFound):
        meta.get_ledger("t", 7)


def test_attribute_verbs(meta, db):
    meta.create_topic("a")
    attrs = Attributes(db)
    assert attrs.update("a", [AttributeUpdate("r", Verb.REPLACE, 5)]) == {"r": 5}
    assert attrs.update("a", [AttributeUpdate("r", Verb.REPLACE, -3)]) == {"r": -3}
    assert attrs.update("a", [AttributeUpdate("g", Verb.REPLACE_IF_GREATER, 10)]) == {"g": 10}
    assert attrs.update("a", [AttributeUpdate("g", Verb.REPLACE_IF_GREATER, 11)]) == {"g": 11}
    with pytest.raises(ConditionalUpdateFailed, match="expected a value below 11, found 11"):
        attrs.update("a", [AttributeUpdate("g", Verb.REPLACE_IF_GREATER, 11)])
    assert attrs.update("a", [AttributeUpdate("e", Verb.REPLACE_IF_EQUALS, 1, expected=None)]) == {"e": 1}
    with pytest.raises(ConditionalUpdateFailed, match="expected not set, found 1"):
        attrs.update("a", [AttributeUpdate("e", Verb.REPLACE_IF_EQUALS, 2, expected=None)])
    assert attrs.update("a", [AttributeUpdate("e", Verb.REPLACE_IF_EQUALS, 2, expected=1)]) == {"e": 2}
    with pytest.raises(ConditionalUpdateFailed, match="expected 1, found 2"):
        attrs.update("a", [AttributeUpdate("e", Verb.REPLACE_IF_EQUALS, 3, expected=1)])
    assert attrs.update("a", [AttributeUpdate("n", Verb.ACCUMULATE, 4)]) == {"n": 4}
    assert attrs.update("a", [AttributeUpdate("n", Verb.ACCUMULATE, -1)]) == {"n": 3}
    assert attrs.get_all("a") == {"r": -3, "g": 11, "e": 2, "n": 3}


def test_failed_batch_applies_nothing(meta, db):
    meta.create_topic("a")
    attrs = Attributes(db)
    attrs.update("a", [AttributeUpdate("x", Verb.REPLACE, 1)])
    before = attrs.get_all("a")
    with pytest.raises(ConditionalUpdateFailed):
        attrs.update("a", [AttributeUpdate("a-first", Verb.ACCUMULATE, 5),
                           AttributeUpdate("new", Verb.REPLACE, 9),
                           AttributeUpdate("x", Verb.REPLACE_IF_EQUALS, 2, expected=0)])
    assert attrs.get_all("a") == before


def test_ledger_scoped_attributes_are_separate(meta, db):
    meta.create_topic("a")
    attrs = Attributes(db)
    attrs.update("a", [AttributeUpdate("k", Verb.REPLACE, 1)])
    attrs.update("a", [AttributeUpdate("k", Verb.REPLACE, 2)], ledger_id=0)
    assert attrs.get("a", "k") == 1 and attrs.get("a", "k", ledger_id=0) == 2


def test_sessions_are_in_utc_whatever_the_clients_or_servers_default(database_url, monkeypatch):
    """A client environment (PGTZ) or a database default in another zone must not move day and hour
    boundaries: the product's sessions run in UTC (a table partition and an hourly counter are UTC's)."""
    import psycopg2

    from tiering.metadata import make_engine

    monkeypatch.setenv("PGTZ", "Asia/Tokyo")
    plain = psycopg2.connect(database_url.replace("postgresql+psycopg2://", "postgresql://"))
    try:
        with plain.cursor() as cur:
            cur.execute("SHOW TimeZone")
            assert cur.fetchone()[0] == "Asia/Tokyo"  # what a session would be in by default here
    finally:
        plain.close()
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW TimeZone")).scalar_one() == "UTC"
            day = conn.execute(text("SELECT CAST(TIMESTAMPTZ '2026-11-27 23:30:00+00' AS date)")).scalar_one()
            assert day.isoformat() == "2026-11-27"
    finally:
        engine.dispose()
