"""`tiering table sync|status|verify`: topics as Iceberg tables, by hand, with the same code as the DAG
`tiering_table_sync` (the data files are written in this process instead of on Spark executors)."""
from __future__ import annotations

from tiering.cli import args as a
from tiering.cli.context import Context
from tiering.cli.output import Output, document, exit_failed, failures, iso, ledger_refs


def register(sub) -> None:
    table = sub.add_parser("table", help="topics as Apache Iceberg tables: sync, status, verify, maintain, "
                           "rebuild")
    table.set_defaults(handler=cmd_table)
    t_sub = table.add_subparsers(dest="table_command", required=True, parser_class=a.Parser)
    sync = t_sub.add_parser("sync", help="append every sealed ledger not yet in its topic's table, exactly once")
    a.topic_flag(sync)
    sync.add_argument("--dry-run", action="store_true", help="say which ledgers a sync would commit; write nothing")
    sync.add_argument("--wait", type=a.seconds, metavar="DURATION", help="how long a topic's sync waits for its "
                      "table's running maintenance to end before it fails (default 10m)")
    a.json_flag(sync)
    status = t_sub.add_parser("status", help="a topic's table: identifier, metadata location, lag")
    a.name(status)
    a.json_flag(status)
    maintain = t_sub.add_parser("maintain", help="compact small data files and expire old snapshots (as the "
                                "DAG tiering_table_maintenance)")
    a.topic_flag(maintain)
    maintain.add_argument("--expire-after-seconds", type=a.seconds, default=7 * 86400, metavar="DURATION",
                          help="expire snapshots older than this (default 7d; never the current one)")
    maintain.add_argument("--orphan-grace-seconds", type=a.seconds, default=86400, metavar="DURATION",
                          help="delete unreferenced files under the table older than this (default 1d)")
    maintain.add_argument("--dry-run", action="store_true", help="count what it would compact, expire and "
                          "delete; write nothing")
    maintain.add_argument("--wait", type=a.seconds, metavar="DURATION", help="how long a topic's maintenance waits "
                          "for its table's running sync to end before it fails (default 10m)")
    a.json_flag(maintain)
    rebuild = t_sub.add_parser("rebuild", help="forget a table that cannot be synced (its metadata file gone, "
                               "dropped, rolled back) so the next sync makes it again from the retained log")
    a.name(rebuild)
    rebuild.add_argument("--dry-run", action="store_true", help="say what the rebuild would forget; change nothing")
    rebuild.add_argument("--force", action="store_true", help="rebuild a table that is readable and in step "
                         "with its sync state too (rows of ledgers no longer retained do not come back)")
    a.json_flag(rebuild)
    verify = t_sub.add_parser("verify", help="compare the table with `tiering read` (exit 1 on a difference)")
    a.name(verify)
    a.json_flag(verify)


def cmd_table(ctx: Context, args, out: Output) -> int:
    return {"sync": _sync, "status": _status, "verify": _verify, "maintain": _maintain,
            "rebuild": _rebuild}[args.table_command](ctx, args, out)


def _rebuild(ctx: Context, args, out: Output) -> int:
    from tiering.metadata.table_sync import TableRows
    from tiering.tables.catalog import catalog
    from tiering.tables.rebuild import rebuild_table

    r = rebuild_table(TableRows(ctx.engine), catalog(ctx.settings), ctx.settings, args.name, args.dry_run,
                      args.force)
    obj = document("table rebuild", r.topic, dry_run=r.dry_run, identifier=r.table, found=r.found,
                   metadata_location=r.metadata_location, synced_through=r.synced_through,
                   retained_from=r.retained_from)
    start = "no retained ledger yet" if r.retained_from is None else f"ledger {r.retained_from} on"
    done = "nothing to forget" if r.found == "absent" else "would be forgotten" if r.dry_run else "forgotten"
    out.result(obj, f"{r.topic} -> {r.table} ({r.found}): {done}; the next `tiering table sync` makes it "
                    f"{'' if r.found == 'absent' else 'again '}from the retained log ({start})")
    return 0


