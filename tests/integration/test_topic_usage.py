"""tiering.topic_usage (migration 0003) stays equal to the aggregates over the base tables through every
operation that changes ledgers or chunks, done by the real code on the real PostgreSQL and loopback S3:
produce and seal, offload (one pair per ledger and batched), delete-lagged, retention, truncate, defrag, GC,
an aborted offload, recovery from the bucket into an empty database, a topic's deletion, TRUNCATE; and
tiering.recompute_topic_usage() repairs totals written past the triggers. The dashboard series' hourly
counters (tiering.ledger_hourly, migration 0010) are checked against their definition at every step too."""
from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.integration.helpers import MIB, entries, make_deps, produce
from tiering.metadata import make_engine, upgrade
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.defrag import defrag
from tiering.ops.delete_lagged import delete_lagged
from tiering.ops.gc import run_gc
from tiering.ops.offload import offload_many
from tiering.ops.recover import recover_from_bucket
from tiering.ops.retention import retention, truncate

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
COLUMNS = ("open_ledgers", "sealed_ledgers", "offloading_ledgers", "offloaded_ledgers", "deleted_ledgers",
           "live_ledgers", "live_entries", "live_bytes", "tier1_ledgers", "tier1_bytes", "tier2_ledgers",
           "tier2_bytes", "tier2_stored_bytes")

# The totals by definition, from the base tables (independent of the migration's recompute function).
REFERENCE = """
    SELECT t.topic_id,
           count(l.ledger_id) FILTER (WHERE l.state = 'OPEN')       AS open_ledgers,
           count(l.ledger_id) FILTER (WHERE l.state = 'SEALED')     AS sealed_ledgers,
           count(l.ledger_id) FILTER (WHERE l.state = 'OFFLOADING') AS offloading_ledgers,
           count(l.ledger_id) FILTER (WHERE l.state = 'OFFLOADED')  AS offloaded_ledgers,
           count(l.ledger_id) FILTER (WHERE l.state = 'DELETED')    AS deleted_ledgers,
           count(l.ledger_id) FILTER (WHERE l.state <> 'DELETED')   AS live_ledgers,
           coalesce(sum(l.entry_count) FILTER (WHERE l.state <> 'DELETED'), 0) AS live_entries,
           coalesce(sum(l.size_bytes) FILTER (WHERE l.state <> 'DELETED'), 0) AS live_bytes,
           count(l.ledger_id) FILTER (WHERE l.tier1_present AND l.state <> 'DELETED') AS tier1_ledgers,
           coalesce(sum(l.size_bytes) FILTER (WHERE l.tier1_present AND l.state <> 'DELETED'), 0) AS tier1_bytes,
           count(l.ledger_id) FILTER (WHERE l.state = 'OFFLOADED')  AS tier2_ledgers,
           coalesce(sum(l.size_bytes) FILTER (WHERE l.state = 'OFFLOADED'), 0) AS tier2_bytes,
           coalesce(sum(c.data_length), 0) AS tier2_stored_bytes
    FROM tiering.topic t
    LEFT JOIN tiering.ledger l USING (topic_id)
    LEFT JOIN tiering.chunk c USING (topic_id, ledger_id)
    GROUP BY t.topic_id ORDER BY t.topic_id"""


def usage(engine) -> dict[int, tuple]:
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT topic_id, {', '.join(COLUMNS)} FROM tiering.topic_usage")).all()
    return {r[0]: tuple(int(v) for v in r[1:]) for r in rows}


def reference(engine) -> dict[int, tuple]:
    with engine.connect() as conn:
        return {r[0]: tuple(int(v) for v in r[1:]) for r in conn.execute(text(REFERENCE))}


