"""Filters Spark pushes to the `tiering` source, turned into bounds the planner prunes with. No Spark import:
the planner and its tests see plain values (the Filter objects are read by attribute and class name).

Pushed down: EqualTo, EqualNullSafe, GreaterThan(OrEqual), LessThan(OrEqual), In, IsNull, IsNotNull on
`ledger_id`, `entry_id`, `sealed_at`, `offloaded_at`. Each is applied exactly by the source (ledger and
timestamp bounds at planning, entry bounds at planning and per row), so none is handed back to Spark; any
other filter (on topic, payload, tier, a Not, ...) is handed back and Spark evaluates it on the rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

COLUMNS = ("ledger_id", "entry_id", "sealed_at", "offloaded_at")
_INT_COLUMNS = ("ledger_id", "entry_id")
_UNARY = {"IsNull": True, "IsNotNull": False}


def _utc(v: Any) -> Any:
    # A naive datetime from a filter is UTC (Spark hands timestamps over as instants); metadata's are aware.
    if isinstance(v, datetime) and v.tzinfo is None:
        return v.replace(tzinfo=timezone.utc)
    return v


@dataclass
class Bound:
    """AND of the comparisons pushed on one column; `allows(None)` follows SQL (a comparison with NULL is
    not true). Bounds are (value, strict) pairs."""
    lo: tuple[Any, bool] | None = None
    hi: tuple[Any, bool] | None = None
    values: frozenset | None = None
    null: bool | None = None  # True: IS NULL, False: IS NOT NULL, None: either
    empty: bool = False  # contradictory (e.g. IS NULL and > x)

    def add(self, kind: str, value: Any = None) -> None:
        if kind in _UNARY:
            want = _UNARY[kind]
            if self.null is not None and self.null != want:
                self.empty = True
            self.null = want
            return
        if kind == "In":
            vals = frozenset(_utc(v) for v in value if v is not None)
            self.values = vals if self.values is None else self.values & vals
            self.null = False if self.null is None else self.null
            return
        value = _utc(value)
        if value is None:  # `= NULL` is never true (EqualNullSafe NULL is IS NULL)
            if kind == "EqualNullSafe":
                self.add("IsNull")
            else:
                self.empty = True
            return
        if kind in ("EqualTo", "EqualNullSafe"):
            self.add("In", (value,))
        elif kind in ("GreaterThan", "GreaterThanOrEqual"):
            new = (value, kind == "GreaterThan")
            if self.lo is None or new[0] > self.lo[0] or (new[0] == self.lo[0] and new[1]):
                self.lo = new
        elif kind in ("LessThan", "LessThanOrEqual"):
            new = (value, kind == "LessThan")
            if self.hi is None or new[0] < self.hi[0] or (new[0] == self.hi[0] and new[1]):
                self.hi = new
        if kind not in _UNARY:
            self.null = False if self.null is None else self.null
        if self.null is True and kind not in _UNARY:
            self.empty = True

    def allows(self, v: Any) -> bool:
        if self.empty:
            return False
        if v is None:
            return self.null is not False
        if self.null is True:
            return False
        if self.values is not None and v not in self.values:
            return False
        if self.lo is not None and (v < self.lo[0] or (self.lo[1] and v == self.lo[0])):
            return False
        if self.hi is not None and (v > self.hi[0] or (self.hi[1] and v == self.hi[0])):
            return False
        return True

    def int_range(self) -> tuple[int, int] | None:
        """Inclusive [lo, hi] of an integer column (None: nothing passes); unbounded ends are +-2**63."""
        if self.empty or self.null is True:
            return None
        lo, hi = -2**63, 2**63 - 1
        if self.lo is not None:
            lo = self.lo[0] + 1 if self.lo[1] else self.lo[0]
        if self.hi is not None:
            hi = self.hi[0] - 1 if self.hi[1] else self.hi[0]
        if self.values is not None:
            inside = [v for v in self.values if lo <= v <= hi]
            if not inside:
                return None
            lo, hi = min(inside), max(inside)
        return (lo, hi) if lo <= hi else None


@dataclass
class Pushed:
    """The pushed filters, one Bound per column."""
    bounds: dict[str, Bound] = field(default_factory=dict)

    def bound(self, column: str) -> Bound:
        return self.bounds.get(column) or Bound()

    def describe(self) -> str:
        parts = []
        for col, b in self.bounds.items():
            bits = []
            if b.lo is not None:
                bits.append(f"{'>' if b.lo[1] else '>='} {b.lo[0]}")
            if b.hi is not None:
                bits.append(f"{'<' if b.hi[1] else '<='} {b.hi[0]}")
            if b.values is not None:
                bits.append(f"in {len(b.values)} value(s)")
            if b.null is not None:
                bits.append("is null" if b.null else "is not null")
            parts.append(f"{col} {' and '.join(bits) or 'any'}{' (empty)' if b.empty else ''}")
        return "; ".join(parts) or "none"


def _accepts(f) -> tuple[str, str, Any] | None:
    """(column, kind, value) of a filter the source applies itself, else None."""
    kind = type(f).__name__
    attr = getattr(f, "attribute", None)
    if not isinstance(attr, tuple) or len(attr) != 1 or attr[0] not in COLUMNS:
        return None
    col = attr[0]
    if kind in _UNARY:
        return col, kind, None
    if kind not in ("EqualTo", "EqualNullSafe", "GreaterThan", "GreaterThanOrEqual", "LessThan",
                    "LessThanOrEqual", "In"):
        return None
    value = f.value
    items = value if kind == "In" else (value,)
    for v in items:
        if v is None:
            continue
        ok = (isinstance(v, int) and not isinstance(v, bool)) if col in _INT_COLUMNS else isinstance(v, datetime)
        if not ok:
            return None  # a value of an unexpected type: Spark evaluates it
    return col, kind, value


def push(pushed: Pushed, filters: Iterable) -> list:
    """Record the filters the source applies; return the others (Spark evaluates them), by reference."""
    rest = []
    for f in filters:
        got = _accepts(f)
        if got is None:
            rest.append(f)
            continue
        col, kind, value = got
        pushed.bounds.setdefault(col, Bound()).add(kind, value)
    return rest
