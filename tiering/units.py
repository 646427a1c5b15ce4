"""Durations and sizes with units, the one parser of every edge (CLI flags, settings, job arguments, DAG
Params): `90s 15m 4h 7d 2w`, `512KiB 64MiB 10GB 1TiB 10G`. A bare number keeps meaning seconds or bytes, so
scripts that pass numbers keep working; `-1` stays "disabled" where a bound allows it. Pure: no I/O.

Sizes: `KiB MiB GiB TiB` are powers of 1024, `KB MB GB TB` powers of 1000 (SI), and the single letters
`K M G T` are powers of 1024, as pulsar-admin reads `10G`. Units are case-insensitive (`64mib`), a space
between number and unit is allowed, a fraction is allowed when the result is a whole number (`1.5h`,
`0.5KiB`).
"""
from __future__ import annotations

import re
from decimal import Decimal

from tiering.model import BadInt

DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
SIZE_UNITS = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
              "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
              "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
DURATION_HELP = "seconds, or a number with a unit s, m, h, d, w (e.g. 90s, 15m, 4h, 7d)"
SIZE_HELP = "bytes, or a number with a unit KiB, MiB, GiB, TiB (1024), KB, MB, GB, TB (1000) or K, M, G, T (1024)"


def _any_case(unit: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" for c in unit)


# A size as a JSON-schema pattern (Airflow's trigger form; JSON schema has no case-insensitive flag): built
# from SIZE_UNITS, so the form takes the units parse_size takes. parse_size still decides (bounds, fractions).
SIZE_PATTERN = (r"^[0-9]+(\.[0-9]+)? ?(" + "|".join(_any_case(u) for u in sorted(SIZE_UNITS, key=len, reverse=True))
                + r")?$(?!\n)")
# ASCII only: int()/Decimal() would take other digits ("١٠", "５"); no '+', no '_', no exponent
_VALUE = re.compile(r"(-?[0-9]+(?:\.[0-9]+)?)(?: ?([A-Za-z]+))?")


def _parse(text: object, what: str, lo: int, hi: int, units: dict[str, int], base: str, kind: str, noun: str,
           hint: str, show) -> int:
    m = _VALUE.fullmatch(text) if isinstance(text, str) and len(text) <= 64 else None
    shown = (text[:40] + ("..." if len(text) > 40 else "")) if isinstance(text, str) else text
    if m is None or (m.group(2) and m.group(2).lower() not in units):
        raise BadInt(f"{what} must be {kind}: {hint}; got {shown!r}", "syntax")
    number, unit = m.group(1), (m.group(2) or "").lower()
    if number.startswith("-") and (unit or number != "-1"):  # "-1h", "-0", "-01", "-1.0": only a bare -1 disables
        raise BadInt(f"{what} must not be negative" + (" (a bare -1 disables it)" if lo < 0 else "")
                     + f"; got {shown!r}", "low")
    if not unit and "." in number:
        raise BadInt(f"{what} must be a whole number of {noun} without a unit; got {shown!r}", "fraction")
    exact = Decimal(number) * units[unit or base]
    if exact != exact.to_integral_value():
        raise BadInt(f"{what} must come to a whole number of {noun}; got {shown!r}", "fraction")
    value = int(exact)
    if not lo <= value <= hi:
        rng = f"from {show(lo) if lo > 0 else lo} to {show(hi)}"
        raise BadInt(f"{what} must be {rng}{' (-1: disabled)' if lo == -1 else ''}, got {shown}",
                     "high" if value > hi else "low")
    return value


def parse_duration(text: object, what: str, lo: int, hi: int) -> int:
    """A duration in seconds within [lo, hi]: a bare integer (seconds) or a number with a unit."""
    return _parse(text, what, lo, hi, DURATION_UNITS, "s", "a duration", "seconds", DURATION_HELP, format_duration)


def parse_size(text: object, what: str, lo: int, hi: int) -> int:
    """A size in bytes within [lo, hi]: a bare integer (bytes) or a number with a unit."""
    return _parse(text, what, lo, hi, SIZE_UNITS, "b", "a size", "bytes", SIZE_HELP, format_size)


def format_duration(seconds: int) -> str:
    """The largest unit that divides it exactly: 3600 -> '1h', 90 -> '90s', -1 -> '-1'."""
    if seconds <= 0:
        return str(seconds)
    for unit in ("w", "d", "h", "m"):
        if seconds % DURATION_UNITS[unit] == 0:
            return f"{seconds // DURATION_UNITS[unit]}{unit}"
    return f"{seconds}s"


def format_size(n: int) -> str:
    """The largest binary unit that divides it exactly: 67108864 -> '64MiB', 1000 -> '1000B', -1 -> '-1'."""
    if n <= 0:
        return str(n)
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if n % SIZE_UNITS[unit.lower()] == 0:
            return f"{n // SIZE_UNITS[unit.lower()]}{unit}"
    return str(n)
