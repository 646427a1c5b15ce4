"""Tier-1 ledger files: round trips, ranges, sealing, corruption, streaming (recovery: test_tier1_recovery)."""
from __future__ import annotations

import hashlib
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.errors import BadInput, CorruptObjectError, EntryNotFound, LedgerStorageError
from tiering.tier1 import (LedgerFileExists, LedgerFileMissing, LedgerReader, LedgerWriter, RecoveryInfo,
                           SealInfo, recover)
from tiering.tier1 import frames

HEADER = frames.HEADER_LEN[frames.VERSION]  # where a new file's first frame starts

MiB = 1 << 20


def payload(i: int, size: int | None = None) -> bytes:
    """Deterministic, distinct per id; variable size unless given."""
    seed = hashlib.sha256(str(i).encode()).digest()
    n = (seed[0] * 7 + i) % 300 if size is None else size
    return (seed * (n // 32 + 1))[:n]


def write(path, payloads, seal=True):
    with LedgerWriter(path) as w:
        ids = [w.append(p) for p in payloads]
        info = w.seal() if seal else None
    assert ids == list(range(len(payloads)))
    return info


def check_all(path, payloads, sealed):
    with LedgerReader(path) as r:
        assert r.sealed is sealed
        assert r.entry_count == len(payloads)
        assert r.size_bytes == sum(map(len, payloads))
        got = list(r.iter_entries())
        assert [i for i, _ in got] == list(range(len(payloads)))
        assert [p for _, p in got] == payloads
        for i in {0, len(payloads) // 2, len(payloads) - 1} if payloads else ():
            assert r.read_entry(i) == payloads[i]


CASES = {
    "empty": [],
    "one": [b"hello"],
    "zero_byte_entries": [b"", b"", b"x", b""],
    "10k_small": [payload(i) for i in range(10_000)],
    "1MiB_entries": [payload(i, MiB) for i in range(3)] + [b"tail"],
}


@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "open"])
@pytest.mark.parametrize("case", CASES)
def test_round_trip(tmp_path, case, seal):
    path = tmp_path / "l.ledger"
    payloads = CASES[case]
    info = write(path, payloads, seal=seal)
    if seal:
        assert info == SealInfo(len(payloads), sum(map(len, payloads)), path.stat().st_size)
        assert path.stat().st_size == HEADER + 16 * len(payloads) + info.size_bytes + 8 * len(payloads) + 20
    check_all(path, payloads, sealed=seal)


def test_accepts_bytearray_and_memoryview_rejects_str(tmp_path):
    with LedgerWriter(tmp_path / "l") as w:
        assert w.append(bytearray(b"ab")) == 0
        assert w.append(memoryview(b"cd")) == 1
        with pytest.raises(BadInput):
            w.append("text")
        w.seal()
    check_all(tmp_path / "l", [b"ab", b"cd"], sealed=True)


@pytest.fixture(scope="module")
def ranged(tmp_path_factory):
    d = tmp_path_factory.mktemp("ranged")
    payloads = [payload(i) for i in range(300)]
    write(d / "sealed", payloads, seal=True)
    write(d / "open", payloads, seal=False)
    readers = {k: LedgerReader(d / k) for k in ("sealed", "open")}
    yield payloads, readers
    for r in readers.values():
        r.close()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(-1, 299), st.sampled_from(["sealed", "open"]))
def test_random_ranges(ranged, first, last, kind):
    payloads, readers = ranged
    r = readers[kind]
    if first > last + 1:
        with pytest.raises(EntryNotFound):
            r.iter_entries(first, last)
        return
    assert list(r.iter_entries(first, last)) == [(i, payloads[i]) for i in range(first, last + 1)]


@pytest.mark.parametrize("kind", ["sealed", "open"])
def test_out_of_range_is_entry_not_found(ranged, kind):
    _, readers = ranged
    r = readers[kind]
    for bad in (-1, 300, 10**12):
        with pytest.raises(EntryNotFound):
            r.read_entry(bad)
    with pytest.raises(EntryNotFound):
        r.iter_entries(0, 300)  # raised at the call, not at the first next()
    with pytest.raises(EntryNotFound):
        r.iter_entries(-1)
    assert list(r.iter_entries(300)) == []


