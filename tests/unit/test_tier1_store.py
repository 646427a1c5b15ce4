"""Tier1Store: ledgers of topics under one root."""
from __future__ import annotations

import os
import threading

import pytest

from tiering.errors import LedgerStorageError
from tiering.tier1 import LedgerFileExists, LedgerFileMissing, RecoveryInfo, Tier1Store, topic_dir


@pytest.fixture
def store(tmp_path):
    return Tier1Store(tmp_path / "root")


def test_create_write_seal_read(store):
    with store.create_ledger("t", 1) as w:
        assert [w.append(b"a"), w.append(b"bc")] == [0, 1]
        info = w.seal()
    assert (info.entry_count, info.size_bytes) == (2, 3)
    assert store.exists("t", 1) and not store.exists("t", 2) and not store.exists("other", 1)
    assert store.file_size("t", 1) == info.file_bytes
    with store.reader("t", 1) as r:
        assert r.sealed and list(r.iter_entries()) == [(0, b"a"), (1, b"bc")]


def test_root_is_created_on_first_write_only(store):
    assert store.ledger_ids("t") == [] and not store.exists("t", 0)
    with pytest.raises(LedgerStorageError):
        store.reader("t", 0)
    assert not store.root.exists()
    store.create_ledger("t", 0).close()
    assert store.root.is_dir()


def test_create_twice_fails_with_topic_and_ledger_in_message(store):
    store.create_ledger("orders", 5).close()
    with pytest.raises(LedgerFileExists, match=r"ledger 5 of topic 'orders'"):
        store.create_ledger("orders", 5)


@pytest.mark.parametrize("op", ["reader", "open_writer", "file_size", "recover"])
def test_missing_ledger_errors_name_topic_and_ledger(store, op):
    store.create_ledger("orders", 1).close()
    with pytest.raises(LedgerFileMissing, match=r"ledger 9 of topic 'orders'") as e:
        getattr(store, op)("orders", 9)
    assert isinstance(e.value, LedgerStorageError)


def test_open_writer_recovers_torn_tail_and_continues(store):
    with store.create_ledger("t", 0) as w:
        for i in range(3):
            w.append(b"x" * i)
    path = store.path("t", 0)
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00\x09garbage")
    with store.open_writer("t", 0) as w:
        assert w.recovery == RecoveryInfo(3, 3, 11)
        assert w.append(b"next") == 3
        w.seal()
    with store.reader("t", 0) as r:
        assert r.entry_count == 4 and r.read_entry(3) == b"next"


def test_ledger_ids_lists_files_in_order(store):
    for lid in (10, 2, 300, 0):
        store.create_ledger("t", lid).close()
    store.create_ledger("u", 7).close()
    (topic_dir(store.root, "t") / "stray.tmp").write_bytes(b"")  # not a ledger file
    assert store.ledger_ids("t") == [0, 2, 10, 300]
    assert store.ledger_ids("u") == [7]
    assert store.ledger_ids("none") == []


def test_delete_is_idempotent_and_keeps_the_topic_dir_until_the_topic_goes(store):
    store.create_ledger("t", 1).close()
    store.create_ledger("t", 2).close()
    tdir = topic_dir(store.root, "t")
    assert store.delete("t", 1) is True
    assert store.delete("t", 1) is False
    assert tdir.is_dir() and store.ledger_ids("t") == [2]
    assert store.delete("t", 2) is True
    # the last copy leaves the directory: it tells a copy removed by hand from a wrong root
    assert tdir.is_dir() and store.has_topic("t") and store.ledger_ids("t") == []
    assert store.delete("t", 2) is False
    assert store.delete("never", 0) is False
    (tdir / "notes.txt").write_text("an operator's file")
    store.remove_topic_dir("t")  # not empty: kept, no error
    assert tdir.is_dir()
    (tdir / "notes.txt").unlink()
    store.remove_topic_dir("t")
    assert not tdir.exists() and not store.has_topic("t") and store.root.is_dir()
    store.remove_topic_dir("t")  # already gone: nothing to do
    store.create_ledger("t", 3).close()  # the topic directory comes back
    assert store.ledger_ids("t") == [3]


