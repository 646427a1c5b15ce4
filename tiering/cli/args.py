"""Argument types and shared flags of the `tiering` command: bad input is refused while parsing (one line,
exit 2), before any client is built."""
from __future__ import annotations

import argparse
import sys

from tiering.errors import BadInput
from tiering.model import (INT64_MAX, MAX_SECONDS, BadInt, Position, check_subscription_name, check_topic_name,
                           parse_int)

EXIT_BAD_INPUT = 2


def one_line(text: str) -> str:
    """Collapse a message to one line (a library's multi-line message, a name with a newline)."""
    return " ".join(text.split("\n")).replace("\r", " ").strip()


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage on two)
        sys.stderr.write(one_line(f"{self.prog}: error: {message}") + "\n")
        raise SystemExit(EXIT_BAD_INPUT)


def _int(text: str, lo: int, hi: int) -> int:
    """model.parse_int's rule (ASCII digits only: int() would take "١٠", "５" or "1\v"), within [lo, hi]
    (PostgreSQL's bigint at most), phrased as argparse errors."""
    shown = text[:40] + ("..." if len(text) > 40 else "")
    try:
        return parse_int(text, "the value", lo, hi)
    except BadInt as exc:
        if exc.reason == "syntax":
            raise argparse.ArgumentTypeError(f"{shown!r} is not an integer (ASCII digits only)") from None
        if exc.reason == "high":
            raise argparse.ArgumentTypeError(f"{shown} is too large (at most {hi})") from None
        raise argparse.ArgumentTypeError(f"{shown} is not positive" if lo > 0 else
                                         f"{shown} is negative" + (" (use -1 to disable)" if lo < 0 else "")) from None


def nonneg(text: str) -> int:
    return _int(text, 0, INT64_MAX)


def positive(text: str) -> int:
    return _int(text, 1, INT64_MAX)


def policy_int(text: str) -> int:
    return _int(text, -1, INT64_MAX)


def seconds(text: str) -> int:
    return _int(text, 0, MAX_SECONDS)


def policy_seconds(text: str) -> int:
    return _int(text, -1, MAX_SECONDS)


def expiry_seconds(text: str) -> int:
    """-1 (never) or a positive number of seconds."""
    value = _int(text, -1, MAX_SECONDS)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is not allowed (use -1 for never, or a positive number of seconds)")
    return value


def position(text: str) -> Position:
    try:
        return Position.parse(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def topic_name(text: str) -> str:
    try:
        return check_topic_name(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def subscription_name(text: str) -> str:
    try:
        return check_subscription_name(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def topic_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", type=topic_name, metavar="NAME", help="limit to one topic")


def name(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", type=topic_name, metavar="TOPIC")


# The names these types had in the old cli.py, which tests/unit/test_edge_numbers.py checks one by one.
_nonneg, _positive, _policy_int = nonneg, positive, policy_int
_seconds, _policy_seconds, _position = seconds, policy_seconds, position
