"""Spark job: recover the metadata of a lost database from the bucket and tier 1, at bucket scale.

The driver lists the prefix's topic segments only (S3 `Delimiter`: one LIST per 1,000 topics, whatever the
number of objects) and the tier-1 root's topic directories; each topic is one item. An executor lists its
topic's objects, reads the index objects with a pool of threads, reads the topic's tier-1 files, and
commits the topic in one transaction: the code `tiering recover-from-bucket` runs in one process
(`tiering.ops.recover.recover_topic`). With `--dry-run` each topic's transaction is rolled back instead and
open tier-1 files are not sealed: the job_run row's counts are what a run would do now. An item that fails
(an S3 error, a file a writer holds) is retried, then counted failed with its reason; nothing of that topic
is committed, and a rerun finishes it (recovery is idempotent).

Tier 1 is read on the executors: adopting a ledger file needs the file (sealing an open one takes its
lock), so the driver ships its root's marker token and an executor that does not see the same root fails
its items with the marker's message instead of silently recovering without tier 1 (tiering.tier1.marker).
A topic directory whose name cannot be decoded (a long topic's cut name) is reported unless a recovered
topic turns out to own it.
"""
from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

from tiering.config import Settings
from tiering.errors import TieringError
from tiering.format.keys import encode_topic, parse_key
from tiering.jobs.runner import driver_job, executor_partition, fan_out, retried, spark_context, topic_arg
from tiering.jobs.spec import int_arg, run_job_name
from tiering.metadata import gc_sweep
from tiering.metadata.job_runs import JobOutcome
from tiering.metadata.recovery import topic_names
from tiering.model import TopicPolicy, preview_marks
from tiering.ops.recover import (RecoverReport, list_segment, recover_topic, recovery_guard, tier1_only_items,
                                 unnamed_dirs_error)
from tiering.ops.recover_tier1 import topic_dirs
from tiering.tier1 import topic_dir_name
from tiering.tier1.marker import root_token
from tiering.tier2.listing import topic_segments

SHOWN = 20  # reasons kept per kind in the job_run row (the counts are exact)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-recover")
    topic_arg(p)
    p.add_argument("--check-pages", action="store_true", help="download every data object and check its pages")
    p.add_argument("--dry-run", action="store_true",
                   help="what a run would do now: each topic's decisions made and rolled back, nothing sealed")
    p.add_argument("--concurrency", type=int_arg("--concurrency", 1, 256), default=16,
                   help="index objects an executor reads at once")
    return p


def _plan(deps, args) -> tuple[list[dict], list[str]]:
    """(items, tier-1 directories no item is known to cover: reported unless an executor names their topic)."""
    if args.topic:
        return [{"segment": encode_topic(args.topic), "topic": args.topic}], []
    items, seen = [], set()
    known = topic_names(deps.meta.engine)
    by_segment = {encode_topic(n): n for n in known}
    for segment in topic_segments(deps.bucket):
        items.append({"segment": segment})
        parsed = parse_key(deps.bucket.prefix, f"{deps.bucket.prefix}{segment}/x-ledger-0")
        # not hashed, or a topic metadata knows: its name is known now, and its directory is this item's
        name = parsed.topic if parsed is not None and parsed.topic is not None else by_segment.get(segment)
        if name is not None:
            seen.add(topic_dir_name(name))
    unnamed = RecoverReport()
    segments = {item["segment"] for item in items}
    # a long topic the bucket holds, named by its directory's name file: its bucket item covers its tier 1
    items += [item for item in tier1_only_items(topic_dirs(deps.tier1), seen, unnamed, known=known, tier1=deps.tier1)
              if item["segment"] not in segments]
    return items, unnamed.unnamed_tier1_dirs


def plan(deps, args) -> list[dict]:
    return _plan(deps, args)[0]


def _one(deps, item: dict, reads, check_pages: bool, dry_run: bool) -> RecoverReport:
    """One topic, retried while it reports errors (S3 or tier-1 failures, none of it committed)."""
    return retried(lambda: _attempt(deps, item, reads, check_pages, dry_run), lambda report: bool(report.errors))


