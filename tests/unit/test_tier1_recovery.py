"""Tier-1 recovery: torn tails at every byte, garbage tails, a crash mid-seal, a writer killed with SIGKILL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tiering.errors import CorruptObjectError
from tiering.tier1 import LedgerReader, LedgerWriter, RecoveryInfo, recover
from tiering.tier1 import frames
from tests.unit.test_tier1_ledger import check_all, payload, write

REPO = Path(__file__).resolve().parents[2]


def _torn_copies(tmp_path, payloads, last):
    """Write payloads + [last] open; yield (cut offset, path of a copy cut there) for every cut in the last frame."""
    src = tmp_path / "src" / "l"
    src.parent.mkdir()
    with LedgerWriter(src) as w:
        for p in payloads:
            w.append(p)
        before = w.file_bytes
        w.append(last)
        after = w.file_bytes
    data = src.read_bytes()
    assert len(data) == after
    for cut in range(before, after):
        copy = tmp_path / f"cut{cut}" / "src" / "l"  # the same directory and file name: the same identity
        copy.parent.mkdir(parents=True)
        copy.write_bytes(data[:cut])
        yield cut - before, copy


def test_torn_tail_at_every_byte_of_last_frame_recovers_to_previous_entry(tmp_path):
    payloads = [payload(i) for i in range(5)]
    for extra, path in _torn_copies(tmp_path, payloads, b"L" * 40):
        with LedgerReader(path) as r:  # a reader of the torn file sees only complete frames
            assert r.entry_count == 5
        assert recover(path) == RecoveryInfo(5, sum(map(len, payloads)), extra)
        assert recover(path).truncated_bytes == 0
        with LedgerWriter(path, open_existing=True) as w:
            assert w.append(b"next") == 5
            w.seal()
        check_all(path, payloads + [b"next"], sealed=True)


def test_torn_tail_via_open_existing_reports_recovery(tmp_path):
    for extra, path in _torn_copies(tmp_path, [b"a", b"b"], b"c" * 10):
        with LedgerWriter(path, open_existing=True) as w:
            assert w.recovery == RecoveryInfo(2, 2, extra) and w.entry_count == 2
            assert w.append(b"z") == 2
        check_all(path, [b"a", b"b", b"z"], sealed=False)


@pytest.mark.parametrize("cut", range(0, frames.HEADER_LEN[frames.VERSION] + 1))
def test_torn_file_header_recovers_to_empty_ledger(tmp_path, cut):
    path = tmp_path / "l"
    write(path, [], seal=False)
    path.write_bytes(path.read_bytes()[:cut])
    assert recover(path).entry_count == 0
    write_more(path, [b"first"])
    check_all(path, [b"first"], sealed=False)


def write_more(path, payloads):
    with LedgerWriter(path, open_existing=True) as w:
        return [w.append(p) for p in payloads]


GARBAGE = {
    "random": os.urandom(1000),
    "zeros": bytes(64),  # a crash can leave a zero-filled tail
    "huge_length": frames.FRAME.pack(2**32 - 1, 3, 0) + b"x" * 50,
    "wrong_id": frames.frame_header(7, b"abc") + b"abc",
    "bad_crc": frames.FRAME.pack(3, 3, 12345) + b"abc",
    "crc_of_payload_only": frames.FRAME.pack(0, 3, 0),
    "one_byte": b"\x00",
}


@pytest.mark.parametrize("kind", GARBAGE)
def test_garbage_tail_is_cut(tmp_path, kind):
    path = tmp_path / "l"
    payloads = [b"a", b"", b"ccc"]
    write(path, payloads, seal=False)
    clean = path.stat().st_size
    with open(path, "ab") as f:
        f.write(GARBAGE[kind])
    assert recover(path) == RecoveryInfo(3, 4, len(GARBAGE[kind]))
    assert path.stat().st_size == clean
    assert write_more(path, [b"d"]) == [3]
    check_all(path, payloads + [b"d"], sealed=False)


def test_zero_filled_tail_of_empty_ledger_is_not_an_entry(tmp_path):
    path = tmp_path / "l"
    write(path, [], seal=False)
    with open(path, "ab") as f:
        f.write(bytes(16))  # would be a valid empty entry 0 if the crc covered only the payload
    assert recover(path) == RecoveryInfo(0, 0, 16)


def test_crash_mid_seal_leaves_an_open_ledger(tmp_path):
    path = tmp_path / "l"
    payloads = [b"a", b"bb"]
    write(path, payloads, seal=True)
    data = bytearray(path.read_bytes())
    data[4:8] = frames.header_bytes(False, path)[4:8]  # footer written, flag not yet
    path.write_bytes(bytes(data))
    footer = 2 * 8 + 20
    assert recover(path) == RecoveryInfo(2, 3, footer)
    with LedgerWriter(path, open_existing=True) as w:
        assert w.seal().entry_count == 2
    check_all(path, payloads, sealed=True)


# Appends entries of 1..31 KB forever; says "ready" after 200 so the kill lands mid-stream.
WRITER = textwrap.dedent("""
    import sys
    from tiering.tier1 import LedgerWriter
    from tests.unit.test_tier1_ledger import payload
    w = LedgerWriter(sys.argv[1])
    i = 0
    while True:
        w.append(payload(i, 1000 + (i * 7919) % 30000))
        i += 1
        if i == 200:
            print("ready", flush=True)
