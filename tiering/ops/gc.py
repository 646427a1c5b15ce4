"""Garbage collection of tier 2 (Pravega's GC: queue before commit, delay, retries, a failed state).

1. Due `gc_task` keys, claimed under row locks: a key some chunk still references is dropped from the
   queue (a later removal queues it again); the others are deleted (with any multipart upload under them)
   and dequeued; a failure retries with exponential backoff and becomes FAILED after `max_attempts`.
2. Orphan sweep: objects under the prefix that no chunk references and no task holds, older than the
   grace period (left by hand, by a tool, or by a run whose queue row was lost with its database).
3. Multipart uploads older than the grace period are aborted: under the prefix, and under the default
   export location beside it (a failed or killed metadata export leaves its Parquet uploads there).
Killed anywhere, a rerun converges: deleting a missing key succeeds, and locked rows roll back.

Why the orphan sweep never deletes an object a chunk references
---------------------------------------------------------------
What every writer of the prefix guarantees (offload, defrag; retention's trim markers are skipped):

  (W1) a key is queued in `gc_task` by a committed transaction before its object is written;
  (W2) a key leaves the queue only in the transaction that makes a chunk row reference it (offload's and
       defrag's commits), or after its object was deleted (step 1, an attempt that removed its own objects);
  (W3) a chunk row stops referencing a key only in a transaction that queues the key again (retention,
       defrag's merged-away keys).

Keys carry a fresh UUID, so an object once deleted is never written again under the same key.

The sweep lists a page of keys first, and only then decides about them on ONE snapshot
(`gc_queue.kept_in_one_snapshot`: a single statement in a REPEATABLE READ transaction). Take a key K
listed at time L and judged on a snapshot S taken after L. K's object existed at L, so by (W1) K's first
queueing committed before L, hence before S. From then on, by (W2) and (W3), every committed state has K
queued, or referenced, or its object already deleted: each transaction that takes K out of one place puts
it into the other, and S sees that transaction whole or not at all. So if S shows K neither queued nor
referenced, its object was deleted before S and deleting it again changes nothing; any object a chunk
references in S, or will reference later (only through the queue, W2), is kept. Two READ COMMITTED
statements ("referenced?" then "queued?") break exactly this: a commit landing between them moves K from
the queue to a chunk row behind the sweep's back, and K looks like neither.

The order matters as well: judged on a snapshot taken before the listing, a key queued and written after
the snapshot would look like an orphan. The grace period (default twice the offload timeout) is a margin
for objects outside (W1): written by hand or by other tools. Recovery from the bucket (`recover-from-bucket`)
references objects that are in no queue; do not run GC's sweep while it runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from tiering.format.keys import is_trim_marker
from tiering.metadata import gc_queue
from tiering.ops.context import Deps
from tiering.ops.export_metadata import default_export_prefix
from tiering.tier2.objects import abort_upload, check_bucket, delete_keys, list_objects, list_uploads


@dataclass
class GcReport:
    deleted: list[str] = field(default_factory=list)
    still_referenced: int = 0
    retried: int = 0
    failed: int = 0
    orphans_deleted: list[str] = field(default_factory=list)
    uploads_aborted: int = 0


def run_gc(deps: Deps, batch: int = 500, max_attempts: int = 5, backoff: timedelta = timedelta(minutes=1),
           orphan_grace: timedelta | None = None, sweep: bool = True) -> GcReport:
    report = GcReport()
    check_bucket(deps.bucket)  # tier 2 down: fail once, without counting a failed attempt on every task
    while _gc_batch(deps, batch, max_attempts, backoff, report):
        pass
    if sweep:
        grace = orphan_grace if orphan_grace is not None else 2 * deps.knobs.offload_timeout
        _sweep_orphans(deps, grace, report)
        _abort_stale_uploads(deps, grace, report)
    return report


def _gc_batch(deps: Deps, batch: int, max_attempts: int, backoff: timedelta, report: GcReport) -> bool:
    with gc_queue.claimed(deps.meta.engine, batch) as claim:
        tasks = claim.tasks
        if not tasks:
            return False
        refs = claim.referenced()
        live = [t for t in tasks if t.key in refs]
        todo = [t for t in tasks if t.key not in refs]
        failed = set(delete_keys(deps.bucket, {t.key for t in todo}))
        claim.finish([t.task_id for t in live] + [t.task_id for t in todo if t.key not in failed])
        report.failed += claim.retry([t for t in todo if t.key in failed], "S3 delete failed", max_attempts, backoff)
        report.still_referenced += len(live)
        report.deleted += sorted({t.key for t in todo if t.key not in failed})
        report.retried += sum(1 for t in todo if t.key in failed)
    return len(tasks) == batch  # a full batch: there may be more


def _sweep_orphans(deps: Deps, grace: timedelta, report: GcReport) -> None:
    cutoff = datetime.now(timezone.utc) - grace
    page: list[str] = []
    for obj in list_objects(deps.bucket):
        if is_trim_marker(deps.bucket.prefix, obj["Key"]):
            continue  # retention's marker is metadata, not garbage
        if obj["LastModified"] <= cutoff:
            page.append(obj["Key"])
        if len(page) >= 1000:
            _delete_orphans(deps, page, report)
            page = []
    _delete_orphans(deps, page, report)


def _delete_orphans(deps: Deps, keys: list[str], report: GcReport) -> None:
    """`keys` were listed before this call: judged on one snapshot taken now (see the module docstring)."""
    if not keys:
        return
    keep = gc_queue.kept_in_one_snapshot(deps.meta.engine, keys)
    orphans = [k for k in keys if k not in keep]
    failed = set(delete_keys(deps.bucket, orphans))
    report.orphans_deleted += [k for k in orphans if k not in failed]


def _abort_stale_uploads(deps: Deps, grace: timedelta, report: GcReport) -> None:
    cutoff = datetime.now(timezone.utc) - grace
    b = deps.bucket
    prefixes = [b.prefix] if not b.prefix else [b.prefix, default_export_prefix(b.prefix)]  # "" lists all
    stale = [up for p in prefixes for up in list_uploads(b, p) if up["Initiated"] <= cutoff]
    for up in stale:
        abort_upload(b, up["Key"], up["UploadId"])
        report.uploads_aborted += 1
