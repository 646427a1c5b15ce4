"""Metadata commands of `tiering`: export-metadata, import-metadata, recover-from-bucket (the same code the
`tiering_metadata_export` job and a disaster recovery use).

tiering.ops is imported inside the handlers (pyarrow, boto3, SQLAlchemy): building the parser must not pay
for them."""
from __future__ import annotations

import argparse

from tiering.cli import args as a
from tiering.cli.context import Context
from tiering.cli.output import Output, document, error, iso, ledger_refs
from tiering.errors import BadInput
from tiering.model import check_export_location


def register(sub) -> None:
    exp = sub.add_parser("export-metadata", help="Parquet snapshot of the metadata tables (manifest last)")
    exp.set_defaults(handler=cmd_export_metadata)
    exp.add_argument("dest", metavar="DEST", help="s3://bucket/path or a local directory")
    exp.add_argument("--overwrite", action="store_true", help="replace an existing export at DEST")
    a.json_flag(exp)
    imp = sub.add_parser("import-metadata", help="restore an export into an empty schema (all or nothing)")
    imp.set_defaults(handler=cmd_import_metadata)
    imp.add_argument("source", metavar="SOURCE", help="s3://bucket/path or a local directory")
    imp.add_argument("--other-bucket", action="store_true",
                     help="import an export of a store whose tier 2 was another bucket (its objects copied to "
                          "TIERING_BUCKET under the same keys)")
    a.json_flag(imp)
    rec = sub.add_parser("recover-from-bucket",
                         help="rebuild the metadata of a lost database from the bucket's index objects and tier 1")
    rec.set_defaults(handler=cmd_recover_from_bucket)
    rec.add_argument("--topic", type=a.topic_name, metavar="NAME", help="only this topic")
    rec.add_argument("--check-pages", action="store_true",
                     help="also download every data object and check its page CRC32Cs, and read every entry of "
                          "each sealed tier-1 file it would adopt, so a corrupt copy is not recovered (reads the "
                          "whole bucket; off by default: reads check pages anyway)")
    rec.add_argument("--skip-page-check", action="store_true", help=argparse.SUPPRESS)  # the old default's opt-out
    rec.add_argument("--concurrency", type=_concurrency, default=16, metavar="N",
                     help="index objects read at once, 1 to 256 (default 16)")
    a.dry_run_flag(rec)
    a.json_flag(rec)


def _concurrency(text: str) -> int:
    value = a.positive(text)
    if value > 256:  # threads, each with an S3 connection
        raise argparse.ArgumentTypeError(f"{value} is too many (at most 256)")
    return value


def _location(ctx: Context, url: str):
    from tiering.ops.export_metadata import filesystem_for

    return filesystem_for(check_export_location(url, ctx.settings.bucket, ctx.settings.prefix), ctx.settings)


def cmd_export_metadata(ctx: Context, args, out: Output) -> int:
    from tiering.ops.export_metadata import export_metadata

    fs, base = _location(ctx, args.dest)
    manifest = export_metadata(ctx.engine, fs, base, overwrite=args.overwrite, bucket=ctx.settings.bucket)
    out.result(document("export-metadata", None, dest=args.dest, exported_at=iso(manifest.exported_at),
                        row_count=sum(manifest.row_counts.values()), row_counts=manifest.row_counts),
               f"exported {sum(manifest.row_counts.values())} rows to {args.dest} "
               f"({', '.join(f'{t} {n}' for t, n in manifest.row_counts.items())})")
    return 0


def cmd_import_metadata(ctx: Context, args, out: Output) -> int:
    from tiering.ops.import_metadata import import_metadata

    fs, base = _location(ctx, args.source)
    report = import_metadata(ctx.engine, fs, base, bucket=ctx.settings.bucket, other_bucket=args.other_bucket,
                             store_bucket=ctx.bucket)
    out.result(document("import-metadata", None, source=args.source, exported_at=iso(report.exported_at),
                        row_count=sum(report.rows.values()), row_counts=report.rows),
               f"imported {sum(report.rows.values())} rows exported at {report.exported_at} from {args.source}")
    return 0


