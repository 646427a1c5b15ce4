"""Object keys: percent-encoded topics that can never escape the prefix, and parsing keys back."""
from __future__ import annotations

import pytest

from tiering.errors import BadInput
from tiering.format import ParsedKey, data_key, encode_topic, index_key, parse_key

UUID = "0b7e0d2c-1111-4222-8333-444455556666"


def test_examples():
    assert data_key("t/", "persistent://a/b/c", UUID, 3) == f"t/persistent%3A%2F%2Fa%2Fb%2Fc/{UUID}-ledger-3"
    assert index_key("t/", "orders", UUID, 0) == f"t/orders/{UUID}-ledger-0-index"
    assert data_key("", "x", "u", 12) == "x/u-ledger-12"


@pytest.mark.parametrize("topic,encoded", [
    ("a/b", "a%2Fb"), ("..", "%2E%2E"), (".", "%2E"), ("...", "%2E%2E%2E"), ("a..b", "a..b"), ("../x", "..%2Fx"),
    ("nul\0", "nul%00"), ("q'\"`", "q%27%22%60"), ("100%", "100%25"), ("%2E", "%252E"), ("é", "%C3%A9"),
    ("sp ace", "sp%20ace"), ("back\\slash", "back%5Cslash"), ("~_-.", "~_-."),
])
def test_topic_encoding(topic, encoded):
    assert encode_topic(topic) == encoded
    key = data_key("p/", topic, UUID, 9)
    assert key == f"p/{encoded}/{UUID}-ledger-9"
    assert parse_key("p/", key) == ParsedKey(topic, UUID, 9, False, encoded)
    assert parse_key("p/", key + "-index") == ParsedKey(topic, UUID, 9, True, encoded)
    assert all(seg not in (".", "..", "") for seg in key.split("/"))


@pytest.mark.parametrize("args", [("", UUID, 1), (None, UUID, 1), ("\udc80", UUID, 1), ("t", "a/b", 1),
                                  ("t", "", 1), ("t", "a.b", 1), ("t", UUID, -1), ("t", UUID, True),
                                  ("t", UUID, "1"), ("t", UUID, 2**63), ("t", UUID, 2**63 - 1),
                                  ("t", 5, 1)])
def test_bad_arguments(args):
    with pytest.raises(BadInput):
        data_key("p/", *args)


@pytest.mark.parametrize("key", [
    "q/t/u-ledger-1",               # other prefix
    "p/t",                          # no tail
    "p/t/u-ledger-1/x",             # extra segment
    "p//u-ledger-1",                # empty topic
    "p/t/u-ledger-01",              # non-canonical ledger id
    "p/t/u-ledger--1",
    "p/t/u-ledger-x",
    "p/t/u-ledger-1-index-index",
    "p/t/u-ledger-1-idx",
    "p/t/-ledger-1",                # empty uuid
    "p/t/u.v-ledger-1",
    "p/a%2fb/u-ledger-1",           # lower-case escape: not what data_key writes
    "p/../u-ledger-1",              # a dots segment data_key never writes
    "p/a b/u-ledger-1",             # unescaped space
    "p/%FF/u-ledger-1",             # not UTF-8
    "p/%2/u-ledger-1",
    f"p/t/u-ledger-{2**63}",
    f"p/t/u-ledger-{2**63 - 1}",  # no next_ledger_id (a bigint) could follow it: not an id the store makes
    "p/t/u-ledger-1.tmp",
])
def test_foreign_keys_are_not_ours(key):
    assert parse_key("p/", key) is None


def test_uuid_containing_ledger_word_still_parses():
    key = index_key("p/", "t", "a-ledger-1", 2)
    assert parse_key("p/", key) == ParsedKey("t", "a-ledger-1", 2, True, "t")


def test_parse_with_empty_prefix():
    assert parse_key("", "t/u-ledger-0") == ("t", "u", 0, False, "t")


@pytest.mark.parametrize("topic", ["x" * 1000, "é" * 1024, "/" * 1024, "a" * 199 + "é", "." * 300])
def test_long_topics_get_a_hashed_segment_within_s3s_key_limit(topic):
    segment = encode_topic(topic)
    assert 200 < len(segment) <= 217 and "/" not in segment
    key = index_key("p/", topic, UUID, 2**63 - 2)
    assert len(key.encode()) <= 1024
    parsed = parse_key("p/", key)
    assert parsed == ParsedKey(None, UUID, 2**63 - 2, True, segment)  # the index metadata names the topic
    assert encode_topic(topic + "y") != segment  # injective by the hash


def test_short_and_hashed_segments_never_collide():
    assert len(encode_topic("a" * 200)) == 200 and len(encode_topic("a" * 201)) > 200
