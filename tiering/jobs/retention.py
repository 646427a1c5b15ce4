"""Spark job: retention by time and size, bounded by subscriptions, one topic per item (a topic's truncation
is one transaction)."""
from __future__ import annotations

import argparse
import logging
import sys

from tiering.errors import LedgerStorageError
from tiering.jobs.runner import run, topic_arg
from tiering.ops.retention import apply_retention, describe_plan, dry_run, plan_retention

log = logging.getLogger(__name__)


def plan(deps, args) -> list[dict]:
    """The topics with work; logs what a run would delete now and what subscriptions hold back (the retention
    DAG's plan task shows it in the run's log, as `tiering retention --dry-run` does)."""
    items = [{"topic": name} for name in plan_retention(deps, args.topic)]
    for item in dry_run(deps, args.topic):
        log.info("retention plan: %s", describe_plan(item))
    return items


def work(deps, item) -> tuple[int, bool]:
    # decided again under the topic's locks: the freshest view wins (the marker and leftover copies too)
    report = apply_retention(deps, item["topic"])
    if report.failed:  # the item fails (its deletion is committed; the next run finishes the marker and copies)
        _, ledger_id, error = report.failed[0]
        what = f"ledger {ledger_id}'s tier-1 copy" if ledger_id is not None else "the trim marker"
        raise LedgerStorageError(f"topic {item['topic']!r}: {len(report.deleted)} ledger(s) deleted, then "
                                 f"{len(report.failed)} step(s) not done; first, {what}: {error}")
    return report.bytes, not report.deleted and not report.files_removed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-retention")
    topic_arg(p)
    return p


def main(argv=None) -> int:
    return run("retention", argv, build_parser(), plan, work)


if __name__ == "__main__":
    sys.exit(main())