def _maintain(ctx: Context, args, out: Output) -> int:
    from datetime import timedelta

    from tiering.tables.catalog import catalog
    from tiering.tables.maintenance import maintain_topic
    from tiering.tables.sync import TableSync

    ctx.check_topic(args.topic)
    sync = TableSync(ctx.engine, ctx.settings, catalog(ctx.settings), _limits(args))
    reports = [(s.topic, maintain_topic(sync, s, timedelta(seconds=args.expire_after_seconds),
                                        orphan_grace=timedelta(seconds=args.orphan_grace_seconds),
                                        dry_run=args.dry_run))
               for s in sync.rows.list(args.topic)]
    failed = failures((t, None, f"table {r.table}: {r.errors[0]}") for t, r in reports if r.errors)
    obj = document("table maintain", args.topic, dry_run=args.dry_run,
                   tables=[{"topic": t, "table": r.table, "partitions_compacted_count": r.partitions_compacted,
                            "files_before_count": r.files_before, "files_after_count": r.files_after,
                            "snapshots_expired_count": r.snapshots_expired, "orphans_deleted_count": r.orphans_deleted,
                            "skipped": r.skipped}
                           for t, r in reports],
                   # as every list named skipped: {topic, ledger} (the whole topic: ledger null, as in failed)
                   skipped=[{"topic": t, "ledger": None} for t, r in reports if r.skipped],
                   failed=failed, failed_count=len(failed))
    would = "would have: " if args.dry_run else ""

    def line(t: str, r) -> str:
        if r.skipped:
            return f"{t} -> {r.table}: skipped: {r.skipped}"
        return (f"{t} -> {r.table}: {would}{r.files_before} small file(s) compacted into {r.files_after} in "
                f"{r.partitions_compacted} partition(s), {r.snapshots_expired} snapshot(s) expired, "
                f"{r.orphans_deleted} orphan file(s) deleted" + (f": {r.errors[0]}" if r.errors else ""))
    out.result(obj, "\n".join(line(t, r) for t, r in reports) or "no topic has a table")
    return exit_failed(failed, "table(s)")


def _limits(args):
    from tiering.tables.sync import Limits

    return Limits() if args.wait is None else Limits(wait_seconds=args.wait)


def _sync(ctx: Context, args, out: Output) -> int:
    from tiering.tables.catalog import catalog
    from tiering.tables.files import local_writer
    from tiering.tables.sync import TableSync, sync_tables

    import sys

    ctx.check_topic(args.topic)
    # a backfill's progress, one line per committed round, on a terminal only (as the other progress bars)
    progress = (lambda line: print(line, file=sys.stderr)) if sys.stderr.isatty() else None
    sync = TableSync(ctx.engine, ctx.settings, catalog(ctx.settings), _limits(args), progress=progress)
    results = sync_tables(sync, local_writer(ctx.deps, ctx.settings), args.topic, args.dry_run)
    committed = [x for r in results for x in ledger_refs((r.topic, i) for i in r.ledgers)]
    planned = [x for r in results for x in ledger_refs((r.topic, i) for i in r.planned)]
    failed = failures((r.topic, None, f"table {r.table}: {r.error}") for r in results if r.status == "failed")
    obj = document("table sync", args.topic, dry_run=args.dry_run,
                   topics=[{"topic": r.topic, "table": r.table, "status": r.status,
                            "ledgers": ledger_refs((r.topic, i) for i in r.ledgers), "ledger_count": len(r.ledgers),
                            "planned": ledger_refs((r.topic, i) for i in r.planned), "planned_count": len(r.planned),
                            "passed_count": len(r.passed), "deleted": ledger_refs((r.topic, i) for i in r.deleted),
                            "deleted_count": len(r.deleted), "entry_count": r.entries, "bytes": r.bytes,
                            "round_count": r.rounds, "reconciled": r.reconciled, "error": r.error} for r in results],
                   ledgers=committed, ledger_count=len(committed), planned=planned, planned_count=len(planned),
                   # as every list named skipped: {topic, ledger} (the whole topic: ledger null, as in failed)
                   skipped=[{"topic": r.topic, "ledger": None} for r in results if r.status == "skipped"],
                   failed=failed, failed_count=len(failed))
    lines = []
    for r in results:
        what = (f"would commit {len(r.planned)} ledger(s)" if args.dry_run else
                f"{r.status}: {len(r.ledgers)} ledger(s), {r.entries} entries in {r.rounds} commit(s)"
                + (f", {len(r.deleted)} deleted ledger(s) removed" if r.deleted else "")
                # a run killed after its commit: its rows were in, this run recorded them (and its dead letters)
                + (", the sync state caught up with the table's commits of a run that stopped" if r.reconciled
                   else ""))
        lines.append(f"{r.topic} -> {r.table}: {what}" + (f": {r.error}" if r.error else ""))
    out.result(obj, "\n".join(lines) or "no topic has a table")
    return exit_failed(failed, "table(s)")


