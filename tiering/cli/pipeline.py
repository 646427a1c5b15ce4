"""Pipeline commands of `tiering`: the operations the Spark jobs run, by hand (same plans and functions in
tiering/ops), each printing a one-line summary or, with --json, one JSON object; exit 1 with the first
error on one stderr line when an item failed.

tiering.ops is imported inside the handlers: it loads boto3 and SQLAlchemy, which building the parser (every
invocation, `--help`, a refused argument) must not pay for."""
from __future__ import annotations

from datetime import timedelta

from tiering.cli import args as a
from tiering.cli.context import Context
from tiering.cli.output import Output, document, error, exit_failed, failures, iso, ledger_refs, progress_bar
from tiering.errors import BadInput
from tiering.model import MIB


def register(sub) -> None:
    op = sub.add_parser("offload-prefix", help="offload every sealed ledger wholly before L:E (Pulsar's offloadPrefix)")
    op.set_defaults(handler=cmd_offload_prefix)
    a.name(op)
    op.add_argument("position", type=a.position, metavar="L:E", nargs="?",
                    help="the first position kept in tier 1 only; the end of the topic is one past the last "
                         "sealed entry (L:<its entry count>) or, after a seal, the next ledger's N:0")
    op.add_argument("--all-sealed", action="store_true", help="instead of L:E: every sealed ledger")
    a.dry_run_flag(op)
    a.json_flag(op)
    ost = sub.add_parser("offload-status", help="per ledger: state, attempt, offloaded time, tier-1 copy, keys")
    ost.set_defaults(handler=cmd_offload_status)
    a.name(ost)
    a.json_flag(ost)

    for by in ("age", "size"):
        knob = "offload-after" if by == "age" else "offload-threshold"
        ob = sub.add_parser(f"offload-by-{by}", help=f"offload the sealed ledgers the topics' {knob} selects")
        ob.set_defaults(handler=cmd_offload_by)
        a.topic_flag(ob)
        a.dry_run_flag(ob)
        a.json_flag(ob)
    dl = sub.add_parser("delete-lagged", help="delete tier-1 copies offloaded longer ago than the deletion lag")
    dl.set_defaults(handler=cmd_delete_lagged)
    a.topic_flag(dl)
    a.dry_run_flag(dl)
    a.json_flag(dl)
    ret = sub.add_parser("retention", help="truncate topic heads by retention time and size, bounded by readers")
    ret.set_defaults(handler=cmd_retention)
    a.topic_flag(ret)
    ret.add_argument("--dry-run", action="store_true",
                     help="print what a run would delete now (as its output, with \"dry_run\": true and the plan "
                          "per topic: reasons, what subscriptions hold back); change nothing")
    a.json_flag(ret)
    tr = sub.add_parser("truncate", help="delete every whole ledger before L:E (never the open one)")
    tr.set_defaults(handler=cmd_truncate)
    a.name(tr)
    tr.add_argument("position", type=a.position, metavar="L:E")
    tr.add_argument("--force", action="store_true",
                    help="delete even entries an ACTIVE subscription has not read (the loss is recorded)")
    a.dry_run_flag(tr)
    a.json_flag(tr)
    dfr = sub.add_parser("defrag", help="merge runs of small tier-2 objects")
    dfr.set_defaults(handler=cmd_defrag)
    a.topic_flag(dfr)
    dfr.add_argument("--small-bytes", type=a.size, default=8 * MIB, metavar="SIZE",
                     help="a data object below this is small (bytes or e.g. 8MiB; default 8MiB)")
    dfr.add_argument("--max-merged-bytes", type=a.size, default=256 * MIB, metavar="SIZE",
                     help="a merged object stays within this (bytes or e.g. 256MiB; default 256MiB)")
    a.dry_run_flag(dfr)
    a.json_flag(dfr)
    gc = sub.add_parser("gc", help="delete due queued tier-2 objects and stale uploads; --sweep: orphans")
    gc.set_defaults(handler=cmd_gc)
    gc.add_argument("--orphan-grace-seconds", type=a.seconds, default=None, metavar="DURATION",
                    help="unreferenced objects and uploads older than this are deleted (seconds or e.g. 2h; "
                         "default twice TIERING_OFFLOAD_TIMEOUT_SECONDS: 2h)")
    gc.add_argument("--sweep", action="store_true",
                    help="instead: sweep orphaned objects, resuming the listing where the last sweep stopped")
    gc.add_argument("--max-pages", type=a.positive, default=None, metavar="N",
                    help="with --sweep: list at most N pages of 1,000 keys (default 10,000)")
    gc.add_argument("--retry-failed", action="store_true",
                    help="first make the queued objects FAILED after their last attempt due again (once what "
                         "failed their deletes is mended)")
    a.dry_run_flag(gc)
    a.json_flag(gc)


