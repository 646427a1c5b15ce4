"""Tier-1 paths: no topic name escapes the root, the mapping is injective, names fit the file-name limit."""
from __future__ import annotations

import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.errors import BadInput, LedgerStorageError
from tiering.tier1 import Tier1Store, ledger_path, topic_dir, topic_dir_name

HOSTILE = ["../x", "/", "..", ".", "a/../../b", "../../../../etc/passwd", "a\x00b", "\x00", "'", '"', "`",
           "a b", "%", "%2F", "-", "~", "\\..\\x", "ü", "日本語", "🙂", "\u202e", "CON", "x" * 1000,
           "/" * 1000, "é" * 1000, "a/b", "a%2Fb", "A", "a", "\n", "*", "$HOME"]
NAME_CHARS = re.compile(r"^[A-Za-z0-9_%-]+$")


def _inside(root, path) -> bool:
    real_root = os.path.realpath(root)
    return os.path.commonpath([real_root, os.path.realpath(path)]) == real_root


@pytest.mark.parametrize("topic", HOSTILE)
def test_hostile_names_stay_one_level_inside_root(tmp_path, topic):
    d = topic_dir(tmp_path, topic)
    assert d.parent == tmp_path
    assert NAME_CHARS.match(d.name) and d.name not in (".", "..")
    assert len(d.name.encode()) <= 255
    p = ledger_path(tmp_path, topic, 7)
    assert p == d / "00000000000000000007.ledger"
    assert _inside(tmp_path, p)


def test_hostile_names_map_injectively_and_really_write_inside_root(tmp_path):
    root = tmp_path / "root"
    store = Tier1Store(root)
    for i, topic in enumerate(HOSTILE):
        with store.create_ledger(topic, 0) as w:
            w.append(topic.encode("utf-8"))
            w.seal()
    assert len({topic_dir_name(t) for t in HOSTILE}) == len(HOSTILE)
    assert sorted(os.listdir(tmp_path)) == ["root"]  # nothing written beside the root
    assert len(os.listdir(root)) == len(HOSTILE)
    for topic in HOSTILE:
        with store.reader(topic, 0) as r:
            assert r.read_entry(0) == topic.encode("utf-8")


def test_case_differing_names_are_distinct_even_case_insensitively():
    assert topic_dir_name("Topic").lower() != topic_dir_name("topic").lower()


def test_long_names_keep_a_readable_prefix_and_fit():
    name = topic_dir_name("orders-" + "x" * 1000)
    assert name.startswith("orders-xxx") and len(name) <= 117
    # a cut never leaves a broken %XX escape
    cut = topic_dir_name("é" * 1000)
    prefix = cut[: -17]
    assert re.fullmatch(r"(%[0-9A-F]{2})+", prefix)


def test_distinct_long_names_with_same_prefix_differ():
    assert topic_dir_name("a" * 500 + "1") != topic_dir_name("a" * 500 + "2")


@pytest.mark.parametrize("bad", ["", None, 3, b"bytes", "\udc80"])
def test_bad_topic_names_are_bad_input(tmp_path, bad):
    with pytest.raises(BadInput):
        topic_dir(tmp_path, bad)


@pytest.mark.parametrize("bad", [-1, 2**63 - 1, 2**63, 1.0, "3", True, None])
def test_bad_ledger_ids_are_bad_input(tmp_path, bad):
    with pytest.raises(BadInput):
        ledger_path(tmp_path, "t", bad)


def test_ledger_ids_are_zero_padded_so_listing_sorts(tmp_path):
    assert ledger_path(tmp_path, "t", 2**63 - 2).name == "09223372036854775806.ledger"
    assert ledger_path(tmp_path, "t", 0).name == "00000000000000000000.ledger"


def test_symlink_planted_as_topic_dir_is_refused(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / topic_dir_name("t"))
    with pytest.raises(LedgerStorageError):
        topic_dir(root, "t")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=300), min_size=1, max_size=20, unique=True))
def test_any_names_are_safe_and_injective(topics):
    names = [topic_dir_name(t) for t in topics]
    assert len(set(names)) == len(names)
    for name in names:
        assert NAME_CHARS.match(name) and name not in (".", "..") and len(name.encode()) <= 255


def test_a_file_naming_an_id_the_store_never_makes_is_not_a_ledger(tmp_path):
    """Twenty digits hold ids past int64: such a file listed as a ledger made recovery overflow the topic's
    next_ledger_id (a bigint), failing it whole."""
    from tiering.tier1.paths import LEDGER_FILE, ledger_id_of

    assert ledger_id_of(LEDGER_FILE, "09223372036854775806.ledger") == 2**63 - 2
    for name in ("09223372036854775807.ledger", "99999999999999999999.ledger", "1.ledger", "x.ledger"):
        assert ledger_id_of(LEDGER_FILE, name) is None
