"""The scheduled GC costs what is due, not what the bucket holds; the orphan sweep is its own
resumable operation (a persisted cursor, a page budget per run, one sweep at a time). PostgreSQL and RGW.

Costs are counted exactly, never timed: S3 requests with botocore's `before-send` on the client the command
builds, SQL statements with SQLAlchemy's `before_cursor_execute` on its engine."""
from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from sqlalchemy import event, text

from tests.faults.harness import gc_all, referenced_keys
from tests.integration.helpers import bucket_keys, entries, produce
from tiering import clients
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.gc import sweep_orphans
from tiering.ops.offload import offload_many

BIG = TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40)
FILLER = 2_500  # three LIST pages: the old hourly run listed them all (HEAD + 3 LIST + 2 upload listings = 6)


class Counted:
    """Counts every S3 request and SQL statement of the clients `tiering.clients` builds while active."""

    def __init__(self, monkeypatch):
        self.s3: Counter = Counter()
        self.sql: list[str] = []
        real_s3, real_engine = clients.s3_client, clients.engine

        def s3_client(*a, **kw):
            client = real_s3(*a, **kw)
            client.meta.events.register("before-send.s3", self._on_send)
            return client

        def engine(*a, **kw):
            eng = real_engine(*a, **kw)
            event.listen(eng, "before_cursor_execute", self._on_sql)
            return eng

        monkeypatch.setattr(clients, "s3_client", s3_client)
        monkeypatch.setattr(clients, "engine", engine)

    def _on_send(self, request, **kwargs):
        self.s3[f"{request.method} {kwargs.get('event_name', '')}".split(".")[-1]] += 1
        self.s3["total"] += 1

    def _on_sql(self, conn, cursor, statement, parameters, context, executemany):
        self.sql.append(statement)


def run_cli(argv, settings, bucket, tier1_root, monkeypatch, capsys) -> tuple[int, str, str]:
    from tiering.cli.main import main

    for key, value in {**settings.to_env(), "TIERING_TIER1_ROOT": str(tier1_root), "TIERING_BUCKET": bucket}.items():
        monkeypatch.setenv(key, value)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _fill(deps, n: int, prefix: str = "t/filler/") -> list[str]:
    """n small objects under the prefix (in no queue, referenced by nothing: orphans to the sweep, once
    older than its grace)."""
    keys = [f"{prefix}{i:06d}" for i in range(n)]
    s3, name = deps.bucket.s3, deps.bucket.name
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=name, Key=k, Body=b"x"), keys))
    return keys


def test_scheduled_gc_with_nothing_due_costs_the_same_whatever_the_bucket_holds(
        deps, db, settings, bucket, tier1_root, monkeypatch, capsys):
    produce(deps, "g", [entries("g", 3, 100)], BIG)
    assert offload_many(deps, deps.meta.list_ledgers("g", [S.SEALED])).failed == {}
    _fill(deps, FILLER)
    assert len(bucket_keys(deps)) == FILLER + 2
    counted = Counted(monkeypatch)
    code, out, err = run_cli(["gc", "--json"], settings, bucket, tier1_root, monkeypatch, capsys)
    assert code == 0, err
    assert '"deleted_count": 0' in out and '"uploads_aborted_count": 0' in out
    s3 = dict(counted.s3)
    print(f"scheduled gc, nothing due, {FILLER + 2} objects: S3 {s3}, SQL {len(counted.sql)}: {counted.sql}")
    assert s3["total"] <= 5 and not any("ListObjects" in k for k in s3), s3
    assert len(counted.sql) <= 10, counted.sql
    assert len(bucket_keys(deps)) == FILLER + 2  # the hourly run sweeps nothing: that is the sweep's