# ------------------------------------------------------------------------------------------------ offload
def cmd_offload_prefix(ctx: Context, args, out: Output) -> int:
    from tiering.ops.offload import end_of_sealed, first_not_offloaded, offload_prefix, plan_offload_prefix

    if (args.position is None) == (not args.all_sealed):
        raise BadInput("offload-prefix takes a position L:E or --all-sealed (one of them)")
    position = end_of_sealed(ctx.deps, args.name) if args.all_sealed else args.position  # unknown topic: here
    planned = plan_offload_prefix(ctx.deps, args.name, position)
    if args.dry_run:
        first = first_not_offloaded(ctx.deps, args.name, assume_offloaded={led.ledger_id for led in planned})
        offloaded, skipped, failed = [led.ledger_id for led in planned], [], {}
        size = sum(led.size_bytes for led in planned)
    else:
        # bytes, so the bar shows the rate and an ETA (tqdm), as offload-by-* does
        bar = progress_bar("offload-prefix", sum(led.size_bytes for led in planned), "B")
        report, first = offload_prefix(ctx.deps, args.name, position,
                                       on_done=lambda led: bar.update(led.size_bytes), planned=planned)
        bar.close()
        offloaded, skipped, failed, size = report.offloaded, report.skipped, report.failed, report.bytes
    result = document("offload-prefix", args.name, **a.preview_fields(args), position=str(position),
                      offloaded=ledger_refs((args.name, i) for i in offloaded),
                      skipped=ledger_refs((args.name, i) for i in skipped),
                      failed=failures((args.name, i, e) for i, e in failed.items()),
                      offloaded_count=len(offloaded), bytes=size,
                      first_not_offloaded=None if first is None else str(first))
    where = "none (the topic was deleted meanwhile)" if first is None else first
    out.result(result, a.would(args, f"offloaded {len(offloaded)} ledger(s) ({size} bytes), skipped {len(skipped)}, "
                                    f"failed {len(failed)}; first position not offloaded: {where}"))
    return exit_failed(result["failed"], "ledger(s)")


def cmd_offload_by(ctx: Context, args, out: Output) -> int:
    from tiering.ops.offload import TopicsOffloadReport, offload_by_topic, plan_offload

    by = args.command.rsplit("-", 1)[1]
    ctx.check_topic(args.topic)
    ledgers = plan_offload(ctx.deps, by, args.topic)
    if args.dry_run:
        report = TopicsOffloadReport(planned=len(ledgers), offloaded=[(led.topic, led.ledger_id) for led in ledgers],
                                     bytes=sum(led.size_bytes for led in ledgers))
    else:
        bar = progress_bar(f"offload by {by}", sum(led.size_bytes for led in ledgers), "B")
        report = offload_by_topic(ctx.deps, ledgers, on_done=lambda done: bar.update(done.size_bytes))
        bar.close()
    result = document(args.command, args.topic, **a.preview_fields(args), planned_count=report.planned,
                      offloaded=ledger_refs(report.offloaded), skipped=ledger_refs(report.skipped),
                      failed=failures(report.failed), offloaded_count=len(report.offloaded), bytes=report.bytes)
    out.result(result, a.would(args, f"offload by {by}: {report.planned} planned; offloaded {len(report.offloaded)} "
                                    f"ledger(s) ({report.bytes} bytes), skipped {len(report.skipped)}, failed "
                                    f"{len(report.failed)}"))
    return exit_failed(result["failed"], "ledger(s)")