def _status(ctx: Context, args, out: Output) -> int:
    from dataclasses import replace

    from tiering.metadata.table_sync import TableRows
    from tiering.tables.catalog import catalog, owner_problem
    from tiering.errors import BadInput, TableUnreadable
    from tiering.tables.catalog import check_current_files
    from tiering.tables.marks import dead_letters_pending, dropped, table_problem, uncounted
    from tiering.tables.naming import DLQ_SUFFIX, PROP_SYNCED, PROP_TRIMMED

    rows = TableRows(ctx.engine)
    [state] = rows.list(args.name)
    cat = catalog(ctx.settings)
    location = problem = None
    snapshot_id = state.snapshot_id
    row_count = None  # not known: no table of this topic's, or its metadata unreadable
    dlq_pending = None  # of the table's commits, those whose dead letters TABLE__dlq has not taken yet
    table = None
    try:
        if not cat.table_exists(state.identifier):
            problem = dropped(state)  # what sync, verify and maintain refuse: the row's marks name rows no table holds
            if problem is None:  # not made yet (nothing synced): it holds nothing, and no dead letter waits
                row_count = dlq_pending = 0
        else:
            table = cat.load_table(state.identifier)
            problem = owner_problem(table, state.topic, state.topic_id)  # e.g. an earlier topic's of this name
            if problem is not None:
                table = None  # another topic's table: none of its rows, nor its location, are this topic's
    except (TableUnreadable, BadInput) as exc:  # its metadata file gone or corrupt, or outside the warehouse
        table, problem = None, str(exc)
    if table is not None:
        # what its metadata file says, also when a file it names is gone (the operator looks there first)
        location = table.metadata_location
        current = table.current_snapshot()
        row_count = int((current.summary or {}).get("total-records", "0")) if current else 0
        try:
            check_current_files(table)
            dlq = cat.load_table(state.identifier + DLQ_SUFFIX) \
                if cat.table_exists(state.identifier + DLQ_SUFFIX) else None
            if dlq is not None:  # the dead letters' table fails a sync as much
                check_current_files(dlq)
            dlq_pending = dead_letters_pending(table, dlq)
        except (TableUnreadable, BadInput) as exc:
            problem = str(exc)
        if problem is None:
            # the counts below are what syncs committed, rows deleted since included; row_count what it holds
            problem = table_problem(table, state)  # e.g. rolled back: the marks claim rows it does not hold
        if problem is None:
            # the table's own marks are the record (a sync killed after its commit left the row behind them
            # until the next sync): what it holds, as its metadata location says, and the lag from there
            ledgers, entries = uncounted(state, table)  # the commits past the row's mark, as the next sync counts them
            synced = max(state.synced_through, int(table.properties.get(PROP_SYNCED, "-1")))
            trimmed = max(state.trimmed_through, int(table.properties.get(PROP_TRIMMED, "-1")))
            state = replace(state, synced_through=synced, trimmed_through=trimmed,
                            ledgers_committed=state.ledgers_committed + ledgers,
                            entries_committed=state.entries_committed + entries)
            snap = table.current_snapshot()
            snapshot_id = snap.snapshot_id if snap else None
    lag_ledgers, lag_bytes = rows.lag(state)
    obj = {**document("table status", state.topic), "identifier": state.identifier, "problem": problem,
           "retention": state.retention, "metadata_location": location, "snapshot_id": snapshot_id,
           "synced_through": state.synced_through, "trimmed_through": state.trimmed_through,
           "lag_ledger_count": lag_ledgers, "lag_bytes": lag_bytes, "ledger_count": state.ledgers_committed,
           "entry_count": state.entries_committed, "row_count": row_count,
           "dlq_pending_commit_count": dlq_pending, "synced_at": iso(state.synced_at)}
    out.result(obj, "\n".join(f"{k:18} {'-' if v is None else v}" for k, v in obj.items() if k != "command"))
    return 0


