"""The managed-ledger writer on real PostgreSQL: rollover, resume after a torn crash, exactly-once appends."""
from __future__ import annotations

import os

import pytest

from tiering.errors import BadInput
from tiering.metadata.attributes import Attributes
from tiering.metadata.repository import MetadataStore
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.read import Entry, ReadHandle, open_ledger_now
from tiering.tier1 import LedgerFileExists, LedgerFileMissing, Tier1Store
from tiering.writer import ManagedLedgerWriter


@pytest.fixture
def meta(db):
    return MetadataStore(db)


def test_rollover_by_entries_and_by_bytes(meta, tier1_root):
    t1 = Tier1Store(tier1_root)
    meta.create_topic("e", TopicPolicy(rollover_entries=3))
    w = ManagedLedgerWriter(meta, t1, "e")
    positions = [w.append(b"x") for _ in range(7)]
    assert positions == [Position(0, 0), Position(0, 1), Position(0, 2), Position(1, 0), Position(1, 1),
                         Position(1, 2), Position(2, 0)]
    assert [(led.state, led.entry_count) for led in meta.list_ledgers("e")] == \
        [(S.SEALED, 3), (S.SEALED, 3), (S.OPEN, 0)]
    meta.create_topic("b", TopicPolicy(rollover_bytes=10))
    w = ManagedLedgerWriter(meta, t1, "b")
    assert [w.append(b"12345").ledger_id for _ in range(5)] == [0, 0, 1, 1, 2]
    assert [led.size_bytes for led in meta.list_ledgers("b", [S.SEALED])] == [10, 10]


def test_writer_resumes_an_open_ledger_torn_by_a_crash(meta, tier1_root):
    t1 = Tier1Store(tier1_root)
    meta.create_topic("t")
    w = ManagedLedgerWriter(meta, t1, "t")
    for i in range(5):
        w.append(f"entry-{i}".encode())
    w.close()
    path = t1.path("t", 0)
    with open(path, "ab") as f:  # a crash mid-append leaves half a frame
        f.write(b"\x00\x00\x00\x40\x00\x00")
    w = ManagedLedgerWriter(meta, t1, "t")  # recovers to the last complete entry and continues
    assert w.append(b"after") == Position(0, 5)
    sealed = w.seal()
    assert (sealed.entry_count, sealed.size_bytes) == (6, sum(len(f"entry-{i}") for i in range(5)) + 5)
    got = [e.data for e in ReadHandle(meta, t1).read("t") if isinstance(e, Entry)]
    assert got == [f"entry-{i}".encode() for i in range(5)] + [b"after"]
    assert os.path.getsize(path) > 0


def test_writer_records_a_seal_its_killed_predecessor_left_only_in_the_file(meta, tier1_root):
    # killed between sealing the ledger's file and recording the seal: the row still says OPEN
    t1 = Tier1Store(tier1_root)
    meta.create_topic("k")
    w = ManagedLedgerWriter(meta, t1, "k")
    for i in range(3):
        w.append(f"entry-{i}".encode())
    w._writer.seal()
    w.close()
    assert meta.get_ledger("k", 0).state == S.OPEN
    w = ManagedLedgerWriter(meta, t1, "k")  # records the seal from the file, then writes the next ledger
    assert (w.sealed_on_open.ledger_id, w.sealed_on_open.entry_count) == (0, 3)
    assert w.append(b"next") == Position(1, 0)
    w.close()
    led = meta.get_ledger("k", 0)
    assert (led.state, led.entry_count, led.size_bytes) == (S.SEALED, 3, sum(len(f"entry-{i}") for i in range(3)))
    got = [(e.ledger_id, e.data) for e in ReadHandle(meta, t1).read("k") if isinstance(e, Entry)]
    assert got == [(0, f"entry-{i}".encode()) for i in range(3)] + [(1, b"next")]