def _offload_table(rows: list[dict]):
    yield f"{'ledger':>8} {'state':<11} {'attempt':<36} {'offloaded_at':<32} {'tier1':<5} keys"
    for r in rows:
        keys = f"{r['data_key']} {r['index_key']}" if r["data_key"] else "-"
        yield (f"{r['ledger']:>8} {r['state']:<11} {r['attempt'] or '-':<36} {str(r['offloaded_at'] or '-'):<32} "
               f"{'yes' if r['tier1_present'] else 'no':<5} {keys}")


def cmd_offload_status(ctx: Context, args, out: Output) -> int:
    ledgers = ctx.meta.list_ledgers(args.name)
    chunks = ctx.meta.chunks(args.name)
    rows = []
    for led in ledgers:
        ch = chunks.get(led.ledger_id)
        rows.append({"topic": args.name, "ledger": led.ledger_id, "state": led.state.value,
                     "attempt": led.offload_uuid, "offload_started_at": iso(led.offload_started_at),
                     "offloaded_at": iso(led.offloaded_at), "tier1_present": led.tier1_present,
                     "data_key": ch.data_key if ch else None, "index_key": ch.index_key if ch else None})
    out.listing(document("offload-status", args.name, ledgers=rows), "ledgers", _offload_table)
    return 0


# ------------------------------------------------------------------------------- tier-1 copies, retention
def cmd_delete_lagged(ctx: Context, args, out: Output) -> int:
    from tiering.ops.delete_lagged import delete_lagged, preview

    ctx.check_topic(args.topic)
    report = preview(ctx.deps, args.topic) if args.dry_run else delete_lagged(ctx.deps, args.topic)
    result = document("delete-lagged", args.topic, **a.preview_fields(args), deleted=ledger_refs(report.deleted),
                      skipped=ledger_refs(report.skipped), failed=failures(report.failed),
                      deleted_count=len(report.deleted), bytes=report.bytes)
    out.result(result, a.would(args, f"deleted {len(report.deleted)} tier-1 cop(ies) ({report.bytes} bytes); skipped "
                                    f"{len(report.skipped)} that changed meanwhile; kept {len(report.failed)} that "
                                    "failed"))
    return exit_failed(result["failed"], "ledger(s)")


def _retention_result(args, report, topic: str | None) -> dict:
    return document(args.command, topic, **a.preview_fields(args), deleted=ledger_refs(report.deleted),
                    deleted_count=len(report.deleted), files_removed_count=report.files_removed, bytes=report.bytes,
                    reasons=dict(sorted(report.reasons.items())), unread_deleted=report.losses,
                    failed=failures(report.failed))


def _queued(report, would: bool = False) -> str:
    """What becomes (or, in a preview, would become) of the deleted ledgers' tier-2 objects, said when there
    are any."""
    if not report.tier2_ledgers:
        return ""
    return "; their tier-2 objects " + ("would be queued" if would else "are queued") + " for gc"


def _losses(report, would: bool = False) -> str:
    if not report.losses:
        return ""
    return ("; unread: " if would else "; deleted unread: ") + ", ".join(
        f"{x['subscription']!r} of {x['topic']!r} {x['entry_count']} entries ({x['reason']})" for x in report.losses)


