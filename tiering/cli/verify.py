"""`tiering verify TOPIC`: renders tiering.ops.verify's report; exit 1 on loss or corruption.

tiering.ops.verify is imported inside the handler (it loads the reader and SQLAlchemy): building the parser
must not pay for it."""
from __future__ import annotations

from tiering.cli import args as a
from tiering.cli.context import Context
from tiering.cli.output import Output, document, error, gap_dict, ledger_refs, progress_bar


def register(sub) -> None:
    ver = sub.add_parser("verify", help="read a whole topic (and every tier-2 copy); exit 1 on loss or corruption")
    ver.set_defaults(handler=cmd_verify)
    a.name(ver)
    a.json_flag(ver)


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
                      ok=report.ok)
    kinds = ", ".join(f"{g['gap']} {g['from']}..{g['to']}" for g in gaps[:5])
    out.result(result, f"verified {args.name!r}: {report.ledgers} ledger(s), {report.entries} entries, "
                       f"{report.bytes} bytes, {report.tier2_copies_checked} tier-2 cop(ies) compared, "
                       f"{len(gaps)} gap(s){' (' + kinds + ')' if gaps else ''}"
                       + (f", {len(no_pages)} ledger(s) with no page index (offloaded before page checksums: "
                          f"framing checked, bytes not)" if no_pages else "")
                       + f"; {'OK' if report.ok else f'{len(problems)} problem(s)'}")
    if problems:
        error(f"{len(problems)} check(s) of {args.name!r} failed; first: {problems[0]}")
        return 1
    return 0
