"""The `tiering` command: every operation by hand, the same code the pipeline jobs run.

Errors a user can cause print one line on stderr and exit 2 with nothing written; other failures (a service
down, an item of a pipeline command that failed) print one line and exit 1; never a traceback, never a
secret. This module builds the parser from the command families, dispatches, and maps errors to exit codes.
"""
from __future__ import annotations

import os
import sys
from typing import Sequence

from tiering.cli import data, metadata, pipeline, subscriptions, tables, topics, verify
from tiering.cli.args import EXIT_BAD_INPUT, Parser
from tiering.cli.context import Context
from tiering.cli.output import error, output_for
from tiering.errors import TieringError

FAMILIES = (topics, subscriptions, data, pipeline, verify, metadata, tables)  # the order of `tiering --help`


def build_parser() -> Parser:
    p = Parser(prog="tiering", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for family in FAMILIES:
        family.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    _quiet_libraries()
    argv = sys.argv[1:] if argv is None else list(argv)
    refuse_non_utf8(argv)
    args = build_parser().parse_args(argv)
    try:
        ctx = Context()
        try:
            code = args.handler(ctx, args, output_for(args)) or 0
        finally:
            ctx.close()
        sys.stdout.flush()
        return code
    except TieringError as exc:
        error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("tiering: interrupted\n")
        return 130
    except BrokenPipeError:  # the reader of our output went away: the work is not done (an --ack acks
        _silence_stdout()     # nothing more), so not a success; 128 + SIGPIPE, as a process SIGPIPE ended
        return 141
    except Exception as exc:  # services down and the like: one line, no traceback, no secrets
        error(describe_failure(exc))
        return 1


def entry() -> None:
    """The `tiering` command: main(), then exit with its status. Interrupted (130), it exits at once: Python's
    own exit would first wait for every worker thread still inside a request (an upload's part on a link
    that stopped answering: its retries, minutes), and what those threads were doing is left as a killed
    process leaves it, which every operation takes up on its next run."""
    code = main()
    if code == 130:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    raise SystemExit(code)


def refuse_non_utf8(argv: Sequence[str]) -> None:
    """Bytes that are not UTF-8 reach us as lone surrogates (surrogateescape), which fail only later when
    encoded (a path, a seed, a SQL parameter) with exit 1: refuse them as bad input first. The argument is
    named by its number, not shown: its bytes are what cannot be written."""
    for number, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            error(f"argument {number} is not valid UTF-8")
            raise SystemExit(EXIT_BAD_INPUT) from None


def describe_failure(exc: Exception) -> str:
    """One line for an unexpected failure; never a URL with a password (output.error redacts on top)."""
    # SQLAlchemy and botocore are imported only when something failed: a run that succeeds may never need them.
    from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError, SQLAlchemyError

    first = _first_line
    if isinstance(exc, ProgrammingError) and "does not exist" in str(exc.orig):
        return "the metadata schema is missing or old: run `tiering db upgrade`"
    if isinstance(exc, OperationalError) and getattr(exc.orig, "pgcode", None) and exc.orig.pgcode[:2] == "54":
        # program_limit_exceeded (a value past what an index or row holds): the server answered
        return f"metadata database refused a value past its limits: {first(exc.orig)}"
    if isinstance(exc, OperationalError) and getattr(exc.orig, "pgcode", None) and exc.orig.pgcode[:2] == "40":
        # transaction_rollback (a deadlock, a serialization failure): the server is up; this transaction lost a
        # race with another worker's and was rolled back whole
        return f"metadata database rolled the transaction back, in a race with another worker (run it again): " \
               f"{first(exc.orig)}"
    if isinstance(exc, OperationalError):
        return f"metadata database unavailable (check TIERING_DATABASE_URL; is it running?): {first(exc.orig)}"
    if isinstance(exc, DBAPIError):
        return f"metadata database error: {type(exc.orig).__name__}: {first(exc.orig)}"
    if isinstance(exc, SQLAlchemyError):
        return f"metadata database error: {type(exc).__name__}"
    try:
        from botocore.exceptions import BotoCoreError, ClientError, SSLError

        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            return f"S3 {exc.operation_name} failed: {err.get('Code')} {err.get('Message', '')}".strip()
        if isinstance(exc, SSLError):
            return ("S3's TLS certificate could not be verified (check TIERING_S3_CA_BUNDLE and "
                    f"TIERING_S3_ENDPOINT_URL): {first(exc)}")
        if isinstance(exc, BotoCoreError):
            return f"S3 is unreachable or misconfigured (check TIERING_S3_ENDPOINT_URL): {first(exc)}"
    except ImportError:
        pass
    return f"{type(exc).__name__}: {first(exc)}".rstrip(": ")


def _first_line(exc: object) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else ""


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


if __name__ == "__main__":
    raise SystemExit(main())