def cmd_retention(ctx: Context, args, out: Output) -> int:
    from tiering.ops.retention import RetentionReport, describe_plan, dry_run, retention

    ctx.check_topic(args.topic)
    if args.dry_run:
        plan = dry_run(ctx.deps, args.topic)
        report = RetentionReport()
        for p in plan:
            report.deleted += [(p["topic"], i) for i in p["ledger_ids"]]
            report.bytes += p["bytes"]
            report.files_removed += p["tier1_copy_count"]
            report.reasons.update(p["reasons"].values())
            # as the run reports them (the plan's items also say the subscription's state)
            report.losses += [{k: v for k, v in u.items() if k != "state"} for u in p["unread_deleted"]]
        plan = [{k: v for k, v in p.items() if k not in ("reasons", "ledger_ids")} for p in plan]
        result = {**_retention_result(args, report, args.topic), "plan": plan}
        head = "retention --dry-run: nothing due" if not plan else (
            f"retention --dry-run: would delete {len(report.deleted)} ledger(s), {report.bytes} bytes, remove "
            f"{report.files_removed} tier-1 file(s)")
        out.result(result, "\n".join([head] + [f"  {describe_plan(p)}" for p in plan]))
        return 0
    report = retention(ctx.deps, args.topic)
    result = _retention_result(args, report, args.topic)
    out.result(result,
               f"retention: deleted {len(report.deleted)} ledger(s) ({report.bytes} bytes), removed "
               f"{report.files_removed} tier-1 file(s){_queued(report)}" + _losses(report)
               + _retention_failures(report))
    # a failed item is a topic that failed whole, its trim marker or one tier-1 copy: counted as steps, and the
    # topics they fall in said apart (one topic's three copies are not three topics)
    return exit_failed(result["failed"], "step(s)")


def _retention_failures(report) -> str:
    if not report.failed:
        return ""
    topics = len({topic for topic, _, _ in report.failed})
    return f"; {len(report.failed)} step(s) not done in {topics} topic(s)"


def cmd_truncate(ctx: Context, args, out: Output) -> int:
    from tiering.ops.retention import truncate

    # unknown topic, position past the end, unread entries of an ACTIVE subscription without --force: exit 2
    report = truncate(ctx.deps, args.name, args.position, args.force, dry_run=args.dry_run)
    result = {**_retention_result(args, report, args.name), "position": str(args.position)}
    if args.dry_run:  # in the conditional: what a run would do, nothing done
        out.result(result, f"[dry run] truncate {args.name!r} before {args.position} would delete "
                           f"{len(report.deleted)} ledger(s) ({report.bytes} bytes) and remove {report.files_removed} "
                           f"tier-1 file(s){_queued(report, would=True)}{_losses(report, would=True)}")
        return 0
    out.result(result, f"truncated {args.name!r} before {args.position}: deleted {len(report.deleted)} ledger(s) "
                       f"({report.bytes} bytes), removed {report.files_removed} tier-1 file(s){_queued(report)}"
                       + _losses(report) + _truncate_failures(report))
    # a copy it could not remove, or the trim marker not written, is planned work not done, as in retention:
    # the next retention run finishes it
    return exit_failed(result["failed"], "ledger(s)" if all(ledger is not None for _, ledger, _ in report.failed)
                       else "step(s)")


def _truncate_failures(report) -> str:
    copies = sum(1 for _, ledger, _ in report.failed if ledger is not None)
    return ("; the trim marker not written" if len(report.failed) > copies else "") + \
        (f"; {copies} tier-1 cop(ies) not removed" if copies else "")


# --------------------------------------------------------------------------------------------- defrag, gc
def cmd_defrag(ctx: Context, args, out: Output) -> int:
    from tiering.ops.defrag import DefragReport, merge_groups, plan_defrag, planned_transfer

    ctx.check_topic(args.topic)
    groups = plan_defrag(ctx.deps, args.topic, args.small_bytes, args.max_merged_bytes)
    if args.dry_run:
        n = sum(len(g.ledgers) for g in groups)
        copied, downloaded = planned_transfer(groups)
        report = DefragReport(groups=len(groups), ledgers=n, objects_before=2 * n, objects_after=2 * len(groups),
                              bytes_copied_server_side=copied, bytes_downloaded=downloaded)
    else:
        bar = progress_bar("defrag", sum(g.data_bytes for g in groups), "B")
        report = merge_groups(ctx.deps, groups, args.small_bytes, args.max_merged_bytes,
                              on_group=lambda g: bar.update(g.data_bytes))
        bar.close()
    result = document("defrag", args.topic, **a.preview_fields(args), planned_group_count=len(groups),
                      ledgers=ledger_refs(led for g in groups for led in g.ledgers),
                      group_count=report.groups, ledger_count=report.ledgers,
                      objects_before_count=report.objects_before, objects_after_count=report.objects_after,
                      planned_bytes=sum(g.data_bytes for g in groups),
                      copied_server_side_bytes=report.bytes_copied_server_side,
                      downloaded_bytes=report.bytes_downloaded, lost_race_count=report.lost_races,
                      failed=failures(report.failures))
    out.result(result, a.would(args, f"defrag: merged {report.groups} group(s) of {report.ledgers} ledger(s), "
                                    f"{report.objects_before} object(s) -> {report.objects_after}; "
                                    f"{report.bytes_copied_server_side} bytes copied server-side, "
                                    f"{report.bytes_downloaded} downloaded; {report.lost_races} lost race(s), "
                                    f"{len(report.errors)} failed"))
    return exit_failed(result["failed"], "group(s)")


