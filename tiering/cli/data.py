"""`tiering produce|seal|status|read`: writes and reads of a topic's entries.

The writer, the reader and SQLAlchemy are imported inside the handlers: building the parser (every
invocation, `--help`, a refused argument) must not pay for them."""
from __future__ import annotations

import sys

from tiering.cli import args as a
from tiering.cli.context import Context
from tiering.cli.output import (PAYLOAD_FORMATS, Output, document, gap_dict, iso, position_text, progress,
                                subscription_at, warnings_after)
from tiering.errors import BadInput, TieringError
from tiering.model import LedgerState
from tiering.policy import check_within_ledger


def register(sub) -> None:
    produce = sub.add_parser("produce", help="append entries to a topic (demos, benchmarks)")
    produce.set_defaults(handler=cmd_produce)
    a.name(produce)
    src = produce.add_mutually_exclusive_group(required=True)
    src.add_argument("--entries", type=a.nonneg, metavar="N", help="N deterministic payloads (needs --entry-size)")
    src.add_argument("--stdin-lines", action="store_true", help="one entry per line of standard input")
    produce.add_argument("--entry-size", type=a.size_or_zero, metavar="SIZE", help="bytes or e.g. 1KiB")
    produce.add_argument("--seed", default="demo", help="seed of the deterministic payloads (default 'demo')")
    produce.add_argument("--seal", action="store_true", help="seal the open ledger at the end")
    a.json_flag(produce)

    seal = sub.add_parser("seal", help="seal the topic's open ledger")
    seal.set_defaults(handler=cmd_seal)
    a.name(seal)
    seal.add_argument("--discard-damaged", action="store_true",
                      help="the open ledger's file has a damaged entry with intact ones after it (produce and "
                           "seal refuse it): seal the ledger before the damaged entry, discarding it and every "
                           "entry after it")
    a.json_flag(seal)

    status = sub.add_parser("status", help="every ledger of a topic: state, entries, bytes, tiers")
    status.set_defaults(handler=cmd_status)
    a.name(status)
    a.json_flag(status)

    read = sub.add_parser("read", help="read a range of a topic across tiers")
    read.set_defaults(handler=cmd_read)
    a.name(read)
    read.add_argument("--from", dest="start", type=a.position, metavar="L:E")
    read.add_argument("--to", dest="end", type=a.position, metavar="L:E")
    read.add_argument("--json", action="store_true",
                      help="JSON lines, one per entry {ledger, entry, data} (data in base64) or gap {gap, from, to}")
    read.add_argument("--format", choices=sorted(PAYLOAD_FORMATS), default=None,
                      help="how text output prints a payload: text (UTF-8, other bytes and control characters as "
                           "backslash escapes; the default), hex or base64")
    read.add_argument("--fail-on-dataloss", action="store_true", help="exit 1 instead of printing a DATALOSS gap")
    read.add_argument("--subscription", type=a.subscription_name, metavar="NAME",
                      help="read from the entry after the subscription's position")
    read.add_argument("--max-entries", type=a.positive, metavar="N", help="stop after N entries")
    read.add_argument("--ack", action="store_true",
                      help="with --subscription: acknowledge what was printed, after printing it")


def cmd_produce(ctx: Context, args, out: Output) -> int:
    from tiering.workload import payload
    from tiering.writer import MAX_ENTRY_BYTES, ManagedLedgerWriter

    if args.entries is not None and args.entry_size is None:
        raise BadInput("--entries needs --entry-size")
    if args.stdin_lines and args.entry_size is not None:
        raise BadInput("--entry-size goes with --entries, not --stdin-lines")
    if args.entry_size is not None and args.entry_size > MAX_ENTRY_BYTES:
        raise BadInput(f"--entry-size is at most {MAX_ENTRY_BYTES} bytes")
    writer = ManagedLedgerWriter(ctx.meta, ctx.tier1, args.name)  # an unknown topic fails here
    first = last = sealed = None
    count = 0
    try:
        if args.stdin_lines:
            for line in sys.stdin.buffer:
                last = writer.append(line[:-1] if line.endswith(b"\n") else line)
                first = first or last
                count += 1
        else:
            for seq in progress(range(args.entries), "produce", sys.stderr, unit="entry"):
                last = writer.append(payload(args.seed, seq, args.entry_size))
                first = first or last
                count += 1
        if args.seal:
            sealed = writer.seal() or writer.sealed_on_open
    finally:
        writer.close()
    out.result(document("produce", args.name, entry_count=count, first=position_text(first), last=position_text(last),
                        sealed_ledger=None if sealed is None else sealed.ledger_id),
               str(last) if last is not None else "nothing written")
    return 0


