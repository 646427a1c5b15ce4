"""Hostile topic names: path traversal, separators, quotes, SQL, very long names, NUL and other control characters.

After produce + offload of every name: the tier-1 root holds one directory per topic and nothing outside
it was written; every object lies under the bucket prefix, one key segment per topic; SQL-looking names
are stored verbatim and inert (the tables are all still there); everything reads back byte-exact. NUL,
which PostgreSQL text cannot hold, and control characters (a name must print as one line) are refused
with BadInput."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.faults.harness import check_invariants
from tests.integration.helpers import entries, produce
from tiering.errors import BadInput
from tiering.format.keys import data_key, encode_topic, index_key, parse_key
from tiering.model import MAX_LEDGER_ID, LedgerState as S, TopicPolicy
from tiering.ops.offload import offload_many
from tiering.tier1.paths import LEDGER_FILE, NAME_FILE, topic_dir_name

NAMES = [
    "../", "/", "..", ".", "../../../../../../tmp/escaped", "a/../../b", "..\\..\\win",
    "it's \"quoted\" `back`", "'; DROP TABLE tiering.ledger; --", "\"; DROP SCHEMA tiering CASCADE; --",
    "%2e%2e%2f%00", "line break *?$HOME |<>", "t" * 1000, "é/" * 300,
]
TABLES = ["topic", "ledger", "chunk", "gc_task", "attribute", "job_run", "schema_migrations"]
S3_MAX_KEY_BYTES = 1024  # AWS: "the UTF-8 encoding of a key is at most 1,024 bytes"; moto does not check


def test_hostile_names_stay_inside_the_tier1_root_and_the_bucket_prefix(deps, db, tmp_path, tier1_root):
    policy = TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40)
    expected = {}
    for i, name in enumerate(NAMES):
        expected[name] = produce(deps, name, [entries(f"h{i}", 3, 100)], policy, open_tail=[b"open"])
        report = offload_many(deps, deps.meta.list_ledgers(name, [S.SEALED]))
        assert report.offloaded == [0], (name, report)

    # tier 1: nothing written beside the root; under it one plain directory per topic, holding ledger files
    assert sorted(os.listdir(tmp_path)) == ["tier1"]
    root = Path(os.path.realpath(tier1_root))
    topic_dirs = sorted(os.listdir(root))
    assert len(topic_dirs) == len(NAMES)
    for d in topic_dirs:
        path = root / d
        assert not path.is_symlink() and path.is_dir() and Path(os.path.realpath(path)).parent == root
        assert d not in (".", "..") and len(d.encode()) <= 255
        for f in os.listdir(path):
            assert LEDGER_FILE.match(f) or f == NAME_FILE, f  # a long name's whole name, beside its ledgers
            assert (path / f).is_file() and not (path / f).is_symlink()
            if f == NAME_FILE:
                assert topic_dir_name((path / f).read_bytes().decode()) == d
    assert not Path("/tmp/escaped").exists() and not (tmp_path.parent / "b").exists()

    # tier 2: every key under the prefix, exactly one segment for the topic, mapping back to the name
    s3, bucket = deps.bucket.s3, deps.bucket.name
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])]
    assert len(keys) == 2 * len(NAMES)
    topics_seen = set()
    for key in keys:
        assert key.startswith("t/")
        segments = key[2:].split("/")
        assert len(segments) == 2 and all(s not in ("", ".", "..") for s in segments), key
        parsed = parse_key("t/", key)
        assert parsed is not None, key
        topics_seen.add(parsed.segment)
    assert topics_seen == {encode_topic(n) for n in NAMES}  # one segment per topic, long ones hashed

    # SQL-looking names are plain data: every table still there, every name stored verbatim
    with db.connect() as conn:
        for table in TABLES:
            assert conn.execute(text("SELECT to_regclass(:t)"), {"t": f"tiering.{table}"}).scalar() is not None
        assert conn.execute(text("SELECT count(*) FROM tiering.ledger")).scalar() == 2 * len(NAMES)
    assert sorted(t.name for t in deps.meta.list_topics()) == sorted(NAMES)

    check_invariants(deps, db, expected)  # byte-exact read-back from both tiers, bucket == metadata


@pytest.mark.parametrize("name", ["a\x00b", "../\x00/etc"], ids=["nul-inside", "nul-after-dots"])
def test_nul_in_a_topic_name_is_refused_with_bad_input(deps, name):
    # PostgreSQL text cannot hold NUL: the library must refuse it as bad input, not crash with the driver's
    # ValueError ("A string literal cannot contain NUL (0x00) characters.")
    with pytest.raises(BadInput):
        deps.meta.create_topic(name)
    with pytest.raises(BadInput):
        deps.meta.get_topic(name)
    assert deps.meta.list_topics() == []


@pytest.mark.parametrize("name", ["line\nbreak", "cr\rlf", "tab\t", "esc\x1b[2J", "c1\x85", "ls\u2028"])
def test_control_characters_are_refused_in_new_names(name, deps):
    # `topic list` would print such a name as several lines (or move the terminal's cursor)
    with pytest.raises(BadInput, match="control characters"):
        deps.meta.create_topic(name)
    assert deps.meta.list_topics() == []


@pytest.mark.parametrize("name", ["t" * 1000, "é" * 1024, "/" * 1024], ids=["1000-ascii", "1024-e-acute", "1024-slashes"])
def test_object_keys_of_the_longest_topic_names_fit_s3s_key_limit(name):
    # Topic names may have up to 1024 characters (README, schema CHECK); their object keys must still be
    # storable on AWS S3, whatever the prefix (default "tiering/") and the attempt uuid.
    uuid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    for key in (data_key("tiering/", name, uuid, MAX_LEDGER_ID), index_key("tiering/", name, uuid, MAX_LEDGER_ID)):
        assert len(key.encode("utf-8")) <= S3_MAX_KEY_BYTES, f"{len(key.encode())}-byte key for a {len(name)}-char topic"