def test_reader_survives_delete(store):
    with store.create_ledger("t", 0) as w:
        for i in range(50):
            w.append(bytes([i]) * 100)
        w.seal()
    with store.reader("t", 0) as r:
        assert store.delete("t", 0)
        assert not store.exists("t", 0)
        assert [p[0] for _, p in r.iter_entries()] == list(range(50))


def test_topics_are_isolated(store):
    for topic in ("a", "A", "a/b", "a%2Fb", "../a"):
        with store.create_ledger(topic, 0) as w:
            w.append(topic.encode())
            w.seal()
    for topic in ("a", "A", "a/b", "a%2Fb", "../a"):
        with store.reader(topic, 0) as r:
            assert r.read_entry(0) == topic.encode()
    assert sorted(os.listdir(store.root.parent)) == ["root"]


def test_create_races_with_delete_of_the_empty_topic_dir(store):
    errors = []

    def creator(start):
        try:
            for lid in range(start, start + 200, 2):
                store.create_ledger("t", lid).close()
                store.delete("t", lid)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=creator, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.ledger_ids("t") == []


LONG = "ä" * 300  # its directory's name holds a cut of it


def test_a_long_topic_s_name_is_written_beside_its_ledgers_and_goes_with_its_directory(store):
    from tiering.ops.recover_tier1 import topic_of_dir
    from tiering.tier1.paths import NAME_FILE

    for topic in ("short", LONG):
        store.create_ledger(topic, 0).close()
    assert sorted(os.listdir(topic_dir(store.root, "short"))) == ["00000000000000000000.ledger"]
    long_dir = topic_dir(store.root, LONG)
    assert (long_dir / NAME_FILE).read_bytes() == LONG.encode() and store.ledger_ids(LONG) == [0]
    assert topic_of_dir(long_dir.name) is None and topic_of_dir(long_dir.name, store) == LONG
    assert topic_of_dir(topic_dir(store.root, "short").name, store) == "short"

    (long_dir / NAME_FILE).write_bytes(b"something else")  # damaged: written again by the next ledger
    assert topic_of_dir(long_dir.name, store) is None  # it does not make this directory's name
    store.create_ledger(LONG, 1).close()
    assert topic_of_dir(long_dir.name, store) == LONG

    for lid in (0, 1):
        store.delete(LONG, lid)
    store.remove_topic_dir(LONG)  # the topic's deletion: its name goes with the directory
    assert not long_dir.exists()


@pytest.mark.parametrize("plant", ["fifo", "huge", "not utf-8", "directory", "symlink"])
def test_a_name_file_that_is_not_a_name_names_nothing_and_never_blocks(store, tmp_path, plant):
    from tiering.ops.recover_tier1 import topic_of_dir
    from tiering.tier1.paths import NAME_FILE

    store.create_ledger(LONG, 0).close()
    path = topic_dir(store.root, LONG) / NAME_FILE
    path.unlink()
    if plant == "fifo":
        os.mkfifo(path)
    elif plant == "huge":
        path.write_bytes(LONG.encode() * 100)
    elif plant == "not utf-8":
        path.write_bytes(b"\xff" * 10)
    elif plant == "directory":
        path.mkdir()
    else:
        (tmp_path / "elsewhere").write_bytes(LONG.encode())
        path.symlink_to(tmp_path / "elsewhere")
    assert topic_of_dir(path.parent.name, store) is None


def test_a_fifo_in_the_name_file_s_place_does_not_hold_the_producer(store):
    from tiering.tier1.paths import NAME_FILE

    store.create_ledger(LONG, 0).close()
    path = topic_dir(store.root, LONG) / NAME_FILE
    path.unlink()
    os.mkfifo(path)  # an open for reading would wait for a writer for ever
    store.create_ledger(LONG, 1).close()  # the name is written over it
    assert path.read_bytes() == LONG.encode()
