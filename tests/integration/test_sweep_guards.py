"""The orphan sweep and recovery from the bucket never run beside each other, and the sweep refuses to
treat a lost database's whole bucket as orphans. PostgreSQL and RGW."""
from __future__ import annotations

from datetime import timedelta

import pytest

from tests.conftest import empty_tables
from tests.integration.helpers import bucket_keys, entries, produce
from tiering.errors import TieringError
from tiering.metadata import gc_sweep
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.gc import sweep_orphans
from tiering.ops.offload import offload_many
from tiering.ops.recover import recover_from_bucket
from tests.integration.test_export_recover import new_database  # noqa: F401  (extra databases)

BIG = TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40)


@pytest.fixture
def offloaded(deps):
    produce(deps, "sg", [entries(f"sg{i}", 3, 100) for i in range(2)], BIG)
    assert offload_many(deps, deps.meta.list_ledgers("sg", [S.SEALED])).failed == {}
    keys = bucket_keys(deps)
    assert len(keys) == 4
    return keys


def test_the_sweep_refuses_a_database_that_references_nothing_and_deletes_nothing(deps, db, offloaded):
    empty_tables(db)  # the metadata lost: every object of the bucket now looks like an orphan
    with pytest.raises(TieringError, match="recover-from-bucket"):
        sweep_orphans(deps, orphan_grace=timedelta(0))
    assert bucket_keys(deps) == offloaded
    # recovery brings the references back, and the sweep then keeps every object
    report = recover_from_bucket(db, deps.bucket)
    assert report.ok and len(report.ledgers_recovered) == 2
    r = sweep_orphans(deps, orphan_grace=timedelta(0))
    assert r.orphans_deleted == [] and bucket_keys(deps) == offloaded


def test_recovery_refuses_to_start_while_a_sweep_runs(deps, db, offloaded):
    empty_tables(db)
    with gc_sweep.exclusive(db, deps.bucket.name, deps.bucket.prefix) as held:
        assert held
        with pytest.raises(TieringError, match="sweep .* is running"):
            recover_from_bucket(db, deps.bucket)
    assert deps.meta.list_topics() == []  # nothing recovered, nothing half-written


def test_a_second_recovery_says_a_recovery_runs_not_a_sweep(deps, db, offloaded):
    empty_tables(db)
    with gc_sweep.excluding_sweep(db, deps.bucket.name, deps.bucket.prefix):
        with pytest.raises(TieringError, match="another recovery from the bucket .* is running"):
            recover_from_bucket(db, deps.bucket)
    assert deps.meta.list_topics() == []
    assert recover_from_bucket(db, deps.bucket).ok  # the first one over: a rerun recovers


def test_a_sweep_started_during_recovery_fails_and_deletes_nothing(deps, db, offloaded):
    """Not "taken by another worker" (exit 0): no sweep did the work, so the run fails with the reason."""
    empty_tables(db)
    with gc_sweep.excluding_sweep(db, deps.bucket.name, deps.bucket.prefix):
        with pytest.raises(TieringError, match="recovery from the bucket is running"):
            sweep_orphans(deps, orphan_grace=timedelta(0))
    assert bucket_keys(deps) == offloaded
    # recovery over: the sweep runs (and, the metadata still empty, refuses to delete the store)
    with pytest.raises(TieringError, match="recover-from-bucket"):
        sweep_orphans(deps, orphan_grace=timedelta(0))
    assert bucket_keys(deps) == offloaded


def _offloaded_topics(deps, names, n=2):
    for name in names:
        produce(deps, name, [entries(f"{name}{i}", 3, 100) for i in range(n)], BIG)
        assert offload_many(deps, deps.meta.list_ledgers(name, [S.SEALED])).failed == {}
    return bucket_keys(deps)


