"""`tiering db upgrade` and `tiering topic create|set|delete|list|show`."""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from tiering.cli import args as a
from tiering.cli.context import Context
from tiering.cli.output import Output, document, iso
from tiering.errors import BadInput
from tiering.model import MIB, TopicPolicy

# (flag, policy field, argument type, metavar, help); the defaults are TopicPolicy's (shown by `create`).
# Durations: seconds or 90s/15m/4h/7d; sizes: bytes or 512KiB/64MiB/10GB/1TiB (tiering/units.py).
MIN_ROLLOVER_BYTES = 4096  # smaller: a ledger (a tier-1 file, a tier-2 object pair) per entry or two
POLICY_FLAGS = (
    ("--offload-after", "offload_after_seconds", a.policy_seconds, "DURATION",
     "offload sealed ledgers this long after their seal (e.g. 4h; -1: never, 0: at once; default -1)"),
    ("--offload-threshold", "offload_threshold_bytes", a.policy_size, "SIZE",
     "offload the oldest sealed ledgers once the topic's ledgers, newest first and in either tier, exceed this "
     "(Pulsar's rule; e.g. 10GiB; -1: never; default -1)"),
    ("--deletion-lag", "deletion_lag_seconds", a.seconds, "DURATION",
     "keep tier-1 copies this long after offload (default 4h)"),
    ("--retention-time", "retention_seconds", a.policy_seconds, "DURATION",
     "delete whole ledgers sealed longer ago than this, measured from each ledger's seal (e.g. 7d; -1: keep; "
     "default -1)"),
    ("--retention-size", "retention_bytes", a.policy_size, "SIZE",
     "delete the oldest ledgers while the topic's live ledgers without them still hold at least this (Pulsar's "
     "rule: it keeps at least this, less than this plus one ledger): every ledger not deleted, in tier 1 or "
     "tier 2, each counted once (e.g. 10GB; -1: keep; default -1)"),
    ("--max-retention-time", "max_retention_seconds", a.policy_seconds, "DURATION",
     "ceiling: delete ledgers sealed longer ago than this even when unread (-1: none; default -1)"),
    ("--max-retention-size", "max_retention_bytes", a.policy_size, "SIZE",
     "ceiling: delete the oldest ledgers, even unread, while the topic without them still holds at least this "
     "(it keeps less than this plus one ledger: --rollover-bytes bounds a ledger) (-1: none; default -1)"),
    ("--subscription-expiry", "subscription_expiry_seconds", a.expiry_seconds, "DURATION",
     "a subscription with no ack for this long is EXPIRED and holds nothing back (e.g. 7d; -1: never; "
     "default -1)"),
    ("--rollover-entries", "rollover_entries", a.positive, "N", "start a new ledger after N entries (default 50000)"),
    ("--rollover-bytes", "rollover_bytes", a.size_at_least(MIN_ROLLOVER_BYTES), "SIZE",
     f"start a new ledger after this many payload bytes (at least 4KiB; default {64 * MIB // MIB}MiB)"),
)


UNITS = ("DURATION: seconds, or a number with a unit s, m, h, d, w (90s, 15m, 4h, 7d). SIZE: bytes, or a number "
         "with a unit KiB, MiB, GiB, TiB (1024), KB, MB, GB, TB (1000) or K, M, G, T (1024): 512KiB, 64MiB, 10GB. "
         "-1 (a bare -1) disables a limit.")


def _policy_flags(p: argparse.ArgumentParser) -> None:
    for flag, field, kind, metavar, text in POLICY_FLAGS:
        p.add_argument(flag, dest=field, type=kind, default=None, metavar=metavar, help=text)
    p.add_argument("--retain-unread", dest="retain_unread", action=argparse.BooleanOptionalAction, default=None,
                   help="retention deletes a ledger only once every ACTIVE subscription has read it (ceilings "
                        "excepted); --no-retain-unread turns it off (default off)")


