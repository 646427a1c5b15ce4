"""kill -9 at named points of every pipeline operation, then rerun, GC, and check nothing is lost, leaked or
left half-done.

Each case: set the scene in-process (produce, offload, ...), start `python -m tests.faults.worker OP` with
a point, wait until it announces the point, SIGKILL it there, sleep past the 1 s offload timeout (the dead
attempt becomes stale), rerun the operation in-process to completion, run GC (orphan grace 0) and check the
invariants of `harness.check_invariants`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

import pytest

from sqlalchemy import text

from tests.faults.harness import check_invariants, gc_all, kill_at_point, referenced_keys, settle, start_worker
from tests.faults.worker import run_op
from tests.integration.helpers import bucket_keys, entries, open_uploads, produce
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.delete_lagged import delete_lagged
from tiering.ops.offload import offload_ledger
from tiering.ops.retention import truncate

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
KIB = 1024


@dataclass(frozen=True)
class Scene:
    expected: dict          # topic -> {(ledger, entry): payload}
    trimmed: dict           # topic -> ledger ids retention removes (after the operation completed)


def _small(deps, topic="k", n=3, policy=None) -> dict:
    """n sealed ledgers of ~100 KB and an open tail."""
    return produce(deps, topic, [entries(f"{topic}{i}", 10, 10 * KIB) for i in range(n)],
                   policy or TopicPolicy(**BIG), open_tail=[b"tail"])


def _one_by_one(deps, leds):
    """One object pair per ledger (no batching): the scenes below are about those objects."""
    for led in leds:
        offload_ledger(deps, led)


def _offload_all(deps, topic):
    _one_by_one(deps, deps.meta.list_ledgers(topic, [S.SEALED]))


def scene_offload(deps) -> Scene:
    return Scene({"k": _small(deps)}, {})


def scene_offload_multipart(deps) -> Scene:
    # ledger 0: ~11 MiB = 3 parts of the 5 MiB block size; ledger 1 small
    exp = produce(deps, "k", [entries("big", 110, 100 * KIB), entries("k1", 10, 10 * KIB)], TopicPolicy(**BIG),
                  open_tail=[b"tail"])
    return Scene({"k": exp}, {})


def scene_offload_batch(deps) -> Scene:
    # three small ledgers (~2.4 MiB each) offloaded as one batch: ~7 MiB, one part (the 5 MiB part size is a
    # minimum: the bytes pending when it is passed go as one part)
    exp = produce(deps, "k", [entries(f"b{i}", 24, 100 * KIB) for i in range(3)], TopicPolicy(**BIG),
                  open_tail=[b"tail"])
    return Scene({"k": exp}, {})


def scene_delete_lagged(deps) -> Scene:
    exp = _small(deps, policy=TopicPolicy(deletion_lag_seconds=0, **BIG))
    _offload_all(deps, "k")
    return Scene({"k": exp}, {})


def scene_retention(deps) -> Scene:
    # 4 x 100,000 bytes; keeping at least 200,000 removes ledgers 0 (offloaded) and 1 (tier 1 only)
    exp = produce(deps, "k", [entries(f"r{i}", 10, 10_000) for i in range(4)],
                  TopicPolicy(retention_bytes=200_000, **BIG), open_tail=[b"tail"])
    _one_by_one(deps, [deps.meta.get_ledger("k", 0), deps.meta.get_ledger("k", 2)])
    return Scene({"k": exp}, {"k": {0, 1}})


def scene_defrag(deps) -> Scene:
    # 4 ledgers of ~2 MiB: the merge passes 5 MiB, so it is a multipart upload (one under 5 MiB is one PUT)
    exp = produce(deps, "k", [entries(f"d{i}", 20, 100 * KIB) for i in range(4)],
                  TopicPolicy(deletion_lag_seconds=0, **BIG), open_tail=[b"tail"])
    _offload_all(deps, "k")
    delete_lagged(deps, "k")  # reads of these ledgers now depend on tier 2 alone
    return Scene({"k": exp}, {})


def scene_gc(deps) -> Scene:
    exp = _small(deps, n=3)
    _offload_all(deps, "k")
    truncate(deps, "k", Position(3, 0))  # 6 keys queued, due at once (gc_delay 0)
    return Scene({"k": exp}, {"k": {0, 1, 2}})


def scene_sweep(deps) -> Scene:
    exp = _small(deps, n=2)
    _offload_all(deps, "k")
    for i in range(3):  # orphans (in no queue, referenced by nothing) before and after the topic's keys
        for where in ("a", "z"):
            deps.bucket.s3.put_object(Bucket=deps.bucket.name, Key=f"t/{where}-stray-{i}", Body=b"stray")
    return Scene({"k": exp}, {})


# -- what the kill must have left behind (proof the process died where the case says), checked before the rerun
def _states(deps):
    return [led.state for led in deps.meta.list_ledgers("k")]


def offloading_with_upload(deps):
    assert S.OFFLOADING in _states(deps) and open_uploads(deps)


def upload_open_claimed_or_not(deps):
    """Killed as the upload was created: its claim (the begin transaction, on a thread beside it) may or
    may not have committed by then."""
    assert open_uploads(deps) and set(_states(deps)) <= {S.OFFLOADING, S.SEALED, S.OPEN}


def sealed_unclaimed(deps):
    """Killed before the claim ran: no row moved, and nothing is an object (an upload in progress may be)."""
    assert _states(deps) == [S.SEALED, S.SEALED, S.OPEN] and bucket_keys(deps) == set()


def offloading_with_objects(n_objects):
    def check(deps):
        assert S.OFFLOADING in _states(deps) and not open_uploads(deps)
        assert len(bucket_keys(deps) - referenced_keys(deps.meta.engine)) == n_objects
    return check


def batch_offloading_with_objects(*n_objects):
    def check(deps):
        assert _states(deps) == [S.OFFLOADING] * 3 + [S.OPEN] and not open_uploads(deps)
        assert len(bucket_keys(deps) - referenced_keys(deps.meta.engine)) in n_objects
    return check


def batch_committed(deps):
    assert _states(deps) == [S.OFFLOADED] * 3 + [S.OPEN]
    assert len({c.data_key for c in deps.meta.chunks("k").values()}) == 1


def first_committed_rest_sealed(deps):
    assert _states(deps) == [S.OFFLOADED, S.SEALED, S.SEALED, S.OPEN]


def copy_gone_metadata_not_told(deps):
    led = deps.meta.get_ledger("k", 0)
    assert led.tier1_present and not deps.tier1.exists("k", 0)


def deleted_with_files_left(deps):
    assert _states(deps)[:2] == [S.DELETED, S.DELETED]
    assert all(deps.tier1.exists("k", i) for i in (0, 1))


def merge_upload_open(deps):
    assert open_uploads(deps) and len({c.data_key for c in deps.meta.chunks("k").values()}) == 4


def merged_objects_unreferenced(deps):
    assert len(bucket_keys(deps) - referenced_keys(deps.meta.engine)) == 2  # the merged data + index
    assert len({c.data_key for c in deps.meta.chunks("k").values()}) == 4


def merged_old_objects_left(deps):
    assert len({c.data_key for c in deps.meta.chunks("k").values()}) == 1
    assert len(bucket_keys(deps) - referenced_keys(deps.meta.engine)) == 8  # the 4 old data + index objects


def gc_batch_rolled_back(deps):
    with deps.meta.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.gc_task WHERE state = 'PENDING'")).scalar() == 6
    assert len(bucket_keys(deps)) == 4  # the first batch's two objects are gone, its tasks are not


def anything(_deps):
    pass


# -- what the rerun must have achieved
def all_offloaded(deps):
    assert all(led.state in (S.OFFLOADED, S.OPEN) for led in deps.meta.list_ledgers("k"))


def copies_deleted(deps):
    assert not any(led.tier1_present for led in deps.meta.list_ledgers("k") if led.state != S.OPEN)


def merged(deps):
    chunks = deps.meta.chunks("k")
    assert len(chunks) == 4 and len({c.data_key for c in chunks.values()}) == 1


def sweep_page_deleted_cursor_not_moved(deps):
    """The first page's orphans are gone, the cursor has not moved past them, the sweep's lock is free."""
    from tiering.metadata import gc_sweep

    assert {"t/a-stray-0", "t/a-stray-1"}.isdisjoint(bucket_keys(deps)) and "t/a-stray-2" in bucket_keys(deps)
    with deps.meta.engine.connect() as conn:
        assert conn.execute(text("SELECT cursor, version FROM tiering.gc_sweep")).one() == ("", 0)
    with gc_sweep.exclusive(deps.meta.engine, deps.bucket.name, deps.bucket.prefix) as held:
        assert held, "the killed sweep's lock outlived it"


def swept(deps):
    assert not {k for k in bucket_keys(deps) if "-stray-" in k}


def nothing(_deps):
    pass


@dataclass(frozen=True)
class Case:
    op: str
    point: str
    scene: Callable
    left: Callable = anything
    after: Callable = nothing
    gc_batch: int = 500
    batch_bytes: int = 0  # > 0: the worker offloads small ledgers in batches


CASES = {
    # a ledger of one block is one PUT; the multipart steps need a ledger of several blocks
    "offload@initiated": Case("offload", "step:initiated", scene_offload_multipart, upload_open_claimed_or_not,
                              all_offloaded),
    # the claim runs beside the upload's creation and first part: killed before it, the upload is GC's
    "offload@before-claim": Case("offload", "meta-before:begin_offload_batch", scene_offload_multipart,
                                 sealed_unclaimed, all_offloaded),
    # the second part: only the first may go before the claim committed
    "offload@part": Case("offload", "step:part:2", scene_offload_multipart, offloading_with_upload, all_offloaded),
    "offload@completed": Case("offload", "step:completed:2", scene_offload, offloading_with_objects(1),
                              all_offloaded),
    "offload@index": Case("offload", "step:index", scene_offload, offloading_with_objects(2), all_offloaded),
    "offload@before-commit": Case("offload", "commit-after-step:index", scene_offload, offloading_with_objects(2),
                                  all_offloaded),
    "offload@after-commit": Case("offload", "done", scene_offload, first_committed_rest_sealed, all_offloaded),
    # batches: between parts, between upload and commit, inside the commit, after it
    "offload-batch@initiated": Case("offload", "step:initiated", scene_offload_batch, upload_open_claimed_or_not,
                                    all_offloaded, batch_bytes=8 * 1024 * KIB),
    # the batch's one part (its three ledgers fill 7 MiB, shipped at once): the claim beside it may be running
    "offload-batch@part-stored": Case("offload", "step:part:1", scene_offload_batch, upload_open_claimed_or_not,
                                      all_offloaded, batch_bytes=8 * 1024 * KIB),
    # the index PUT goes beside the parts: at the completion it may have landed too
    "offload-batch@completed": Case("offload", "step:completed", scene_offload_batch,
                                    batch_offloading_with_objects(1, 2), all_offloaded, batch_bytes=8 * 1024 * KIB),
    "offload-batch@before-commit": Case("offload", "commit-after-step:index", scene_offload_batch,
                                        batch_offloading_with_objects(2), all_offloaded, batch_bytes=8 * 1024 * KIB),
    "offload-batch@after-commit": Case("offload", "done", scene_offload_batch, batch_committed, all_offloaded,
                                       batch_bytes=8 * 1024 * KIB),
    "delete-lagged@file-deleted": Case("delete-lagged", "tier1-delete:after", scene_delete_lagged,
                                       copy_gone_metadata_not_told, copies_deleted),
    "retention@metadata-committed": Case("retention", "tier1-delete:before", scene_retention,
                                         deleted_with_files_left),
    "defrag@part": Case("defrag", "step:part", scene_defrag, merge_upload_open, merged),
    "defrag@merged": Case("defrag", "step:merged", scene_defrag, merged_objects_unreferenced, merged),
    "defrag@committed": Case("defrag", "meta-after:replace_chunks", scene_defrag, merged_old_objects_left, merged),
    "gc@mid-batch": Case("gc", "s3:after:DeleteObjects", scene_gc, gc_batch_rolled_back, gc_batch=2),
    "gc-sweep@page-deleted": Case("gc-sweep", "s3:after:DeleteObjects", scene_sweep,
                                  sweep_page_deleted_cursor_not_moved, swept),
}
# Randomised points: the N-th S3 call (of the 6 an offload of three small ledgers makes), before it is sent
# or after its reply arrived. Seeded, so a failure names a reproducible case.
_rng = random.Random(20240917)
for _ in range(3):
    when, n = _rng.choice(["before", "after"]), _rng.randint(1, 6)
    CASES[f"offload@s3-{when}-call-{n}"] = Case("offload", f"s3:{when}:*:{n}", scene_offload, after=all_offloaded)


@pytest.mark.parametrize("name", list(CASES))
def test_kill9_then_rerun_and_gc_converge(name, deps, db, worker_env):
    case = CASES[name]
    worker = start_worker(case.op, dict(worker_env, FAULT_GC_BATCH=str(case.gc_batch),
                                        FAULT_BATCH_BYTES=str(case.batch_bytes)), ["k"], case.point)
    try:
        scene = case.scene(deps)
    except BaseException:
        worker.kill()
        raise
    kill_at_point(worker, db)
    case.left(deps)

    settle(db)  # the dead attempt is now older than the offload timeout: the rerun takes it over
    run_op(deps, case.op, list(scene.expected), gc_batch=case.gc_batch)
    case.after(deps)
    gc_all(deps)
    figures = check_invariants(deps, db, scene.expected, scene.trimmed)
    assert figures["leaked"] == 0 and figures["uploads"] == 0


@pytest.mark.parametrize("point,scene", [("step:part", scene_offload_multipart),
                                         ("meta-after:begin_offload_batch", scene_offload)])
def test_a_killed_workers_attempt_is_taken_over_without_waiting_for_the_timeout(point, scene, deps, db, worker_env):
    """The worker dies mid-attempt (as an executor lost with its node); with an offload
    timeout of an hour, the next run plans its ledger at once (its attempt lock died with it) and offloads it."""
    from dataclasses import replace
    from datetime import timedelta

    worker = start_worker("offload", worker_env, ["k"], point, FAULT_OFFLOAD_TIMEOUT="3600")
    try:
        scene = scene(deps)
    except BaseException:
        worker.kill()
        raise
    kill_at_point(worker, db)
    assert S.OFFLOADING in {led.state for led in deps.meta.list_ledgers("k")}
    hour = replace(deps, knobs=replace(deps.knobs, offload_timeout=timedelta(hours=1),
                                       gc_delay=timedelta(minutes=10)))
    report = run_op(hour, "offload", ["k"])
    assert report["failed"] == {} and report["skipped"] == []
    all_offloaded(deps)
    # The dead attempt can never commit now: its objects (its index object lands beside the parts, so it may
    # be complete) are due once the GC delay has passed (a request it sent may still land), not after the
    # rest of its hour
    with db.connect() as conn:
        dead = conn.execute(text("SELECT key, not_before - now() FROM tiering.gc_task WHERE state = 'PENDING' "
                                 "AND not_before > now()")).all()
    assert dead and all(key.startswith(f"{deps.bucket.prefix}k/") and wait <= timedelta(minutes=10)
                        for key, wait in dead), dead
    with db.begin() as conn:  # the delay passes here
        conn.execute(text("UPDATE tiering.gc_task SET not_before = now() WHERE state = 'PENDING'"))
    gc_all(deps)
    figures = check_invariants(deps, db, scene.expected)
    assert figures["leaked"] == 0 and figures["uploads"] == 0