def cmd_seal(ctx: Context, args, out: Output) -> int:
    from tiering.writer import ManagedLedgerWriter

    writer = ManagedLedgerWriter(ctx.meta, ctx.tier1, args.name, discard_damaged=args.discard_damaged)
    try:
        sealed = writer.seal() or writer.sealed_on_open
    finally:
        writer.close()
    cut = writer.recovery.truncated_bytes if writer.recovery else 0
    gone = writer.discarded  # intact entries cut after a damaged one: (first, last at least)
    out.result(document("seal", args.name, sealed_ledger=None if sealed is None else sealed.ledger_id,
                        entry_count=0 if sealed is None else sealed.entry_count, discarded_bytes=cut,
                        discarded_entries=None if gone is None else {"from": gone[0], "to": gone[1]},
                        subscriptions_losing=[{"subscription": n, "entries": k} for n, k in writer.discard_losses]),
               (f"sealed ledger {sealed.ledger_id} ({sealed.entry_count} entries)" if sealed else "no open ledger")
               + (f"; {cut} byte(s) after its last intact entry discarded" if cut else "")
               + (f" (entries {gone[0]} to at least {gone[1]})" if gone else "")
               + "".join(f"; subscription {n!r} lost {k} entries it had not read" for n, k in writer.discard_losses))
    return 0


def ledger_status(ctx: Context, name: str) -> list[dict]:
    from tiering.read import open_ledger_now
    from tiering.tier1 import LedgerFileMissing

    rows = []
    for led in ctx.meta.list_ledgers(name):
        missing = False
        if led.state == LedgerState.OPEN:
            try:
                led = open_ledger_now(ctx.meta, ctx.tier1, led)
            except LedgerFileMissing:
                missing = True  # "0 entries" would be a guess: the row says the file is missing
        entries, size = ctx.tier1.extent(led)
        tiers = ([1] if led.tier1_present and led.state != LedgerState.DELETED else []) + \
                ([2] if led.state == LedgerState.OFFLOADED else [])
        lost = led.lost and led.state != LedgerState.DELETED  # `tiering repair` found no good copy in any tier
        unknown = missing or (lost and led.entries_unknown)  # recovery found no copy saying how many
        rows.append({"topic": name, "ledger": led.ledger_id, "state": led.state.value,
                     "entry_count": None if unknown else entries, "bytes": None if unknown else size,
                     "tiers": [] if lost or missing else tiers, "lost": lost, "tier1_file_missing": missing,
                     "sealed_at": iso(led.sealed_at), "offloaded_at": iso(led.offloaded_at)})
    return rows


def _status_table(rows: list[dict]):
    yield f"{'ledger':>8} {'state':<11} {'entries':>9} {'bytes':>12}  tiers"
    for r in rows:
        if r["tier1_file_missing"]:
            yield f"{r['ledger']:>8} {r['state']:<11} {'?':>9} {'?':>12}  - (its tier-1 file is missing: check TIERING_TIER1_ROOT)"
            continue
        entries, size = ("?", "?") if r["entry_count"] is None else (r["entry_count"], r["bytes"])
        yield (f"{r['ledger']:>8} {r['state']:<11} {entries:>9} {size:>12}  "
               f"{'LOST (no good copy)' if r['lost'] else '+'.join(map(str, r['tiers'])) or '-'}")


def cmd_status(ctx: Context, args, out: Output) -> int:
    out.listing(document("status", args.name, ledgers=ledger_status(ctx, args.name)), "ledgers", _status_table)
    return 0


def check_start(ctx: Context, topic: str, start) -> None:
    """A read's first position must be in the topic: past the end of the topic, or past the end of its ledger,
    is a mistake (exit 2), not an empty read. Its end itself is fine (nothing to print yet): one past the last
    entry of a ledger, or the next ledger's first position once the last one is sealed. A trimmed ledger
    reads as a TRIMMED gap, within its entry count."""
    from tiering.read import ledger_extent

    ledgers = ctx.meta.list_ledgers(topic)  # an unknown topic fails here
    led = next((x for x in ledgers if x.ledger_id == start.ledger_id), None)
    if led is None:
        newest = ledgers[-1] if ledgers else None
        if newest is None:  # its first ledger is the topic's next (not 0 for a topic made again under a name)
            first = ctx.meta.get_topic(topic).next_ledger_id
            if start.ledger_id < first or (start.ledger_id == first and start.entry_id == 0):
                return
        elif start.ledger_id < newest.ledger_id or (start.entry_id == 0 and newest.state != LedgerState.OPEN
                                                    and start.ledger_id == newest.ledger_id + 1):
            return
        raise BadInput(f"position {start} is beyond the end of topic {topic!r}"
                       + (f" (last ledger {newest.ledger_id})" if newest else " (no ledgers)"))
    # a trimmed ledger keeps its entry count: a position past it is past its end like any other ledger's;
    # an open one's is counted as the read counts it (its file may be gone since the listing: sealed)
    check_within_ledger(start, led, ledger_extent(ctx.meta, ctx.tier1, led)[1])


