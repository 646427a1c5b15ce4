"""The offload's fast path changes no byte: tier-1 framed runs (`LedgerReader.iter_framed`) hold what
`iter_entries` yields with every check kept, and the packer (runs joined once per block) writes exactly the
blocks of a plain reference packer written from the format's description, page CRCs included, however the
entries are cut into runs."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_tier1_ledger import CASES, _flip, payload, write
from tiering.errors import BadInput, CorruptObjectError
from tiering.format.block import HEADER_LEN, PADDING, crc32c, encode_block_header
from tiering.format.block import decode_block
from tiering.format.packing import frame_entries, pack_blocks, pack_runs
from tiering.tier1 import LedgerReader
from tiering.tier1 import frames

MiB = 1024 * 1024


def entries_of(runs):
    """(entry_id, payload) pairs back out of framed runs, each run's framing checked on the way."""
    out = []
    for run in runs:
        data, start = bytes(run.data), 0
        assert len(run.ends) and int(run.ends[-1]) == len(data)
        for k, end in enumerate(run.ends.tolist()):
            length, entry_id = struct.unpack_from(">iq", data, start)
            assert entry_id == run.first_id + k and start + 12 + length == end
            out.append((entry_id, data[start + 12:end]))
            start = end
    return out


@pytest.mark.parametrize("chunk", [frames.CHUNK, 1000], ids=["1MiB-runs", "small-runs"])
@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "open"])
@pytest.mark.parametrize("case", CASES)
def test_framed_runs_equal_entries(tmp_path, case, seal, chunk, monkeypatch):
    monkeypatch.setattr(frames, "CHUNK", chunk)
    monkeypatch.setattr(frames, "INDEX_SLICE", 7)  # many index slices, each read alone
    write(tmp_path / "l", CASES[case], seal=seal)
    with LedgerReader(tmp_path / "l") as r:
        assert entries_of(r.iter_framed()) == list(r.iter_entries())
        n = r.entry_count
        for first, last in [(0, n - 1), (n // 3, n - 2), (n - 1, n - 1), (n, n - 1), (1, n - 1)]:
            if 0 <= first <= last + 1 <= n:
                assert entries_of(r.iter_framed(first, last)) == list(r.iter_entries(first, last))


def test_runs_across_chunks_and_larger_than_a_chunk(tmp_path):
    payloads = [payload(i, s) for i, s in enumerate([10, frames.CHUNK - 20, 3 * frames.CHUNK + 7, 0, 5000, 1])]
    write(tmp_path / "l", payloads)
    with LedgerReader(tmp_path / "l") as r:
        runs = list(r.iter_framed())
        assert [p for _, p in entries_of(runs)] == payloads
        assert max(len(run.data) for run in runs) == 12 + 3 * frames.CHUNK + 7  # the large frame alone


def _frame_at(k, size=20):
    return frames.HEADER_LEN[frames.VERSION] + k * (16 + size)


@pytest.mark.parametrize("seal", [True, False], ids=["sealed", "open"])
@pytest.mark.parametrize("where", ["payload", "crc", "id", "len"])
def test_runs_check_every_frame(tmp_path, where, seal, monkeypatch):
    """A damaged frame: the entries before it come out, then the error naming it (the reader's wording)."""
    monkeypatch.setattr(frames, "CHUNK", 100)  # runs of two frames, so the damage is inside a run
    path = tmp_path / "l"
    write(path, [payload(i, 20) for i in range(7)], seal=seal)
    _flip(path, _frame_at(3) + {"payload": 16 + 5, "crc": 13, "id": 11, "len": 3}[where])
    if not seal and where in ("len", "id"):
        with pytest.raises(CorruptObjectError, match="entry [34] is damaged"):
            LedgerReader(path)  # an open file's scan finds a frame's header damaged when it is opened
        return
    with LedgerReader(path) as r:
        it = r.iter_framed()
        got = []
        with pytest.raises(CorruptObjectError, match="entry 3|expected 3|index entry 4") as e:
            for run in it:
                got += entries_of([run])
        assert [i for i, _ in got] == [0, 1, 2]
        assert str(path) in str(e.value)


def test_runs_start_where_the_frames_start(tmp_path):
    """Index entry 0 pointing past frame 0 at a frame that would pass for it (entry 0's payload holding a
    whole frame of entry 0): the bytes skipped would be checked by no one."""
    path = tmp_path / "l"
    inner = frames.frame_header(0, b"forged") + b"forged"
    write(path, [inner, payload(1, 20)])
    data = bytearray(path.read_bytes())
    start = frames.HEADER_LEN[frames.VERSION]
    index_at = start + 2 * 16 + len(inner) + 20
    data[index_at:index_at + 8] = struct.pack(">q", start + 16)  # entry 0 "is" the frame inside its payload
    data[index_at + 8:index_at + 16] = struct.pack(">q", start + 16 + len(inner))
    path.write_bytes(bytes(data))
    with LedgerReader(path) as r:
        for read in (lambda: entries_of(r.iter_framed()), lambda: list(r.iter_entries()), lambda: r.read_entry(0)):
            with pytest.raises(CorruptObjectError, match="index entry 0 points at"):
                read()


@pytest.mark.parametrize("value", ["another frame", "inside a frame", "outside the file", "negative"])
def test_runs_check_the_footer_index(tmp_path, value, monkeypatch):
    """The fast path finds frames through the footer index; an index entry that is not where its frame lies
    fails the read with the index entry named, as a whole read entry by entry does."""
    monkeypatch.setattr(frames, "CHUNK", 100)
    path = tmp_path / "l"
    write(path, [payload(i, 20) for i in range(7)])
    data = bytearray(path.read_bytes())
    index_at = _frame_at(7)
    bad = {"another frame": _frame_at(5), "inside a frame": _frame_at(4) + 3, "outside the file": 10**9,
           "negative": -5}[value]
    data[index_at + 4 * 8:index_at + 5 * 8] = struct.pack(">q", bad)
    path.write_bytes(bytes(data))
    with LedgerReader(path) as r:
        assert [i for i, _ in r.iter_entries(0, 2)] == [0, 1, 2]
        with pytest.raises(CorruptObjectError, match="index entry 4|entry 3") as e:
            entries_of(r.iter_framed())
        assert str(path) in str(e.value)
        with pytest.raises(CorruptObjectError, match="index entry 4|entry 3"):
            list(r.iter_entries())  # the same verdict entry by entry


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


def packed(blocks):
    out, offset = [], 0
    for n, b in enumerate(blocks, 1):
        assert (b.part_id, b.offset) == (n, offset)
        assert b.entry_count == len(decode_block(b.data)[1])
        offset += len(b.data)
        out.append((b.first_entry_id, b.data, [tuple(x) for x in b.pages]))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 40_000), max_size=60), st.sampled_from([1024, 4096, 65536]),
       st.booleans(), st.integers(1, 200_000))
