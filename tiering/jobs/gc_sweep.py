"""Spark job: the daily orphan sweep (`tiering gc --sweep`). One cursor, one page after another: the sweep
runs on the driver (no executors, no SparkContext: the runner starts none for an empty plan), a page budget
per run, resuming where the last run stopped (ops/gc.py). A second sweep started while one runs finds it
taken and ends at once, successfully, saying so."""
from __future__ import annotations

import argparse
import sys
from datetime import timedelta

from tiering.jobs.runner import run
from tiering.jobs.spec import duration_arg, int_arg
from tiering.ops.gc import SWEEP_MAX_PAGES, sweep_orphans


def plan(deps, args) -> list[dict]:
    return []  # nothing for executors: the listing is sequential by its cursor


def work(deps, item) -> tuple[int, bool]:
    raise AssertionError("the sweep plans no items")


def finish(deps, args, outcome) -> None:
    grace = None if args.orphan_grace_seconds is None else timedelta(seconds=args.orphan_grace_seconds)
    r = sweep_orphans(deps, orphan_grace=grace, max_pages=args.max_pages)
    outcome.items_done = len(r.orphans_deleted)
    outcome.details.update(taken=r.taken, pages=r.pages, objects_listed=r.objects_listed,
                           orphans_deleted=len(r.orphans_deleted), started_from=r.started_from, cursor=r.cursor,
                           pass_complete=r.pass_complete, passes_completed=r.passes_completed)
    if r.failed:
        outcome.items_failed = len(r.failed)
        outcome.errors.append(f"{len(r.failed)} orphan(s) could not be deleted from S3; first: {r.failed[0]!r}; "
                              f"the next sweep lists that page again")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-gc-sweep")
    p.add_argument("--max-pages", type=int_arg("--max-pages", 1, 10**9), default=SWEEP_MAX_PAGES)
    p.add_argument("--orphan-grace-seconds", type=duration_arg("--orphan-grace-seconds", 0, 10**9), default=None)
    p.add_argument("--topic", help="accepted for symmetry; the sweep works on the whole bucket prefix")
    return p


def main(argv=None) -> int:
    return run("gc_sweep", argv, build_parser(), plan, work, finish, tier1=False)


if __name__ == "__main__":
    sys.exit(main())
