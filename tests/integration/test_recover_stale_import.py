"""Recovery from the bucket over metadata older than the bucket (an import of an earlier export), on the real
PostgreSQL and S3: what the export caught in flight, or what changed in the bucket after it, is taken from the
bucket's copies instead of being left to GC or marked lost."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, make_deps, produce
from tests.integration.test_export_recover import new_database  # noqa: F401 - the fixture
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.defrag import defrag
from tiering.ops.delete_lagged import delete_lagged
from tiering.ops.export_metadata import export_metadata, filesystem_for
from tiering.ops.gc import run_gc
from tiering.ops.import_metadata import import_metadata
from tiering.ops.offload import offload_ledger, offload_many
from tiering.ops.recover import recover_from_bucket
from tiering.ops.repair import repair
from tiering.read import Entry, ReadHandle
from tiering.tier2.reader import tier2_opener


def _read(deps, topic) -> dict:
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket), raise_on_dataloss=True)
    return {(e.ledger_id, e.entry_id): e.data for e in handle.read(topic, Position(0, 0), None)
            if isinstance(e, Entry)}


def _imported(deps, new_database, base, tmp_path):  # noqa: F811
    """The store on a new database holding the import of export `base` (the same bucket and tier-1 root)."""
    target = new_database()
    import_metadata(target, *filesystem_for(str(tmp_path / base)))
    return make_deps(target, deps.bucket.s3, deps.bucket.name, deps.tier1.root)


def test_an_offload_the_export_caught_in_flight_is_recovered_not_collected(deps, db, new_database, tmp_path):  # noqa: F811
    """The export ran while an offload's objects were written and its claim held the ledger OFFLOADING (its
    keys queued for GC); the offload then committed and delete-lagged removed the tier-1 copy. Imported,
    the ledger was OFFLOADING with its keys due for GC, and `gc` deleted the only copy. Recovery now makes
    it OFFLOADED with that copy (its attempt's worker is gone) and takes its keys out of GC's queue."""
    expected = produce(deps, "r", [entries("r", 120, 100 * 1024)])
    [led] = deps.meta.list_ledgers("r", [S.SEALED])

    def export_meanwhile(step):
        if step == "index":  # both objects written, the claim committed, not the offload
            export_metadata(db, *filesystem_for(str(tmp_path / "exp")))

    offload_ledger(deps, led, hook=export_meanwhile)
    deps.tier1.delete("r", 0)
    after = _imported(deps, new_database, "exp", tmp_path)
    assert after.meta.get_ledger("r", 0).state == S.OFFLOADING
    report = recover_from_bucket(after.meta.engine, after.bucket, "r")
    assert report.ok and report.ledgers_recovered == [("r", 0)], report
    assert after.meta.get_ledger("r", 0).state == S.OFFLOADED
    with after.meta.engine.begin() as conn:  # the keys it now references left GC's queue with the recovery
        assert conn.execute(text("SELECT count(*) FROM tiering.gc_task")).scalar() == 0
    assert run_gc(after).deleted == []
    assert _read(after, "r") == expected


def test_a_defrag_after_the_export_moves_the_imported_chunks_to_the_merged_copy(deps, db, new_database, tmp_path):  # noqa: F811
    """The export, then a defrag merged the topic's objects and GC deleted the old ones. Imported, the chunk
    rows named the deleted objects: recovery said "already known", repair marked every ledger lost, and no
    later recovery brought them back. Recovery now moves each chunk to the merged copy (its old objects gone,
    by the listing and a HEAD under the row's lock), clearing the lost mark repair made."""
    expected = produce(deps, "q", [entries(f"q{i}", 10, 100) for i in range(3)], TopicPolicy(
        rollover_entries=10**9, rollover_bytes=2**40, deletion_lag_seconds=0))
    assert len(offload_many(deps, deps.meta.list_ledgers("q", [S.SEALED])).offloaded) == 3
    assert len(delete_lagged(deps, "q").deleted) == 3
    export_metadata(db, *filesystem_for(str(tmp_path / "exp")))
    old_keys = {k for ch in deps.meta.chunks("q").values() for k in (ch.data_key, ch.index_key)}
    assert defrag(deps, "q", small_bytes=2**20, max_merged_bytes=2**26).ledgers == 3
    run_gc(deps)  # the merged-away objects (gc delay 0)
    assert not old_keys & {o["Key"] for o in deps.bucket.s3.list_objects_v2(Bucket=deps.bucket.name).get("Contents", [])}
    after = _imported(deps, new_database, "exp", tmp_path)

    first = repair(after, "q")  # the imported rows name objects that are gone: marked lost
    assert sorted(first.lost) == [("q", 0), ("q", 1), ("q", 2)], first
    report = recover_from_bucket(after.meta.engine, after.bucket, "q")
    assert report.ok and sorted(report.ledgers_recovered) == [("q", 0), ("q", 1), ("q", 2)], report
    assert sorted(report.chunks_moved) == [("q", 0), ("q", 1), ("q", 2)], report
    assert [led.lost_at for led in after.meta.list_ledgers("q")] == [None, None, None]
    merged = {ch.data_key for ch in deps.meta.chunks("q").values()}
    assert {ch.data_key for ch in after.meta.chunks("q").values()} == merged
    assert _read(after, "q") == expected
    again = recover_from_bucket(after.meta.engine, after.bucket, "q")  # a rerun changes nothing
    assert again.ok and again.ledgers_recovered == [], again


def test_recovery_waits_for_a_gc_run_under_way_and_gc_does_not_run_beside_it(deps, db):
    """A defrag's merged object lost from the bucket (repair marked its ledgers lost) while the copies it
    merged away wait in GC's queue: recovery moves the chunks to them, but a GC run that claimed those keys
    deleted them meanwhile, and recovery made the ledgers look whole on deleted objects (both at exit 0).
    Recovery now waits for the GC runs under way before it lists (then finds no copy: the ledgers stay lost,
    nothing moved), and a GC run while a recovery runs does nothing, saying why."""
    import threading

    from tiering.ops import gc as gc_ops

    produce(deps, "m", [entries(f"m{i}", 5, 100) for i in range(2)], TopicPolicy(
        rollover_entries=10**9, rollover_bytes=2**40, deletion_lag_seconds=0))
    assert len(offload_many(deps, deps.meta.list_ledgers("m", [S.SEALED])).offloaded) == 2
    assert len(delete_lagged(deps, "m").deleted) == 2
    old = {k for ch in deps.meta.chunks("m").values() for k in (ch.data_key, ch.index_key)}
    assert defrag(deps, "m", small_bytes=2**20, max_merged_bytes=2**26).ledgers == 2  # the old keys queued, due
    merged = {k for ch in deps.meta.chunks("m").values() for k in (ch.data_key, ch.index_key)}
    for key in merged:
        deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=key)
    assert sorted(repair(deps, "m").lost) == [("m", 0), ("m", 1)]

    paused, go, delete_keys = threading.Event(), threading.Event(), gc_ops.delete_keys

    def paused_delete(*args, **kwargs):  # GC claimed the keys and found nothing referencing them
        paused.set()
        go.wait(60)
        return delete_keys(*args, **kwargs)

    gc_ops.delete_keys = paused_delete
    try:
        collector = threading.Thread(target=lambda: run_gc(deps))
        collector.start()
        assert paused.wait(60)
        results = []
        recovering = threading.Thread(target=lambda: results.append(recover_from_bucket(db, deps.bucket, "m")))
        recovering.start()
        recovering.join(2)  # it waits behind GC's claim of the keys it chose
        assert recovering.is_alive()
        go.set()
        collector.join(60)
        recovering.join(60)
    finally:
        gc_ops.delete_keys = delete_keys
        go.set()
    [report] = results
    assert report.ok and report.chunks_moved == [], report
    assert [led.lost_at is not None for led in deps.meta.list_ledgers("m")] == [True, True]
    assert {k for ch in deps.meta.chunks("m").values() for k in (ch.data_key, ch.index_key)} == merged
    assert not old & {o["Key"] for o in deps.bucket.s3.list_objects_v2(Bucket=deps.bucket.name).get("Contents", [])}

    from tiering.errors import TieringError
    from tiering.metadata import gc_sweep

    with gc_sweep.excluding_sweep(db, deps.bucket.name, deps.bucket.prefix):
        with pytest.raises(TieringError, match="recovery from the bucket .* is running; the next run collects"):
            run_gc(deps)
    run_gc(deps)  # once it has ended


def test_a_copy_a_live_defrag_still_writes_is_not_taken_from_it(deps, db):
    """The copy recovery would move a ledger to is one a live defrag attempt queued (its merged object, not
    committed): taking its keys out of the queue would let that attempt's own discard delete what recovery
    points at. The topic fails, nothing committed; once the attempt has ended recovery moves the ledger."""
    import uuid

    from tiering.format.keys import data_key, index_key
    from tiering.metadata.attempt_locks import DEFRAG_CLASS, DEFRAG_REASON

    produce(deps, "d", [entries("d", 5, 100)])
    assert len(offload_many(deps, deps.meta.list_ledgers("d", [S.SEALED])).offloaded) == 1
    s3, name, prefix = deps.bucket.s3, deps.bucket.name, deps.bucket.prefix
    [ch] = deps.meta.chunks("d").values()
    with deps.meta.new_attempt(DEFRAG_CLASS) as attempt:
        new = str(uuid.uuid4())
        copy = (data_key(prefix, "d", new, 0), index_key(prefix, "d", new, 0))
        for src, dst in zip((ch.data_key, ch.index_key), copy):
            s3.copy_object(Bucket=name, Key=dst, CopySource={"Bucket": name, "Key": src})
        deps.meta.enqueue_gc(list(copy), DEFRAG_REASON, owner=attempt, delay=timedelta(hours=1))
        for key in (ch.data_key, ch.index_key):  # the ledger's own objects lost
            s3.delete_object(Bucket=name, Key=key)
        report = recover_from_bucket(db, deps.bucket, "d")
        assert [e for e in report.errors if "being written by a live attempt" in e], report
        assert deps.meta.chunks("d")[0].data_key == ch.data_key
    report = recover_from_bucket(db, deps.bucket, "d")  # the attempt ended (its worker gone)
    assert report.ok and report.chunks_moved == [("d", 0)], report
    assert deps.meta.chunks("d")[0].data_key == copy[0]