def test_packing_is_byte_identical_to_the_reference(sizes, page_size, views, run_bytes):
    """However the entries are cut into runs (a run may end inside a block, at its end, or span several)."""
    block_size = 64 * 1024  # small blocks so that oversized entries, exact fits and padding all occur
    entries = [(i, payload(i, n)) for i, n in enumerate(sizes)]
    fed = [(i, memoryview(p)) for i, p in entries] if views else entries
    assert packed(pack_runs(frame_entries(fed, run_bytes), block_size, page_size)) == \
        reference_blocks(entries, block_size, page_size)


@pytest.mark.parametrize("chunk", [frames.CHUNK, 3000])
def test_packing_tier1_runs_is_byte_identical_to_the_reference(tmp_path, chunk, monkeypatch):
    monkeypatch.setattr(frames, "CHUNK", chunk)
    block_size = 64 * 1024
    entries = [(i, payload(i, n)) for i, n in enumerate([0, 5, 70_000, 300, 65_000, 12, 64 * 1024 - 128 - 12]
                                                         + [1000 + i for i in range(200)])]
    write(tmp_path / "l", [p for _, p in entries])
    with LedgerReader(tmp_path / "l") as r:
        assert packed(pack_runs(r.iter_framed(), block_size, 4096)) == reference_blocks(entries, block_size, 4096)


def test_runs_out_of_sequence_are_refused():
    runs = list(frame_entries([(i, b"x") for i in range(10)], run_bytes=30))
    with pytest.raises(BadInput, match="consecutive"):
        list(pack_runs([runs[0], runs[2]], 1000))


def test_exact_fit_and_empty_entries():
    block_size = 64 * 1024
    exact = block_size - HEADER_LEN - 12  # one entry filling a block exactly
    entries = [(0, b""), (1, payload(1, exact)), (2, b""), (3, payload(3, exact + 1)), (4, b"x")]
    got = [(b.first_entry_id, b.data, [tuple(x) for x in b.pages]) for b in pack_blocks(entries, block_size, 4096)]
    assert got == reference_blocks(entries, block_size, 4096)