def _table_name(text: str) -> str:
    """`--table NAMESPACE.TABLE`, refused while parsing (exit 2) when malformed."""
    from tiering.tables.naming import parse_identifier

    try:
        parse_identifier(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _json_fields(text: str) -> dict:
    from tiering.tables.decoder import parse_fields

    try:
        return parse_fields(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _table_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--table", type=_table_name, default=None, metavar="NAMESPACE.TABLE",
                   help="sync the topic's sealed ledgers to this Iceberg table (DAG tiering_table_sync, "
                        "`tiering table sync`)")
    p.add_argument("--table-json-fields", type=_json_fields, default=None, metavar="NAME:TYPE[,...]",
                   help="decode JSON payloads into these nullable columns (types: string, int64, double, boolean, "
                        "timestamp); entries that do not decode also go to NAMESPACE.TABLE__dlq with the reason; "
                        "a change may only add fields")
    p.add_argument("--table-retention", choices=("keep", "follow"), default=None,
                   help="follow: ledgers retention or truncate delete are deleted from the table too (default); "
                        "keep: they stay in the table")


def _table_change(ctx: Context, args, out: dict):
    """The topic's table policy change as `then(conn, topic)` for the transaction that creates the topic or
    changes its policy (one refusal undoes both), when --table, --table-retention or --table-json-fields was
    given, else None; `out["table"]` receives the table's row."""
    if args.table is None and args.table_retention is None and args.table_json_fields is None:
        return None
    from tiering.metadata.table_sync import TableRows
    from tiering.tables.decoder import check_change

    def check_rename(old: str, t) -> None:
        from tiering.tables.catalog import catalog
        from tiering.tables.marks import check_renamable

        check_renamable(catalog(ctx.settings), old, t.name, t.topic_id)

    def change(conn, t) -> None:
        s = TableRows(ctx.engine).apply(conn, t, args.table, args.table_retention, args.table_json_fields,
                                        check_change, check_rename=check_rename)
        out["table"] = {"identifier": s.identifier, "retention": s.retention, "decoder": s.decoder,
                        "version": s.version}
    return change


def _given(args) -> dict:
    fields = [f for _, f, *_ in POLICY_FLAGS] + ["retain_unread"]
    return {f: getattr(args, f) for f in fields if getattr(args, f) is not None}


def register(sub) -> None:
    db = sub.add_parser("db", help="schema migrations")
    db_sub = db.add_subparsers(dest="db_command", required=True, parser_class=a.Parser)
    db_sub.add_parser("upgrade", help="apply sql/migrations and recreate sql/views")
    db.set_defaults(handler=cmd_db)

    topic = sub.add_parser("topic", help="create, change, delete, list and show topics")
    topic.set_defaults(handler=cmd_topic)
    t_sub = topic.add_subparsers(dest="topic_command", required=True, parser_class=a.Parser)
    create = t_sub.add_parser("create", help="create a topic with its tiering policy", description=UNITS)
    a.name(create, new=True)
    _policy_flags(create)
    _table_flags(create)
    a.json_flag(create)
    change = t_sub.add_parser("set", help="change a topic's policy (compare-and-set on its version)",
                              description=UNITS)
    a.name(change)
    _policy_flags(change)
    _table_flags(change)
    change.add_argument("--expect-version", type=a.nonneg, default=None, metavar="N",
                        help="refuse unless the topic is still at this version (from `topic show`)")
    a.json_flag(change)
    drop = t_sub.add_parser("delete", help="delete a topic, its ledgers in both tiers and its subscriptions")
    a.name(drop)
    drop.add_argument("--force", action="store_true", help="delete it even while ACTIVE subscriptions read it")
    drop.add_argument("--dry-run", action="store_true",
                      help="say what the delete would remove (the same refusals); write nothing")
    a.json_flag(drop)
    a.json_flag(t_sub.add_parser("list", help="every topic, by name"))
    show = t_sub.add_parser("show", help="a topic's policy and counters")
    a.name(show)
    a.json_flag(show)
    stats = t_sub.add_parser("stats", help="per topic: ledgers and bytes per tier and state, offload backlog, "
                                           "lagged copies, GC queue, oldest ledger, last successful runs")
    stats.add_argument("name", nargs="?", type=a.topic_name, metavar="TOPIC", help="one topic only")
    a.json_flag(stats)


def cmd_db(ctx: Context, args, out: Output) -> int:
    from tiering.metadata.migrations import upgrade  # SQLAlchemy: only for the commands that use it

    result = upgrade(ctx.engine)
    print(f"schema tiering: applied {len(result.applied)} migration(s) {', '.join(result.applied) or ''}".rstrip()
          + f"; {len(result.already)} already applied; {len(result.views)} views")
    return 0


def _table_free(ctx: Context, identifier: str, topic: str | None = None) -> None:
    from tiering.metadata.table_sync import TableRows

    owner = TableRows(ctx.engine).owner(identifier)
    if owner is not None and owner != topic:
        raise BadInput(f"table {identifier!r} is already the table of topic {owner!r}")


def _topic_dict(t) -> dict:
    return {"topic": t.name, "topic_id": t.topic_id, "next_ledger_id": t.next_ledger_id, "version": t.version,
            **asdict(t.policy)}


def _stats_doc(ctx: Context, name: str | None) -> dict:
    from tiering.metadata.stats import topic_stats

    rows, common = topic_stats(ctx.engine, name)
    if name is not None and not rows:
        ctx.meta.get_topic(name)  # the one-line "does not exist", exit 2
    topics = []
    for r in rows:
        oldest = r.pop("oldest_created_at")
        r["oldest_ledger_age_seconds"] = None if oldest is None else round((common["now"] - oldest).total_seconds(), 3)
        r["oldest_ledger_created_at"] = iso(oldest)
        topics.append({k: iso(v) if k.endswith("_at") else v for k, v in r.items()})
    gc = {"pending_count": common["gc_pending_count"], "due_count": common["gc_due_count"],
          "failed_count": common["gc_failed_count"]}
    return document("topic stats", name, topics=topics, gc_queue=gc,
                    last_success_by_job=dict(sorted(common["last_success"].items())))


def _stats_text(doc: dict):
    for t in doc["topics"]:
        yield (f"{t['topic']}: {t['live_count']} live ledger(s) ({t['open_count']} open, {t['sealed_count']} sealed, "
               f"{t['offloading_count']} offloading, {t['offloaded_count']} offloaded), {t['deleted_count']} deleted; "
               f"{t['live_entry_count']} entries, {t['live_bytes']} bytes"
               + (f"; {t['lost_count']} LOST (no good copy: reads give its DATALOSS gap)" if t["lost_count"] else ""))
        yield (f"  tier 1: {t['tier1_count']} ledger(s), {t['tier1_bytes']} bytes; tier 2: {t['tier2_count']} "
               f"ledger(s), {t['tier2_bytes']} bytes ({t['tier2_stored_bytes']} stored)")
        yield (f"  offload backlog: {t['backlog_count']} ledger(s), {t['backlog_bytes']} bytes "
               f"({t['backlog_offloading_count']} offloading); lagged tier-1 copies: {t['lagged_count']} "
               f"({t['lagged_bytes']} bytes, {t['lagged_due_count']} due)")
        age = t["oldest_ledger_age_seconds"]
        yield (f"  oldest live ledger: " + ("none" if t["oldest_ledger"] is None else
               f"{t['oldest_ledger']}, created {t['oldest_ledger_created_at']} ({age:.0f} s ago)")
               + f"; {t['subscription_count']} subscription(s)")
    gc = doc["gc_queue"]
    yield f"gc queue (all topics): {gc['pending_count']} pending, {gc['due_count']} due, {gc['failed_count']} failed"
    runs = doc["last_success_by_job"]
    yield "last successful runs: " + (", ".join(f"{k} {v}" for k, v in runs.items()) or "none")


def cmd_topic(ctx: Context, args, out: Output) -> int:
    if args.topic_command == "create":
        if (args.table_retention is not None or args.table_json_fields is not None) and args.table is None:
            raise BadInput("--table-retention and --table-json-fields need --table")
        if args.table is not None:
            _table_free(ctx, args.table)  # the usual refusal, before anything is done
        made: dict = {}
        t = ctx.meta.create_topic(args.name, TopicPolicy(**_given(args)), then=_table_change(ctx, args, made))
        table = made.get("table")
        out.result(document("topic create", **_topic_dict(t), **({"table": table} if table else {})),
                   f"created topic {t.name!r}" + (f" with table {table['identifier']!r}" if table else ""))
    elif args.topic_command == "set":
        from tiering.ops.topics import set_policy

        if not _given(args) and args.table is None and args.table_retention is None \
                and args.table_json_fields is None:
            raise BadInput("topic set needs at least one policy option (see `tiering topic set --help`)")
        if args.table is not None:
            _table_free(ctx, args.table, args.name)
        made: dict = {}
        change = _table_change(ctx, args, made)
        # one transaction: a refused table change leaves the policy unchanged; every change, a table-only one
        # too, moves the topic's version, so --expect-version detects any change made since it was read
        t = set_policy(ctx.deps, args.name, _given(args), args.expect_version, then=change)
        table = made.get("table")
        out.result(document("topic set", **_topic_dict(t), **({"table": table} if table else {})),
                   f"updated topic {t.name!r}: version {t.version}"
                   + (f"; table {table['identifier']!r} (retention {table['retention']})" if table else ""))
    elif args.topic_command == "delete":
        from tiering.metadata.table_sync import WAIT_SECONDS
        from tiering.ops.topics import delete_topic

        def waiting() -> None:  # on a terminal only, as progress bars are: stderr stays one line otherwise
            if sys.stderr.isatty():
                print(f"tiering: topic delete waits for a sync or maintenance of the Iceberg table of topic "
                      f"{args.name!r} to end (up to {WAIT_SECONDS:g} s)", file=sys.stderr, flush=True)

        r = delete_topic(ctx.deps, args.name, args.force, args.dry_run, on_wait=waiting)
        result = document("topic delete", r.topic, subscriptions_deleted=r.subscriptions_deleted,
                          deleted_count=r.ledgers_deleted, bytes=r.bytes, files_removed_count=r.files_removed,
                          finished_elsewhere=r.finished_elsewhere, **a.preview_fields(args))
        what = (f"{r.ledgers_deleted} ledger(s) ({r.bytes} bytes), {r.files_removed} tier-1 file(s), "
                f"{len(r.subscriptions_deleted)} subscription(s)")
        out.result(result, f"would delete topic {r.topic!r}: {what}; nothing written" if args.dry_run else
                   f"deleted topic {r.topic!r}: {what} deleted"
                   + (" by this run; another delete of it ran at the same time and finished it"
                      if r.finished_elsewhere else "")
                   + ("; its tier-2 objects are queued for gc" if r.tier2_ledgers else ""))
    elif args.topic_command == "list":
        doc = document("topic list", None, topics=[_topic_dict(t) for t in ctx.meta.list_topics()])
        out.listing(doc, "topics", lambda rows: (r["topic"] for r in rows))
    elif args.topic_command == "stats":
        doc = _stats_doc(ctx, args.name)
        out.result(doc, "\n".join(_stats_text(doc)))
    else:
        t = _topic_dict(ctx.meta.get_topic(args.name))
        out.result(document("topic show", **t), "\n".join(f"{k:28} {v}" for k, v in t.items()))
    return 0
