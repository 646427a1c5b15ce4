"""`tiering db upgrade` and `tiering topic create|list|show`."""
from __future__ import annotations

from dataclasses import asdict

from tiering.cli import args as a
from tiering.cli.context import Context
from tiering.cli.output import Output
from tiering.model import MIB, TopicPolicy


def register(sub) -> None:
    db = sub.add_parser("db", help="schema migrations")
    db_sub = db.add_subparsers(dest="db_command", required=True, parser_class=a.Parser)
    db_sub.add_parser("upgrade", help="apply sql/migrations and recreate sql/views")
    db.set_defaults(handler=cmd_db)

    topic = sub.add_parser("topic", help="create, list and show topics")
    topic.set_defaults(handler=cmd_topic)
    t_sub = topic.add_subparsers(dest="topic_command", required=True, parser_class=a.Parser)
    create = t_sub.add_parser("create", help="create a topic with its tiering policy")
    a.name(create)
    create.add_argument("--offload-after", type=a.policy_seconds, default=-1, metavar="SECONDS",
                        help="offload sealed ledgers older than this (-1: never, 0: at once)")
    create.add_argument("--offload-threshold", type=a.policy_int, default=-1, metavar="BYTES",
                        help="offload while tier 1 holds more than this (-1: never)")
    create.add_argument("--deletion-lag", type=a.seconds, default=4 * 3600, metavar="SECONDS",
                        help="keep tier-1 copies this long after offload (default 4 h)")
    create.add_argument("--retention-time", type=a.policy_seconds, default=-1, metavar="SECONDS")
    create.add_argument("--retention-size", type=a.policy_int, default=-1, metavar="BYTES")
    create.add_argument("--rollover-entries", type=a.positive, default=50_000, metavar="N")
    create.add_argument("--rollover-bytes", type=a.positive, default=64 * MIB, metavar="BYTES")
    a.json_flag(t_sub.add_parser("list", help="every topic, by name"))
    show = t_sub.add_parser("show", help="a topic's policy and counters")
    a.name(show)
    a.json_flag(show)


def cmd_db(ctx: Context, args, out: Output) -> int:
    from tiering.metadata.migrations import upgrade  # SQLAlchemy: only for the commands that use it

    result = upgrade(ctx.engine)
    print(f"schema tiering: applied {len(result.applied)} migration(s) {', '.join(result.applied) or ''}".rstrip()
          + f"; {len(result.already)} already applied; {len(result.views)} views")
    return 0


def _topic_dict(t) -> dict:
    return {"name": t.name, "topic_id": t.topic_id, "next_ledger_id": t.next_ledger_id, "version": t.version,
            **asdict(t.policy)}


def cmd_topic(ctx: Context, args, out: Output) -> int:
    if args.topic_command == "create":
        policy = TopicPolicy(args.offload_after, args.offload_threshold, args.deletion_lag, args.retention_time,
                             args.retention_size, args.rollover_entries, args.rollover_bytes)
        t = ctx.meta.create_topic(args.name, policy)
        print(f"created topic {t.name!r}")
    elif args.topic_command == "list":
        out.rows([_topic_dict(t) for t in ctx.meta.list_topics()], lambda rows: (r["name"] for r in rows))
    else:
        t = _topic_dict(ctx.meta.get_topic(args.name))
        out.result(t, "\n".join(f"{k:24} {v}" for k, v in t.items()))
    return 0
