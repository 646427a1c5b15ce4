"""The `tiering` source's pushed filters as bounds (tiering/spark/filters.py): SQL semantics (a comparison
with NULL is not true), strict and inclusive ends, IN intersected with ranges, and what is handed back."""
from __future__ import annotations

from datetime import datetime, timezone

from tiering.spark.filters import Bound, Pushed, push


def f(kind, column, value=None):
    """A Spark filter's shape: its class name, an attribute tuple and a value."""
    return type(kind, (), {"attribute": (column,), "value": value})()


def pushed(*filters):
    p = Pushed()
    rest = push(p, filters)
    return p, rest


def test_integer_ranges_strict_and_inclusive():
    p, rest = pushed(f("GreaterThan", "ledger_id", 2), f("LessThanOrEqual", "ledger_id", 5))
    assert rest == [] and p.bound("ledger_id").int_range() == (3, 5)
    p, _ = pushed(f("GreaterThanOrEqual", "entry_id", 2), f("LessThan", "entry_id", 3))
    assert p.bound("entry_id").int_range() == (2, 2)
    p, _ = pushed(f("GreaterThan", "entry_id", 4), f("LessThan", "entry_id", 5))
    assert p.bound("entry_id").int_range() is None  # nothing between: no partition at all


def test_in_meets_a_range_and_equal_is_a_one_value_in():
    p, _ = pushed(f("In", "ledger_id", (1, 4, 9)), f("GreaterThan", "ledger_id", 3))
    b = p.bound("ledger_id")
    assert b.int_range() == (4, 9) and [v for v in range(12) if b.allows(v)] == [4, 9]
    p, _ = pushed(f("EqualTo", "ledger_id", 7), f("EqualTo", "ledger_id", 8))
    assert p.bound("ledger_id").int_range() is None


def test_null_follows_sql():
    ts = datetime(2026, 1, 1, tzinfo=timezone.utc)
    p, _ = pushed(f("GreaterThan", "sealed_at", ts))
    assert not p.bound("sealed_at").allows(None)  # an open ledger has no sealed_at: not > anything
    p, _ = pushed(f("IsNull", "offloaded_at"))
    assert p.bound("offloaded_at").allows(None) and not p.bound("offloaded_at").allows(ts)
    p, _ = pushed(f("IsNull", "sealed_at"), f("GreaterThan", "sealed_at", ts))
    assert not p.bound("sealed_at").allows(None) and not p.bound("sealed_at").allows(ts)
    p, _ = pushed(f("EqualNullSafe", "sealed_at", None))
    assert p.bound("sealed_at").allows(None) and not p.bound("sealed_at").allows(ts)
    p, _ = pushed(f("EqualTo", "ledger_id", None))
    assert p.bound("ledger_id").int_range() is None  # `= NULL` is never true


def test_a_naive_timestamp_is_utc():
    p, _ = pushed(f("GreaterThanOrEqual", "sealed_at", datetime(2026, 1, 1, 12)))
    b = p.bound("sealed_at")
    assert b.allows(datetime(2026, 1, 1, 12, tzinfo=timezone.utc))
    assert not b.allows(datetime(2026, 1, 1, 11, 59, tzinfo=timezone.utc))


def test_other_filters_are_handed_back_to_spark_by_reference():
    other = [f("EqualTo", "topic", "orders"), f("StringContains", "payload", "x"),
             f("EqualTo", "ledger_id", "7"),  # a string where an integer belongs: Spark evaluates it
             type("Not", (), {"child": f("EqualTo", "ledger_id", 1)})()]
    p, rest = pushed(*other, f("EqualTo", "ledger_id", 1))
    assert all(a is b for a, b in zip(rest, other)) and len(rest) == len(other)
    assert p.bound("ledger_id").int_range() == (1, 1)


def test_an_empty_bound_allows_everything():
    assert Bound().allows(None) and Bound().allows(5) and Bound().int_range() == (-2**63, 2**63 - 1)
