"""Defrag beside GC: a merge that outlasts the offload timeout keeps its merged objects while its process
lives; if they are collected anyway, the group fails (it is no lost race) and nothing leaks or dangles."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
from sqlalchemy import text

from tests.integration.helpers import MIB, bucket_keys, entries, make_deps, produce
from tests.integration.test_cli import make_cli, run_main
from tiering.errors import TieringError
from tiering.jobs import defrag as defrag_job
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops import defrag as defrag_ops
from tiering.ops.defrag import defrag, merge_groups, plan_defrag
from tiering.ops.gc import run_gc
from tiering.ops.offload import offload_ledger, offload_many
from tiering.read import Entry, ReadHandle
from tiering.tier2.reader import tier2_opener

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
TIMEOUT = timedelta(seconds=1)


@pytest.fixture
def slow_deps(db, s3_client, bucket, tier1_root):
    """One object pair per ledger; a defrag's merged keys are due one second after they are queued."""
    return make_deps(db, s3_client, bucket, tier1_root, offload_timeout=TIMEOUT, gc_delay=timedelta(0))


def small_topic(deps, topic="t") -> dict:
    expected = produce(deps, topic, [entries(f"{topic}{i}", 5, 500) for i in range(3)], open_tail=[b"o"],
                       policy=TopicPolicy(**BIG))
    offload_many(deps, deps.meta.list_ledgers(topic, [S.SEALED]))
    return expected


def read(deps, topic) -> dict:
    items = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket)).read(topic, None, None)
    return {(e.ledger_id, e.entry_id): e.data for e in items if isinstance(e, Entry)}


def referenced(db) -> set[str]:
    with db.connect() as conn:
        return {k for r in conn.execute(text("SELECT data_key, index_key FROM tiering.chunk")) for k in r}


def defrag_queue(db) -> set[str]:
    with db.connect() as conn:
        return set(conn.execute(text("SELECT key FROM tiering.gc_task WHERE reason = 'defrag attempt'")).scalars())


def test_a_defrag_slower_than_the_offload_timeout_keeps_its_merged_objects_from_gc(slow_deps, db):
    deps = slow_deps
    expected = small_topic(deps)
    collected = []

    def gc_meanwhile(name):
        if name == "merged":  # the merged objects are written and queued; their queue delay runs out
            merged = defrag_queue(db)
            time.sleep(TIMEOUT.total_seconds() + 0.5)
            collected.extend(set(run_gc(deps).deleted) & merged)

    report = defrag(deps, "t", small_bytes=MIB, max_merged_bytes=64 * MIB, hook=gc_meanwhile)
    assert collected == [], "GC deleted the merged objects of a live defrag"
    assert (report.groups, report.ledgers, report.lost_races, report.errors) == (1, 3, 0, [])
    merged = deps.meta.chunks("t")
    assert len({c.data_key for c in merged.values()}) == 1
    for key in (merged[0].data_key, merged[0].index_key):  # both name the largest ledger they hold, for recovery
        assert deps.bucket.s3.head_object(Bucket=deps.bucket.name, Key=key)["Metadata"]["tiering-last-ledger"] == \
            str(max(merged))
    assert read(deps, "t") == expected
    run_gc(deps)  # the merged-away objects (gc_delay 0)
    assert bucket_keys(deps) == referenced(db) and len(referenced(db)) == 2
    assert read(deps, "t") == expected


def test_gc_collects_a_defrag_attempts_keys_once_its_holder_is_gone(deps, db):
    from tiering.metadata.attempt_locks import DEFRAG_CLASS, DEFRAG_REASON

    s3, name = deps.bucket.s3, deps.bucket.name
    with deps.meta.new_attempt(DEFRAG_CLASS) as attempt:
        keys = [f"t/x/{attempt}/merged", f"t/x/{attempt}/index"]
        deps.meta.enqueue_gc(keys, DEFRAG_REASON, owner=attempt)  # due at once
        for k in keys:
            s3.put_object(Bucket=name, Key=k, Body=b"m")
        assert run_gc(deps).deleted == [] and set(keys) <= bucket_keys(deps)
    # the holder is gone (the block ended, as a dead process's connection does): the keys are collectable
    assert sorted(run_gc(deps).deleted) == sorted(keys) and not set(keys) & bucket_keys(deps)