def test_the_sweep_resumes_from_its_cursor_and_deletes_only_unreferenced_unqueued_objects(deps, db):
    produce(deps, "g", [entries(f"g{i}", 3, 100) for i in range(2)], BIG, open_tail=[b"o"])
    assert offload_many(deps, deps.meta.list_ledgers("g", [S.SEALED])).failed == {}
    referenced = referenced_keys(db)
    assert len(referenced) == 4
    orphans = _fill(deps, 5, "t/g/zz-orphan-")  # after the topic's keys: the last pages
    queued = "t/g/zz-orphan-queued"  # unreferenced, but held by the queue (not yet due): kept
    deps.meta.enqueue_gc([queued], "a test: not due", delay=timedelta(hours=1))
    deps.bucket.s3.put_object(Bucket=deps.bucket.name, Key=queued, Body=b"q")
    everything = sorted(bucket_keys(deps))
    assert len(everything) == 10

    # a grace longer than the objects' age: a whole pass, page by page, deletes nothing
    cursors, reports = [], []
    for _ in range(10):
        r = sweep_orphans(deps, orphan_grace=timedelta(hours=1), max_pages=1, page_keys=3)
        reports.append(r)
        cursors.append(r.cursor)
        if r.pass_complete:
            break
    assert [r.pages for r in reports] == [1, 1, 1, 1] and [r.objects_listed for r in reports] == [3, 3, 3, 1]
    assert cursors == [everything[2], everything[5], everything[8], ""], "each run resumed after the last"
    assert [r.started_from for r in reports] == ["", *cursors[:3]]
    assert reports[-1].passes_completed == 1 and reports[-1].last_pass_completed_at is not None
    assert all(r.orphans_deleted == [] for r in reports) and len(bucket_keys(deps)) == 10

    # grace 0, one page per run: the orphans go, page by page; referenced and queued objects stay
    deleted = []
    for _ in range(4):
        r = sweep_orphans(deps, orphan_grace=timedelta(0), max_pages=1, page_keys=3)
        deleted += r.orphans_deleted
    assert r.pass_complete and r.passes_completed == 2
    assert sorted(deleted) == sorted(orphans)
    assert bucket_keys(deps) == referenced | {queued}
    with db.connect() as conn:
        row = conn.execute(text("SELECT cursor, passes_completed, pages_listed, orphans_deleted, version "
                                "FROM tiering.gc_sweep")).one()
    assert tuple(row) == ("", 2, 8, 5, 8)


def test_a_sweep_killed_between_delete_and_cursor_move_repeats_its_page(deps, db):
    keys = _fill(deps, 4, "t/k/")
    with db.begin() as conn:  # as a run killed after its deletes: the cursor never moved
        conn.execute(text("INSERT INTO tiering.gc_sweep (bucket, prefix, cursor) VALUES (:b, :p, '')"),
                     {"b": deps.bucket.name, "p": deps.bucket.prefix})
    deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=keys[0])
    r = sweep_orphans(deps, orphan_grace=timedelta(0), max_pages=1, page_keys=2)
    assert r.orphans_deleted == keys[1:3] and r.cursor == keys[2]


def test_two_sweeps_at_once_never_work_the_same_pages(deps, db):
    orphans = _fill(deps, 12, "t/c/")
    gate, inside = threading.Event(), threading.Event()
    s3 = deps.bucket.s3

    def hold(**kwargs):  # the first sweep stops inside its first LIST until the second has tried
        if not inside.is_set():
            inside.set()
            assert gate.wait(60)

    s3.meta.events.register("before-call.s3.ListObjectsV2", hold)
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(sweep_orphans, deps, timedelta(0), 100, 5)
            assert inside.wait(60)
            second = sweep_orphans(deps, orphan_grace=timedelta(0), max_pages=100, page_keys=5)
            gate.set()
            first = first.result(60)
    finally:
        gate.set()
        s3.meta.events.unregister("before-call.s3.ListObjectsV2", hold)
    assert second.taken and second.pages == 0 and second.orphans_deleted == []
    assert not first.taken and first.pass_complete and sorted(first.orphans_deleted) == orphans
    assert bucket_keys(deps) == set()
    # the lock went with the first sweep: the next one runs
    assert not sweep_orphans(deps, orphan_grace=timedelta(0)).taken


