"""Argument types and shared flags of the `tiering` command: bad input is refused while parsing (one line,
exit 2), before any client is built."""
from __future__ import annotations

import argparse
import sys

from tiering.argtypes import arg_type
from tiering.model import (INT64_MAX, MAX_SECONDS, BadInt, Position, check_subscription_name, check_topic_name,
                           parse_int, preview_marks)
from tiering.units import DURATION_HELP, SIZE_HELP, format_duration, format_size, parse_duration, parse_size

EXIT_BAD_INPUT = 2


def one_line(text: str) -> str:
    """Collapse a message to one line (a library's multi-line message, a name with a newline)."""
    return " ".join(text.split("\n")).replace("\r", " ").strip()


class Parser(argparse.ArgumentParser):
    """One line, exit 2 (argparse prints usage on two), with the one prefix of every error (`tiering: error:`,
    also from a subcommand's parser: the command is named in the message instead); a single-valued option
    given twice is refused (argparse would silently keep the last). Options are never abbreviated (`--res`
    for `--reset`): a prefix that means one option today could mean another once an option is added."""

    def error(self, message):
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        where = f"{command}: " if command else ""
        sys.stderr.write(one_line(f"tiering: error: {where}{message}") + "\n")
        raise SystemExit(EXIT_BAD_INPUT)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        for name, action in _ONCE.items():  # groups share the registry: their options too
            self.register("action", name, action)
        self.register("action", None, _ONCE["store"])

    def parse_known_args(self, args=None, namespace=None):
        namespace = namespace if namespace is not None else argparse.Namespace()
        setattr(namespace, _SEEN, set())
        return super().parse_known_args(args, namespace)


_SEEN = "_options_seen"


def _once(base: type[argparse.Action], why: str = "it takes one value") -> type[argparse.Action]:
    """`base` that refuses a second occurrence of its option in one command line."""
    class Once(base):
        def __call__(self, parser, namespace, values, option_string=None):
            seen = getattr(namespace, _SEEN, None)
            if seen is None:
                seen = set()
                setattr(namespace, _SEEN, seen)
            if self.dest in seen:
                raise argparse.ArgumentError(self, f"given more than once ({why})")
            seen.add(self.dest)
            super().__call__(parser, namespace, values, option_string)
    Once.__name__ = f"Once{base.__name__}"
    return Once


_ONCE = {"store": _once(argparse._StoreAction), "store_true": _once(argparse._StoreTrueAction),
         "store_false": _once(argparse._StoreFalseAction), "store_const": _once(argparse._StoreConstAction),
         # Passed as a class, not a name: the registry maps the class itself. Both spellings are one action
         # (one dest), so `--x --no-x` is refused too instead of the last one silently winning.
         argparse.BooleanOptionalAction: _once(argparse.BooleanOptionalAction,
                                               "it is on or off: give one spelling once")}


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


def _units(parse, text: str, lo: int, hi: int) -> int:
    """A duration or a size (tiering/units.py) within [lo, hi], phrased as argparse errors (as `_int`)."""
    shown = text[:40] + ("..." if len(text) > 40 else "")
    try:
        return parse(text, "the value", lo, hi)
    except BadInt as exc:
        duration = parse is parse_duration
        if exc.reason == "fraction":  # a number with a unit, only not a whole one: say that, not "not a size"
            raise argparse.ArgumentTypeError(
                f"{shown!r} does not come to a whole number of {'seconds' if duration else 'bytes'}") from None
        if exc.reason == "syntax":
            raise argparse.ArgumentTypeError(
                f"{shown!r} is not {'a duration' if duration else 'a size'}: "
                f"{DURATION_HELP if duration else SIZE_HELP}, in ASCII digits only") from None
        if exc.reason == "high":
            top = format_duration(hi) if duration else format_size(hi)
            raise argparse.ArgumentTypeError(f"{shown} is too large (at most {top})") from None
        if lo > 1:
            bottom = format_duration(lo) if duration else format_size(lo)
            raise argparse.ArgumentTypeError(f"{shown} is too small (at least {bottom})") from None
        raise argparse.ArgumentTypeError(f"{shown} is not positive" if lo > 0 else
                                         f"{shown} is negative" + (" (use -1 to disable)" if lo < 0 else "")) from None


def seconds(text: str) -> int:
    """A duration: seconds, or with a unit (90s, 15m, 4h, 7d)."""
    return _units(parse_duration, text, 0, MAX_SECONDS)


def policy_seconds(text: str) -> int:
    """-1 (disabled) or a duration."""
    return _units(parse_duration, text, -1, MAX_SECONDS)


def expiry_seconds(text: str) -> int:
    """-1 (never) or a positive duration."""
    value = _units(parse_duration, text, -1, MAX_SECONDS)
    if value == 0:
        raise argparse.ArgumentTypeError("0 is not allowed (use -1 for never, or a positive duration)")
    return value


def size(text: str) -> int:
    """A positive size: bytes, or with a unit (512KiB, 64MiB, 10GB, 1TiB)."""
    return _units(parse_size, text, 1, INT64_MAX)


def size_or_zero(text: str) -> int:
    """A size, 0 allowed."""
    return _units(parse_size, text, 0, INT64_MAX)


def policy_size(text: str) -> int:
    """-1 (disabled) or a size."""
    return _units(parse_size, text, -1, INT64_MAX)


def size_at_least(lo: int):
    """A size of at least `lo` bytes (a smaller one is a mistake: a ledger of one entry, ...)."""
    def parse(text: str) -> int:
        return _units(parse_size, text, lo, INT64_MAX)
    return parse


position = arg_type(Position.parse)
topic_name = arg_type(check_topic_name)
subscription_name = arg_type(check_subscription_name)
# the names a command creates: also refused there, as what prints like another name, with the argument named
new_topic_name = arg_type(lambda text: check_topic_name(text, new=True))
new_subscription_name = arg_type(lambda text: check_subscription_name(text, new=True))


def json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output")


def dry_run_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan a real run would execute now, as its output with \"dry_run\": true; "
                        "change nothing (no row, no object, no file)")


def preview_fields(args) -> dict:
    """What a command's JSON document adds on a preview (`--dry-run`)."""
    return preview_marks(getattr(args, "dry_run", False))


def would(args, text: str) -> str:
    """A command's one-line text, marked as a preview's on `--dry-run`."""
    return f"[dry run] {text}" if getattr(args, "dry_run", False) else text


def topic_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topic", type=topic_name, metavar="NAME", help="limit to one topic")


def name(p: argparse.ArgumentParser, new: bool = False) -> None:
    p.add_argument("name", type=new_topic_name if new else topic_name, metavar="TOPIC")


# The names these types had in the old cli.py, which tests/unit/test_edge_numbers.py checks one by one.
_nonneg, _positive, _policy_int = nonneg, positive, policy_int
_seconds, _policy_seconds, _position = seconds, policy_seconds, position
