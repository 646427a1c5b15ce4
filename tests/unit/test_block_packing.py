"""Offload's buffer packer (issue 22): `pack_frames`, fed by tier 1's `iter_entry_views` object reading runs
of entries straight into one reused block buffer, writes exactly the blocks `pack_blocks` writes from
(entry_id, payload) pairs (data, pages with their CRC32Cs, ids, offsets), and tier 1 still checks every
entry's id, length and crc on that path."""
from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_tier1_ledger import _flip, payload, write
from tiering.errors import BadInput, CorruptObjectError
from tiering.format import block as blockmod
from tiering.format.block import HEADER_LEN, FrameSource, pack_blocks, pack_frames
from tiering.tier1 import LedgerReader
from tiering.tier1 import entry_views

BLOCK = 64 * 1024  # small blocks, so that padding, exact fits and oversized entries all occur


def as_tuples(blocks):
    return [(b.part_id, b.first_entry_id, b.entry_count, b.data, b.offset, b.pages) for b in blocks]


class ListFrames:
    """A FrameSource over (id, payload) pairs in memory: what the packer needs, nothing of tier 1."""

    def __init__(self, entries):
        self.entries = list(entries)
        self.base = self.entries[0][0] if self.entries else 0
        self.next_id = self.base

    def lengths(self, first_id, n):
        k = first_id - self.base
        return [len(p) for _, p in self.entries[k:k + n]]

    def readinto(self, buf, n):
        k = self.next_id - self.base
        framed = b"".join(struct.pack(">iq", len(p), i) + p for i, p in self.entries[k:k + n])
        assert len(framed) == len(buf)
        buf[:] = framed
        self.next_id += n


def test_sources_are_frame_sources(tmp_path):
    write(tmp_path / "l", [b"a"])
    with LedgerReader(tmp_path / "l") as r:
        assert isinstance(r.iter_entry_views(), FrameSource)
    assert isinstance(ListFrames([]), FrameSource)
    assert not isinstance(iter([(0, b"a")]), FrameSource)  # the offloader's other path: pack_blocks


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 300), st.integers(0, 90_000),
                          st.sampled_from([0, BLOCK - HEADER_LEN - 12, BLOCK - HEADER_LEN - 11])), max_size=60),
       st.sampled_from([1, 1024, 4096, 65536]), st.integers(0, 1000))
def test_same_bytes_as_pack_blocks(sizes, page_size, first):
    entries = [(first + i, payload(i, n)) for i, n in enumerate(sizes)]
    want = as_tuples(pack_blocks(entries, BLOCK, page_size))
    assert as_tuples(pack_frames(ListFrames(entries), BLOCK, page_size)) == want


def test_exact_fits_empty_and_oversized_entries():
    exact = BLOCK - HEADER_LEN - 12  # one entry filling a block exactly
    sizes = [0, exact, 0, exact + 1, 5, 0, 3 * BLOCK, exact, 100, exact - 112, 0]
    entries = [(i, payload(i, n)) for i, n in enumerate(sizes)]
    got = list(pack_frames(ListFrames(entries), BLOCK, 4096))
    assert as_tuples(got) == as_tuples(pack_blocks(entries, BLOCK, 4096))
    assert any(len(b.data) == BLOCK and b.entry_count == 1 for b in got)  # an exact fit, no padding
    assert any(len(b.data) > BLOCK for b in got)  # the oversized entry: a block of its own size


def test_blocks_own_their_bytes_while_the_buffer_is_reused():
    entries = [(i, payload(i, 5000)) for i in range(100)]
    kept = list(pack_frames(ListFrames(entries), BLOCK, 4096))  # all kept while the next ones are packed
    assert [bytes(b.data) for b in kept] == [b.data for b in pack_blocks(entries, BLOCK, 4096)]
    assert all(isinstance(b.data, bytes) for b in kept)


def test_argument_checks_match_pack_blocks():
    for size in (10, True, 1.5):
        with pytest.raises(BadInput):
            list(pack_frames(ListFrames([(0, b"a")]), size))
    with pytest.raises(BadInput):
        list(pack_frames(ListFrames([(0, b"a")]), BLOCK, 0))
    assert list(pack_frames(ListFrames([]), BLOCK)) == []


# ----------------------------------------------------------------------------------- from tier-1 files