def test_a_wrong_index_entry_costs_no_large_read(tmp_path, monkeypatch):
    """An index entry pointing far into a later frame makes one 'frame' of megabytes: its header is read
    first, so no read is larger than the checked stream's own chunks on the index's word."""
    monkeypatch.setattr(frames, "CHUNK", 100)
    path = tmp_path / "l"
    sizes = [20, 20, 3 * MiB, 20]
    write(path, [payload(i, n) for i, n in enumerate(sizes)])
    f2 = frames.HEADER_LEN[frames.VERSION] + 2 * 36
    f3 = f2 + 16 + 3 * MiB
    data = bytearray(path.read_bytes())
    index_at = f3 + 36
    data[index_at + 8:index_at + 24] = struct.pack(">qq", f2 + 2 * MiB, f2 + 2 * MiB + 40)  # entries 1 and 2
    path.write_bytes(bytes(data))
    reads = []
    real = frames._pread
    monkeypatch.setattr(frames, "_pread", lambda fd, n, off: reads.append(n) or real(fd, n, off))
    with LedgerReader(path) as r:
        with pytest.raises(CorruptObjectError, match="index entry 1"):
            entries_of(r.iter_framed())
    assert 0 < max(reads) <= MiB + 16  # the 2 MiB "frame" was never read


@pytest.mark.parametrize("values", [(2**63 - 1, -2**63 + 200), (-2**63, None), (2**63 - 1, None)])
def test_wild_index_values_are_corruption(tmp_path, values):
    """Index values whose int64 differences wrap (the top bit set) are found before any difference is taken:
    the index entry is named, as entry by entry, instead of a numpy IndexError or a read at a negative offset."""
    path = tmp_path / "l"
    write(path, [payload(i, n) for i, n in enumerate([10, 20, 30, 5])])
    data = bytearray(path.read_bytes())
    index_at = _frame_at(0) + sum(16 + n for n in [10, 20, 30, 5])
    for k, v in enumerate(values, start=1):
        if v is not None:
            data[index_at + 8 * k:index_at + 8 * (k + 1)] = struct.pack(">q", v)
    path.write_bytes(bytes(data))
    with LedgerReader(path) as r:
        with pytest.raises(CorruptObjectError, match="index entry 1") as e:
            entries_of(r.iter_framed())
        assert str(path) in str(e.value)


def test_a_wrong_index_entry_after_a_slice_is_blamed(tmp_path, monkeypatch):
    """The index entry that bounds a slice of the index is named, not an intact entry before it."""
    monkeypatch.setattr(frames, "INDEX_SLICE", 8)
    path = tmp_path / "l"
    write(path, [payload(i, 10) for i in range(20)])
    data = bytearray(path.read_bytes())
    index_at = _frame_at(20, 10)
    data[index_at + 8 * 8:index_at + 8 * 9] = struct.pack(">q", _frame_at(2, 10) + 5)  # inside entry 2
    path.write_bytes(bytes(data))
    with LedgerReader(path) as r:
        with pytest.raises(CorruptObjectError, match="index entry 8 says"):
            entries_of(r.iter_framed())


def test_a_frame_claiming_more_than_an_entry_may_hold_is_corruption(tmp_path, monkeypatch):
    monkeypatch.setattr(frames, "MAX_PAYLOAD", 100)  # a frame over the limit without writing 2 GiB
    path = tmp_path / "l"
    with monkeypatch.context() as m:
        m.setattr(frames, "MAX_PAYLOAD", 2**31 - 1)
        write(path, [payload(0, 10), payload(1, 200)])
    with LedgerReader(path) as r:
        with pytest.raises(CorruptObjectError, match="entry 1 claims 200 bytes") as e:
            entries_of(r.iter_framed())
        assert str(path) in str(e.value)


def test_one_entry_size_limit_for_tier1_and_the_packer_and_the_producer_under_it():
    """Tier 1 stores and the packer frames the same largest payload; the producer takes less, so that an entry
    it wrote is never one a later step refuses: a ledger that could not be offloaded, or a payload too large for
    one value of an Arrow binary array (2^31 - 2 bytes), which read_batches, the Spark source and table sync build."""
    from tiering import writer
    from tiering.format import block, packing

    assert frames.MAX_PAYLOAD == block.MAX_ENTRY_LEN == 2**31 - 1
    assert writer.MAX_ENTRY_BYTES <= 2**31 - 2
    import numpy as np

    # a view of 2 GiB that holds one byte (stride 0): the packer refuses it on its length, before any copy
    huge = memoryview(np.broadcast_to(np.zeros(1, np.uint8), (2**31,)))
    with pytest.raises(BadInput, match=f"the format allows at most {2**31 - 1}"):
        list(packing.frame_entries([(0, huge)]))
