"""Pipeline commands of `tiering`: the operations the Spark jobs run, by hand (same plans and functions in
tiering/ops), each printing a one-line summary or, with --json, one JSON object; exit 1 with the first
error on one stderr line when an item failed.

tiering.ops is imported inside the handlers: it loads boto3 and SQLAlchemy, which building the parser (every
invocation, `--help`, a refused argument) must not pay for."""
from __future__ import annotations

from dataclasses import asdict
from datetime import timedelta

from tiering.cli import args as a
from tiering.cli.context import Context
from tiering.cli.output import Output, error, progress_bar
from tiering.errors import BadInput
from tiering.model import MIB


def register(sub) -> None:
    op = sub.add_parser("offload-prefix", help="offload every sealed ledger before L:E (Pulsar's offloadPrefix)")
    op.set_defaults(handler=cmd_offload_prefix)
    a.name(op)
    op.add_argument("position", type=a.position, metavar="L:E")
    a.json_flag(op)
    ost = sub.add_parser("offload-status", help="per ledger: state, attempt, offloaded time, keys")
    ost.set_defaults(handler=cmd_offload_status)
    a.name(ost)
    a.json_flag(ost)

    for by in ("age", "size"):
        knob = "offload-after" if by == "age" else "offload-threshold"
        ob = sub.add_parser(f"offload-by-{by}", help=f"offload the sealed ledgers the topics' {knob} selects")
        ob.set_defaults(handler=cmd_offload_by)
        a.topic_flag(ob)
        a.json_flag(ob)
    dl = sub.add_parser("delete-lagged", help="delete tier-1 copies offloaded longer ago than the deletion lag")
    dl.set_defaults(handler=cmd_delete_lagged)
    a.topic_flag(dl)
    a.json_flag(dl)
    ret = sub.add_parser("retention", help="truncate topic heads by retention time and size, bounded by readers")
    ret.set_defaults(handler=cmd_retention)
    a.topic_flag(ret)
    ret.add_argument("--dry-run", action="store_true",
                     help="show what a run would delete now and what subscriptions hold back; change nothing")
    a.json_flag(ret)
    tr = sub.add_parser("truncate", help="delete every whole ledger before L:E (never the open one)")
    tr.set_defaults(handler=cmd_truncate)
    a.name(tr)
    tr.add_argument("position", type=a.position, metavar="L:E")
    tr.add_argument("--force", action="store_true",
                    help="delete even entries an ACTIVE subscription has not read (the loss is recorded)")
    a.json_flag(tr)
    dfr = sub.add_parser("defrag", help="merge runs of small tier-2 objects")
    dfr.set_defaults(handler=cmd_defrag)
    a.topic_flag(dfr)
    dfr.add_argument("--small-bytes", type=a.positive, default=8 * MIB, metavar="N",
                     help="a data object below this is small (default 8 MiB)")
    dfr.add_argument("--max-merged-bytes", type=a.positive, default=256 * MIB, metavar="N",
                     help="a merged object stays within this (default 256 MiB)")
    a.json_flag(dfr)
    gc = sub.add_parser("gc", help="delete due queued tier-2 objects and stale uploads; --sweep: orphans")
    gc.set_defaults(handler=cmd_gc)
    gc.add_argument("--orphan-grace-seconds", type=a.seconds, default=None, metavar="N",
                    help="unreferenced objects and uploads older than this are deleted (default 2 h)")
    gc.add_argument("--sweep", action="store_true",
                    help="instead: sweep orphaned objects, resuming the listing where the last sweep stopped")
    gc.add_argument("--max-pages", type=a.positive, default=None, metavar="N",
                    help="with --sweep: list at most N pages of 1,000 keys (default 10,000)")
    a.json_flag(gc)


def _fail(count: int, what: str, first: str) -> int:
    error(f"{count} {what} failed; first: {first}")
    return 1


def _pairs(items) -> list[dict]:
    return [{"topic": t, "ledger": i} for t, i in items]


# ------------------------------------------------------------------------------------------------ offload
def cmd_offload_prefix(ctx: Context, args, out: Output) -> int:
    from tiering.ops.offload import offload_prefix, plan_offload_prefix

    planned = plan_offload_prefix(ctx.deps, args.name, args.position)  # an unknown topic fails here
    # bytes, so the bar shows the rate and an ETA (tqdm), as offload-by-* does
    bar = progress_bar("offload-prefix", sum(led.size_bytes for led in planned), "B")
    report, first = offload_prefix(ctx.deps, args.name, args.position,
                                   on_done=lambda led: bar.update(led.size_bytes), planned=planned)
    bar.close()
    result = {"command": "offload-prefix", "topic": args.name, "position": str(args.position),
              "offloaded": report.offloaded, "skipped": report.skipped, "failed": report.failed,
              "bytes": report.bytes, "first_not_offloaded": str(first)}
    out.result(result, f"offloaded {len(report.offloaded)} ledger(s) ({report.bytes} bytes), skipped "
                       f"{len(report.skipped)}, failed {len(report.failed)}; first position not offloaded: {first}")
    if report.first_error:
        return _fail(len(report.failed), "ledger(s)", report.first_error)
    return 0