# The hourly counters by definition (migration 0010, the dashboard's series): offloads in the hour holding
# offloaded_at; a non-empty sealed ledger's +1 in the hour holding sealed_at and -1 in the one holding its
# end (first of offload and deletion), an event at t in the hour (h, h + 1 h]. Rows of all zeros excluded.
HOURLY_REFERENCE = """
    WITH l AS (SELECT topic_id, entry_count, size_bytes, sealed_at, offloaded_at,
                      least(offloaded_at, deleted_at) AS end_at FROM tiering.ledger),
    e AS (
        SELECT date_bin('1 hour', offloaded_at, '1970-01-01Z') AS hour, topic_id, 1 AS ol, size_bytes AS ob,
               0 AS bn, 0 AS bb FROM l WHERE offloaded_at IS NOT NULL
        UNION ALL
        SELECT date_bin('1 hour', sealed_at - interval '1 microsecond', '1970-01-01Z'), topic_id, 0, 0, 1, size_bytes
        FROM l WHERE entry_count > 0 AND sealed_at IS NOT NULL AND (end_at IS NULL OR end_at > sealed_at)
        UNION ALL
        SELECT date_bin('1 hour', end_at - interval '1 microsecond', '1970-01-01Z'), topic_id, 0, 0, -1, -size_bytes
        FROM l WHERE entry_count > 0 AND sealed_at IS NOT NULL AND end_at > sealed_at)
    SELECT hour, topic_id, sum(ol), sum(ob), sum(bn), sum(bb) FROM e GROUP BY hour, topic_id
    HAVING (sum(ol), sum(ob), sum(bn), sum(bb)) <> (0, 0, 0, 0)"""


def hourly(engine) -> dict[tuple, tuple]:
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT hour, topic_id, offloaded_ledgers, offloaded_bytes, backlog_ledgers, backlog_bytes "
            "FROM tiering.ledger_hourly WHERE (offloaded_ledgers, offloaded_bytes, backlog_ledgers, "
            "backlog_bytes) <> (0, 0, 0, 0)")).all()
    return {(r[0], r[1]): tuple(int(v) for v in r[2:]) for r in rows}


def hourly_reference(engine) -> dict[tuple, tuple]:
    with engine.connect() as conn:
        return {(r[0], r[1]): tuple(int(v) for v in r[2:]) for r in conn.execute(text(HOURLY_REFERENCE))}


def assert_exact(engine) -> dict[int, tuple]:
    expected = reference(engine)
    assert usage(engine) == expected
    assert hourly(engine) == hourly_reference(engine)  # the series' counters follow the same statements
    return expected


def by_name(engine, name: str) -> dict:
    with engine.connect() as conn:
        tid = conn.execute(text("SELECT topic_id FROM tiering.topic WHERE name = :n"), {"n": name}).scalar_one()
    return dict(zip(COLUMNS, usage(engine)[tid]))


@pytest.fixture
def other_database(database_url):
    """An extra migrated database, dropped after the test."""
    server = make_url(database_url)
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    name = f"{server.database}_u{secrets.token_hex(3)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    eng = make_engine(server.set(database=name).render_as_string(hide_password=False))
    upgrade(eng)
    yield eng
    eng.dispose()
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_totals_follow_every_operation(deps, db, s3_client, bucket, tmp_path, other_database):
    produce(deps, "keep", [entries(f"k{i}", 4, 1000) for i in range(5)], open_tail=[b"tail"],
            policy=TopicPolicy(retention_bytes=8000, deletion_lag_seconds=0, **BIG))
    produce(deps, "lag", [entries(f"l{i}", 3, 500) for i in range(3)], TopicPolicy(**BIG))
    produce(deps, "small", [entries(f"s{i}", 10, 2000) for i in range(4)] + [[]], open_tail=[b"x"],
            policy=TopicPolicy(**BIG))
    first = assert_exact(db)
    # sealed ledgers with their sizes; the open tails have no counts in metadata yet
    assert by_name(db, "keep")["sealed_ledgers"] == 5 and by_name(db, "keep")["live_bytes"] == 20_000
    assert by_name(db, "small")["open_ledgers"] == 1 and len(first) == 3

    # offload: one pair per ledger, then batched (several ledgers in one transaction)
    offload_many(deps, deps.meta.list_ledgers("keep", [S.SEALED])[:3])
    offload_many(deps, [led for led in deps.meta.list_ledgers("small", [S.SEALED]) if led.entry_count])
    assert_exact(db)
    assert by_name(db, "small")["tier2_ledgers"] == 4 and by_name(db, "small")["tier2_stored_bytes"] > 80_000
    batched = make_deps(db, s3_client, bucket, deps.tier1.root, batch_small_bytes=MIB)
    assert offload_many(batched, deps.meta.list_ledgers("lag", [S.SEALED])).first_error is None
    assert_exact(db)
    assert by_name(db, "lag")["tier2_ledgers"] == 3

    # an offload that fails after its attempt began, and is aborted
    [led] = deps.meta.list_ledgers("keep", [S.SEALED])[:1]
    begun = deps.meta.begin_offload(led, "00000000-0000-0000-0000-0000000000aa", ["t/x/a", "t/x/b"],
                                    timedelta(0))
    assert by_name(db, "keep")["offloading_ledgers"] == 1
    assert_exact(db)
    deps.meta.abort_offload(begun, "00000000-0000-0000-0000-0000000000aa", objects_deleted=False)
    assert_exact(db)

    # tier-1 copies past their lag, retention by size, a truncate
    assert delete_lagged(deps).deleted
    assert_exact(db)
    assert retention(deps).deleted
    assert by_name(db, "keep")["deleted_ledgers"] == 3
    assert_exact(db)
    truncate(deps, "lag", Position(1, 0))
    assert_exact(db)

    # defrag rewrites chunk rows (new object, new offsets and lengths), then GC
    for led in deps.meta.list_ledgers("small", [S.OFFLOADED]):
        deps.tier1.delete("small", led.ledger_id)
        deps.meta.mark_tier1_deleted(led)
    assert defrag(deps, topic="small", small_bytes=8 * MIB, max_merged_bytes=64 * MIB).groups == 1
    assert_exact(db)
    run_gc(deps, orphan_grace=timedelta(hours=1))
    totals = assert_exact(db)
    with db.begin() as conn:  # one statement changing chunk rows of several topics
        assert conn.execute(text("UPDATE tiering.chunk SET data_length = data_length + topic_id")).rowcount > 2
    assert_exact(db)

    # recovery from the bucket (and tier 1) into an empty database gives that database exact totals
    report = recover_from_bucket(other_database, deps.bucket, tier1=deps.tier1)
    assert report.ok, report.errors
    recovered = assert_exact(other_database)
    assert sum(r[COLUMNS.index("tier2_ledgers")] for r in recovered.values()) == \
        sum(r[COLUMNS.index("tier2_ledgers")] for r in totals.values())

    # a topic's deletion takes its totals with it (ON DELETE CASCADE through ledger and chunk)
    with db.begin() as conn:
        conn.execute(text("DELETE FROM tiering.topic WHERE name = 'small'"))
    assert len(assert_exact(db)) == 2