def test_seal_then_append_fails_and_seal_is_idempotent(tmp_path):
    path = tmp_path / "l"
    w = LedgerWriter(path)
    w.append(b"a")
    info = w.seal()
    assert w.seal() == info and w.sealed
    with pytest.raises(LedgerStorageError):
        w.append(b"b")
    w.flush()  # durable already: no-op
    w.close()
    again = LedgerWriter(path, open_existing=True)  # e.g. crash after sealing, before the metadata knew
    assert again.sealed and again.seal() == info and again.recovery == RecoveryInfo(1, 1, 0)
    with pytest.raises(LedgerStorageError):
        again.append(b"b")
    check_all(path, [b"a"], sealed=True)


def test_create_existing_and_open_missing_fail(tmp_path):
    write(tmp_path / "l", [b"x"])
    with pytest.raises(LedgerFileExists):
        LedgerWriter(tmp_path / "l")
    with pytest.raises(LedgerFileMissing):
        LedgerWriter(tmp_path / "nope", open_existing=True)
    with pytest.raises(LedgerFileMissing):
        LedgerReader(tmp_path / "nope")
    check_all(tmp_path / "l", [b"x"], sealed=True)  # the failed create did not touch it


def test_one_writer_at_a_time(tmp_path):
    path = tmp_path / "l"
    with LedgerWriter(path) as w:
        w.append(b"a")
        with pytest.raises(LedgerStorageError, match="another writer"):
            LedgerWriter(path, open_existing=True)
        with pytest.raises(LedgerStorageError, match="another writer"):
            recover(path)
    with LedgerWriter(path, open_existing=True) as w:
        assert w.append(b"b") == 1


def _flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "open"])
@pytest.mark.parametrize("where", ["payload", "crc"])
def test_crc_corruption_is_reported_on_read(tmp_path, seal, where):
    path = tmp_path / "l"
    payloads = [payload(i, 20) for i in range(5)]
    write(path, payloads, seal=seal)
    frame2 = HEADER + 2 * (16 + 20)
    _flip(path, frame2 + (16 + 5 if where == "payload" else 13))
    with LedgerReader(path) as r:
        assert r.read_entry(1) == payloads[1] and r.read_entry(3) == payloads[3]
        with pytest.raises(CorruptObjectError, match="crc") as e:
            r.read_entry(2)
        assert str(path) in str(e.value)
        it = r.iter_entries()
        assert [next(it), next(it)] == [(0, payloads[0]), (1, payloads[1])]
        with pytest.raises(CorruptObjectError):
            next(it)
        assert list(r.iter_entries(3)) == [(3, payloads[3]), (4, payloads[4])]


def test_corrupt_entry_id_in_sealed_file(tmp_path):
    path = tmp_path / "l"
    write(path, [b"abc"] * 3)
    _flip(path, HEADER + (16 + 3) + 11)  # entry 1's id
    with LedgerReader(path) as r, pytest.raises(CorruptObjectError, match="expected 1"):
        r.read_entry(1)


@pytest.mark.parametrize("offset", [-1, -5, -13, -21, 0, 4])
def test_damaged_sealed_file_is_corrupt_not_repaired(tmp_path, offset):
    path = tmp_path / "l"
    write(path, [b"abc"] * 3)
    _flip(path, offset % path.stat().st_size)
    before = path.read_bytes()

    def read_everything():
        with LedgerReader(path) as r:
            [r.read_entry(i) for i in range(3)]  # a damaged index entry only shows in random access
            list(r.iter_entries())
    with pytest.raises(CorruptObjectError):
        read_everything()
    with pytest.raises(CorruptObjectError):
        recover(path)
    assert path.read_bytes() == before