def test_exactly_once_appends_drop_retries(meta, tier1_root, db):
    t1 = Tier1Store(tier1_root)
    meta.create_topic("x")
    w = ManagedLedgerWriter(meta, t1, "x")
    first = w.append_once(b"e0", "writer-a", 0)
    retry = w.append_once(b"e0", "writer-a", 0)
    second = w.append_once(b"e1", "writer-a", 1)
    other = w.append_once(b"b0", "writer-b", 0)
    assert first.position == Position(0, 0) and not first.duplicate
    assert retry.duplicate and retry.position is None
    assert second.position == Position(0, 1) and other.position == Position(0, 2)
    assert Attributes(db).get("x", "writer:writer-a") == 1
    w.seal()
    assert [e.data for e in ReadHandle(meta, t1).read("x") if isinstance(e, Entry)] == [b"e0", b"e1", b"b0"]


def test_append_refuses_what_the_format_cannot_hold(meta, tier1_root):
    meta.create_topic("y")
    w = ManagedLedgerWriter(meta, Tier1Store(tier1_root), "y")
    with pytest.raises(BadInput):
        w.append("text, not bytes")
    with pytest.raises(BadInput):
        w.append_once(b"x", "w", -1)
    assert meta.list_ledgers("y") == []  # nothing written


def test_an_open_ledger_whose_file_is_not_there_is_refused_not_started_again(meta, tier1_root, tmp_path):
    t1 = Tier1Store(tier1_root)
    meta.create_topic("w")
    w = ManagedLedgerWriter(meta, t1, "w")
    assert [w.append(b"%d" % i) for i in range(3)][-1] == Position(0, 2)
    w.close()
    wrong = Tier1Store(tmp_path / "not-the-root")  # another machine's view, or a typo in the setting
    with pytest.raises(LedgerFileMissing):
        ManagedLedgerWriter(meta, wrong, "w")
    [led] = meta.list_ledgers("w")
    assert (led.state, led.version) == (S.OPEN, 0) and not wrong.exists("w", 0)
    w = ManagedLedgerWriter(meta, t1, "w")  # the right root goes on where it was
    assert w.append(b"3") == Position(0, 3)
    assert w.seal().entry_count == 4


def test_a_read_refuses_an_open_ledger_whose_file_is_not_there(meta, tier1_root, tmp_path):
    # read as empty, the open ledger's entries would silently be missing from the output
    t1 = Tier1Store(tier1_root)
    meta.create_topic("r", TopicPolicy(rollover_entries=2))
    w = ManagedLedgerWriter(meta, t1, "r")
    for i in range(3):
        w.append(b"%d" % i)  # ledger 0 sealed with 2 entries, ledger 1 open with 1
    w.close()
    wrong = Tier1Store(tmp_path / "not-the-root")
    with pytest.raises(LedgerFileMissing, match="open ledger 1 of topic 'r' .*TIERING_TIER1_ROOT"):
        list(ReadHandle(meta, wrong).read("r"))
    assert [e.data for e in ReadHandle(meta, t1).read("r") if isinstance(e, Entry)] == [b"0", b"1", b"2"]
    # listed while open, sealed and its file gone since (offloaded, copy deleted): the row read again decides
    stale = meta.list_ledgers("r")[1]
    w = ManagedLedgerWriter(meta, t1, "r")
    w.seal()
    w.close()
    assert t1.delete("r", 1)
    assert open_ledger_now(meta, t1, stale).state == S.SEALED


def test_a_file_made_before_its_row_is_taken_over_only_while_empty(meta, tier1_root):
    t1 = Tier1Store(tier1_root)
    meta.create_topic("f", TopicPolicy(rollover_entries=2))
    t1.create_ledger("f", 0).close()  # a writer killed between the new ledger's file and its row
    w = ManagedLedgerWriter(meta, t1, "f")
    assert [w.append(b"a"), w.append(b"b"), w.append(b"c")] == [Position(0, 0), Position(0, 1), Position(1, 0)]
    w.close()
    meta.create_topic("g")
    stray = t1.create_ledger("g", 0)  # entries with no row: never written over
    stray.append(b"kept")
    stray.close()
    with pytest.raises(LedgerFileExists):
        ManagedLedgerWriter(meta, t1, "g").append(b"new")
    assert meta.list_ledgers("g") == [] and meta.get_topic("g").next_ledger_id == 0
    with t1.reader("g", 0) as r:
        assert [data for _, data in r.iter_entries()] == [b"kept"]
