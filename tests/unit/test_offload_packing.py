"""The offload's fast path changes no byte: tier-1 payload views (`LedgerReader.iter_entry_views`)
equal `iter_entries` with every check kept, and `pack_blocks` (pieces joined once per block) writes exactly
the blocks of a plain reference packer written from the format's description, page CRCs included."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_tier1_ledger import CASES, _flip, payload, write
from tiering.errors import CorruptObjectError
from tiering.format.block import HEADER_LEN, PADDING, crc32c, encode_block_header, pack_blocks
from tiering.tier1 import LedgerReader
from tiering.tier1 import frames

MiB = 1024 * 1024


@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "open"])
@pytest.mark.parametrize("case", CASES)
def test_views_equal_entries(tmp_path, case, seal):
    write(tmp_path / "l", CASES[case], seal=seal)
    with LedgerReader(tmp_path / "l") as r:
        got = [(i, bytes(v)) for i, v in r.iter_entry_views()]
        assert got == list(r.iter_entries())
        n = r.entry_count
        for first, last in [(0, n - 1), (n // 3, n - 2), (n - 1, n - 1), (n, n - 1)]:
            if 0 <= first <= last + 1 <= n:
                assert [(i, bytes(v)) for i, v in r.iter_entry_views(first, last)] == \
                    list(r.iter_entries(first, last))


def test_views_across_chunks_and_larger_than_a_chunk(tmp_path, monkeypatch):
    payloads = [payload(i, s) for i, s in enumerate([10, frames.CHUNK - 20, 3 * frames.CHUNK + 7, 0, 5000, 1])]
    write(tmp_path / "l", payloads)
    with LedgerReader(tmp_path / "l") as r:
        assert [bytes(v) for _, v in r.iter_entry_views()] == payloads


@pytest.mark.parametrize("where", ["payload", "crc", "id"])
def test_views_check_every_frame(tmp_path, where):
    path = tmp_path / "l"
    write(path, [payload(i, 20) for i in range(5)])
    frame2 = frames.HEADER_LEN[frames.VERSION] + 2 * (16 + 20)
    _flip(path, frame2 + {"payload": 16 + 5, "crc": 13, "id": 11}[where])
    with LedgerReader(path) as r:
        it = r.iter_entry_views()
        assert [i for i, _ in (next(it), next(it))] == [0, 1]
        with pytest.raises(CorruptObjectError, match="entry 2|expected 2"):
            next(it)


def reference_blocks(entries, block_size, page_size):
    """Blocks as the format describes them, built the plain way: header, frames [len:i32][id:i64][payload],
    padding to block_size except in the last block and in a block holding one oversized entry; pages of whole
    entries of at most page_size bytes (a larger entry alone), the first with the header."""
    out, cur, first, starts = [], None, 0, []

    def close(pad):
        nonlocal cur
        if pad:
            n = block_size - len(cur)
            cur += (PADDING * n)[:n]
        cur[:HEADER_LEN] = encode_block_header(len(cur), first)
        data = bytes(cur)
        pages = [(e, o, crc32c(data[o:starts[k + 1][1] if k + 1 < len(starts) else len(data)]))
                 for k, (e, o) in enumerate(starts)]
        out.append((first, data, pages))
        cur = None

    for entry_id, p in entries:
        framed = 12 + len(p)
        if cur is not None and len(cur) + framed > block_size:
            close(True)
        if cur is None:
            cur, first, starts = bytearray(HEADER_LEN), entry_id, [(entry_id, 0)]
        elif len(cur) + framed - starts[-1][1] > page_size:
            starts.append((entry_id, len(cur)))
        cur += struct.pack(">iq", len(p), entry_id) + p
        if framed > block_size - HEADER_LEN:
            close(False)
    if cur is not None:
        close(False)
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 40_000), max_size=60), st.sampled_from([1024, 4096, 65536]),
       st.booleans())
def test_packing_is_byte_identical_to_the_reference(sizes, page_size, views):
    block_size = 64 * 1024  # small blocks so that oversized entries, exact fits and padding all occur
    entries = [(i, payload(i, n)) for i, n in enumerate(sizes)]
    fed = [(i, memoryview(p)) for i, p in entries] if views else entries
    got = [(b.first_entry_id, b.data, [tuple(x) for x in b.pages]) for b in pack_blocks(fed, block_size, page_size)]
    assert got == reference_blocks(entries, block_size, page_size)


def test_exact_fit_and_empty_entries():
    block_size = 64 * 1024
    exact = block_size - HEADER_LEN - 12  # one entry filling a block exactly
    entries = [(0, b""), (1, payload(1, exact)), (2, b""), (3, payload(3, exact + 1)), (4, b"x")]
    got = [(b.first_entry_id, b.data, [tuple(x) for x in b.pages]) for b in pack_blocks(entries, block_size, 4096)]
    assert got == reference_blocks(entries, block_size, 4096)