def cmd_offload_by(ctx: Context, args, out: Output) -> int:
    from tiering.ops.offload import offload_by_topic, plan_offload

    by = args.command.rsplit("-", 1)[1]
    ctx.check_topic(args.topic)
    ledgers = plan_offload(ctx.deps, by, args.topic)
    bar = progress_bar(f"offload by {by}", sum(led.size_bytes for led in ledgers), "B")
    report = offload_by_topic(ctx.deps, ledgers, on_done=lambda done: bar.update(done.size_bytes))
    bar.close()
    result = {"command": args.command, "topic": args.topic, "planned": report.planned,
              "offloaded": _pairs(report.offloaded), "skipped": _pairs(report.skipped), "failed": report.failed,
              "bytes": report.bytes}
    out.result(result, f"offload by {by}: {report.planned} planned; offloaded {len(report.offloaded)} ledger(s) "
                       f"({report.bytes} bytes), skipped {len(report.skipped)}, failed {len(report.failed)}")
    if report.failed:
        f = report.failed[0]
        return _fail(len(report.failed), "ledger(s)", f"topic {f['topic']!r} ledger {f['ledger']}: {f['error']}")
    return 0


def _offload_table(rows: list[dict]):
    yield f"{'ledger':>8} {'state':<11} {'offloaded_at':<32} keys"
    for r in rows:
        yield f"{r['ledger']:>8} {r['state']:<11} {str(r['offloaded_at'] or '-'):<32} {r['data_key'] or '-'}"


def cmd_offload_status(ctx: Context, args, out: Output) -> int:
    ledgers = ctx.meta.list_ledgers(args.name)
    chunks = ctx.meta.chunks(args.name)
    rows = []
    for led in ledgers:
        ch = chunks.get(led.ledger_id)
        rows.append({"ledger": led.ledger_id, "state": led.state.value, "attempt": led.offload_uuid,
                     "offload_started_at": led.offload_started_at, "offloaded_at": led.offloaded_at,
                     "tier1_present": led.tier1_present,
                     "data_key": ch.data_key if ch else None, "index_key": ch.index_key if ch else None})
    out.rows(rows, _offload_table)
    return 0


# ------------------------------------------------------------------------------- tier-1 copies, retention
def cmd_delete_lagged(ctx: Context, args, out: Output) -> int:
    from tiering.ops.delete_lagged import delete_lagged

    ctx.check_topic(args.topic)
    report = delete_lagged(ctx.deps, args.topic)
    result = {"command": "delete-lagged", "topic": args.topic, "deleted": _pairs(report.deleted),
              "skipped": _pairs(report.skipped), "bytes": report.bytes,
              "failed": [{"topic": t, "ledger": i, "error": e} for t, i, e in report.failed]}
    out.result(result, f"deleted {len(report.deleted)} tier-1 cop(ies) ({report.bytes} bytes); skipped "
                       f"{len(report.skipped)} that changed meanwhile; kept {len(report.failed)} that failed")
    if report.failed:
        return _fail(len(report.failed), "ledger(s)", report.failed[0][2])
    return 0


def _retention_result(args, report) -> dict:
    return {"command": args.command, "topic": getattr(args, "topic", None) or getattr(args, "name", None),
            "deleted": _pairs(report.deleted), "files_removed": report.files_removed, "bytes": report.bytes,
            "reasons": dict(sorted(report.reasons.items())), "unread_deleted": report.losses}


def _losses(report) -> str:
    if not report.losses:
        return ""
    return "; deleted unread: " + ", ".join(f"{x['subscription']!r} of {x['topic']!r} {x['entries']} entries "
                                            f"({x['reason']})" for x in report.losses)


def cmd_retention(ctx: Context, args, out: Output) -> int:
    from tiering.ops.retention import describe_plan, dry_run, retention

    ctx.check_topic(args.topic)
    if args.dry_run:
        plan = dry_run(ctx.deps, args.topic)
        result = {"command": "retention", "dry_run": True, "topic": args.topic, "topics": plan,
                  "ledgers": sum(p["ledgers"] for p in plan), "bytes": sum(p["bytes"] for p in plan)}
        out.result(result, "\n".join(["retention --dry-run: nothing due" if not plan else
                                      f"retention --dry-run: would delete {result['ledgers']} ledger(s), "
                                      f"{result['bytes']} bytes"] + [f"  {describe_plan(p)}" for p in plan]))
        return 0
    report = retention(ctx.deps, args.topic)
    out.result(_retention_result(args, report),
               f"retention: deleted {len(report.deleted)} ledger(s) ({report.bytes} bytes), removed "
               f"{report.files_removed} tier-1 file(s); their tier-2 objects are queued for gc" + _losses(report))
    return 0


