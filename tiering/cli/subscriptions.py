"""`tiering subscription create|ack|list|delete`: named reader positions of a topic (tiering/ops/subscriptions.py)."""
from __future__ import annotations

import argparse

from tiering.cli import args as a
from tiering.cli.context import Context
from tiering.cli.output import Output, document, error, iso, position_text, subscription_at


def _start(text: str) -> str:
    if text in ("earliest", "latest"):
        return text
    a.position(text)  # L:E, or one line naming what is expected
    return text


def _acked(text: str):
    """L:E, or `earliest`: nothing read (the next read starts at the topic's head), with --reset only."""
    return None if text == "earliest" else a.position(text)


def subscription_name(p: argparse.ArgumentParser, new: bool = False) -> None:
    p.add_argument("subscription", type=a.new_subscription_name if new else a.subscription_name, metavar="NAME")


def register(sub) -> None:
    s = sub.add_parser("subscription", help="named reader positions: create, ack, list, delete")
    s.set_defaults(handler=cmd_subscription)
    s_sub = s.add_subparsers(dest="subscription_command", required=True, parser_class=a.Parser)
    create = s_sub.add_parser("create", help="a new subscription of a topic")
    a.name(create)
    subscription_name(create, new=True)
    create.add_argument("--from", dest="start", type=_start, default="earliest", metavar="earliest|latest|L:E",
                        help="the first entry it reads: the topic's head (earliest, the default), the next entry "
                             "written (latest), or L:E")
    a.json_flag(create)
    ack = s_sub.add_parser("ack", help="everything up to and including L:E is read")
    a.name(ack)
    subscription_name(ack)
    ack.add_argument("position", type=_acked, metavar="L:E|earliest",
                     help="the last entry read; earliest (with --reset): nothing, the next read starts at the "
                          "topic's head (a replay of all it retains)")
    ack.add_argument("--reset", action="store_true", help="allow moving the position backwards")
    a.json_flag(ack)
    lst = s_sub.add_parser("list", help="subscriptions with their backlog, state and losses")
    lst.add_argument("name", nargs="?", type=a.topic_name, metavar="TOPIC", help="one topic's only")
    a.json_flag(lst)
    delete = s_sub.add_parser("delete", help="delete a subscription (it holds nothing back any more)")
    a.name(delete)
    subscription_name(delete)
    delete.add_argument("--dry-run", action="store_true", help="say which subscription would go; write nothing")
    a.json_flag(delete)


def listed_dict(item, now) -> dict:
    s = item.subscription
    age = 0.0 if item.oldest_unread_at is None else max(0.0, (now - item.oldest_unread_at).total_seconds())
    return {"topic": s.topic, "subscription": s.name, "position": position_text(s.position),
            "backlog_entry_count": item.backlog_entries, "backlog_bytes": item.backlog_bytes, "oldest_unread_age_seconds": round(age, 3),
            "last_ack_at": iso(s.last_ack_at), "created_at": iso(s.created_at), "state": s.state,
            "unread_deleted_entry_count": s.entries_deleted_unread, "unread_deleted_bytes": s.bytes_deleted_unread,
            "last_loss_at": iso(s.last_loss_at), "last_loss_reason": s.last_loss_reason, "version": s.version,
            **({"error": item.error} if item.error else {})}


def _table(rows: list[dict]):
    yield (f"{'topic':<20} {'name':<20} {'position':<14} {'state':<8} {'backlog':>9} {'bytes':>12} "
           f"{'age_s':>9} {'lost':>8}")
    for r in rows:
        unknown = r["backlog_entry_count"] is None  # its open ledger file unreadable: said on stderr
        yield (f"{r['topic']:<20} {r['subscription']:<20} {r['position'] or '-':<14} {r['state']:<8} "
               f"{'?' if unknown else r['backlog_entry_count']:>9} {'?' if unknown else r['backlog_bytes']:>12} "
               f"{r['oldest_unread_age_seconds']:>9.0f} {r['unread_deleted_entry_count']:>8}")


def _one(s) -> dict:
    return {"topic": s.topic, "subscription": s.name, "position": position_text(s.position), "state": s.state,
            "last_ack_at": iso(s.last_ack_at), "version": s.version}


def _at(s) -> str:
    return subscription_at(s.position)


def cmd_subscription(ctx: Context, args, out: Output) -> int:
    from tiering.ops import subscriptions as ops

    cmd = args.subscription_command
    if cmd == "create":
        s = ops.create(ctx.deps, args.name, args.subscription, args.start)
        out.result(document("subscription create", **_one(s)),
                   f"created subscription {s.name!r} of {s.topic!r} at {_at(s)}")
    elif cmd == "ack":
        s = ops.ack(ctx.deps, args.name, args.subscription, args.position, args.reset)
        out.result(document("subscription ack", **_one(s)), f"subscription {s.name!r} of {s.topic!r} at {_at(s)}")
    elif cmd == "list":
        now = ctx.meta.now()
        listed = ops.list_subscriptions(ctx.deps, args.name)
        out.listing(document("subscription list", args.name, subscriptions=[listed_dict(x, now) for x in listed]),
                    "subscriptions", _table)
        if failed := [x for x in listed if x.error]:
            # the others are listed; these backlogs are not known, so the command did not do all it was asked
            error(f"{len(failed)} subscription(s) listed without their backlog; first: "
                  f"{failed[0].subscription.topic!r}: {failed[0].error}")
            return 1
    elif args.dry_run:
        s = ops.delete(ctx.deps, args.name, args.subscription, dry_run=True)
        out.result(document("subscription delete", **_one(s), dry_run=True),
                   f"would delete subscription {s.name!r} of {s.topic!r} (at {_at(s)}); nothing written")
    else:
        s = ops.delete(ctx.deps, args.name, args.subscription)
        out.result(document("subscription delete", **_one(s)), f"deleted subscription {s.name!r} of {s.topic!r}")
    return 0