def test_after_a_recovery_of_one_topic_the_sweep_keeps_the_topics_not_recovered_yet(deps, db):
    """Recovery of one topic (`--topic`), or one killed after some topics: the sweep must not take the other
    topics' objects for orphans (metadata lacks them, it does not know them gone)."""
    keys = _offloaded_topics(deps, ["orders", "billing"])
    empty_tables(db)
    assert recover_from_bucket(db, deps.bucket, topic="orders").ok
    r = sweep_orphans(deps, orphan_grace=timedelta(0))
    assert r.orphans_deleted == [] and bucket_keys(deps) == keys
    report = recover_from_bucket(db, deps.bucket, topic="billing")
    assert report.ok and len(report.ledgers_recovered) == 2


def test_the_sweep_keeps_objects_of_ledgers_metadata_has_as_not_yet_offloaded(deps, db):
    """Metadata restored from an export taken before the ledgers were offloaded: their rows say SEALED and
    no chunk row names the objects, which hold the only copy once tier 1 deleted its own. Kept."""
    from sqlalchemy import text

    keys = _offloaded_topics(deps, ["other", "imp"])
    imp = "(SELECT topic_id FROM tiering.topic WHERE name = 'imp')"
    with db.begin() as conn:
        conn.execute(text(f"DELETE FROM tiering.chunk WHERE topic_id = {imp}"))
        conn.execute(text(f"UPDATE tiering.ledger SET state = 'SEALED', offloaded_at = NULL WHERE topic_id = {imp}"))
    assert sweep_orphans(deps, orphan_grace=timedelta(0)).orphans_deleted == []
    assert bucket_keys(deps) == keys


def test_the_sweep_takes_older_copies_and_what_a_deleted_topic_left_and_keeps_a_copy_still_needed(deps, db):
    """Gone for sure: an object of a DELETED ledger; an older copy of an OFFLOADED ledger whose chunk's
    objects are in the bucket; an object of a deleted topic below the marker its deletion wrote. Kept: a
    copy of an OFFLOADED ledger whose chunk row names objects no longer there (a stale row: this copy may be
    the only one), and a data object of a deleted topic whose index object is gone (nothing says which
    ledgers it holds)."""
    from tiering.ops.retention import truncate
    from tiering.ops.topics import delete_topic
    from tiering.model import Position

    _offloaded_topics(deps, ["live", "gone"], n=3)
    s3, name = deps.bucket.s3, deps.bucket.name

    def copy(key, new):  # the data object and its index object, as an older attempt's pair
        for suffix in ("", "-index"):
            s3.copy_object(Bucket=name, Key=new + suffix, CopySource={"Bucket": name, "Key": key + suffix})
        return new
    chunks = {led.ledger_id: deps.meta.get_chunk(led) for led in deps.meta.list_ledgers("live")}
    gone_chunks = [deps.meta.get_chunk(led) for led in deps.meta.list_ledgers("gone")]
    prefix = chunks[0].data_key.rsplit("/", 1)[0]
    older = copy(chunks[1].data_key, f"{prefix}/00000000-0000-0000-0000-000000000001-ledger-1")
    stale = copy(chunks[2].data_key, f"{prefix}/00000000-0000-0000-0000-000000000002-ledger-2")
    s3.delete_object(Bucket=name, Key=chunks[2].index_key)  # ledger 2's row names an object no longer there
    trimmed = copy(chunks[0].data_key, f"{prefix}/00000000-0000-0000-0000-000000000003-ledger-0")
    truncate(deps, "live", Position(1, 0))  # ledger 0 DELETED (its own objects queued, as retention does)
    gone_prefix = gone_chunks[0].data_key.rsplit("/", 1)[0]
    left = copy(gone_chunks[0].data_key, f"{gone_prefix}/00000000-0000-0000-0000-000000000004-ledger-0")
    delete_topic(deps, "gone")  # its marker: trimmed before its next ledger id (3)
    above = f"{gone_prefix}/00000000-0000-0000-0000-000000000005-ledger-7"  # no index object: what it holds
    s3.copy_object(Bucket=name, Key=above, CopySource={"Bucket": name, "Key": gone_chunks[0].data_key})  # is unknown
    r = sweep_orphans(deps, orphan_grace=timedelta(0))
    assert sorted(r.orphans_deleted) == sorted(k + suffix for k in (older, trimmed, left) for suffix in ("", "-index"))
    assert {stale, above} <= bucket_keys(deps)


