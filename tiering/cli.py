"""The `tiering` command: every operation by hand, the same code the pipeline jobs run.

Errors a user can cause print one line on stderr and exit 2; other failures exit 1; never a traceback.
"""
from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Sequence

from tiering.errors import BadInput, TieringError

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage on two)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(EXIT_BAD_INPUT)


def _nonneg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _policy_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < -1:
        raise argparse.ArgumentTypeError(f"{text} is negative (use -1 to disable)")
    return value


def _position(text: str):
    from tiering.model import Position

    try:
        return Position.parse(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tiering", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    db = sub.add_parser("db", help="schema migrations")
    db_sub = db.add_subparsers(dest="db_command", required=True, parser_class=_Parser)
    db_sub.add_parser("upgrade", help="apply sql/migrations and recreate sql/views")

    topic = sub.add_parser("topic", help="create, list and show topics")
    t_sub = topic.add_subparsers(dest="topic_command", required=True, parser_class=_Parser)
    create = t_sub.add_parser("create", help="create a topic with its tiering policy")
    create.add_argument("name")
    create.add_argument("--offload-after", type=_policy_int, default=-1, metavar="SECONDS",
                        help="offload sealed ledgers older than this (-1: never, 0: at once)")
    create.add_argument("--offload-threshold", type=_policy_int, default=-1, metavar="BYTES",
                        help="offload while tier 1 holds more than this (-1: never)")
    create.add_argument("--deletion-lag", type=_nonneg, default=4 * 3600, metavar="SECONDS",
                        help="keep tier-1 copies this long after offload (default 4 h)")
    create.add_argument("--retention-time", type=_policy_int, default=-1, metavar="SECONDS")
    create.add_argument("--retention-size", type=_policy_int, default=-1, metavar="BYTES")
    create.add_argument("--rollover-entries", type=_nonneg, default=50_000, metavar="N")
    create.add_argument("--rollover-bytes", type=_nonneg, default=64 * 1024 * 1024, metavar="BYTES")
    for name in ("list", "show"):
        sp = t_sub.add_parser(name)
        if name == "show":
            sp.add_argument("name")
        sp.add_argument("--json", action="store_true")

    produce = sub.add_parser("produce", help="append entries to a topic (demos, benchmarks)")
    produce.add_argument("name")
    src = produce.add_mutually_exclusive_group(required=True)
    src.add_argument("--entries", type=_nonneg, metavar="N")
    src.add_argument("--stdin-lines", action="store_true", help="one entry per line of standard input")
    produce.add_argument("--entry-size", type=_nonneg, metavar="BYTES")
    produce.add_argument("--seed", default="demo", help="seed of the deterministic payloads")
    produce.add_argument("--seal", action="store_true", help="seal the open ledger at the end")

    seal = sub.add_parser("seal", help="seal the topic's open ledger")
    seal.add_argument("name")

    status = sub.add_parser("status", help="every ledger of a topic: state, entries, bytes, tiers")
    status.add_argument("name")
    status.add_argument("--json", action="store_true")

    read = sub.add_parser("read", help="read a range of a topic across tiers")
    read.add_argument("name")
    read.add_argument("--from", dest="start", type=_position, metavar="L:E")
    read.add_argument("--to", dest="end", type=_position, metavar="L:E")
    read.add_argument("--json", action="store_true", help="JSON lines (data in base64)")
    read.add_argument("--fail-on-dataloss", action="store_true")

    op = sub.add_parser("offload-prefix", help="offload every sealed ledger before L:E (Pulsar's offloadPrefix)")
    op.add_argument("name")
    op.add_argument("position", type=_position, metavar="L:E")
    op.add_argument("--json", action="store_true")
    ost = sub.add_parser("offload-status", help="per ledger: state, attempt, offloaded time, keys")
    ost.add_argument("name")
    ost.add_argument("--json", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from tiering import cli_commands

        return cli_commands.dispatch(args) or 0
    except TieringError as exc:
        sys.stderr.write(f"tiering: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("tiering: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # services down and the like: one line, no traceback, no secrets
        from tiering.cli_commands import describe_failure

        sys.stderr.write(f"tiering: error: {describe_failure(exc)}\n")
        return 1


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


if __name__ == "__main__":
    raise SystemExit(main())