def test_gc_aborts_no_upload_of_a_live_attempt_however_old(deps, db):
    from tiering.metadata.attempt_locks import DEFRAG_CLASS, DEFRAG_REASON, REPAIR_CLASS, REPAIR_REASON

    s3, name, prefix = deps.bucket.s3, deps.bucket.name, deps.bucket.prefix

    def uploads() -> set[str]:
        return {u["Key"] for u in s3.list_multipart_uploads(Bucket=name, Prefix=prefix).get("Uploads", [])}

    stray = f"{prefix}t/stray/merged"  # no attempt queued it: a killed worker's
    s3.create_multipart_upload(Bucket=name, Key=stray)
    with deps.meta.new_attempt(DEFRAG_CLASS) as merge, deps.meta.new_attempt(REPAIR_CLASS) as fix:
        kept = {f"{prefix}t/x/{merge}/merged": (DEFRAG_REASON, merge), f"{prefix}t/x/{fix}/data": (REPAIR_REASON, fix)}
        for key, (reason, attempt) in kept.items():
            deps.meta.enqueue_gc([key], reason, owner=attempt, delay=timedelta(hours=1))
            s3.create_multipart_upload(Bucket=name, Key=key)
        report = run_gc(deps, orphan_grace=timedelta(0))  # every upload is past the grace period
        assert report.uploads_aborted == 1 and uploads() == set(kept)
    # their holders are gone (the block ended, as a dead process's connection does)
    assert run_gc(deps, orphan_grace=timedelta(0)).uploads_aborted == 2 and uploads() == set()


def test_an_upload_gone_since_the_listing_counts_as_aborted_work_not_a_failure(deps, db, monkeypatch):
    """Two GC runs at once (the hourly DAG and one by hand) list the same stale uploads: the one that comes
    second to an upload gets NoSuchUpload, which is the work done, not a failure (it exited 1 and stopped)."""
    from tiering.ops import gc as gc_ops

    s3, name, prefix = deps.bucket.s3, deps.bucket.name, deps.bucket.prefix
    ups = [s3.create_multipart_upload(Bucket=name, Key=f"{prefix}t/stale/{i}")["UploadId"] for i in range(3)]
    listed = gc_ops.stale_uploads(deps, timedelta(0))
    assert sorted(u["UploadId"] for u in listed) == sorted(ups)
    s3.abort_multipart_upload(Bucket=name, Key=f"{prefix}t/stale/1", UploadId=ups[1])  # the other run's
    monkeypatch.setattr(gc_ops, "stale_uploads", lambda *a: listed)  # this run listed before it
    assert run_gc(deps, orphan_grace=timedelta(0)).uploads_aborted == 2
    assert s3.list_multipart_uploads(Bucket=name, Prefix=prefix).get("Uploads", []) == []


@pytest.mark.parametrize("claim", ["committed", "blocked"])
def test_gc_with_no_grace_aborts_no_upload_of_a_live_offload(deps, db, claim):
    """`gc --orphan-grace-seconds 0` run while an offload uploads: the upload is the live attempt's (its worker
    holds the attempt lock, taken before the upload is created), so it is left and the offload commits
    (aborted, its completion would fail). Also while the claim's transaction still waits (`blocked`: another
    transaction holds the ledger's row), when no key of the attempt is queued yet."""
    s3, name, prefix = deps.bucket.s3, deps.bucket.name, deps.bucket.prefix
    expected = produce(deps, "up", [entries("u", 120, 100 * 1024)])  # 12 MiB: a multipart upload
    [led] = deps.meta.list_ledgers("up", [S.SEALED])
    seen = []
    blocker = db.connect()
    tx = blocker.begin()
    if claim == "blocked":
        blocker.execute(text("SELECT 1 FROM tiering.ledger l JOIN tiering.topic t USING (topic_id) "
                             "WHERE t.name = 'up' FOR UPDATE OF l"))

    def gc_meanwhile(step):
        if step == "initiated":  # the upload exists
            with db.connect() as conn:
                queued = conn.execute(text("SELECT count(*) FROM tiering.gc_task")).scalar()
            seen.append((queued > 0, run_gc(deps, orphan_grace=timedelta(0)).uploads_aborted))
            tx.commit()  # the claim goes on

    try:
        done = offload_ledger(deps, led, hook=gc_meanwhile)
    finally:
        blocker.close()
    assert seen[0][1] == 0 and done.state == S.OFFLOADED, seen
    if claim == "blocked":
        assert seen == [(False, 0)]  # nothing queued yet: the lock alone kept the upload
    assert s3.list_multipart_uploads(Bucket=name, Prefix=prefix).get("Uploads", []) == []
    assert read(deps, "up") == expected


