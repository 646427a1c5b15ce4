"""Garbage collection of tier 2 (Pravega's GC: queue before commit, delay, retries, a failed state).

The scheduled run (`run_gc`: `tiering gc`, DAG `tiering_gc`, hourly) costs what is due, not what the bucket
holds: one HEAD of the bucket, the due rows of the queue, and a listing of multipart uploads.

1. Due `gc_task` keys, claimed under row locks: a key some chunk still references is dropped from the
   queue (a later removal queues it again); the others are deleted (with any multipart upload under them)
   and dequeued; a failure retries with exponential backoff and becomes FAILED after `max_attempts`.
2. Multipart uploads older than the grace period are aborted: under the prefix, and under the default
   export location beside it (a failed or killed metadata export leaves its Parquet uploads there); not
   those of keys a live defrag or repair attempt queued (gc_queue.live_attempt_keys).

The orphan sweep (`sweep_orphans`: `tiering gc --sweep`, DAG `tiering_gc_sweep`, daily) is an operation of
its own: objects under the prefix that no chunk references and no task holds, older than the grace period
(left by hand, by a tool, or by a run whose queue row was lost with its database). It lists the prefix a
page budget per run (pages of up to 1,000 keys), resuming after a cursor kept in `gc_sweep`
(metadata/gc_sweep.py), and wraps round at the end of the prefix: one pass visits every key. Two sweeps of
the same prefix never run at once (a try-lock; the second reports the sweep taken). So an orphan lives at
most the grace period plus one pass (docs/performance.md: the figures at 1M and 100M objects).
Killed anywhere, a rerun converges: deleting a missing key succeeds, locked rows roll back, and a page whose
cursor move did not commit is listed and decided again.

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

Metadata that is not the store's whole history breaks (W1)-(W3): restored from an older export, or rebuilt
by a recovery of one topic or one killed midway, it lacks rows whose objects are in the bucket, and those are
in no queue. So a ledger object neither referenced nor queued is deleted only when the same snapshot also
knows gone every ledger its index object lists (a batch's or a defrag's object holds several and is named
after the first; one whose index cannot be read is kept, one without any index object holds the ledger its
name gives) (`proven_orphans`): DELETED; OFFLOADED with both objects of its chunk row in the bucket as the row
recorded them (ETags: this one is an older copy); without a row but below its topic's trim marker; or of a
topic without a row, below the marker the bucket holds for that topic's key segment (retention's and topic
deletion's). Anything else, a ledger SEALED or OPEN whose bucket copy a recovery may need included, is kept:
at worst an orphan lives until its ledger is offloaded or trimmed.

The order matters as well: judged on a snapshot taken before the listing, a key queued and written after
the snapshot would look like an orphan. The grace period (default twice the offload timeout) is a margin
for objects outside (W1): written by hand or by other tools. Recovery from the bucket (`recover-from-bucket`)
references objects that are in no queue; do not run GC's sweep while it runs.

Why resuming from a persisted cursor is still safe: the cursor is only where the next LIST starts
(StartAfter), never a decision. Every key the sweep deletes was listed in this run, in this page, and judged
on a snapshot taken after that page's listing: the argument above, page by page. Nothing decided in an
earlier run, or on an earlier page, is reused. A cursor that is stale, restored from a backup, edited by hand
or left by a killed run can only make the sweep list some keys again or skip some until the next pass:
it can delay an orphan's deletion, never delete a kept object. The cursor moves (compare-and-set on its
version) only after its page was decided and its orphans deleted, so a kill in between repeats the page.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable

from tiering.errors import (BadInput, ConditionalUpdateFailed, CorruptObjectError, DataLossError, RecoveryRunning,
                            TieringError)
from tiering.format.keys import INDEX_SUFFIX, is_trim_marker, parse_key
from tiering.format.merged import split_indexes
from tiering.metadata import export_lock, gc_queue, gc_sweep, table_sync
from tiering.metadata.attempt_locks import classes_held
from tiering.model import LedgerState, tables_prefix
from tiering.ops.context import Deps
from tiering.ops.export_metadata import default_export_prefix
from tiering.tier2.markers import read_segment_marker, readable_or_none
from tiering.tier2.objects import (abort_upload, check_bucket, delete_keys, list_page, list_uploads, object_head,
                                   read_object)

PAGE_KEYS = 1000  # S3's largest LIST page
SWEEP_MAX_PAGES = 10_000  # default page budget of one sweep run: 10M keys (docs/performance.md: how long an orphan lives)


@dataclass
class GcReport:
    deleted: list[str] = field(default_factory=list)
    still_referenced: int = 0
    retried: int = 0
    failed: int = 0
    uploads_aborted: int = 0
    failed_keys: list[dict] = field(default_factory=list)  # {"key", "error"}: retried or failed for good
    requeued: int = 0  # FAILED tasks made due again (retry_failed)


@dataclass
class SweepReport:
    taken: bool = False  # another worker holds (or took) the sweep of this prefix: this run stopped
    started_from: str = ""  # the cursor this run resumed after ('' : a pass started)
    pages: int = 0
    objects_listed: int = 0
    orphans_deleted: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # orphans S3 would not delete: the page is listed again
    cursor: str = ""  # where the next run resumes ('' : the next run starts a pass)
    pass_complete: bool = False  # this run reached the end of the prefix
    passes_completed: int = 0
    last_pass_completed_at: datetime | None = None


def grace_of(deps: Deps, orphan_grace: timedelta | None) -> timedelta:
    return orphan_grace if orphan_grace is not None else 2 * deps.knobs.offload_timeout


def run_gc(deps: Deps, batch: int = 500, max_attempts: int = 5, backoff: timedelta = timedelta(minutes=1),
           orphan_grace: timedelta | None = None, uploads: bool = True, retry_failed: bool = False) -> GcReport:
    """The scheduled run: due queue rows, then stale multipart uploads (`uploads`). No listing of objects.
    `retry_failed`: the tasks FAILED after their last attempt are made due again first (by hand, once what
    failed their deletes is mended; nothing else ever takes them up again)."""
    report = GcReport()
    check_bucket(deps.bucket)  # tier 2 down: fail once, without counting a failed attempt on every task
    with gc_sweep.collecting(deps.meta.engine, deps.bucket.name, deps.bucket.prefix):
        if retry_failed:
            report.requeued = requeue_failed(deps)
        while _gc_batch(deps, batch, max_attempts, backoff, report):
            pass
    if uploads:
        for up in stale_uploads(deps, grace_of(deps, orphan_grace)):
            report.uploads_aborted += abort_upload(deps.bucket, up["Key"], up["UploadId"])
    return report


def requeue_failed(deps: Deps) -> int:
    """The queue's FAILED tasks (S3 refused their delete `max_attempts` times) made due again, their attempts
    counted afresh; how many. Nothing else ever takes them up again: by hand (`gc --retry-failed`, the GC
    DAG's `retry_failed`), once what refused the deletes is mended."""
    return gc_queue.requeue_failed(deps.meta.engine)


def plan_gc(deps: Deps, orphan_grace: timedelta | None = None, retry_failed: bool = False) -> tuple[int, int]:
    """(due queue rows, stale multipart uploads): what a run would take now, read cheaply (one count on the
    queue's partial index, one listing of uploads per location), whatever the bucket holds. `retry_failed`:
    the FAILED rows count as due (the run makes them due first); nothing is written here."""
    failed = gc_queue.failed_count(deps.meta.engine) if retry_failed else 0
    return gc_queue.due_count(deps.meta.engine) + failed, len(stale_uploads(deps, grace_of(deps, orphan_grace)))


def preview_gc(deps: Deps, orphan_grace: timedelta | None = None, retry_failed: bool = False) -> GcReport:
    """What `run_gc` would do now (`gc --dry-run`): the due keys it would delete and those it would drop as
    still referenced (read without claiming them), and the stale uploads it would abort; nothing written."""
    report = GcReport()
    check_bucket(deps.bucket)
    if gc_sweep.collecting_refused(deps.meta.engine, deps.bucket.name, deps.bucket.prefix):
        raise RecoveryRunning(f"a GC run now would do nothing: recovery from the bucket {deps.bucket.name}/"
                              f"{deps.bucket.prefix} is running")
    tasks, refs = gc_queue.due_tasks(deps.meta.engine, failed=retry_failed)
    report.requeued = gc_queue.failed_count(deps.meta.engine) if retry_failed else 0
    report.deleted = sorted({t.key for t in tasks if t.key not in refs})
    report.still_referenced = sum(1 for t in tasks if t.key in refs)
    report.uploads_aborted = len(stale_uploads(deps, grace_of(deps, orphan_grace)))
    return report


def preview_sweep(deps: Deps, orphan_grace: timedelta | None = None, max_pages: int = SWEEP_MAX_PAGES,
                  page_keys: int = PAGE_KEYS) -> SweepReport:
    """What `sweep_orphans` would do now (`gc --sweep --dry-run`): the same pages from the persisted cursor,
    each judged on one snapshot taken after its listing; the orphans it would delete in `orphans_deleted`
    and where its cursor would end. Nothing is deleted, the cursor does not move, no lock is taken."""
    if max_pages < 1 or not 1 <= page_keys <= PAGE_KEYS:
        raise BadInput("a sweep takes at least one page of 1 to 1,000 keys")
    grace = grace_of(deps, orphan_grace)
    b, engine = deps.bucket, deps.meta.engine
    state = gc_sweep.peek(engine, b.name, b.prefix)
    report = SweepReport(started_from=state.cursor, cursor=state.cursor, passes_completed=state.passes_completed,
                         last_pass_completed_at=state.last_pass_completed_at)
    cursor = state.cursor
    while report.pages < max_pages and not report.pass_complete:
        cutoff = datetime.now(timezone.utc) - grace
        page = list_page(b, cursor, page_keys)
        report.pages += 1
        report.objects_listed += len(page.objects)
        old = [o["Key"] for o in page.objects if not is_trim_marker(b.prefix, o["Key"]) and o["LastModified"] <= cutoff]
        orphans, unknown = proven_orphans(deps, old)
        if unknown and not gc_sweep.references_any(engine):
            _refuse_if_metadata_empty(engine, b)
        report.orphans_deleted += orphans
        cursor = "" if not page.truncated else (page.last_key or "")
        report.cursor, report.pass_complete = cursor, not page.truncated
    return report


def _gc_batch(deps: Deps, batch: int, max_attempts: int, backoff: timedelta, report: GcReport) -> bool:
    with gc_queue.claimed(deps.meta.engine, batch) as claim:
        tasks = claim.tasks
        if not tasks:
            return False
        refs = claim.referenced()
        live = [t for t in tasks if t.key in refs]
        todo = [t for t in tasks if t.key not in refs]
        # a delete S3 never answered counts no attempt: the claim rolls back and the run fails (five flaky
        # runs would otherwise leave keys FAILED, which nothing but `gc --retry-failed` takes up again)
        failed = set(delete_keys(deps.bucket, {t.key for t in todo}, unanswered_raises=True))
        claim.finish([t.task_id for t in live] + [t.task_id for t in todo if t.key not in failed])
        report.failed += claim.retry([t for t in todo if t.key in failed], "S3 delete failed", max_attempts, backoff)
        report.still_referenced += len(live)
        report.deleted += sorted({t.key for t in todo if t.key not in failed})
        report.retried += sum(1 for t in todo if t.key in failed)
        report.failed_keys += [{"key": k, "error": "S3 delete failed"} for k in sorted(failed)]
    return len(tasks) == batch  # a full batch: there may be more


def stale_uploads(deps: Deps, grace: timedelta) -> list[dict]:
    """Multipart uploads older than the grace that no live attempt owns: killed offloads, defrags and repairs
    under the tier-2 prefix, killed exports under the default export prefix, killed table syncs and
    maintenance under the tables' warehouse (pyarrow's S3 writer uploads a table's files in parts); nothing
    else lists them, and S3 keeps and bills their parts until they are aborted."""
    cutoff = datetime.now(timezone.utc) - grace
    b = deps.bucket
    prefixes = [b.prefix] if not b.prefix else [b.prefix, default_export_prefix(b.prefix),
                                                tables_prefix(b.prefix)]  # "" lists all
    stale = [up for p in prefixes for up in list_uploads(b, p) if up["Initiated"] <= cutoff]
    if not stale:
        return []
    live = gc_queue.live_attempt_keys(deps.meta.engine, (up["Key"] for up in stale),
                                      offload_attempts(b.prefix, (up["Key"] for up in stale)))
    # An export's or a table writer's uploads carry no attempt: while any export (its lock on its location)
    # or any table sync or maintenance runs, those under its prefix wait for a later run
    writers = {export_lock.LOCK_CLASS: default_export_prefix(b.prefix), table_sync.LOCK_CLASS: tables_prefix(b.prefix)}
    busy = tuple(writers[c] for c in classes_held(deps.meta.engine, writers)) if b.prefix else ()
    return [up for up in stale if up["Key"] not in live and not up["Key"].startswith(busy)]


def offload_attempts(prefix: str, keys: Iterable[str]) -> dict[str, str]:
    """{key: the attempt uuid its name carries} for the keys named as an offload names its objects (a data
    key; the index object is a single PUT): the attempt whose lock tells whether the upload is live."""
    found = {}
    for key in keys:
        parsed = parse_key(prefix, key)
        if parsed is not None and not parsed.is_index:
            try:
                found[key] = str(uuid.UUID(parsed.uuid))
            except ValueError:  # not a uuid: no attempt of ours named it
                continue
    return found


def sweep_orphans(deps: Deps, orphan_grace: timedelta | None = None, max_pages: int = SWEEP_MAX_PAGES,
                  page_keys: int = PAGE_KEYS) -> SweepReport:
    """Up to `max_pages` pages of the prefix after the persisted cursor, each listed, then decided on one
    snapshot, its orphans deleted, then the cursor moved past it (module docstring). Stops at the end of
    the prefix (a pass completed), at the budget, or at a page whose orphans S3 would not delete."""
    if max_pages < 1 or not 1 <= page_keys <= PAGE_KEYS:
        raise BadInput("a sweep takes at least one page of 1 to 1,000 keys")
    grace = grace_of(deps, orphan_grace)
    b, engine = deps.bucket, deps.meta.engine
    report = SweepReport()
    with gc_sweep.exclusive(engine, b.name, b.prefix) as held:
        if not held:
            if gc_sweep.recovery_running(engine, b.name, b.prefix):
                # not another sweep's work: this run's work is not done, so it is not a success
                raise TieringError(f"the orphan sweep of {b.name}/{b.prefix} did not run: recovery from the "
                                   "bucket is running; the next run sweeps")
            report.taken = True
            return report
        state = gc_sweep.load(engine, b.name, b.prefix)
        report.started_from = report.cursor = state.cursor
        report.passes_completed, report.last_pass_completed_at = state.passes_completed, state.last_pass_completed_at
        refs_checked = False
        while report.pages < max_pages and not report.pass_complete:
            cutoff = datetime.now(timezone.utc) - grace
            page = list_page(b, state.cursor, page_keys)  # the listing first ...
            report.pages += 1
            report.objects_listed += len(page.objects)
            old = [o["Key"] for o in page.objects
                   if not is_trim_marker(b.prefix, o["Key"]) and o["LastModified"] <= cutoff]
            orphans, unknown = proven_orphans(deps, old)  # ... then decided on one snapshot taken after it
            if not refs_checked and unknown:
                _refuse_if_metadata_empty(engine, b)
                refs_checked = True
            failed = set(delete_keys(b, orphans))
            report.orphans_deleted += [k for k in orphans if k not in failed]
            if failed:  # the cursor stays before this page: the next run lists and decides it again
                report.failed += sorted(failed)
                break
            try:
                state = gc_sweep.advance(engine, state, page.last_key or "", not page.truncated,
                                         len(orphans))
            except ConditionalUpdateFailed:
                report.taken = True  # the cursor moved under us: another worker has the sweep now
                break
            report.cursor, report.pass_complete = state.cursor, not page.truncated
            report.passes_completed, report.last_pass_completed_at = state.passes_completed, state.last_pass_completed_at
    return report


def proven_orphans(deps: Deps, keys: list[str]) -> tuple[list[str], bool]:
    """The listed keys that one snapshot taken after the listing proves unreferenced (module docstring): neither
    referenced nor queued, and, for a ledger object, every ledger its index object lists (a batch's or a defrag's
    object holds several, and is named after the first) known to metadata as gone. Metadata that does not say so
    (a topic or ledger it lacks: restored from an older export, a recovery partly done or killed; a ledger
    SEALED, OPEN or OFFLOADING, whose copy in the bucket may be the one a recovery brings back) is no proof, and
    the object is kept; so is one whose index object cannot be read. Gone: the ledger is DELETED; or OFFLOADED
    and both objects its chunk row names are in the bucket with the ETags the row recorded (then this one is an
    older copy); or it has no row and lies below its topic's trim marker; or its topic has no row and the
    bucket's marker for the topic's segment (written by retention and by topic deletion) lies above it. Also
    whether any ledger object was neither referenced nor queued (with no chunk row at all, the sign of a lost
    database)."""
    b = deps.bucket
    parsed = {k: p for k in keys if (p := parse_key(b.prefix, k)) is not None}
    # which ledgers the candidates hold, from their index objects (read between the listing and the snapshot
    # that decides: an object's bytes never change under its key)
    kept = gc_queue.kept_in_one_snapshot(deps.meta.engine, keys)
    indexes: dict[str, list[int] | None] = {}  # a pair's data and index keys share one index object: read once
    held = {k: _held_ledgers(b, k, p, indexes) for k, p in parsed.items() if k not in kept}
    # data objects without any index object: no reader and no recovery can use them (see _held_ledgers)
    unusable = {k for k, p in parsed.items() if indexes.get(_key_index(k, p)) == []}
    view = gc_sweep.sweep_view(deps.meta.engine, keys, parsed, {k: ids for k, ids in held.items() if ids})
    markers: dict[str, int] = {}

    def gone(segment: str, ledger_id: int, usable: bool = True) -> bool:
        at = (segment, ledger_id)
        state = view.states.get(at)
        if segment not in view.trim_marks:
            if segment not in markers:
                markers[segment] = readable_or_none(read_segment_marker, b, segment)
            return ledger_id < markers[segment]
        if state is None:
            return ledger_id < view.trim_marks[segment]
        if state == LedgerState.DELETED.value:
            return True
        if state == LedgerState.OFFLOADED.value and at in view.chunks and not usable:
            return True  # offloaded elsewhere, and this copy could never stand in for that one
        if state == LedgerState.OFFLOADED.value and at in view.chunks:
            # An older copy is redundant only beside a current one known sound: the objects its row recorded
            # when written or checked (ETags). A row without ETags (a recovery that did not check pages) or
            # whose objects were replaced since may name a corrupt copy, and this one may be the good one.
            return all(etag is not None and (head := object_head(b, key)) is not None and head[1] == etag
                       for key, etag in view.chunks[at])
        return False

    out, unknown = [], False
    for k in keys:
        if k in view.kept:
            continue
        p = parsed.get(k)
        if p is None:  # not a ledger object: nothing in metadata could reference it
            out.append(k)
            continue
        unknown = True
        ids = held.get(k)
        if ids and all(gone(p.segment, lid, k not in unusable) for lid in ids):
            out.append(k)
    return out, unknown


def _held_ledgers(b, key: str, p, indexes: dict[str, list[int] | None]) -> list[int] | None:
    """The ledger ids the object's index object lists (its own bytes for an index key), the one its name gives
    when there is no index object, or None when it cannot be read whole (then nothing proves what the object
    holds); `indexes` keeps those read."""
    index = _key_index(key, p)
    if index not in indexes:
        indexes[index] = _index_ledgers(b, index)
    held = indexes[index]
    # No index object at all (an offload killed before writing it, in metadata lost since): the object
    # serves no reader and no recovery, so it holds nothing more than the ledger its name gives, and goes
    # once that one is known gone or offloaded elsewhere (else kept, as any object of a ledger not
    # offloaded yet).
    return [p.ledger_id] if held == [] else held


def _key_index(key: str, p) -> str:
    """The index object of a ledger object's pair (an index key's own)."""
    return key if p.is_index else key + INDEX_SUFFIX


def _index_ledgers(b, index: str) -> list[int] | None:
    """The ledger ids an index object lists; [] when it does not exist; None when it cannot be read whole."""
    try:
        data = read_object(b, index)
        if data is None:
            return []
        return [ix.metadata.ledger_id for _, _, ix in split_indexes(data, index)]
    except (CorruptObjectError, DataLossError):
        return None


def _refuse_if_metadata_empty(engine, b) -> None:
    """Ledger objects in a bucket whose database has no chunk row are what a lost database looks like
    (restored empty, before `recover-from-bucket`). The sweep would keep them (metadata does not know them
    gone), but a run that says nothing there hides the loss: it refuses, naming the remedy."""
    if not gc_sweep.references_any(engine):
        raise TieringError(f"refused: no chunk row references any object, yet {b.name}/{b.prefix} holds "
                           "ledger objects; if the metadata was lost, run `tiering recover-from-bucket` first "
                           "(the sweep would delete them all)")
