"""Spark job: the hourly garbage collection. Executors drain the queue's due rows in parallel (row locks
with SKIP LOCKED keep them apart); the driver then takes what is left and aborts stale multipart uploads.
No listing of the bucket: the orphan sweep is its own job (jobs/gc_sweep.py, DAG tiering_gc_sweep).

`plan` is cheap and complete (one count on the queue's partial index, a listing of multipart uploads), so
the DAG's plan task skips Spark when nothing is due (JobSpec.planned_before_spark). `--retry-failed` (the
DAG's `retry_failed` Param, `tiering gc --retry-failed` by hand): the FAILED rows count in the plan, and the
driver makes them due again once, before the workers drain the queue."""
from __future__ import annotations

import argparse
import sys

from tiering.jobs.runner import ItemFailed, run
from tiering.jobs.spec import int_arg
from tiering.metadata import gc_sweep
from tiering.ops.gc import plan_gc, requeue_failed, run_gc

BATCH = 500  # queue rows one worker claims at a time


def plan(deps, args) -> list[dict]:
    due, stale = plan_gc(deps, retry_failed=args.retry_failed)
    if due:
        return [{"worker": i} for i in range(min(args.workers, -(-due // BATCH)))]
    return [{"worker": 0}] if stale else []  # the driver's finish aborts them; one item starts the run


def _undeleted(report) -> str | None:
    """The sentence of a run that left queued objects in the bucket (S3 refused their delete: each row is
    retried later, or FAILED after its last attempt), as `tiering gc` says it before it exits 1."""
    if not (report.retried or report.failed):
        return None
    return (f"deleted {len(report.deleted)} queued object(s), {report.retried + report.failed} could not be "
            f"deleted from S3 ({report.failed} marked FAILED after their last attempt); first: "
            f"{report.failed_keys[0]['key'] if report.failed_keys else '?'}")


def work(deps, item) -> tuple[int, bool]:
    report = run_gc(deps, batch=BATCH, uploads=False)
    if why := _undeleted(report):
        raise ItemFailed(why)  # the rows are retried on their own schedule, not by another attempt now
    return len(report.deleted), not report.deleted


def requeue(deps, args, items: list[dict], _parallelism: int) -> list[dict]:
    """On the driver once Spark is up, before the items run: `--retry-failed` makes FAILED rows due again."""
    if args.retry_failed:  # not during a recovery from the bucket (as the CLI's run refuses whole)
        with gc_sweep.collecting(deps.meta.engine, deps.bucket.name, deps.bucket.prefix):
            args.requeued = requeue_failed(deps)
    return items


def finish(deps, args, outcome) -> None:
    report = run_gc(deps, batch=BATCH)
    outcome.details.update(uploads_aborted=report.uploads_aborted, gc_failed=report.failed)
    if (requeued := getattr(args, "requeued", None)) is not None:  # set by `requeue` (--retry-failed)
        outcome.details["requeued"] = requeued
    if why := _undeleted(report):  # an error fails the run (runner.recorded); items are the workers, not objects
        outcome.errors.append(why)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-gc")
    p.add_argument("--workers", type=int_arg("--workers", 1, 64), default=2)
    p.add_argument("--topic", help="accepted for symmetry; GC works on the whole bucket prefix")
    p.add_argument("--retry-failed", action="store_true",
                   help="first make the queue's FAILED rows (5 deletes refused) due again")
    return p


def main(argv=None) -> int:
    return run("gc", argv, build_parser(), plan, work, finish, tier1=False, prepare=requeue)


if __name__ == "__main__":
    sys.exit(main())