@pytest.fixture
def collected_before_commit(deps, db, monkeypatch):
    """GC collects a defrag's merged objects after they are written, as when its attempt lock is lost."""
    put_index = defrag_ops._put_index

    def then_collected(*args, **kwargs):
        out = put_index(*args, **kwargs)
        keys = defrag_queue(db)
        assert len(keys) == 2
        for k in keys:
            deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=k)
        with db.begin() as conn:
            conn.execute(text("DELETE FROM tiering.gc_task WHERE reason = 'defrag attempt'"))
        return out

    monkeypatch.setattr(defrag_ops, "_put_index", then_collected)


def _nothing_changed_nothing_leaked(deps, db, expected, topic):
    chunks = deps.meta.chunks(topic)
    assert len({c.data_key for c in chunks.values()}) == 3  # no chunk switched
    assert referenced(db) <= bucket_keys(deps)  # no chunk references a deleted object
    assert read(deps, topic) == expected
    run_gc(deps)
    assert bucket_keys(deps) == referenced(db) and defrag_queue(db) == set()  # the merged objects went


def test_merged_objects_collected_before_the_commit_fail_the_group_not_a_lost_race(
        deps, db, collected_before_commit):
    expected = small_topic(deps)
    report = merge_groups(deps, plan_defrag(deps, "t", small_bytes=MIB, max_merged_bytes=64 * MIB), MIB, 64 * MIB)
    assert (report.groups, report.lost_races, len(report.errors), len(report.failures)) == (0, 0, 1, 1)
    message = report.errors[0]
    assert "TIERING_OFFLOAD_TIMEOUT_SECONDS" in message and "collected" in message and "rerun" in message
    _nothing_changed_nothing_leaked(deps, db, expected, "t")
    # the Spark job's item fails too (a lost race would be a skipped item)
    [group] = plan_defrag(deps, "t", small_bytes=MIB, max_merged_bytes=64 * MIB)
    with pytest.raises(TieringError, match="TIERING_OFFLOAD_TIMEOUT_SECONDS"):
        defrag_job.work(deps, {"group": group, "small_bytes": MIB, "max_merged_bytes": 64 * MIB})
    _nothing_changed_nothing_leaked(deps, db, expected, "t")


def test_the_cli_exits_1_when_the_merged_objects_were_collected(
        deps, db, collected_before_commit, settings, bucket, tier1_root, tmp_path, monkeypatch, capsys):
    expected = small_topic(deps)
    for key, value in make_cli(settings, bucket, tier1_root, tmp_path).env.items():
        monkeypatch.setenv(key, value)
    res = run_main(("defrag", "--topic", "t", "--small-bytes", "1MiB"), capsys)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert "0 lost race(s), 1 failed" in res.stdout and "TIERING_OFFLOAD_TIMEOUT_SECONDS" in res.stderr
    _nothing_changed_nothing_leaked(deps, db, expected, "t")


