"""`recover-from-bucket --dry-run` says what a recovery would do and changes nothing; GC runs and a recovery
take turns (a waiting recovery is not starved by overlapping GC runs; a GC preview during a recovery says a
run would be refused). The real PostgreSQL, RGW and tier-1 files."""
from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import text

from tests.conftest import empty_tables
from tests.integration.helpers import bucket_keys, entries, produce
from tiering.errors import RecoveryRunning
from tiering.metadata import gc_sweep
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.gc import preview_gc, run_gc
from tiering.ops.offload import offload_many
from tiering.ops.recover import recover_from_bucket
from tiering.tier1.ledger_reader import LedgerReader

BIG = TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40)


def _rows(db) -> dict:
    with db.connect() as conn:
        return {t: conn.execute(text(f"SELECT count(*) FROM tiering.{t}")).scalar_one()
                for t in ("topic", "ledger", "chunk", "gc_task")}


def _summary(report) -> tuple:
    return (sorted(report.topics_created), sorted(report.ledgers_recovered), sorted(report.tier1_adopted),
            sorted(report.tier1_sealed), sorted(report.lost_recorded), sorted(report.chunks_moved),
            report.unknown, report.errors)


def test_a_dry_run_reports_what_the_run_then_does_and_writes_nothing(deps, db):
    """Two offloaded ledgers, one sealed and one open ledger only tier 1 holds, a ledger whose objects are
    gone (recorded lost): the preview's report is the run's, and after the preview the database is as empty
    as before, the queue untouched and the open file still open."""
    produce(deps, "pv", [entries(f"pv{i}", 3, 100) for i in range(4)], BIG)
    sealed = deps.meta.list_ledgers("pv", [S.SEALED])
    assert offload_many(deps, sealed[:3]).failed == {}
    chunk1 = deps.meta.chunks("pv")[1]
    for key in (chunk1.data_key, chunk1.index_key):  # ledger 1's only copy lost (tier 1's deleted below)
        deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=key)
    deps.tier1.delete("pv", 1)
    with deps.tier1.create_ledger("pv", 4) as w:  # an open ledger a producer left
        w.append(b"open")
    empty_tables(db)
    keys = bucket_keys(deps)

    preview = recover_from_bucket(db, deps.bucket, tier1=deps.tier1, dry_run=True)
    assert preview.ok, preview.errors
    assert _rows(db) == {"topic": 0, "ledger": 0, "chunk": 0, "gc_task": 0}
    assert bucket_keys(deps) == keys
    with LedgerReader(deps.tier1.path("pv", 4)) as r:
        assert not r.sealed and r.entry_count == 1

    report = recover_from_bucket(db, deps.bucket, tier1=deps.tier1)
    assert report.ok, report.errors
    assert _summary(preview) == _summary(report)
    assert sorted(report.ledgers_recovered) == [("pv", 0), ("pv", 2)]
    assert sorted(report.tier1_adopted) == [("pv", 3), ("pv", 4)] and report.tier1_sealed == [("pv", 4)]
    assert report.lost_recorded == [("pv", 1)]
    # a second preview over the recovered database: nothing more to do
    again = recover_from_bucket(db, deps.bucket, tier1=deps.tier1, dry_run=True)
    assert again.ok and again.ledgers_recovered == [] and again.tier1_adopted == [] and again.lost_recorded == []


def test_a_dry_run_takes_no_lock_against_gc(deps, db):
    """A preview deletes nothing and writes nothing: GC runs beside it, and a sweep holding its lock does not
    refuse it (a real recovery refuses to start then)."""
    produce(deps, "pl", [entries("pl", 3, 100)], BIG)
    assert offload_many(deps, deps.meta.list_ledgers("pl", [S.SEALED])).failed == {}
    empty_tables(db)
    with gc_sweep.exclusive(db, deps.bucket.name, deps.bucket.prefix) as held:
        assert held
        report = recover_from_bucket(db, deps.bucket, dry_run=True)
        assert report.ok and report.ledgers_recovered == [("pl", 0)]
    assert _rows(db)["ledger"] == 0


