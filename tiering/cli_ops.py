"""Pipeline commands of `tiering`: the operations the Spark jobs run, by hand (same functions in
tiering/ops), each printing a one-line summary or, with --json, one JSON object; exit 1 with the first
error on one stderr line when an item failed."""
from __future__ import annotations

import hashlib
import struct
import sys
from dataclasses import asdict
from datetime import timedelta

from tiering.cli import error, print_json
from tiering.cli_commands import Context, NoBar, gap_dict, progress_bar, read_handle, tier2_opener
from tiering.errors import CorruptObjectError, DataLossError, EntryNotFound, LedgerStorageError, TieringError


def _check_topic(ctx: Context, topic: str | None) -> None:
    """`--topic NAME` must name a topic (a misspelt name would otherwise quietly do nothing)."""
    if topic is not None:
        ctx.meta.get_topic(topic)


def _emit(args, result: dict, human: str) -> None:
    print_json(result) if args.json else print(human)


def _fail(count: int, what: str, first: str) -> int:
    error(f"{count} {what} failed; first: {first}")
    return 1


def _pairs(items) -> list[dict]:
    return [{"topic": t, "ledger": i} for t, i in items]


# ------------------------------------------------------------------------------------------------ offload
def cmd_offload_prefix(ctx: Context, args) -> int:
    from tiering import policy
    from tiering.ops.offload import offload_prefix

    ledgers = ctx.meta.list_ledgers(args.name)  # an unknown topic fails here, before anything is written
    bar = progress_bar("offload-prefix", len(policy.offload_prefix(ledgers, args.position)), "ledger") \
        if sys.stderr.isatty() else NoBar()
    report, first = offload_prefix(ctx.deps, args.name, args.position,
                                   hook=lambda step: bar.update(1) if step == "index" else None)
    bar.close()
    result = {"command": "offload-prefix", "topic": args.name, "position": str(args.position),
              "offloaded": report.offloaded, "skipped": report.skipped, "failed": report.failed,
              "bytes": report.bytes, "first_not_offloaded": str(first)}
    _emit(args, result, f"offloaded {len(report.offloaded)} ledger(s) ({report.bytes} bytes), skipped "
                        f"{len(report.skipped)}, failed {len(report.failed)}; first position not offloaded: {first}")
    if report.first_error:
        return _fail(len(report.failed), "ledger(s)", report.first_error)
    return 0


def cmd_offload_by(ctx: Context, args) -> int:
    from tiering.ops.offload import offload_many, plan_offload

    by = args.command.rsplit("-", 1)[1]
    _check_topic(ctx, args.topic)
    ledgers = plan_offload(ctx.deps, by, args.topic)
    by_topic: dict[str, list] = {}
    for led in ledgers:
        by_topic.setdefault(led.topic, []).append(led)
    bar = progress_bar(f"offload by {by}", sum(led.size_bytes for led in ledgers), "B")
    offloaded, skipped, failed, nbytes = [], [], [], 0
    for topic, leds in by_topic.items():
        report = offload_many(ctx.deps, leds, on_done=lambda done: bar.update(done.size_bytes))
        offloaded += [(topic, i) for i in report.offloaded]
        skipped += [(topic, i) for i in report.skipped]
        failed += [{"topic": topic, "ledger": i, "error": msg} for i, msg in report.failed.items()]
        nbytes += report.bytes
    bar.close()
    result = {"command": args.command, "topic": args.topic, "planned": len(ledgers), "offloaded": _pairs(offloaded),
              "skipped": _pairs(skipped), "failed": failed, "bytes": nbytes}
    _emit(args, result, f"offload by {by}: {len(ledgers)} planned; offloaded {len(offloaded)} ledger(s) "
                        f"({nbytes} bytes), skipped {len(skipped)}, failed {len(failed)}")
    if failed:
        f = failed[0]
        return _fail(len(failed), "ledger(s)", f"topic {f['topic']!r} ledger {f['ledger']}: {f['error']}")
    return 0


# ------------------------------------------------------------------------------- tier-1 copies, retention
def cmd_delete_lagged(ctx: Context, args) -> int:
    from tiering.ops.delete_lagged import delete_lagged

    _check_topic(ctx, args.topic)
    report = delete_lagged(ctx.deps, args.topic)
    result = {"command": "delete-lagged", "topic": args.topic, "deleted": _pairs(report.deleted),
              "skipped": _pairs(report.skipped), "bytes": report.bytes,
              "failed": [{"topic": t, "ledger": i, "error": e} for t, i, e in report.failed]}
    _emit(args, result, f"deleted {len(report.deleted)} tier-1 cop(ies) ({report.bytes} bytes); skipped "
                        f"{len(report.skipped)} that changed meanwhile; kept {len(report.failed)} that failed")
    if report.failed:
        return _fail(len(report.failed), "ledger(s)", report.failed[0][2])
    return 0


def _retention_result(args, report) -> dict:
    return {"command": args.command, "topic": getattr(args, "topic", None) or getattr(args, "name", None),
            "deleted": _pairs(report.deleted), "files_removed": report.files_removed, "bytes": report.bytes}


