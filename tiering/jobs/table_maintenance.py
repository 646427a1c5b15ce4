"""The job of the DAG tiering_table_maintenance: for every topic with a table, compact each partition's
small data files, expire snapshots older than 7 days (`--expire-after-seconds`) and delete unreferenced
files older than a day (`--orphan-grace-seconds`). The work is pyiceberg's, on the driver: Spark is never started (details say so);
it runs as a Spark application to share the DAG frame, its job_run row and its settings path."""
from __future__ import annotations

import argparse
import sys
from datetime import timedelta

from tiering.jobs.spec import int_arg
from tiering.model import MAX_SECONDS

DEFAULT_EXPIRE_SECONDS = 7 * 86400


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-table-maintenance")
    p.add_argument("--topic", help="limit the job to one topic (which must have a table)")
    p.add_argument("--expire-after-seconds", type=int_arg("--expire-after-seconds", 0, MAX_SECONDS),
                   default=DEFAULT_EXPIRE_SECONDS)
    p.add_argument("--orphan-grace-seconds", type=int_arg("--orphan-grace-seconds", 0, MAX_SECONDS), default=86400)
    return p


def plan(deps, args) -> list[dict]:
    from tiering.metadata.table_sync import TableRows

    # a table exists once a sync committed: only those have anything to maintain
    return [{"topic": s.topic} for s in TableRows(deps.meta.engine).list(args.topic) if s.snapshot_id is not None]


def main(argv=None) -> int:
    from tiering.jobs.runner import driver_job

    args = build_parser().parse_args(argv)
    return driver_job("table_maintenance", args.topic, lambda settings, deps: _body(settings, deps, args))


def _body(settings, deps, args):
    from tiering.tables.catalog import catalog, table_dataset
    from tiering.tables.maintenance import maintain_topic
    from tiering.tables.sync import TableSync

    def body(outcome, _run_id: int) -> None:
        items = plan(deps, args)
        outcome.details.update(planned=len(items), spark="skipped")
        if not items:
            return
        sync = TableSync(deps.meta.engine, settings, catalog(settings))
        wanted = {i["topic"] for i in items}
        for state in sync.rows.list(args.topic):
            if state.topic not in wanted:
                continue
            r = maintain_topic(sync, state, timedelta(seconds=args.expire_after_seconds),
                               orphan_grace=timedelta(seconds=args.orphan_grace_seconds))
            outcome.items_done += 0 if r.errors else 1
            outcome.items_failed += 1 if r.errors else 0
            outcome.errors.extend(f"{state.topic}: {e}" for e in r.errors)
            for k in ("partitions_compacted", "files_before", "files_after", "snapshots_expired", "orphans_deleted"):
                outcome.details[k] = outcome.details.get(k, 0) + getattr(r, k)
            # the table is what maintenance reads and rewrites (the DAG's OpenLineage datasets)
            named = outcome.details.setdefault("lineage", {"inputs": [], "outputs": []})
            named["inputs"].append(table_dataset(settings, state.identifier))
            named["outputs"].append(table_dataset(settings, state.identifier))

    return body


if __name__ == "__main__":
    sys.exit(main())