def test_a_waiting_recovery_refuses_new_gc_runs_and_starts_when_the_running_one_ends(deps, db):
    """GC runs share their lock; recovery waits for the runs under way. New runs arriving while it waits are
    refused (a GC run that overlapped the last one would otherwise keep it waiting for good), and a GC
    preview says a run would be refused."""
    produce(deps, "st", [entries("st", 3, 100)], BIG)
    assert offload_many(deps, deps.meta.list_ledgers("st", [S.SEALED])).failed == {}
    b = deps.bucket
    results = []
    with gc_sweep.collecting(db, b.name, b.prefix):  # a GC run under way
        recovering = threading.Thread(target=lambda: results.append(recover_from_bucket(db, b)))
        recovering.start()
        deadline = time.monotonic() + 30
        while not gc_sweep.recovery_running(db, b.name, b.prefix):
            assert time.monotonic() < deadline, "recovery never started waiting"
            time.sleep(0.05)
        with pytest.raises(RecoveryRunning, match="the next run collects"):
            run_gc(deps)  # a second run, overlapping the first: refused, not let in ahead of recovery
        with pytest.raises(RecoveryRunning, match="would do nothing"):
            preview_gc(deps)
        recovering.join(1)
        assert recovering.is_alive()  # still behind the run under way
    recovering.join(60)
    assert not recovering.is_alive() and results[0].ok, results
    assert not gc_sweep.recovery_running(db, b.name, b.prefix)
    run_gc(deps)  # recovery over: GC runs again
    with db.connect() as conn:  # the refused run's shared lock went back with its connection
        # of this database only: a GC run in another test's database holds the same class
        assert conn.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                                 "(SELECT oid FROM pg_database WHERE datname = current_database()) AND classid = "
                                 f"{gc_sweep.QUEUE_CLASS}")).scalar_one() == 0


def test_a_spark_recovery_topic_waits_for_gc_and_refuses_it_without_its_driver(deps, db):
    """The Spark job's executors guard each topic themselves: with no driver holding recovery's lock (it
    died), a topic waits for the GC run under way, and a GC run starting while a topic is recovered is
    refused, so GC never deletes a queued copy between a topic's listing and its commit."""
    from concurrent.futures import ThreadPoolExecutor

    from tiering.format.keys import encode_topic
    from tiering.jobs import recover as recover_job

    produce(deps, "ex", [entries("ex", 3, 100)], BIG)
    assert offload_many(deps, deps.meta.list_ledgers("ex", [S.SEALED])).failed == {}
    empty_tables(db)
    b, results = deps.bucket, []
    with ThreadPoolExecutor(2) as reads:
        item = {"segment": encode_topic("ex"), "topic": "ex"}
        with gc_sweep.collecting(db, b.name, b.prefix):  # a GC run under way
            worker = threading.Thread(
                target=lambda: results.append(recover_job._attempt(deps, item, reads, False, False)))
            worker.start()
            worker.join(2)
            assert worker.is_alive() and _rows(db)["ledger"] == 0  # it waits, nothing listed or written yet
            with pytest.raises(RecoveryRunning):
                run_gc(deps)  # announced: a new run is refused
        worker.join(60)
    assert not worker.is_alive() and results[0].ok and results[0].ledgers_recovered == [("ex", 0)], results
    with gc_sweep.recovering(db, b.name, b.prefix):  # a topic being recovered: GC refuses, its preview says so
        with pytest.raises(RecoveryRunning):
            run_gc(deps)
        with pytest.raises(RecoveryRunning, match="would do nothing"):
            preview_gc(deps)
    run_gc(deps)


def test_a_dry_run_refuses_what_the_run_refuses_an_open_file_a_producer_still_writes(deps, db):
    """The preview does not seal, but it asks what sealing asks: a producer holding the open file fails the
    topic in the preview as in the run (both exit 1 naming it), nothing written by either."""
    from tiering.tier1.ledger_file import LedgerWriter

    produce(deps, "lw", [entries("lw", 3, 100)], BIG)
    assert offload_many(deps, deps.meta.list_ledgers("lw", [S.SEALED])).failed == {}
    with deps.tier1.create_ledger("lw", 1) as w:
        w.append(b"open")
    empty_tables(db)
    with LedgerWriter(deps.tier1.path("lw", 1), open_existing=True):  # a producer still writing
        for dry_run in (True, False):
            report = recover_from_bucket(db, deps.bucket, tier1=deps.tier1, dry_run=dry_run)
            assert [e for e in report.errors if "being written by another writer" in e], (dry_run, report.errors)
            assert _rows(db)["ledger"] == 0
    preview = recover_from_bucket(db, deps.bucket, tier1=deps.tier1, dry_run=True)  # the producer stopped
    assert preview.ok and preview.tier1_sealed == [("lw", 1)]