@pytest.fixture
def small_windows(monkeypatch):
    """Offset windows, preadv groups and planning look-ahead far smaller than the entries, so that every
    boundary between them falls inside the test's ledgers."""
    monkeypatch.setattr(entry_views, "WINDOW", 7)
    monkeypatch.setattr(entry_views, "_GROUP_ENTRIES", 5)
    monkeypatch.setattr(entry_views, "_GROUP_BYTES", 3000)
    monkeypatch.setattr(blockmod, "_LENGTHS_AHEAD", 11)


@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "open"])
@pytest.mark.parametrize("windows", [False, True], ids=["default", "small_windows"])
def test_tier1_views_pack_like_pack_blocks(tmp_path, request, seal, windows):
    if windows:
        request.getfixturevalue("small_windows")
    exact = BLOCK - HEADER_LEN - 12
    sizes = [0, 17, exact, 0, 0, exact + 1, 3 * BLOCK + 5, 1] + [(i * 7919) % 9000 for i in range(300)] + [0]
    payloads = [payload(i, n) for i, n in enumerate(sizes)]
    write(tmp_path / "l", payloads, seal=seal)
    with LedgerReader(tmp_path / "l") as r:
        n = r.entry_count
        for first, last in [(0, n - 1), (5, n - 3), (n - 1, n - 1), (n, n - 1)]:
            want = as_tuples(pack_blocks(r.iter_entries(first, last), BLOCK, 4096))
            assert as_tuples(pack_frames(r.iter_entry_views(first, last), BLOCK, 4096)) == want


def test_short_preadv_reads_are_resumed(tmp_path, monkeypatch):
    payloads = [payload(i, 3000 + i) for i in range(200)]
    write(tmp_path / "l", payloads)
    real = os.preadv

    def short(fd, buffers, offset):  # at most 1000 bytes a call: every buffer boundary case occurs
        budget, cut = 1000, []
        for b in buffers:
            if budget <= 0:
                break
            cut.append(b[:budget])
            budget -= len(cut[-1])
        return real(fd, cut, offset)

    monkeypatch.setattr(entry_views.os, "preadv", short)
    with LedgerReader(tmp_path / "l") as r:
        got = as_tuples(pack_frames(r.iter_entry_views(), BLOCK, 4096))
        assert got == as_tuples(pack_blocks(r.iter_entries(), BLOCK, 4096))


FRAME2 = 8 + 2 * (16 + 20)  # file offset of entry 2's frame: ledgers of five 20-byte entries


@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "open"])
@pytest.mark.parametrize("where", ["payload", "crc", "id", "length"])
def test_readinto_checks_every_entry(tmp_path, seal, where):
    if where in ("id", "length") and not seal:
        pytest.skip("an open ledger's scan already stops at a frame with a bad id or length")
    path = tmp_path / "l"
    write(path, [payload(i, 20) for i in range(5)], seal=seal)
    _flip(path, FRAME2 + {"payload": 16 + 5, "crc": 13, "id": 11, "length": 3}[where])
    with LedgerReader(path) as r:
        with pytest.raises(CorruptObjectError, match="entry 2|expected 2") as err:
            list(pack_frames(r.iter_entry_views(), BLOCK))
    assert str(path) in str(err.value)


def test_a_damaged_index_is_caught(tmp_path):
    path = tmp_path / "l"
    write(path, [payload(i, 20) for i in range(5)])
    index_at = FRAME2 + 3 * (16 + 20)
    _flip(path, index_at + 2 * 8 + 7)  # entry 2's offset moves by 64 bytes
    with LedgerReader(path) as r:
        with pytest.raises(CorruptObjectError):
            list(pack_frames(r.iter_entry_views(), BLOCK))


def test_a_truncated_file_is_caught(tmp_path):
    path = tmp_path / "l"
    write(path, [payload(i, 20) for i in range(5)], seal=False)
    with LedgerReader(path) as r:
        os.truncate(path, FRAME2 + 10)  # cut while the reader holds the scan of 5 entries
        with pytest.raises(CorruptObjectError, match="ends .* early"):
            list(pack_frames(r.iter_entry_views(), BLOCK))


def test_iterating_and_readinto_do_not_mix(tmp_path):
    write(tmp_path / "l", [payload(i, 20) for i in range(5)])
    with LedgerReader(tmp_path / "l") as r:
        it = r.iter_entry_views()
        next(it)
        with pytest.raises(BadInput):
            it.lengths(1, 3)
        views = r.iter_entry_views()
        views.readinto(memoryview(bytearray(32)), 1)
        with pytest.raises(BadInput):
            next(views)