def test_recover_leaves_a_sealed_file_unchanged(tmp_path):
    path = tmp_path / "l"
    write(path, [b"abc"] * 3)
    before = path.read_bytes()
    assert recover(path) == RecoveryInfo(3, 9, 0)
    assert path.read_bytes() == before


@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "open"])
def test_iter_entries_streams(tmp_path, monkeypatch, seal):
    path = tmp_path / "l"
    write(path, [payload(i, MiB) for i in range(16)], seal=seal)
    fetched = []
    real = frames._pread

    def counting(fd, n, offset):
        data = real(fd, n, offset)
        fetched.append(len(data))
        return data
    monkeypatch.setattr(frames, "_pread", counting)
    with LedgerReader(path) as r:
        opened = sum(fetched)
        it = r.iter_entries()
        assert inspect.isgenerator(it) and sum(fetched) == opened  # nothing read before the first next()
        assert next(it) == (0, payload(0, MiB))
        assert sum(fetched) - opened < 3 * MiB
        assert next(it)[0] == 1
        assert sum(fetched) - opened < 4 * MiB
        assert sum(1 for _ in it) == 14
    assert opened < 256 * 1024  # opening reads a header and trailer (sealed) or frame headers (open)


def test_reader_keeps_reading_a_deleted_file(tmp_path):
    path = tmp_path / "l"
    payloads = [payload(i) for i in range(100)]
    write(path, payloads)
    with LedgerReader(path) as r:
        it = r.iter_entries()
        assert next(it) == (0, payloads[0])
        path.unlink()
        assert [p for _, p in it] == payloads[1:]
        assert r.read_entry(50) == payloads[50]


def test_reader_of_open_ledger_sees_a_snapshot(tmp_path):
    path = tmp_path / "l"
    with LedgerWriter(path) as w:
        w.append(b"a")
        with LedgerReader(path) as r:
            w.append(b"b")  # in the OS as soon as append returns
            assert r.entry_count == 1 and list(r.iter_entries()) == [(0, b"a")]
            with LedgerReader(path) as r2:
                assert list(r2.iter_entries()) == [(0, b"a"), (1, b"b")]
            w.seal()
            assert r.read_entry(0) == b"a"


def test_bad_magic_is_corrupt(tmp_path):
    path = tmp_path / "l"
    path.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(CorruptObjectError, match="magic"):
        LedgerReader(path)
    with pytest.raises(CorruptObjectError):
        recover(path)


def test_a_reader_opening_the_file_while_its_writer_seals_it(tmp_path, monkeypatch):
    """The reader takes the file's length, then its header: a seal landing in between (footer, then the
    sealed flag) must not make the open ledger's last frames read as a bad trailer."""
    import tiering.tier1.ledger_reader as ledger_reader

    path = tmp_path / "l.ledger"
    payloads = [payload(i) for i in range(5)]
    w = LedgerWriter(path)
    for p in payloads:
        w.append(p)
    real_fstat = ledger_reader.os.fstat

    def fstat_then_seal(fd):
        got = real_fstat(fd)
        if not w.sealed:
            w.seal()
        return got

    monkeypatch.setattr(ledger_reader.os, "fstat", fstat_then_seal)
    with LedgerReader(path) as r:
        assert w.sealed and r.entry_count == 5
        assert [data for _, data in r.iter_entries(0, 4)] == payloads
    w.close()


@pytest.mark.parametrize("entries", [0, 3])
def test_an_open_ledger_read_between_its_footer_and_its_sealed_flag(tmp_path, entries):
    """A seal writes the footer, fsyncs, then sets the sealed flag: a reader in between still sees an open
    ledger and counts its frames. An empty ledger's footer is a trailer alone, whose bytes parse as a frame
    header of entry 0 with no payload: it must not be counted as an entry."""
    path = tmp_path / "l.ledger"
    payloads = [payload(i) for i in range(entries)]
    with LedgerWriter(path) as w:
        for p in payloads:
            w.append(p)
        w.seal()
    raw = bytearray(path.read_bytes())
    raw[:HEADER] = frames.header_bytes(False, path)  # the flag not written yet
    path.write_bytes(bytes(raw))
    with LedgerReader(path) as r:
        assert not r.sealed and r.entry_count == entries
        assert [data for _, data in r.iter_entries(0, entries - 1)] == payloads