def test_the_check_fails_on_totals_written_past_the_triggers_and_recompute_repairs_them(deps, db):
    produce(deps, "r", [entries("a", 2, 100), entries("b", 3, 100)], TopicPolicy(**BIG))
    assert_exact(db)
    with db.begin() as conn:  # a bulk load with triggers off, as the bench loaders do
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(text("UPDATE tiering.ledger SET size_bytes = size_bytes + 1"))
        conn.execute(text("INSERT INTO tiering.topic (name) VALUES ('loaded')"))
    assert usage(db) != reference(db)
    assert hourly(db) != hourly_reference(db)
    with db.begin() as conn:
        conn.execute(text("SELECT tiering.recompute_topic_usage()"))
        conn.execute(text("SELECT tiering.recompute_ledger_hourly()"))
    assert by_name(db, "r")["live_bytes"] == 502 and len(assert_exact(db)) == 2


def test_truncate_leaves_no_stale_totals(deps, db):
    produce(deps, "t", [entries("a", 2, 100)], TopicPolicy(**BIG))
    with db.begin() as conn:
        conn.execute(text("TRUNCATE tiering.ledger CASCADE"))
    assert by_name(db, "t")["live_bytes"] == 0 and len(assert_exact(db)) == 1


def test_concurrent_offloads_of_the_same_topics_all_commit_with_exact_totals(deps, db):
    """Writers of one topic wait for each other on its totals row (no deadlock: each transaction changes
    one ledger's rows, or several in one statement) and every delta lands."""
    for topic in ("c1", "c2"):
        produce(deps, topic, [entries(f"{topic}-{i}", 2, 300) for i in range(8)], TopicPolicy(**BIG))
    leds = [led for topic in ("c1", "c2") for led in deps.meta.list_ledgers(topic, [S.SEALED])]
    with ThreadPoolExecutor(4) as pool:  # each worker offloads ledgers of both topics
        reports = list(pool.map(lambda k: offload_many(deps, leds[k::4]), range(4)))
    assert all(r.first_error is None for r in reports)
    assert sum(len(r.offloaded) for r in reports) == 16
    totals = assert_exact(db)
    assert [t[COLUMNS.index("tier2_ledgers")] for t in totals.values()] == [8, 8]
