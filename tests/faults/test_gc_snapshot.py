"""GC's orphan sweep racing a commit that moves keys from the GC queue to chunk rows: a key the sweep read as
unreferenced may be referenced by the time it deletes.

An offload (or a defrag) has written its objects, their keys are queued under its attempt, and its
commit (chunk rows in, queue rows out, one transaction) lands while GC's orphan sweep (`sweep_orphans`, the
resumable sweep, here with orphan grace 0 and pages of 1,000 keys) lists and decides the bucket.
The commit is released from inside the sweep, at an exact point, by listeners on GC's own clients:

- `between-statements`: right after the first SQL statement of the sweep that names the keys. The old
  sweep asked "referenced?" and then "queued?" in two READ COMMITTED statements, so the commit landed
  between them, the keys looked like neither, and GC deleted objects a committed chunk references
  (data lost once delete-lagged removed the tier-1 copy). The sweep now decides on one snapshot.
- `after-listing`: right after GC listed the bucket and before it asks the database. The snapshot must
  be taken after the listing (a key queued and written after the snapshot would look like an orphan).

Either way the commit must win, GC must delete nothing, and everything must read back.
"""
from __future__ import annotations

import threading
from datetime import timedelta

import boto3
import pytest
from botocore.config import Config
from sqlalchemy import event, text

from tests.faults.harness import check_invariants, gc_all, referenced_keys
from tests.integration.helpers import bucket_keys, entries, make_deps, produce
from tiering.metadata import make_engine
from tiering.metadata.repository import MetadataStore
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.context import Deps
from tiering.ops.defrag import DefragReport, merge_group, plan_defrag
from tiering.ops.gc import sweep_orphans
from tiering.ops.offload import offload_ledger, offload_many
from tiering.tier2.objects import Bucket

WAIT = 60
BIG = TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40)


class Paused:
    """Runs `op(hook)` in a thread; the hook stops at `step` until released."""

    def __init__(self, op, step: str):
        self.step, self.reached, self.go = step, threading.Event(), threading.Event()
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self._run, args=(op,), daemon=True)
        self.thread.start()
        assert self.reached.wait(WAIT), f"the writer never reached {step!r}: {self.error!r}"

    def _hook(self, name: str) -> None:
        if name == self.step:
            self.reached.set()
            assert self.go.wait(WAIT), "never released"

    def _run(self, op) -> None:
        try:
            self.result = op(self._hook)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
            self.reached.set()

    def release_and_wait(self) -> None:
        self.go.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the writer's commit did not finish"


@pytest.fixture
def gc_deps(database_url, s3_settings, deps):
    """GC on clients of its own (its own engine and S3 client), so listeners on them see only GC's calls."""
    engine = make_engine(database_url)
    s3 = boto3.client("s3", **s3_settings, config=Config(max_pool_connections=4))
    yield Deps(MetadataStore(engine), deps.tier1, Bucket(s3, deps.bucket.name, deps.bucket.prefix), deps.knobs)
    engine.dispose()


@pytest.fixture
def deps(db, s3_client, bucket, tier1_root):
    # the production offload timeout: the attempt's queued keys are not due, GC's queue pass leaves them
    return make_deps(db, s3_client, bucket, tier1_root, offload_timeout=timedelta(hours=1))