# What the bucket and tier 1 cannot tell: said in every recovery's output so an operator knows what to redo.
NOT_RECOVERED = ("subscriptions and their positions (recreate them: tiering subscription create TOPIC NAME --from "
                 "L:E), topic policies (new topics get the defaults: tiering topic set TOPIC ...) and Iceberg "
                 "tables (record each again: tiering topic set TOPIC --table NS.NAME; the next table sync rebuilds "
                 "it from the retained log)")


def cmd_recover_from_bucket(ctx: Context, args, out: Output) -> int:
    from tiering.ops.recover import recover_from_bucket, unnamed_dirs_error

    if args.check_pages and args.skip_page_check:
        raise BadInput("--check-pages and --skip-page-check contradict each other")
    report = recover_from_bucket(ctx.engine, ctx.bucket, args.topic, check_pages=args.check_pages,
                                 tier1=ctx.tier1, concurrency=args.concurrency, dry_run=args.dry_run)
    result = document("recover-from-bucket", args.topic, topics_created=report.topics_created,
                      ledgers_recovered_count=len(report.ledgers_recovered), pages_checked=report.pages_checked,
                      without_page_index_count=report.without_page_index,
                      already_known_count=len(report.already_known), ignored_count=len(report.ignored),
                      tier1_adopted_count=len(report.tier1_adopted), tier1_sealed_count=len(report.tier1_sealed),
                      tier1_copies_recorded_count=len(report.tier1_copies_recorded),
                      tier1_copies_gone_count=len(report.tier1_copies_gone),
                      tier1_ignored=[f"{what}: {why}" for what, why in report.tier1_ignored],
                      unnamed_tier1_dirs=report.unnamed_tier1_dirs,
                      unknown={t: [list(r) for r in rs] for t, rs in report.unknown.items()},
                      lost_recorded=ledger_refs(report.lost_recorded), lost_recorded_count=len(report.lost_recorded),
                      chunks_moved=ledger_refs(report.chunks_moved), chunks_moved_count=len(report.chunks_moved),
                      errors=report.errors,
                      not_recovered=NOT_RECOVERED, **a.preview_fields(args))
    out.result(result, a.would(args, f"recovered {len(report.ledgers_recovered)} offloaded ledger(s) from the bucket and "
                       f"{len(report.tier1_adopted)} sealed ledger(s) from tier 1 ({len(report.tier1_sealed)} "
                       f"sealed now), {len(report.tier1_copies_recorded)} tier-1 copie(s) recorded, "
                       f"{len(report.tier1_copies_gone)} recorded gone, "
                       f"{len(report.lost_recorded)} ledger(s) with no copy left recorded lost, "
                       f"{len(report.chunks_moved)} moved to another copy (off objects gone, or lost on a damaged one), "
                       f"{len(report.topics_created)} new topic(s); {len(report.already_known)} already known, "
                       f"{len(report.ignored)} object(s) and {len(report.tier1_ignored)} tier-1 file(s) ignored, "
                       f"{len(report.errors)} error(s); pages "
                       + ("checked" + (f" ({report.without_page_index} copie(s) with no page index)"
                                       if report.without_page_index else "") if report.pages_checked
                          else "not checked (--check-pages)")
                       + (f"; tier-1 directories of unnamed topics: {', '.join(report.unnamed_tier1_dirs)}"
                          if report.unnamed_tier1_dirs else "")
               + f"; not recoverable from the bucket: {NOT_RECOVERED}"))
    if report.errors:
        error(f"{len(report.errors)} error(s); first: {report.errors[0]} (rerun to finish)")
        return 1
    if report.unnamed_tier1_dirs and not args.dry_run:
        error(unnamed_dirs_error(report.unnamed_tier1_dirs))
        return 1
    return 0