def _another_writer_between_create_and_lock(monkeypatch, path, then_seal: bool) -> list:
    """The first lock taken (the creating writer's) comes after another writer opened the new, empty file as
    a crashed writer's leftover and wrote to it (and, with `then_seal`, sealed and let it go)."""
    from tiering.tier1 import ledger_file

    real, other = ledger_file._lock, []

    def late_lock(file, p):
        if not other:
            other.append(None)
            b = LedgerWriter(path, open_existing=True)
            b.append(b"from the other writer")
            if then_seal:
                b.seal()
            other[0] = b
        return real(file, p)
    monkeypatch.setattr(ledger_file, "_lock", late_lock)
    return other


@pytest.mark.parametrize("then_seal", [False, True])
def test_a_creating_writer_beaten_to_its_lock_leaves_the_file_to_the_other(tmp_path, monkeypatch, then_seal):
    path = tmp_path / "0.ledger"
    other = _another_writer_between_create_and_lock(monkeypatch, path, then_seal)
    with pytest.raises(LedgerStorageError, match="being written by another writer"):
        LedgerWriter(path)
    assert path.exists()  # not removed under the other writer, nor un-sealed by a header written over it
    if not then_seal:
        other[0].append(b"more")
        other[0].seal()
    with LedgerReader(path) as r:
        assert r.sealed and [d for _, d in r.iter_entries()][0] == b"from the other writer"


@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "open"])
def test_a_file_copied_into_another_ledgers_place_is_refused(tmp_path, seal):
    """Every ledger numbers its entries from 0, so a whole, sound file of another ledger with as many entries
    and bytes passes every frame check: the header's identity (its directory's and its own name) tells."""
    src = tmp_path / "t" / "00000000000000000001.ledger"
    src.parent.mkdir()
    write(src, [b"a", b"bb"], seal=seal)
    (tmp_path / "u").mkdir()
    for other in (src.with_name("00000000000000000002.ledger"), tmp_path / "u" / src.name):
        other.write_bytes(src.read_bytes())
        for opening in (LedgerReader, recover, lambda p: LedgerWriter(p, open_existing=True)):
            with pytest.raises(CorruptObjectError, match="belongs to another ledger"):
                opening(other)
        assert other.read_bytes() == src.read_bytes()  # nothing cut, nothing written
    # the same directory and file name under another root: the same ledger (a root restored elsewhere)
    moved = tmp_path / "elsewhere" / "t" / src.name
    moved.parent.mkdir(parents=True)
    moved.write_bytes(src.read_bytes())
    check_all(moved, [b"a", b"bb"], sealed=seal)


def test_a_version_1_file_is_read_resumed_and_sealed_as_version_1(tmp_path):
    """Files written before the identity (an 8-byte header) stay readable and writable as they are."""
    path = tmp_path / "l"
    write(path, [b"a", b"bb"], seal=False)
    path.write_bytes(frames.HEADER.pack(frames.MAGIC, 1, 0, 0) + path.read_bytes()[HEADER:])
    check_all(path, [b"a", b"bb"], sealed=False)
    with LedgerWriter(path, open_existing=True) as w:
        assert w.recovery.truncated_bytes == 0 and w.append(b"ccc") == 2
        w.seal()
    assert path.read_bytes()[:frames.HEADER.size] == frames.HEADER.pack(frames.MAGIC, 1, frames.FLAG_SEALED, 0)
    check_all(path, [b"a", b"bb", b"ccc"], sealed=True)


def test_an_unknown_format_version_is_corrupt(tmp_path):
    path = tmp_path / "l"
    write(path, [b"a"], seal=True)
    data = bytearray(path.read_bytes())
    data[4] = 3
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError, match="format version 3"):
        LedgerReader(path)
