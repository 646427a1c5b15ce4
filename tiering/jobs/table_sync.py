"""Spark job: append every SEALED or OFFLOADED ledger of the topics that have a table to their Iceberg
tables, exactly once (tiering/tables/sync.py). The driver plans each topic's rounds and commits them with
pyiceberg; executors write a round's Parquet data files in parallel, each reading its ledgers with the one
cross-tier read (tier 1 while its copy exists, else tier 2). Spark (on these machines no Iceberg runtime
jars are reachable) never touches the catalog: the commit, and so exactly once, is the driver's.

`plan` is a few metadata queries per topic with a table (a ledger after the table's mark that is no longer
open, or deleted ledgers for retention 'follow' to delete), so the DAG skips Spark when nothing is new; a
topic that needs only its row caught up or ledgers passed over commits without starting Spark either."""
from __future__ import annotations

import argparse
import sys

APP = "tiering-table-sync"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-table-sync")
    p.add_argument("--topic", help="limit the job to one topic (which must have a table)")
    return p


def plan(deps, args) -> list[dict]:
    from tiering.tables.sync import due_topics

    return [{"topic": s.topic} for s in due_topics(deps.meta.engine, args.topic)]


def _write_partition(settings, token, items):
    """Runs on an executor: write each data file; failures are returned, not raised (the driver then commits
    nothing of that round)."""
    from tiering.jobs.runner import executor_partition
    from tiering.tables.files import s3_filesystem_for, write_file
    from tiering.tier2.reader import tier2_opener

    def run_items(deps, items):
        filesystem, opener = s3_filesystem_for(settings), tier2_opener(deps.bucket)
        out = {"results": [], "errors": []}
        for item in items:
            try:
                out["results"].append(write_file(deps, filesystem, item, opener))
            except Exception as exc:  # noqa: BLE001 - reported to the driver, which fails the round
                out["errors"].append(f"{item['path']}: {type(exc).__name__}: {exc}")
        return out

    return executor_partition(settings, token, items, run_items,
                              lambda items, exc: {"results": [], "errors": [f"{len(items)} file(s) not written: {exc}"]})


def spark_writer(settings, outcome):
    """A sync's `write(items)` on Spark executors; Spark starts at the first round that has files."""
    from tiering.errors import TieringError
    from tiering.jobs.runner import fan_out, spark_context
    from tiering.tier1.marker import root_token

    started: dict = {}

    def write(items: list[dict]) -> list[dict]:
        if "sc" not in started:
            started["sc"] = spark_context(APP, outcome)
        token = root_token(settings.tier1_root)
        parts = fan_out(started["sc"], items, lambda part: _write_partition(settings, token, part), outcome)
        errors = [e for p in parts for e in p["errors"]]
        if errors:
            raise TieringError(f"{len(errors)} data file(s) not written: {errors[0]}")
        return [r for p in parts for r in p["results"]]

    return write, started


def main(argv=None) -> int:
    from tiering.jobs.runner import driver_job

    args = build_parser().parse_args(argv)
    return driver_job("table_sync", args.topic, lambda settings, deps: _body(settings, deps, args))


def _body(settings, deps, args):
    from tiering.tables.catalog import catalog
    from tiering.tables.sync import TableSync, outcome_of

    def body(outcome, _run_id: int) -> None:
        items = plan(deps, args)
        outcome.details["planned"] = len(items)
        if not items:
            outcome.details["spark"] = "skipped"
            return
        # each committed round in the driver's log: a backfill's progress
        sync = TableSync(deps.meta.engine, settings, catalog(settings), progress=lambda line: print(line, flush=True))
        write, started = spark_writer(settings, outcome)
        results = [sync.sync_topic(state, write) for state in sync.rows.list(args.topic)
                   if state.topic in {i["topic"] for i in items}]
        outcome_of(results, outcome, settings)
        if "sc" not in started:
            outcome.details["spark"] = "skipped"

    return body


if __name__ == "__main__":
    sys.exit(main())
