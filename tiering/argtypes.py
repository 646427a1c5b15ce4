"""argparse `type`s from the library's checks: the CLI's and the Spark jobs' parsers both take a value
through the check that owns its rule (a position, a topic name, a number within bounds) and turn that
check's `BadInput` into argparse's error, so the rule and its message are written once."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from tiering.errors import BadInput

T = TypeVar("T")


def arg_type(check: Callable[..., T], *bounds) -> Callable[[str], T]:
    """`check(text, *bounds)` as an argparse `type`: its value, or its BadInput's message as the error."""
    def parse(text: str) -> T:
        try:
            return check(text, *bounds)
        except BadInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = getattr(check, "__name__", "value")  # argparse names the type in some errors
    return parse
