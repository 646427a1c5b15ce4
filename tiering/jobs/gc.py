"""Spark job: garbage collection. Executors drain the queue in parallel (row locks with SKIP LOCKED keep
them apart); the driver then sweeps orphans and aborts stale multipart uploads."""
from __future__ import annotations

import argparse
import sys

from tiering.jobs.runner import run
from tiering.jobs.spec import int_arg
from tiering.ops.gc import run_gc


def plan(deps, args) -> list[dict]:
    return [{"worker": i} for i in range(args.workers)]


def work(deps, item) -> tuple[int, bool]:
    report = run_gc(deps, sweep=False)
    return len(report.deleted), not report.deleted


def finish(deps, args, outcome) -> None:
    report = run_gc(deps, sweep=True)
    outcome.details.update(orphans_deleted=len(report.orphans_deleted), uploads_aborted=report.uploads_aborted,
                           gc_failed=report.failed)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tiering-gc")
    p.add_argument("--workers", type=int_arg("--workers", 1, 64), default=2)
    p.add_argument("--topic", help="accepted for symmetry; GC works on the whole bucket prefix")
    return run("gc", argv, p, plan, work, finish, tier1=False)


if __name__ == "__main__":
    sys.exit(main())