def test_cli_sweep_by_hand_reports_pages_cursor_and_pass(deps, db, settings, bucket, tier1_root, monkeypatch,
                                                          capsys):
    import json

    produce(deps, "h", [entries("h", 3, 100)], BIG)
    offload_many(deps, deps.meta.list_ledgers("h", [S.SEALED]))
    deps.bucket.s3.put_object(Bucket=deps.bucket.name, Key="t/stray/notes.txt", Body=b"left by hand")
    code, out, err = run_cli(["gc", "--sweep", "--orphan-grace-seconds", "0", "--max-pages", "3", "--json"],
                             settings, bucket, tier1_root, monkeypatch, capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["sweep"] is True and doc["taken"] is False and doc["page_count"] == 1
    assert doc["objects_listed_count"] == 3
    assert doc["orphans_deleted_count"] == 1 and doc["pass_complete"] is True and doc["cursor"] == ""
    assert doc["passes_completed_count"] == 1 and doc["last_pass_completed_at"].endswith("Z")
    assert "t/stray/notes.txt" not in bucket_keys(deps) and bucket_keys(deps) == referenced_keys(db)
    code, out, err = run_cli(["gc", "--max-pages", "3"], settings, bucket, tier1_root, monkeypatch, capsys)
    assert code == 2 and "--max-pages is for --sweep" in err and out == ""


@pytest.mark.parametrize("n", [0, 3])
def test_gc_all_of_the_fault_tests_runs_a_whole_pass(deps, db, n):
    """The fault tests' `gc_all` sweeps the whole prefix even when a sweep stopped mid-pass before."""
    keys = _fill(deps, 5, "t/p/")
    if n:
        sweep_orphans(deps, orphan_grace=timedelta(hours=1), max_pages=1, page_keys=n)  # cursor mid-prefix
    report = gc_all(deps)
    assert sorted(report.orphans_deleted) == keys and bucket_keys(deps) == set()


def test_the_grace_keeps_young_orphans_and_lets_old_ones_go(deps, db):
    """Positive grace, real ages (RGW's LastModified): the orphan older than the grace is deleted, the one
    written after it is kept. Ages here are seconds, not hours; the sleep makes the first one old."""
    import time

    [old] = _fill(deps, 1, "t/age/a-old-")
    time.sleep(3.5)
    [young] = _fill(deps, 1, "t/age/b-young-")
    r = sweep_orphans(deps, orphan_grace=timedelta(seconds=2), max_pages=1, page_keys=1)
    assert r.orphans_deleted == [old] and r.cursor == old and not r.pass_complete
    r = sweep_orphans(deps, orphan_grace=timedelta(seconds=2), max_pages=1, page_keys=1)
    assert r.orphans_deleted == [] and r.pass_complete
    assert bucket_keys(deps) == {young}


def test_a_cursor_moved_under_a_running_sweep_stops_it_as_taken(deps, db):
    """The CAS behind the lock: if the cursor's version moves while a sweep works (a reset by hand, a lock
    lost with its connection), the sweep stops at once and says so; its page's decision was still safe."""
    _fill(deps, 6, "t/cas/")
    deps.bucket.s3.meta.events.register("after-call.s3.ListObjectsV2", bump := lambda **kw: _bump(db))
    try:
        r = sweep_orphans(deps, orphan_grace=timedelta(hours=1), max_pages=5, page_keys=2)
    finally:
        deps.bucket.s3.meta.events.unregister("after-call.s3.ListObjectsV2", bump)
    assert r.taken and r.pages == 1 and r.cursor == "" and not r.pass_complete
    with db.connect() as conn:
        assert conn.execute(text("SELECT cursor, version FROM tiering.gc_sweep")).one() == ("t/cas/elsewhere", 1)


def _bump(db) -> None:
    with db.begin() as conn:
        conn.execute(text("UPDATE tiering.gc_sweep SET cursor = 't/cas/elsewhere', version = version + 1"))