""")


def test_killed_writer_process_recovers(tmp_path):
    path = tmp_path / "l"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline() == b"ready\n"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    info = recover(path)
    assert info.entry_count >= 200
    expected = [payload(i, 1000 + (i * 7919) % 30000) for i in range(info.entry_count)]
    assert info.size_bytes == sum(map(len, expected))
    with LedgerWriter(path, open_existing=True) as w:
        assert w.recovery.truncated_bytes == 0
        assert w.append(b"after") == info.entry_count
        w.seal()
    check_all(path, expected + [b"after"], sealed=True)


def test_a_header_whose_identity_never_reached_the_disk_recovers_to_an_empty_ledger(tmp_path):
    path = tmp_path / "l"
    write(path, [], seal=False)
    path.write_bytes(path.read_bytes()[:frames.HEADER.size] + bytes(frames.IDENTITY_LEN))
    assert recover(path).entry_count == 0
    write_more(path, [b"first"])
    check_all(path, [b"first"], sealed=False)


@pytest.mark.parametrize("where", ["payload", "length", "id"])
def test_a_damaged_entry_with_intact_ones_after_it_is_not_cut_as_a_torn_tail(tmp_path, where):
    """A crash tears only what was written last; an intact later entry after a damaged one is damage inside
    the ledger: cutting there would silently discard entries that were appended and acknowledged."""
    path = tmp_path / "l"
    payloads = [payload(i, 100) for i in range(10)]
    write(path, payloads, seal=False)
    frame3 = frames.HEADER_LEN[frames.VERSION] + 3 * (16 + 100)
    data = bytearray(path.read_bytes())
    data[frame3 + {"payload": 16 + 50, "length": 2, "id": 11}[where]] ^= 0x01
    path.write_bytes(bytes(data))
    for opening in (recover, lambda p: LedgerWriter(p, open_existing=True)):
        with pytest.raises(CorruptObjectError, match="entry 3 is damaged and an intact later entry follows"):
            opening(path)
        assert path.read_bytes() == bytes(data)  # nothing cut
    info = recover(path, discard_damaged=True)  # the operator's decision
    assert (info.entry_count, info.truncated_bytes) == (3, len(data) - frame3)
    check_all(path, payloads[:3], sealed=False)


def test_a_damaged_last_entry_is_cut_as_a_torn_tail_is(tmp_path):
    path = tmp_path / "l"
    payloads = [payload(i, 100) for i in range(4)]
    write(path, payloads, seal=False)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01  # nothing intact after it: a crash could leave the same
    path.write_bytes(bytes(data))
    assert recover(path) == RecoveryInfo(3, 300, 116)


def test_a_long_damaged_stretch_with_intact_entries_after_it_is_not_cut_either(tmp_path):
    """A zeroed page holds many small entries: the intact entry after it is found whatever its id."""
    path = tmp_path / "l"
    write(path, [payload(i, 10) for i in range(400)], seal=False)
    data = bytearray(path.read_bytes())
    start = frames.HEADER_LEN[frames.VERSION] + 10 * 26
    data[start:start + 4096] = bytes(4096)  # entries 10 to 167 zeroed
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError, match="entry 10 is damaged and an intact later entry follows"):
        recover(path)
    assert path.read_bytes() == bytes(data)


def test_would_recover_says_what_recover_leaves_and_changes_nothing(tmp_path):
    """A recovery's preview (`recover-from-bucket --dry-run`) counts what sealing would keep: a torn tail or a
    damaged last entry not counted, damage inside refused as recover refuses it, the file unchanged."""
    from tiering.tier1.ledger_file import would_recover

    payloads = [payload(i) for i in range(5)]
    for extra, path in _torn_copies(tmp_path, payloads, b"L" * 40):
        before = path.read_bytes()
        assert would_recover(path) == RecoveryInfo(5, sum(map(len, payloads)), extra)
        assert path.read_bytes() == before
        assert recover(path) == RecoveryInfo(5, sum(map(len, payloads)), extra)
    path = tmp_path / "damaged" / "l"
    path.parent.mkdir()
    write(path, [payload(i, 100) for i in range(4)], seal=False)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01  # the last entry's payload: what a crash could leave, and cut
    path.write_bytes(bytes(data))
    assert would_recover(path) == RecoveryInfo(3, 300, 116) and path.read_bytes() == bytes(data)
    frame1 = frames.HEADER_LEN[frames.VERSION] + (16 + 100)
    data[frame1 + 60] ^= 0x01  # and one inside, intact entries after it: refused, nothing cut
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptObjectError, match="an intact later entry follows"):
        would_recover(path)
    assert path.read_bytes() == bytes(data)


def test_would_recover_refuses_a_file_a_live_writer_holds(tmp_path):
    from tiering.errors import LedgerStorageError
    from tiering.tier1.ledger_file import would_recover

    path = tmp_path / "l"
    with LedgerWriter(path) as w:
        w.append(b"x")
        with pytest.raises(LedgerStorageError, match="being written by another writer"):
            would_recover(path)
    assert would_recover(path) == RecoveryInfo(1, 1, 0)  # the writer gone
