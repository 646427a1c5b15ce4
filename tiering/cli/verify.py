"""`tiering verify TOPIC`: renders tiering.ops.verify's report; exit 1 on loss or corruption. `tiering repair`:
re-makes broken tier-2 copies from verified tier-1 copies, marks lost what no tier holds and clears the mark
of a lost ledger whose good copy is back (tiering.ops.repair); exit 1 when a ledger is lost or a repair failed.

tiering.ops is imported inside the handlers (it loads the reader and SQLAlchemy): building the parser
must not pay for it."""
from __future__ import annotations

from tiering.cli import args as a
from tiering.cli.context import Context
from tiering.cli.output import Output, document, error, exit_failed, failures, gap_dict, ledger_refs, progress_bar


def register(sub) -> None:
    ver = sub.add_parser("verify", help="read a whole topic (and every tier-2 copy); exit 1 on loss or corruption")
    ver.set_defaults(handler=cmd_verify)
    a.name(ver)
    a.json_flag(ver)
    rep = sub.add_parser("repair", help="re-make missing, short or corrupt tier-2 copies from verified tier-1 "
                                        "copies; mark lost what no tier holds (exit 1); recover lost ledgers whose "
                                        "copy is back")
    rep.set_defaults(handler=cmd_repair)
    a.topic_flag(rep)
    rep.add_argument("--dry-run", action="store_true", help="check and report what a run would do; change nothing")
    a.json_flag(rep)


def cmd_verify(ctx: Context, args, out: Output) -> int:
    from tiering.ops.verify import live_entries, verify_topic

    ledgers = ctx.meta.list_ledgers(args.name)  # an unknown topic fails here
    bar = progress_bar("verify", live_entries(ledgers), "entry")
    report = verify_topic(ctx.meta, ctx.tier1, ctx.tier2_opener(), args.name, ledgers, on_entry=bar.update,
                          gc_delay_seconds=ctx.settings.gc_delay_seconds)
    bar.close()
    gaps, problems, no_pages = [gap_dict(g) for g in report.gaps], report.problems, report.no_page_index
    result = document("verify", args.name, ledger_count=report.ledgers, entry_count=report.entries,
                      bytes=report.bytes, tier2_copies_checked_count=report.tier2_copies_checked,
                      no_page_index=ledger_refs((args.name, i) for i in no_pages), gaps=gaps, problems=problems,
                      repairable=ledger_refs((args.name, i) for i in report.repairable),
                      repairable_count=len(report.repairable),
                      unrepairable_count=len(problems) - len(report.repairable), ok=report.ok)
    kinds = ", ".join(f"{g.kind} {g.range_text()}" for g in report.gaps[:5])
    out.result(result, f"verified {args.name!r}: {report.ledgers} ledger(s), {report.entries} entries, "
                       f"{report.bytes} bytes, {report.tier2_copies_checked} tier-2 cop(ies) compared, "
                       f"{len(gaps)} gap(s){' (' + kinds + ')' if gaps else ''}"
                       + (f", {len(no_pages)} ledger(s) with no page index (offloaded before page checksums: "
                          f"framing checked, bytes not)" if no_pages else "")
                       + f"; {'OK' if report.ok else f'{len(problems)} problem(s), {len(report.repairable)} repairable'}")
    if problems:
        error(f"{len(problems)} check(s) of {args.name!r} failed; first: {problems[0]}")
        return 1
    return 0


def cmd_repair(ctx: Context, args, out: Output) -> int:
    from tiering.ops.repair import repair

    ctx.check_topic(args.topic)
    bar = progress_bar("repair: checking", None, "ledger")
    report = repair(ctx.deps, args.topic, dry_run=args.dry_run, on_ledger=lambda _led: bar.update())
    bar.close()
    problems = [f.as_dict() for f in report.findings]
    repairable = sum(1 for f in report.findings if f.repairable)
    result = document("repair", args.topic, dry_run=args.dry_run, checked_count=report.checked, problems=problems,
                      problem_count=len(problems), repairable_count=repairable,
                      unrepairable_count=len(problems) - repairable, repaired=ledger_refs(report.repaired),
                      repaired_count=len(report.repaired), lost=ledger_refs(report.lost), lost_count=len(report.lost),
                      recovered=ledger_refs(report.recovered), recovered_count=len(report.recovered),
                      skipped=ledger_refs(report.skipped), skipped_count=len(report.skipped),
                      failed=failures(report.failed), failed_count=len(report.failed), bytes=report.bytes)
    verb = "would repair" if args.dry_run else "repaired"
    # a preview's findings that no tier holds a good copy of: the run would mark them lost
    would_lose = [] if not args.dry_run else [(f.led.topic, f.led.ledger_id) for f in report.findings
                                              if not f.repairable and not f.tier1_unseen]
    out.result(result, f"repair{' (dry run)' if args.dry_run else ''}: {report.checked} tier-2 cop(ies) checked, "
                       f"{len(problems)} problem(s) ({repairable} repairable); {verb} "
                       f"{repairable if args.dry_run else len(report.repaired)}, "
                       f"{'would recover' if args.dry_run else 'recovered'} {len(report.recovered)} lost, "
                       f"lost {len(report.lost)}"
                       + (f", would mark {len(would_lose)} lost" if would_lose else "")
                       + f", skipped {len(report.skipped)}, failed {len(report.failed)}")
    if report.failed:
        return exit_failed(result["failed"], "repair(s)")
    lost = report.lost + would_lose
    if lost:
        t, i = lost[0]
        error(f"{len(lost)} ledger(s) {'would be ' if args.dry_run and not report.lost else ''}lost: no tier holds a "
              f"good copy; first: topic {t!r} ledger {i}")
        return 1
    return 0