def test_a_repair_slower_than_the_offload_timeout_keeps_its_new_copy_from_gc(slow_deps, db):
    """A repair's new copy is queued under its attempt as defrag's merged objects are: GC running while the
    repair is past the timeout leaves it alone, and the repair commits it."""
    from tests.integration.test_repair import damage
    from tiering.ops.repair import repair

    deps = slow_deps
    expected = small_topic(deps, "r")
    bad = deps.meta.get_chunk(deps.meta.get_ledger("r", 1))
    damage(deps, bad.data_key, "flip", at=bad.data_length // 2)
    collected = []

    def gc_meanwhile(name):
        if name == "checked":
            time.sleep(TIMEOUT.total_seconds() + 0.5)
            collected.extend(run_gc(deps).deleted)
    report = repair(deps, "r", hook=gc_meanwhile)
    assert report.repaired == [("r", 1)] and report.failed == [] and report.skipped == []
    new = deps.meta.get_chunk(deps.meta.get_ledger("r", 1))
    assert new.data_key != bad.data_key and {new.data_key, new.index_key}.isdisjoint(collected)
    assert {new.data_key, new.index_key} <= bucket_keys(deps)
    assert read(deps, "r") == expected


def test_a_repair_whose_new_copy_was_collected_fails_and_is_not_skipped(slow_deps, db):
    """Its new copy's queue rows gone before the commit (as GC would after the worker lost its lock): a
    failure naming the cause, not "skipped" (no other worker took the ledger), and nothing dangles."""
    from tests.integration.test_repair import damage
    from tiering.ops.repair import repair

    deps = slow_deps
    small_topic(deps, "q")
    bad = deps.meta.get_chunk(deps.meta.get_ledger("q", 0))
    damage(deps, bad.data_key, "flip", at=bad.data_length // 2)

    def collect(name):
        if name == "checked":
            with db.begin() as conn:
                conn.execute(text("DELETE FROM tiering.gc_task WHERE reason = 'repair attempt'"))
    report = repair(deps, "q", hook=collect)
    assert report.repaired == [] and report.skipped == []
    assert [f["ledger"] for f in report.failed] == [0] and "collected" in report.failed[0]["error"]
    assert deps.meta.get_chunk(deps.meta.get_ledger("q", 0)) == bad  # the chunk did not move


def test_a_group_merged_and_collected_by_another_defrag_meanwhile_is_a_lost_race_not_a_failure(slow_deps, db):
    """Two defrag runs planned the same group; the first merged it and GC (no delay) collected the objects
    merged away before the second read them. The second's work was done by another worker: a lost race
    (exit 0), not a failure, and it leaves nothing behind."""
    deps = slow_deps
    expected = small_topic(deps)
    [group] = plan_defrag(deps, "t")
    assert defrag(deps, "t").groups == 1
    run_gc(deps)  # the sources the second run planned are gone
    report = merge_groups(deps, [group])
    assert report.errors == [] and report.failures == [] and report.lost_races == 1
    time.sleep(TIMEOUT.total_seconds())
    run_gc(deps)
    assert read(deps, "t") == expected and bucket_keys(deps) == referenced(db)


def test_delete_lagged_checks_again_a_copy_whose_chunk_defrag_moved_while_it_was_checked(slow_deps, db, monkeypatch):
    """Chunk rows without ETags (as recovery writes them) are checked whole before the tier-1 copy goes.
    Defrag merges the ledgers meanwhile and GC (no delay) collects the objects checked: the copy is sound
    at its new place, where it is checked again and the tier-1 copy goes; it is not a missing tier-2 copy
    for `tiering repair` (exit 1)."""
    from tiering.ops import delete_lagged as dl

    deps = slow_deps
    produce(deps, "t", [entries(f"t{i}", 5, 500) for i in range(3)], open_tail=[b"o"],
            policy=TopicPolicy(**BIG, deletion_lag_seconds=0))
    offload_many(deps, deps.meta.list_ledgers("t", [S.SEALED]))
    expected = read(deps, "t")
    with db.begin() as conn:
        conn.execute(text("UPDATE tiering.chunk SET data_etag = NULL, index_etag = NULL"))
    real_check, moved = dl.check_copy, []

    def check_after_defrag(*args, **kwargs):
        if not moved:
            moved.append(defrag(deps, "t").groups)
            run_gc(deps)
        return real_check(*args, **kwargs)
    monkeypatch.setattr(dl, "check_copy", check_after_defrag)
    report = dl.delete_lagged(deps, "t")
    assert moved == [1] and report.failed == [] and report.skipped == [] and len(report.deleted) == 3
    assert [led.tier1_present for led in deps.meta.list_ledgers("t", [S.OFFLOADED])] == [False] * 3
    assert read(deps, "t") == expected


def test_verify_compares_the_copy_defrag_moved_a_ledger_to_while_it_was_verified(slow_deps, db):
    """verify compares each offloaded ledger's tier-2 copy with its tier-1 copy. Defrag merges the ledgers
    while that comparison reads the chunk row's objects, and GC (no delay) collects them: the ledger is
    sound at its new place, so verify reports nothing, not a tier-2 copy to repair."""
    from tiering.ops.verify import verify_topic

    deps = slow_deps
    small_topic(deps)
    real, calls = tier2_opener(deps.bucket), []

    def opener(led, chunk):
        calls.append(led.ledger_id)
        if led.ledger_id == 0 and calls.count(0) == 2:  # ledger 0's comparison, its chunk row read: defrag
            assert defrag(deps, "t").groups == 1  # and GC run now
            run_gc(deps)
        return real(led, chunk)
    report = verify_topic(deps.meta, deps.tier1, opener, "t")
    assert report.problems == [] and report.tier2_copies_checked == 3


def test_a_dry_run_reports_the_bytes_its_run_moves(deps, settings, bucket, tier1_root, tmp_path):
    """The dry run said 0 bytes downloaded and copied for any plan; now it says what the run moves when every
    source is as its chunk row records it (small objects: data and index downloaded)."""
    small_topic(deps)
    cli = make_cli(settings, bucket, tier1_root, tmp_path)
    dry = cli("defrag", "--topic", "t", "--small-bytes", "1MiB", "--dry-run", "--json").json
    run = cli("defrag", "--topic", "t", "--small-bytes", "1MiB", "--json").json
    assert dry["downloaded_bytes"] > 0 and dry["copied_server_side_bytes"] == 0
    assert (dry["downloaded_bytes"], dry["copied_server_side_bytes"]) == (run["downloaded_bytes"],
                                                                          run["copied_server_side_bytes"])


def test_a_group_a_truncate_took_part_of_meanwhile_is_planned_again_and_the_rest_merged(slow_deps, db):
    """A truncate took the group's first ledger between its merge and its commit: the commit lost, and the
    run reported no group merged, no failure and exit 0, although nobody merged the two ledgers left."""
    from tiering.model import Position
    from tiering.ops.defrag import DefragReport, merge_replanning
    from tiering.ops.retention import truncate

    deps = slow_deps
    expected = small_topic(deps)
    [group] = plan_defrag(deps, "t")
    trims = []

    def trim_once(step):
        if step == "merged" and not trims:
            trims.append(truncate(deps, "t", Position(1, 0)))
    report = DefragReport()
    assert merge_replanning(deps, group, report, 8 * MIB, 256 * MIB, hook=trim_once) is True
    assert (report.lost_races, report.groups, report.ledgers) == (1, 1, 2)
    left = [deps.meta.get_chunk(deps.meta.get_ledger("t", i)) for i in (1, 2)]
    assert left[0].data_key == left[1].data_key  # merged into one object
    assert read(deps, "t") == {k: v for k, v in expected.items() if k[0] != 0}
    assert plan_defrag(deps, "t") == []
    time.sleep(TIMEOUT.total_seconds())
    run_gc(deps)
    assert bucket_keys(deps) == referenced(db)


def test_a_group_losing_every_replan_fails_saying_so(slow_deps, monkeypatch):
    """Lost again and again (other workers moving its ledgers each time): not merged, a failure, not done."""
    from tiering.ops.defrag import DefragReport, merge_replanning

    deps = slow_deps
    small_topic(deps)
    [group] = plan_defrag(deps, "t")
    monkeypatch.setattr(defrag_ops, "merge_group", lambda deps, g, report, hook=None: False)
    with pytest.raises(TieringError, match="changed them 5 times"):
        merge_replanning(deps, group, DefragReport(), 8 * MIB, 256 * MIB)


def test_held_reads_whose_attempt_locks_live_sessions_hold_and_takes_none(deps, db):
    """`held` (what GC asks of an upload's attempt) names exactly the attempts whose lock a live session
    holds, of the class asked, for uuids hashing to negative and positive keys alike, and takes no lock: a
    takeover's try-lock at once after it still gets a dead attempt's lock."""
    import uuid

    from tiering.metadata.attempt_locks import DEFRAG_CLASS, OFFLOAD_CLASS, AttemptLock, held, holder_gone

    locks = [AttemptLock(db) for _ in range(16)]
    for lock in locks[:8]:
        assert lock.take()
    try:
        attempts = [lock.attempt for lock in locks] + [str(uuid.uuid4()).upper()]
        with db.connect() as conn:
            assert held(conn, OFFLOAD_CLASS, attempts) == {lock.attempt for lock in locks[:8]}
            assert held(conn, DEFRAG_CLASS, attempts) == set()
            signs = set(conn.execute(text("SELECT DISTINCT sign(hashtext(a)) FROM unnest(CAST(:a AS text[])) a"),
                                     {"a": [lock.attempt for lock in locks]}).scalars())
        if len(signs) < 2:  # one chance in 32,768
            pytest.skip("the 16 uuids all hashed to keys of one sign")
        with db.begin() as conn:
            assert all(holder_gone(conn, lock.attempt) for lock in locks[8:])
    finally:
        for lock in locks:
            lock.release()