def _attempt(deps, item: dict, reads, check_pages: bool, dry_run: bool) -> RecoverReport:
    try:
        # guarded on its own: the driver's guard against GC goes with the driver, and this may outlive it;
        # a dry run writes nothing, so it keeps GC out of nothing (as `recover-from-bucket --dry-run`)
        guard = nullcontext() if dry_run else gc_sweep.recovering(deps.meta.engine, deps.bucket.name,
                                                                  deps.bucket.prefix)
        with guard:
            listed, n, foreign = list_segment(deps.bucket, item["segment"])
            report = recover_topic(deps.meta.engine, deps.bucket, listed, TopicPolicy(), reads, check_pages,
                                   deps.tier1, item.get("topic"), dry_run)
        report.objects_listed, report.foreign_objects = n, foreign
        return report
    except TieringError as exc:
        return RecoverReport(errors=[f"topic segment {item['segment']!r}: {exc}"])
    except Exception as exc:  # noqa: BLE001 - e.g. the database went away: counted, reported, retried
        return RecoverReport(errors=[f"topic segment {item['segment']!r}: {type(exc).__name__}: {exc}"])


def _summary(report: RecoverReport, done: int, failed: int) -> dict:
    """What an executor sends back: exact counts, the topic names, and the first reasons of each kind."""
    return {"done": done, "failed": failed, "topics": report.topics, "errors": report.errors[:SHOWN],
            "counts": {k: len(getattr(report, k)) for k in (
                "topics_created", "ledgers_recovered", "already_known", "ignored", "tier1_adopted",
                "tier1_sealed", "tier1_copies_recorded", "tier1_ignored", "lost_recorded", "chunks_moved")}
            | {"objects_listed": report.objects_listed, "without_page_index": report.without_page_index},
            "ignored": [f"{k}: {why}" for k, why in report.ignored[:SHOWN]],
            "tier1_ignored": [f"{k}: {why}" for k, why in report.tier1_ignored[:SHOWN]],
            "unknown": {t: [list(r) for r in rs] for t, rs in list(report.unknown.items())[:SHOWN]}}


def _partition(settings: Settings, items, token: str | None, check_pages: bool, concurrency: int,
               dry_run: bool):
    """Runs on an executor: its topics one after the other, each topic's index objects read concurrently."""
    def run_items(deps, items) -> dict:
        total, done, failed = RecoverReport(), 0, 0
        with ThreadPoolExecutor(concurrency, thread_name_prefix="recover-read") as reads:
            for item in items:
                report = _one(deps, item, reads, check_pages, dry_run)
                done, failed = done + (not report.errors), failed + bool(report.errors)
                total.merge(report)
        return _summary(total, done, failed)

    def refused(items: list, exc: TieringError) -> dict:
        return _summary(RecoverReport(errors=[f"{len(items)} topic(s) not recovered: {exc}"]), 0, len(items))

    return executor_partition(settings, token, items, run_items, refused)


def _add(details: dict, part: dict) -> None:
    for k, n in part["counts"].items():
        details[k] = details.get(k, 0) + n
    for k in ("ignored", "tier1_ignored"):
        details[k + "_first"] = (details.get(k + "_first", []) + part[k])[:SHOWN]
    details["unknown"] = dict(list({**details.get("unknown", {}), **part["unknown"]}.items())[:SHOWN])


def _run(deps, args, settings: Settings, outcome: JobOutcome) -> None:
    """Plan on the driver, recover the topics on executors (the driver holds the sweep's lock meanwhile)."""
    items, unnamed = _plan(deps, args)
    outcome.details["planned"] = len(items)
    names: list[str] = []
    if items:
        sc = spark_context("tiering-recover", outcome)
        token = root_token(settings.tier1_root)
        check, conc, dry = args.check_pages, args.concurrency, args.dry_run
        for p in fan_out(sc, items, lambda it: _partition(settings, it, token, check, conc, dry), outcome):
            outcome.add(JobOutcome(p["done"], p["failed"], 0, p["errors"]))
            _add(outcome.details, p)
            names += p["topics"]
    covered = {topic_dir_name(n) for n in names}
    left = [d for d in unnamed if d not in covered]
    outcome.details["unnamed_tier1_dirs"] = left[:SHOWN]
    if left and not args.dry_run:  # their ledgers are not in metadata: the run did not finish
        outcome.add(JobOutcome(items_failed=len(left), errors=[unnamed_dirs_error(left)]))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)

    def body_of(settings, deps):
        def body(outcome: JobOutcome, _run_id: int) -> None:
            with recovery_guard(deps.meta.engine, deps.bucket, args.dry_run):
                _run(deps, args, settings, outcome)
        return body

    details = {"pages_checked": args.check_pages, **preview_marks(args.dry_run)}
    return driver_job(run_job_name("recover", args.dry_run), args.topic, body_of, JobOutcome(details=details))


if __name__ == "__main__":
    sys.exit(main())