def _verify(ctx: Context, args, out: Output) -> int:
    from tiering.errors import BadInput, TieringError
    from tiering.metadata.table_sync import TableRows
    from tiering.tables.catalog import catalog, check_current_files, owner_problem
    from tiering.tables.maintenance import check_data_files, listed_files
    from tiering.tables.marks import check_marks, dead_letters_pending, dropped, foreign_commits, gone_file
    from tiering.tables.naming import DLQ_SUFFIX
    from tiering.tables.verify import verify_table

    [state] = TableRows(ctx.engine).list(args.name)
    cat = catalog(ctx.settings)
    if not cat.table_exists(state.identifier):
        if why := dropped(state):  # a sync would not make it again
            raise TieringError(why)
        raise BadInput(f"table {state.identifier!r} of topic {state.topic!r} does not exist yet: run "
                       "`tiering table sync` first")
    table = cat.load_table(state.identifier)
    problem = owner_problem(table, state.topic, state.topic_id)
    if problem:  # its rows are not this topic's: comparing them would only list every ledger as a difference
        raise TieringError(f"table {state.identifier!r} {problem}")
    # rolled back behind the sync state (a catalog row set back by hand): comparing up to the table's own
    # marks would call it the same, as sync and maintain would not
    check_marks(state, table)
    # its snapshot's files gone: said so with the way out, not as a scan's FileNotFoundError
    check_current_files(table)
    try:
        check_data_files(table, listed_files(table, ctx.settings))
        r = verify_table(ctx.read_handle(), ctx.meta, table, state.topic)
    except FileNotFoundError as exc:  # a manifest gone (the manifest list was there)
        raise TieringError(gone_file(exc, state.topic)) from None
    # the dead letters: what another tool removed from their table, no sync puts back (a difference); the
    # commits a killed sync left for the next one to take are said, as the table's own lag is not a difference
    dlq = cat.load_table(state.identifier + DLQ_SUFFIX) if cat.table_exists(state.identifier + DLQ_SUFFIX) else None
    diffs = failures([(r.topic, d["ledger"], d["reason"]) for d in r.differences]
                     + [(r.topic, None, why) for why in (foreign_commits(dlq) if dlq is not None else [])])
    pending = dead_letters_pending(table, dlq)
    obj = document("table verify", r.topic, identifier=r.table, synced_through=r.synced_through,
                   ledger_count=r.ledgers, entry_count=r.entries, dlq_pending_commit_count=pending, failed=diffs,
                   failed_count=len(diffs))
    text = [f"{r.topic} -> {r.table}: {r.ledgers} ledger(s), {r.entries} entries compared through ledger "
            f"{r.synced_through}: " + ("the same" if not diffs else f"{len(diffs)} difference(s)")
            + (f"; the dead letters of {pending} commit(s) not in {r.table + DLQ_SUFFIX!r} yet (the next sync "
               "or maintenance takes them)" if pending else "")]
    text += [f"  {'ledger ' + str(d['ledger']) if d['ledger'] is not None else 'dead letters'}: {d['error']}"
             for d in diffs]
    out.result(obj, "\n".join(text))
    return exit_failed(diffs, "ledger(s)" if all(d["ledger"] is not None for d in diffs) else "check(s)", "differ")