def test_a_topic_whose_key_segment_is_cut_and_hashed_is_found_for_the_sweep(deps, db):
    """A name too long for one key segment (cut, hashed): the sweep still finds its rows (among the names
    that start with the segment's readable part), so an older copy goes and a copy of a SEALED ledger stays."""
    from sqlalchemy import text

    long_name = "é" * 60 + "/long"  # 120 bytes of UTF-8, 360 encoded: cut mid-character, then hashed
    _offloaded_topics(deps, [long_name, long_name[:-1]], n=2)  # a neighbour whose name starts the same
    s3, name = deps.bucket.s3, deps.bucket.name
    chunks = {led.ledger_id: deps.meta.get_chunk(led) for led in deps.meta.list_ledgers(long_name)}
    prefix = chunks[0].data_key.rsplit("/", 1)[0]
    older = f"{prefix}/00000000-0000-0000-0000-000000000001-ledger-0"
    for suffix in ("", "-index"):
        s3.copy_object(Bucket=name, Key=older + suffix, CopySource={"Bucket": name, "Key": chunks[0].data_key + suffix})
    with db.begin() as conn:  # ledger 1 back to SEALED, its chunk row gone (as an older export has it)
        conn.execute(text("DELETE FROM tiering.chunk c USING tiering.topic t WHERE c.topic_id = t.topic_id "
                          "AND t.name = :n AND c.ledger_id = 1"), {"n": long_name})
        conn.execute(text("UPDATE tiering.ledger l SET state = 'SEALED' FROM tiering.topic t WHERE "
                          "l.topic_id = t.topic_id AND t.name = :n AND l.ledger_id = 1"), {"n": long_name})
    r = sweep_orphans(deps, orphan_grace=timedelta(0))
    assert r.orphans_deleted == [older, older + "-index"]
    assert {chunks[1].data_key, chunks[1].index_key} <= bucket_keys(deps)


def test_an_object_is_gone_only_when_every_ledger_it_holds_is(deps, db):
    """Four ledgers offloaded as one batch (one object pair, named after ledger 0), the first two trimmed
    (the topic's marker at 2), then the metadata lost and only another topic recovered: the marker is below
    ledgers 2 and 3, which the object still holds, so the sweep keeps it and a recovery brings them back."""
    from dataclasses import replace

    from tiering.model import Position
    from tiering.ops.gc import run_gc
    from tiering.ops.retention import truncate
    from tiering.read import Entry, ReadHandle
    from tiering.tier2.reader import tier2_opener

    expected = produce(deps, "sb", [entries(f"sb{i}", 3, 100) for i in range(4)], BIG)
    batched = replace(deps, knobs=replace(deps.knobs, batch_small_bytes=8 * 1024 * 1024))
    assert len(offload_many(batched, deps.meta.list_ledgers("sb", [S.SEALED])).offloaded) == 4
    _offloaded_topics(deps, ["other"])
    truncate(deps, "sb", Position(2, 0))
    run_gc(deps)  # nothing of the batch is due: ledgers 2 and 3 still reference it
    keys = bucket_keys(deps)
    empty_tables(db)
    assert recover_from_bucket(db, deps.bucket, topic="other").ok
    assert sweep_orphans(deps, orphan_grace=timedelta(0)).orphans_deleted == []
    assert bucket_keys(deps) == keys
    report = recover_from_bucket(db, deps.bucket)
    assert report.ok and sorted(i for t, i in report.ledgers_recovered if t == "sb") == [2, 3]
    got = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket)).read("sb")
    assert {(e.ledger_id, e.entry_id): e.data for e in got if isinstance(e, Entry)} == \
        {k: v for k, v in expected.items() if k[0] >= 2}


