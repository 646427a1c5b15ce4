"""Metadata commands of `tiering`: export-metadata, import-metadata, recover-from-bucket (the same code the
`tiering_metadata_export` job and a disaster recovery use)."""
from __future__ import annotations

from tiering.cli import print_json
from tiering.cli_commands import Context
from tiering.errors import BadInput


def _location(ctx: Context, url: str):
    from urllib.parse import urlsplit

    from tiering.ops.export_metadata import filesystem_for

    parts = urlsplit(url)
    key = parts.path.lstrip("/") + "/"
    if parts.scheme in ("s3", "s3a") and parts.netloc == ctx.settings.bucket and key.startswith(ctx.settings.prefix):
        raise BadInput(f"{url} is under the tier-2 prefix {ctx.settings.prefix!r}, which GC's orphan sweep owns")
    return filesystem_for(url, ctx.settings)


def cmd_export_metadata(ctx: Context, args) -> int:
    from tiering.ops.export_metadata import export_metadata

    fs, base = _location(ctx, args.dest)
    manifest = export_metadata(ctx.engine, fs, base, overwrite=args.overwrite)
    result = {"dest": args.dest, "exported_at": manifest.exported_at, "rows": manifest.row_counts}
    if args.json:
        print_json(result)
    else:
        print(f"exported {sum(manifest.row_counts.values())} rows to {args.dest} "
              f"({', '.join(f'{t} {n}' for t, n in manifest.row_counts.items())})")
    return 0


def cmd_import_metadata(ctx: Context, args) -> int:
    from tiering.ops.import_metadata import import_metadata

    fs, base = _location(ctx, args.source)
    report = import_metadata(ctx.engine, fs, base)
    if args.json:
        print_json({"source": args.source, "rows": report.rows, "exported_at": report.exported_at})
    else:
        print(f"imported {sum(report.rows.values())} rows exported at {report.exported_at} from {args.source}")
    return 0


def cmd_recover_from_bucket(ctx: Context, args) -> int:
    from tiering.ops.recover import recover_from_bucket

    report = recover_from_bucket(ctx.engine, ctx.bucket, args.topic, check_pages=not args.skip_page_check)
    result = {"topics_created": report.topics_created, "ledgers_recovered": len(report.ledgers_recovered),
              "without_page_index": report.without_page_index,
              "already_known": len(report.already_known), "ignored": len(report.ignored),
              "unknown": {t: [list(r) for r in rs] for t, rs in report.unknown.items()}, "errors": report.errors}
    if args.json:
        print_json(result)
    else:
        print(f"recovered {len(report.ledgers_recovered)} ledger(s) of {len(report.topics_created)} new topic(s); "
              f"{len(report.already_known)} already known, {len(report.ignored)} object(s) ignored, "
              f"{len(report.errors)} error(s)" + (f"; {report.without_page_index} copie(s) with no page index "
                                                  "(bytes not checked)" if report.without_page_index else ""))
    if report.errors:
        from tiering.cli import error

        error(f"{len(report.errors)} object(s) could not be read; first: {report.errors[0]} (rerun to finish)")
        return 1
    return 0


HANDLERS = {"export-metadata": cmd_export_metadata, "import-metadata": cmd_import_metadata,
            "recover-from-bucket": cmd_recover_from_bucket}
