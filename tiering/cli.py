"""The `tiering` command: every operation by hand, the same code the pipeline jobs run.

Errors a user can cause print one line on stderr and exit 2 with nothing written; other failures (a service
down, an item of a pipeline command that failed) print one line and exit 1; never a traceback, never a
secret. Parsing is here; handlers are in cli_commands.py (topics, writes, reads) and cli_ops.py (pipeline).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from typing import Sequence

from tiering.errors import BadInput, TieringError
from tiering.model import ASCII_INT, INT64_MAX, MAX_SECONDS

EXIT_BAD_INPUT = 2
MIB = 1024 * 1024


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage on two)
        sys.stderr.write(one_line(f"{self.prog}: error: {message}") + "\n")
        raise SystemExit(EXIT_BAD_INPUT)


def _int(text: str, lo: int, hi: int) -> int:
    """ASCII digits only (int() would take "١٠", "５" or "1\v"), within [lo, hi] (PostgreSQL's bigint at most)."""
    shown = text[:40] + ("..." if len(text) > 40 else "")
    if not ASCII_INT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{shown!r} is not an integer (ASCII digits only)")
    if len(text.lstrip("-")) > 19 or int(text) > hi:
        raise argparse.ArgumentTypeError(f"{shown} is too large (at most {hi})")
    value = int(text)
    if value < lo:
        raise argparse.ArgumentTypeError(f"{text} is not positive" if lo > 0 else
                                         f"{text} is negative" + (" (use -1 to disable)" if lo < 0 else ""))
    return value


def _nonneg(text: str) -> int:
    return _int(text, 0, INT64_MAX)


def _positive(text: str) -> int:
    return _int(text, 1, INT64_MAX)


def _policy_int(text: str) -> int:
    return _int(text, -1, INT64_MAX)


def _seconds(text: str) -> int:
    return _int(text, 0, MAX_SECONDS)


def _policy_seconds(text: str) -> int:
    return _int(text, -1, MAX_SECONDS)


def _position(text: str):
    from tiering.model import Position

    try:
        return Position.parse(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _topic_name(text: str) -> str:
    from tiering.model import check_topic_name

    try:
        return check_topic_name(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _topic_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", type=_topic_name, metavar="NAME", help="limit to one topic")


def _name(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", type=_topic_name, metavar="TOPIC")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tiering", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    db = sub.add_parser("db", help="schema migrations")
    db_sub = db.add_subparsers(dest="db_command", required=True, parser_class=_Parser)
    db_sub.add_parser("upgrade", help="apply sql/migrations and recreate sql/views")

    topic = sub.add_parser("topic", help="create, list and show topics")
    t_sub = topic.add_subparsers(dest="topic_command", required=True, parser_class=_Parser)
    create = t_sub.add_parser("create", help="create a topic with its tiering policy")
    _name(create)
    create.add_argument("--offload-after", type=_policy_seconds, default=-1, metavar="SECONDS",
                        help="offload sealed ledgers older than this (-1: never, 0: at once)")
    create.add_argument("--offload-threshold", type=_policy_int, default=-1, metavar="BYTES",
                        help="offload while tier 1 holds more than this (-1: never)")
    create.add_argument("--deletion-lag", type=_seconds, default=4 * 3600, metavar="SECONDS",
                        help="keep tier-1 copies this long after offload (default 4 h)")
    create.add_argument("--retention-time", type=_policy_seconds, default=-1, metavar="SECONDS")
    create.add_argument("--retention-size", type=_policy_int, default=-1, metavar="BYTES")
    create.add_argument("--rollover-entries", type=_positive, default=50_000, metavar="N")
    create.add_argument("--rollover-bytes", type=_positive, default=64 * MIB, metavar="BYTES")
    _json_flag(t_sub.add_parser("list", help="every topic, by name"))
    show = t_sub.add_parser("show", help="a topic's policy and counters")
    _name(show)
    _json_flag(show)

    produce = sub.add_parser("produce", help="append entries to a topic (demos, benchmarks)")
    _name(produce)
    src = produce.add_mutually_exclusive_group(required=True)
    src.add_argument("--entries", type=_nonneg, metavar="N", help="N deterministic payloads (needs --entry-size)")
    src.add_argument("--stdin-lines", action="store_true", help="one entry per line of standard input")
    produce.add_argument("--entry-size", type=_nonneg, metavar="BYTES")
    produce.add_argument("--seed", default="demo", help="seed of the deterministic payloads (default 'demo')")
    produce.add_argument("--seal", action="store_true", help="seal the open ledger at the end")

    seal = sub.add_parser("seal", help="seal the topic's open ledger")
    _name(seal)

    status = sub.add_parser("status", help="every ledger of a topic: state, entries, bytes, tiers")
    _name(status)
    _json_flag(status)

    read = sub.add_parser("read", help="read a range of a topic across tiers")
    _name(read)
    read.add_argument("--from", dest="start", type=_position, metavar="L:E")
    read.add_argument("--to", dest="end", type=_position, metavar="L:E")
    read.add_argument("--json", action="store_true", help="JSON lines (data in base64)")
    read.add_argument("--fail-on-dataloss", action="store_true", help="exit 1 instead of printing a DATALOSS gap")

    op = sub.add_parser("offload-prefix", help="offload every sealed ledger before L:E (Pulsar's offloadPrefix)")
    _name(op)
    op.add_argument("position", type=_position, metavar="L:E")
    _json_flag(op)
    ost = sub.add_parser("offload-status", help="per ledger: state, attempt, offloaded time, keys")
    _name(ost)
    _json_flag(ost)

    for by in ("age", "size"):
        knob = "offload-after" if by == "age" else "offload-threshold"
        ob = sub.add_parser(f"offload-by-{by}", help=f"offload the sealed ledgers the topics' {knob} selects")
        _topic_flag(ob)
        _json_flag(ob)
    dl = sub.add_parser("delete-lagged", help="delete tier-1 copies offloaded longer ago than the deletion lag")
    _topic_flag(dl)
    _json_flag(dl)
    ret = sub.add_parser("retention", help="truncate topic heads by retention time and size")
    _topic_flag(ret)
    _json_flag(ret)
    tr = sub.add_parser("truncate", help="delete every whole ledger before L:E (never the open one)")
    _name(tr)
    tr.add_argument("position", type=_position, metavar="L:E")
    _json_flag(tr)
    dfr = sub.add_parser("defrag", help="merge runs of small tier-2 objects")
    _topic_flag(dfr)
    dfr.add_argument("--small-bytes", type=_positive, default=8 * MIB, metavar="N",
                     help="a data object below this is small (default 8 MiB)")
    dfr.add_argument("--max-merged-bytes", type=_positive, default=256 * MIB, metavar="N",
                     help="a merged object stays within this (default 256 MiB)")
    _json_flag(dfr)
    gc = sub.add_parser("gc", help="delete queued tier-2 objects, orphans and stale uploads (whole prefix)")
    gc.add_argument("--orphan-grace-seconds", type=_seconds, default=None, metavar="N",
                    help="unreferenced objects and uploads older than this are deleted (default 2 h)")
    _json_flag(gc)
    ver = sub.add_parser("verify", help="read a whole topic (and every tier-2 copy); exit 1 on loss or corruption")
    _name(ver)
    _json_flag(ver)
    exp = sub.add_parser("export-metadata", help="Parquet snapshot of the metadata tables (manifest last)")
    exp.add_argument("dest", metavar="DEST", help="s3://bucket/path or a local directory")
    exp.add_argument("--overwrite", action="store_true", help="replace an existing export at DEST")
    _json_flag(exp)
    imp = sub.add_parser("import-metadata", help="restore an export into an empty schema (all or nothing)")
    imp.add_argument("source", metavar="SOURCE", help="s3://bucket/path or a local directory")
    _json_flag(imp)
    rec = sub.add_parser("recover-from-bucket", help="rebuild metadata of offloaded ledgers from the bucket alone")
    rec.add_argument("--topic", type=_topic_name, metavar="NAME", help="only this topic")
    rec.add_argument("--skip-page-check", action="store_true",
                     help="do not download the data to check its page CRC32Cs (faster; a corrupt copy may win)")
    _json_flag(rec)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    _quiet_libraries()
    args = build_parser().parse_args(argv)
    try:
        from tiering import cli_commands

        code = cli_commands.dispatch(args) or 0
        sys.stdout.flush()
        return code
    except TieringError as exc:
        error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("tiering: interrupted\n")
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except Exception as exc:  # services down and the like: one line, no traceback, no secrets
        from tiering.cli_commands import describe_failure

        error(describe_failure(exc))
        return 1


def one_line(text: str) -> str:
    """Collapse a message to one line (a library's multi-line message, a name with a newline)."""
    return " ".join(text.split("\n")).replace("\r", " ").strip()


def redact(text: str) -> str:
    """Mask the secrets of the environment (the database password, the S3 secret key) in a message."""
    from urllib.parse import unquote, urlsplit

    secrets = [os.environ.get("AWS_SECRET_ACCESS_KEY") or ""]
    try:
        password = urlsplit(os.environ.get("TIERING_DATABASE_URL", "")).password
    except ValueError:
        password = None
    if password:
        secrets += [password, unquote(password)]
    for s in sorted((s for s in secrets if len(s) >= 3), key=len, reverse=True):
        text = text.replace(s, "***")
    return text


def error(message: str) -> None:
    sys.stderr.write(one_line(redact(f"tiering: error: {message}")) + "\n")
    sys.stderr.flush()


def _quiet_libraries() -> None:
    """Library warnings and log records would add lines (and maybe URLs) to stderr: keep them out."""
    import logging
    import warnings

    if not sys.warnoptions:  # -W or PYTHONWARNINGS given: the user asked to see them
        warnings.simplefilter("ignore")
    root = logging.getLogger()
    if not root.handlers:  # no lastResort handler printing WARNING records of boto3, urllib3, ...
        root.addHandler(logging.NullHandler())


def _silence_stdout() -> None:
    """The reader of our stdout went away (`| head`): stop writing without an error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


if __name__ == "__main__":
    raise SystemExit(main())