ACK_EVERY = 1000  # a long `read --ack` acknowledges as it goes, each time after flushing what it printed


def cmd_read(ctx: Context, args, out: Output) -> int:
    with warnings_after("tiering.read"):  # a tier-1 copy failing its checks, read from tier 2 instead
        return _read(ctx, args, out)


def _read(ctx: Context, args, out: Output) -> int:
    from tiering.errors import DataLossError
    from tiering.read import Gap

    start, sub = args.start, None
    if args.subscription is not None:
        from tiering.ops.subscriptions import read_from

        if args.start is not None:
            raise BadInput("--from and --subscription exclude each other (a subscription reads after its position)")
        sub = ctx.meta.subs.get(args.name, args.subscription)
        start = read_from(sub)
        if start is not None and args.end is not None and args.end < start:
            raise BadInput(f"--to {args.end} is before subscription {args.subscription!r}'s next entry {start}")
    elif args.ack:
        raise BadInput("--ack needs --subscription NAME")
    if args.format is not None and args.json:
        raise BadInput("--format is for text output (--json prints data in base64)")
    if args.start is not None:
        check_start(ctx, args.name, args.start)
    printed, last, acked, told_reset = 0, None, None, False

    def ack_printed():
        nonlocal acked, sub, told_reset
        if args.ack and last is not None and last != acked:
            from tiering.ops.subscriptions import ack

            sys.stdout.flush()  # acknowledged only once printed: a reader killed before this re-reads them
            # retention (a ceiling, an expiry) or another reader may have moved the subscription past what was
            # printed meanwhile, or an operator reset it behind where this read began: neither is bad input,
            # the subscription stays where it is
            now = ack(ctx.deps, args.name, args.subscription, last, reader=sub)
            if now.position is not None and now.position > last:
                sys.stderr.write(f"tiering: subscription {args.subscription!r} was moved to {now.position} meanwhile, "
                                 f"past the last entry printed ({last}); left there\n")
                sub = now
            elif now.position != last:
                if not told_reset:  # said once: every later ack of this read finds it so, and leaves it too
                    sys.stderr.write(f"tiering: subscription {args.subscription!r} was reset to "
                                     f"{subscription_at(now.position)} meanwhile; left there (the entries "
                                     "printed are read again from there)\n")
                told_reset = True
            else:
                sub = now
            acked = last

    try:
        # --ack never acknowledges past a DATALOSS gap: entries no tier holds now (a missing tier-1 file, a
        # lost ledger repair may bring back) were not delivered, and retain-unread must keep them; the read
        # acks what it printed before the gap and fails there (Pulsar's consumers stop likewise unless the
        # broker skips non-recoverable data); an operator who gives them up acks past them by hand
        for item in ctx.read_handle(args.fail_on_dataloss or args.ack).read(args.name, start, args.end):
            if isinstance(item, Gap):
                out.gap(gap_dict(item))
                continue
            out.entry(item.ledger_id, item.entry_id, item.data)
            last, printed = item.position, printed + 1
            if args.max_entries is not None and printed >= args.max_entries:
                break
            if printed % ACK_EVERY == 0:
                ack_printed()
    except DataLossError as exc:
        ack_printed()  # what was printed before the loss was delivered
        if args.ack:
            held = sub.position if acked is None else acked
            raise DataLossError(f"{exc}; subscription {args.subscription!r} left "
                                f"{'at ' + str(held) if held is not None else 'before the first entry'} (`tiering repair` may "
                                f"bring the entries back; `tiering subscription ack` past them gives them up)") from None
        raise
    except TieringError:
        try:  # what was printed before the failure (tier 2 down, say) was delivered: not delivered again
            ack_printed()
        except TieringError:
            pass  # the failure to report is the read's; unacknowledged, the entries are delivered again
        raise
    ack_printed()
    return 0