def cmd_truncate(ctx: Context, args, out: Output) -> int:
    from tiering.ops.retention import truncate

    # unknown topic, position past the end, unread entries of an ACTIVE subscription without --force: exit 2
    report = truncate(ctx.deps, args.name, args.position, args.force)
    result = {**_retention_result(args, report), "position": str(args.position)}
    out.result(result, f"truncated {args.name!r} before {args.position}: deleted {len(report.deleted)} ledger(s) "
                       f"({report.bytes} bytes), removed {report.files_removed} tier-1 file(s); their tier-2 "
                       f"objects are queued for gc" + _losses(report))
    return 0


# --------------------------------------------------------------------------------------------- defrag, gc
def cmd_defrag(ctx: Context, args, out: Output) -> int:
    from tiering.ops.defrag import merge_groups, plan_defrag

    ctx.check_topic(args.topic)
    groups = plan_defrag(ctx.deps, args.topic, args.small_bytes, args.max_merged_bytes)
    bar = progress_bar("defrag", sum(g.data_bytes for g in groups), "B")
    report = merge_groups(ctx.deps, groups, on_group=lambda g: bar.update(g.data_bytes))
    bar.close()
    result = {"command": "defrag", "topic": args.topic, "planned_groups": len(groups), **asdict(report)}
    out.result(result, f"defrag: merged {report.groups} group(s) of {report.ledgers} ledger(s), "
                       f"{report.objects_before} object(s) -> {report.objects_after}; "
                       f"{report.bytes_copied_server_side} bytes copied server-side, {report.bytes_downloaded} "
                       f"downloaded; {report.lost_races} lost race(s), {len(report.errors)} failed")
    if report.errors:
        return _fail(len(report.errors), "group(s)", report.errors[0])
    return 0


def cmd_gc(ctx: Context, args, out: Output) -> int:
    from tiering.ops.gc import run_gc

    grace = None if args.orphan_grace_seconds is None else timedelta(seconds=args.orphan_grace_seconds)
    if args.sweep:
        return _gc_sweep(ctx, args, out, grace)
    if args.max_pages is not None:
        raise BadInput("--max-pages is for --sweep")
    report = run_gc(ctx.deps, orphan_grace=grace)
    result = {"command": "gc", "deleted": len(report.deleted), "still_referenced": report.still_referenced,
              "retried": report.retried, "failed": report.failed, "uploads_aborted": report.uploads_aborted}
    out.result(result, f"gc: deleted {len(report.deleted)} queued object(s), aborted {report.uploads_aborted} "
                       f"stale upload(s); {report.still_referenced} still referenced, {report.retried} to retry, "
                       f"{report.failed} failed for good")
    if report.retried or report.failed:
        error(f"{report.retried + report.failed} queued object(s) could not be deleted from S3 "
              f"({report.failed} marked FAILED after their last attempt)")
        return 1
    return 0


def _gc_sweep(ctx: Context, args, out: Output, grace) -> int:
    from tiering.ops.gc import SWEEP_MAX_PAGES, sweep_orphans

    r = sweep_orphans(ctx.deps, orphan_grace=grace, max_pages=args.max_pages or SWEEP_MAX_PAGES)
    result = {"command": "gc", "sweep": True, "taken": r.taken, "pages": r.pages, "objects_listed": r.objects_listed,
              "orphans_deleted": len(r.orphans_deleted), "failed": len(r.failed), "started_from": r.started_from,
              "cursor": r.cursor, "pass_complete": r.pass_complete, "passes_completed": r.passes_completed,
              "last_pass_completed_at": r.last_pass_completed_at.isoformat() if r.last_pass_completed_at else None}
    if r.taken and not r.pages:
        out.result(result, "gc --sweep: taken by another worker; nothing done")
        return 0
    where = "pass complete, next run starts a new pass" if r.pass_complete else f"next run resumes after {r.cursor!r}"
    out.result(result, f"gc --sweep: listed {r.pages} page(s), {r.objects_listed} object(s); deleted "
                       f"{len(r.orphans_deleted)} orphan(s); {where}"
                       + (" (stopped: taken by another worker)" if r.taken else ""))
    if r.failed:
        error(f"{len(r.failed)} orphan(s) could not be deleted from S3; first: {r.failed[0]}; "
              f"the next sweep lists that page again")
        return 1
    return 0