def cmd_gc(ctx: Context, args, out: Output) -> int:
    from tiering.ops.gc import preview_gc, run_gc

    grace = None if args.orphan_grace_seconds is None else timedelta(seconds=args.orphan_grace_seconds)
    if args.sweep:
        if args.retry_failed:
            raise BadInput("--retry-failed is for the queue's run, not --sweep")
        return _gc_sweep(ctx, args, out, grace)
    if args.max_pages is not None:
        raise BadInput("--max-pages is for --sweep")
    run = preview_gc if args.dry_run else run_gc
    report = run(ctx.deps, orphan_grace=grace, retry_failed=args.retry_failed)
    result = document("gc", None, **a.preview_fields(args), requeued_count=report.requeued, deleted_count=len(report.deleted),
                      still_referenced_count=report.still_referenced, retried_count=report.retried,
                      failed_count=report.failed, failed=failures(report.failed_keys),
                      uploads_aborted_count=report.uploads_aborted)
    requeued = f"{report.requeued} FAILED made due again; " if args.retry_failed else ""
    out.result(result, a.would(args, f"gc: {requeued}deleted {len(report.deleted)} queued object(s), aborted "
                                    f"{report.uploads_aborted} stale upload(s); {report.still_referenced} still "
                                    f"referenced, {report.retried} to retry, {report.failed} failed for good"))
    if report.retried or report.failed:
        error(f"{report.retried + report.failed} queued object(s) could not be deleted from S3 "
              f"({report.failed} marked FAILED after their last attempt)")
        return 1
    return 0


def _gc_sweep(ctx: Context, args, out: Output, grace) -> int:
    from tiering.ops.gc import SWEEP_MAX_PAGES, preview_sweep, sweep_orphans

    sweep = preview_sweep if args.dry_run else sweep_orphans
    r = sweep(ctx.deps, orphan_grace=grace, max_pages=args.max_pages or SWEEP_MAX_PAGES)
    result = document("gc", None, **a.preview_fields(args), sweep=True, taken=r.taken, page_count=r.pages,
                      objects_listed_count=r.objects_listed, orphans_deleted_count=len(r.orphans_deleted),
                      failed=[{"key": k, "error": "S3 delete failed"} for k in r.failed],
                      started_from=r.started_from, cursor=r.cursor, pass_complete=r.pass_complete,
                      passes_completed_count=r.passes_completed, last_pass_completed_at=iso(r.last_pass_completed_at))
    if args.dry_run:
        result["orphans"] = r.orphans_deleted
    if r.taken and not r.pages:
        out.result(result, "gc --sweep: taken by another worker; nothing done")
        return 0
    where = "pass complete, next run starts a new pass" if r.pass_complete else f"next run resumes after {r.cursor!r}"
    out.result(result, a.would(args, f"gc --sweep: listed {r.pages} page(s), {r.objects_listed} object(s); deleted "
                                    f"{len(r.orphans_deleted)} orphan(s); {where}"
                                    + (" (stopped: taken by another worker)" if r.taken else "")))
    if r.failed:
        error(f"{len(r.failed)} orphan(s) could not be deleted from S3; first: {r.failed[0]}; "
              f"the next sweep lists that page again")
        return 1
    return 0