def cmd_retention(ctx: Context, args) -> int:
    from tiering.ops.retention import retention

    _check_topic(ctx, args.topic)
    report = retention(ctx.deps, args.topic)
    _emit(args, _retention_result(args, report),
          f"retention: deleted {len(report.deleted)} ledger(s) ({report.bytes} bytes), removed "
          f"{report.files_removed} tier-1 file(s); their tier-2 objects are queued for gc")
    return 0


def cmd_truncate(ctx: Context, args) -> int:
    from tiering.ops.retention import truncate

    report = truncate(ctx.deps, args.name, args.position)  # unknown topic, position past the end: exit 2
    result = {**_retention_result(args, report), "position": str(args.position)}
    _emit(args, result, f"truncated {args.name!r} before {args.position}: deleted {len(report.deleted)} ledger(s) "
                        f"({report.bytes} bytes), removed {report.files_removed} tier-1 file(s); their tier-2 "
                        f"objects are queued for gc")
    return 0


# --------------------------------------------------------------------------------------------- defrag, gc
def cmd_defrag(ctx: Context, args) -> int:
    from tiering.ops.defrag import DefragReport, merge_group, plan_defrag

    _check_topic(ctx, args.topic)
    groups = plan_defrag(ctx.deps, args.topic, args.small_bytes, args.max_merged_bytes)
    report = DefragReport()
    bar = progress_bar("defrag", sum(g.data_bytes for g in groups), "B")
    for group in groups:  # as ops.defrag.defrag, but a failing group does not stop the others
        try:
            merge_group(ctx.deps, group, report)
        except TieringError as exc:
            first, last = group.ledgers[0], group.ledgers[-1]
            report.errors.append(f"topic {first.topic!r} ledgers {first.ledger_id}..{last.ledger_id}: {exc}")
        bar.update(group.data_bytes)
    bar.close()
    result = {"command": "defrag", "topic": args.topic, "planned_groups": len(groups), **asdict(report)}
    _emit(args, result, f"defrag: merged {report.groups} group(s) of {report.ledgers} ledger(s), "
                        f"{report.objects_before} object(s) -> {report.objects_after}; "
                        f"{report.bytes_copied_server_side} bytes copied server-side, {report.bytes_downloaded} "
                        f"downloaded; {report.lost_races} lost race(s), {len(report.errors)} failed")
    if report.errors:
        return _fail(len(report.errors), "group(s)", report.errors[0])
    return 0


def cmd_gc(ctx: Context, args) -> int:
    from tiering.ops.gc import run_gc

    grace = None if args.orphan_grace_seconds is None else timedelta(seconds=args.orphan_grace_seconds)
    report = run_gc(ctx.deps, orphan_grace=grace)
    result = {"command": "gc", "deleted": len(report.deleted), "still_referenced": report.still_referenced,
              "retried": report.retried, "failed": report.failed, "orphans_deleted": len(report.orphans_deleted),
              "uploads_aborted": report.uploads_aborted}
    _emit(args, result, f"gc: deleted {len(report.deleted)} queued object(s), {len(report.orphans_deleted)} "
                        f"orphan(s), aborted {report.uploads_aborted} stale upload(s); {report.still_referenced} "
                        f"still referenced, {report.retried} to retry, {report.failed} failed for good")
    if report.retried or report.failed:
        error(f"{report.retried + report.failed} queued object(s) could not be deleted from S3 "
              f"({report.failed} marked FAILED after their last attempt)")
        return 1
    return 0


# ------------------------------------------------------------------------------------------------- verify
_MAX_ENTRY = 2**62
_FRAME = struct.Struct(">qq")


class _Scan:
    """Entries of one ledger read in order: count, bytes, a digest, gaps, and whether ids were contiguous."""

    def __init__(self):
        self.entries = self.bytes = 0
        self.digest = hashlib.blake2b(digest_size=16)
        self.gaps: list = []
        self.problem: str | None = None

    def add(self, entry_id: int, data: bytes, bar) -> None:
        if entry_id != self.entries and self.problem is None:
            self.problem = f"entry {entry_id} came where entry {self.entries} was expected"
        self.entries += 1
        self.bytes += len(data)
        self.digest.update(_FRAME.pack(entry_id, len(data)))
        self.digest.update(data)
        bar.update(1)


