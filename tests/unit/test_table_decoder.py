"""The JSON payload decoder of a topic's table: its spec (bad ones refused with a sentence), its changes
(only added fields), and how a payload decodes or becomes a dead letter."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tiering.errors import BadInput
from tiering.tables.decoder import check_change, check_spec, decode, parse_fields


def test_fields_parse():
    assert parse_fields(" id:int64, name : string ") == {
        "kind": "json", "fields": [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}]}


@pytest.mark.parametrize("bad,why", [("", "needs fields"), ("id", "NAME:TYPE"), ("id:int", "types are"),
                                     ("Id:int64", "lower-case"), ("id:int64,id:string", "twice"),
                                     ("payload:string", "own columns"), ("1x:int64", "lower-case"),
                                     ("sealed_at_day:string", "partition field")])
def test_bad_specs_are_refused(bad, why):
    with pytest.raises(BadInput, match=why):
        parse_fields(bad)


def test_spec_shape():
    with pytest.raises(BadInput):
        check_spec({"kind": "avro", "fields": [{"name": "a", "type": "string"}]})
    with pytest.raises(BadInput):
        check_spec({"kind": "json", "fields": []})


def test_changes_only_add_fields():
    old = parse_fields("a:int64")
    check_change(None, old)
    check_change(old, parse_fields("a:int64,b:string"))
    with pytest.raises(BadInput, match="was int64, now string"):
        check_change(old, parse_fields("a:string"))
    with pytest.raises(BadInput, match="removed"):
        check_change(old, parse_fields("b:string"))


def test_decode():
    spec = parse_fields("i:int64,d:double,s:string,b:boolean,t:timestamp")
    values, why = decode(spec, b'{"i": 1, "d": 2, "s": "x", "b": true, "t": "2026-01-02T03:04:05Z", "extra": 1}')
    assert why is None and values == {"i": 1, "d": 2.0, "s": "x", "b": True,
                                      "t": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)}
    assert decode(spec, b"{}") == ({"i": None, "d": None, "s": None, "b": None, "t": None}, None)
    for payload, why in ((b"nope", "not JSON"), (b"[1]", "not a JSON object"), (b'{"i": true}', "field 'i'"),
                         (b'{"i": 1.5}', "field 'i'"), (b'{"i": 9223372036854775808}', "9223372036854775808 (out of the 64-bit range)"),
                         (b'{"s": 3}', "field 's'"), (b'{"t": "yesterday"}', "field 't'"), (b"\xff", "not UTF-8")):
        values, reason = decode(spec, payload)
        assert values is None and why in reason, (payload, reason)


def test_decode_never_raises_on_a_payload():
    """A payload that crashed the decoder would fail every sync of its topic: each of these is a dead letter."""
    spec = parse_fields("d:double,t:timestamp,s:string")
    for payload, why in ((b'{"d": 1' + b"0" * 400 + b"}", "field 'd'"),
                         (b'{"t": "0001-01-01T00:00:00+01:00"}', "field 't'"),
                         (b'{"t": "9999-12-31T23:59:59-01:00"}', "field 't'"),
                         (b'{"s": "\\ud800"}', "field 's'"), (b"[" * 100_000, "nested too deep")):
        values, reason = decode(spec, payload)
        assert values is None and why in reason, (payload[:40], reason)