def _attempt_keys(engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT key FROM tiering.gc_task WHERE owner_uuid IS NOT NULL")).scalars())


def _release_inside_gc(gc_deps: Deps, writer: Paused, keys: set[str], moment: str) -> list:
    """Arm the listener that releases the writer's commit at `moment` of GC's sweep; returns a list that
    gets one element when it fired."""
    fired: list = []

    def fire(what):
        if not fired:
            fired.append(what)
            writer.release_and_wait()

    if moment == "between-statements":
        def after_sql(conn, cursor, statement, parameters, context, executemany):
            if any(k in str(parameters) for k in keys):
                fire(statement)
        event.listen(gc_deps.meta.engine, "after_cursor_execute", after_sql)
    else:
        def after_list(**kwargs):
            fire("ListObjectsV2")
        gc_deps.bucket.s3.meta.events.register("after-call.s3.ListObjectsV2", after_list)
    return fired


def _assert_nothing_referenced_deleted(deps, db, report) -> None:
    refs = referenced_keys(db)
    assert not refs & set(report.orphans_deleted), "GC deleted objects a committed chunk references"
    assert refs <= bucket_keys(deps), f"referenced objects missing: {sorted(refs - bucket_keys(deps))}"


def _gc_releasing(gc_deps, writer, keys, moment):
    """The orphan sweep with zero grace, the paused writer's commit released from inside it at `moment`; its
    report (one whole pass: the bucket holds far fewer than a page of keys)."""
    fired = _release_inside_gc(gc_deps, writer, keys, moment)
    try:
        report = sweep_orphans(gc_deps, orphan_grace=timedelta(0))
    finally:
        writer.go.set()
    assert fired, "the commit was never released from inside GC's sweep"
    assert report.pass_complete and not report.taken and report.pages == 1, report
    return report


@pytest.mark.parametrize("moment", ["between-statements", "after-listing"])
def test_sweep_keeps_an_offload_committed_mid_sweep(moment, deps, gc_deps, db):
    expected = {"t": produce(deps, "t", [entries("gc-race", 20, 1000)], BIG)}
    led = deps.meta.list_ledgers("t")[0]
    writer = Paused(lambda hook: offload_ledger(deps, led, hook), "index")  # both objects written, not committed
    assert writer.error is None, writer.error
    keys = _attempt_keys(db)
    assert len(keys) == 2 and keys <= bucket_keys(deps)
    report = _gc_releasing(gc_deps, writer, keys, moment)
    assert writer.error is None, f"the offload's commit failed: {writer.error!r}"
    assert deps.meta.get_ledger("t", led.ledger_id).state == S.OFFLOADED
    _assert_nothing_referenced_deleted(deps, db, report)
    assert report.orphans_deleted == []
    deps.tier1.delete("t", led.ledger_id)  # as delete-lagged would: only tier 2 is left to read from
    deps.meta.mark_tier1_deleted(deps.meta.get_ledger("t", led.ledger_id))
    gc_all(deps)
    check_invariants(deps, db, expected)


@pytest.mark.parametrize("moment", ["between-statements", "after-listing"])
def test_sweep_keeps_a_defrag_committed_mid_sweep(moment, deps, gc_deps, db):
    expected = {"t": produce(deps, "t", [entries(f"gc-defrag{i}", 10, 500) for i in range(3)], BIG)}
    assert offload_many(deps, deps.meta.list_ledgers("t", [S.SEALED])).failed == {}
    before = referenced_keys(db)
    groups = plan_defrag(deps, "t")
    assert len(groups) == 1
    writer = Paused(lambda hook: merge_group(deps, groups[0], DefragReport(), hook), "merged")
    assert writer.error is None, writer.error
    keys = _attempt_keys(db)  # the merged objects' keys, queued under the defrag attempt
    assert len(keys) == 2 and keys <= bucket_keys(deps)
    report = _gc_releasing(gc_deps, writer, keys, moment)
    assert writer.error is None and writer.result is True, f"the defrag's commit failed: {writer.error!r}"
    assert referenced_keys(db) == keys, "every chunk now points into the merged objects"
    _assert_nothing_referenced_deleted(deps, db, report)
    assert not set(report.orphans_deleted) & before, "pre-defrag objects are the queue's, not orphans"
    for led in deps.meta.list_ledgers("t"):
        deps.tier1.delete("t", led.ledger_id)
        deps.meta.mark_tier1_deleted(led)
    gc_all(deps)  # the merged-away objects (queued, delay 0) go now
    check_invariants(deps, db, expected)