def test_a_data_object_whose_index_was_never_written_goes_once_its_ledger_is_offloaded_again(deps, db):
    """An offload killed between its data object and its index object, in a database lost since: its keys
    were queued there only. Recovered and offloaded again, the ledger is OFFLOADED with both objects of its
    chunk in the bucket; the leftover data object holds nothing any reader or recovery can use (no index), so
    the sweep takes it as it takes an older copy instead of keeping it for ever."""
    keys = _offloaded_topics(deps, ["killed"], n=2)
    s3, name = deps.bucket.s3, deps.bucket.name
    chunk = deps.meta.get_chunk(deps.meta.list_ledgers("killed")[0])
    left = f"{chunk.data_key.rsplit('/', 1)[0]}/00000000-0000-0000-0000-00000000000a-ledger-0"
    s3.copy_object(Bucket=name, Key=left, CopySource={"Bucket": name, "Key": chunk.data_key})  # no index: killed
    empty_tables(db)
    assert recover_from_bucket(db, deps.bucket).ok
    for _ in range(2):  # a rerun changes nothing
        sweep_orphans(deps, orphan_grace=timedelta(0))
        assert bucket_keys(deps) == keys


def test_an_older_copy_is_kept_while_the_current_one_is_unverified_or_replaced(deps, db, new_database):  # noqa: F811
    """A ledger's older copy (a pre-defrag pair, say) beside the copy its chunk row names is taken only when
    that copy is known sound: the row's ETags recorded and the objects still those. A recovery that did not
    check pages records no ETags, and the copy it chose may be the corrupt one: the older copy, perhaps the
    only good one, is kept. So is one beside a current copy whose object was replaced since."""
    from dataclasses import replace

    from tiering.metadata.repository import MetadataStore

    produce(deps, "oc", [entries(f"oc{i}", 3, 100) for i in range(2)], BIG)
    assert offload_many(deps, deps.meta.list_ledgers("oc", [S.SEALED])).failed == {}
    s3, name = deps.bucket.s3, deps.bucket.name
    current = [deps.meta.get_chunk(led) for led in deps.meta.list_ledgers("oc")]
    prefix = current[0].data_key.rsplit("/", 1)[0]
    older = []
    for i, ch in enumerate(current):  # an older attempt's pair of each ledger (written first: recovery's loser)
        key = f"{prefix}/00000000-0000-0000-0000-00000000000{i}-ledger-{i}"
        for suffix in ("", "-index"):
            s3.copy_object(Bucket=name, Key=key + suffix, CopySource={"Bucket": name, "Key": ch.data_key + suffix})
        older.append(key)
    body = bytearray(s3.get_object(Bucket=name, Key=current[0].data_key)["Body"].read())
    body[150] ^= 0x01  # ledger 0's current copy replaced by a corrupt one
    s3.put_object(Bucket=name, Key=current[0].data_key, Body=bytes(body))
    for suffix in ("", "-index"):  # written after the older pair: the current copies are the newest again
        for ch in current:
            s3.copy_object(Bucket=name, Key=ch.data_key + suffix, CopySource={"Bucket": name, "Key": ch.data_key + suffix},
                           MetadataDirective="REPLACE", Metadata={"touched": "1"})
    # this database: ledger 0's row has ETags its object no longer has; ledger 1's copy is as written
    r = sweep_orphans(deps, orphan_grace=timedelta(0))
    assert sorted(r.orphans_deleted) == sorted(older[1] + s for s in ("", "-index"))
    assert {older[0], older[0] + "-index"} <= bucket_keys(deps)
    # a database rebuilt without a page check: no ETags, so no current copy proves an older one redundant
    target = new_database()
    assert recover_from_bucket(target, deps.bucket).ok
    r = sweep_orphans(replace(deps, meta=MetadataStore(target)), orphan_grace=timedelta(0))
    assert r.orphans_deleted == [] and {older[0], older[0] + "-index"} <= bucket_keys(deps)
