"""The pure parts of topics as tables: identifier form, ledger sets in snapshot summaries, file groups."""
from __future__ import annotations

from datetime import date

import pytest
from hypothesis import given, strategies as st

from tiering.errors import BadInput
from tiering.tables.naming import batches, check_retention, decode_ledgers, encode_ledgers, parse_identifier


@pytest.mark.parametrize("good,parts", [("ns.t", ("ns", "t")), ("_a1.b_2", ("_a1", "b_2")),
                                        ("a" * 64 + ".b", ("a" * 64, "b"))])
def test_identifier_accepted(good, parts):
    assert parse_identifier(good) == parts


@pytest.mark.parametrize("bad", ["t", "a.b.c", "A.b", "1a.b", "a.", ".b", "a.b\n", "a-b.c", "a" * 65 + ".b",
                                 "a.b__dlq", "", "a .b", "a.é"])
def test_identifier_refused_with_a_sentence(bad):
    with pytest.raises(BadInput, match="NAMESPACE.TABLE|dead-letter"):
        parse_identifier(bad)


def test_identifier_must_be_text():
    with pytest.raises(BadInput):
        parse_identifier(3)


def test_retention_modes():
    assert check_retention("keep") == "keep" and check_retention("follow") == "follow"
    with pytest.raises(BadInput):
        check_retention("drop")


def test_ledger_ranges():
    assert encode_ledgers([7, 1, 2, 3, 9, 10]) == "1-3,7,9-10"
    assert encode_ledgers([]) == "" and decode_ledgers("") == []


@given(st.sets(st.integers(0, 10**12), max_size=60))
def test_ledger_ranges_round_trip(ids):
    assert decode_ledgers(encode_ledgers(ids)) == sorted(ids)


def _led(i, size, day):
    return {"ledger_id": i, "size_bytes": size, "day": date(2026, 1, day)}


def test_file_groups_keep_one_day_and_the_bounds():
    leds = [_led(0, 10, 1), _led(1, 10, 1), _led(2, 10, 2), _led(3, 100, 2), _led(4, 5, 2), _led(5, 5, 2)]
    groups = [[x["ledger_id"] for x in g] for g in batches(leds, max_bytes=50, max_ledgers=2)]
    assert groups == [[0, 1], [2], [3], [4, 5]]  # a day change, a ledger over the bound alone, the count bound
    assert batches([], 10, 10) == []