def cmd_verify(ctx: Context, args) -> int:
    """Read every ledger as readers do (tier 1 while its copy exists, else tier 2) and, for an offloaded
    ledger that still has its tier-1 copy, its tier-2 copy too; compare counts, bytes and contents."""
    from tiering.model import LedgerState, Position
    from tiering.read import DATALOSS, Gap

    ledgers = ctx.meta.list_ledgers(args.name)
    opener = tier2_opener(ctx)
    handle = read_handle(ctx, opener=opener)
    live = [led for led in ledgers if led.state != LedgerState.DELETED]
    bar = progress_bar("verify", sum(led.entry_count for led in live), "entry")
    gaps, problems, entries, nbytes, tier2_checked, no_pages = [], [], 0, 0, 0, []
    for led in ledgers:
        scan = _Scan()
        try:
            for item in handle.read(args.name, Position(led.ledger_id, 0), Position(led.ledger_id, _MAX_ENTRY)):
                if isinstance(item, Gap):
                    scan.gaps.append(item)
                else:
                    scan.add(item.entry_id, item.data, bar)
        except (DataLossError, CorruptObjectError, EntryNotFound, LedgerStorageError) as exc:
            problems.append(f"ledger {led.ledger_id}: {exc}")
            continue
        for gap in scan.gaps:
            if gap.kind == DATALOSS:
                problems.append(f"ledger {led.ledger_id}: entries {gap.start}..{gap.end} are in no tier (DATALOSS)")
            _add_gap(gaps, gap)
        if scan.problem:
            problems.append(f"ledger {led.ledger_id}: {scan.problem}")
        entries += scan.entries
        nbytes += scan.bytes
        if led.state == LedgerState.OFFLOADED and not _has_page_index(ctx, opener, led, problems):
            no_pages.append(led.ledger_id)
        if led.state in (LedgerState.OPEN, LedgerState.DELETED) or scan.gaps:
            continue
        if (scan.entries, scan.bytes) != (led.entry_count, led.size_bytes):
            problems.append(f"ledger {led.ledger_id}: read {scan.entries} entries ({scan.bytes} bytes), metadata "
                            f"says {led.entry_count} ({led.size_bytes} bytes)")
            continue
        if led.state == LedgerState.OFFLOADED and led.tier1_present and led.entry_count:
            tier2_checked += 1
            problem = _check_tier2(ctx, opener, led, scan)
            if problem:
                problems.append(f"ledger {led.ledger_id}: tier-2 copy: {problem}")
    bar.close()
    ok = not problems
    result = {"command": "verify", "topic": args.name, "ledgers": len(ledgers), "entries": entries, "bytes": nbytes,
              "tier2_copies_checked": tier2_checked, "no_page_index": no_pages, "gaps": [gap_dict(g) for g in gaps], "problems": problems,
              "ok": ok}
    kinds = ", ".join(f"{g['gap']} {g['from']}..{g['to']}" for g in result["gaps"][:5])
    _emit(args, result, f"verified {args.name!r}: {len(ledgers)} ledger(s), {entries} entries, {nbytes} bytes, "
                        f"{tier2_checked} tier-2 cop(ies) compared, {len(gaps)} gap(s)"
                        f"{' (' + kinds + ')' if gaps else ''}"
                        + (f", {len(no_pages)} ledger(s) with no page index (offloaded before page checksums: "
                           f"framing checked, bytes not)" if no_pages else "")
                        + f"; {'OK' if ok else f'{len(problems)} problem(s)'}")
    if problems:
        return _fail(len(problems), "check(s) of " + repr(args.name), problems[0])
    return 0


def _add_gap(gaps: list, gap) -> None:
    """Merge a gap into the previous one when they are of the same kind and adjacent ledgers."""
    from tiering.read import Gap

    prev = gaps[-1] if gaps else None
    if prev is not None and prev.kind == gap.kind and prev.end.ledger_id + 1 >= gap.start.ledger_id:
        gaps[-1] = Gap(gap.kind, prev.start, gap.end)
    else:
        gaps.append(gap)


def _has_page_index(ctx: Context, opener, led, problems: list) -> bool:
    """Whether the ledger's tier-2 index carries page checksums (the index is cached by the read above)."""
    chunk = ctx.meta.get_chunk(led)
    if chunk is None:
        return True  # reported elsewhere
    try:
        return opener(led, chunk).index().pages is not None
    except (CorruptObjectError, DataLossError) as exc:
        if not any(str(exc) in p for p in problems):
            problems.append(f"ledger {led.ledger_id}: {exc}")
        return True


def _check_tier2(ctx: Context, opener, led, scan: _Scan) -> str | None:
    chunk = ctx.meta.get_chunk(led)
    if chunk is None:
        return "metadata has no chunk for an offloaded ledger"
    other = _Scan()
    try:
        for entry_id, data in opener(led, chunk).iter_entries(0, led.entry_count - 1):
            other.add(entry_id, data, NoBar())
    except (DataLossError, CorruptObjectError, EntryNotFound) as exc:
        return str(exc)
    if other.problem:
        return other.problem
    if (other.entries, other.bytes, other.digest.digest()) != (scan.entries, scan.bytes, scan.digest.digest()):
        return f"differs from the tier-1 copy ({other.entries} entries, {other.bytes} bytes)"
    return None


HANDLERS = {"offload-prefix": cmd_offload_prefix, "offload-by-age": cmd_offload_by, "offload-by-size": cmd_offload_by,
            "delete-lagged": cmd_delete_lagged, "retention": cmd_retention, "truncate": cmd_truncate,
            "defrag": cmd_defrag, "gc": cmd_gc, "verify": cmd_verify}
