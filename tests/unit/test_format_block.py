"""Data blocks: Pulsar's BlockAwareSegmentInputStream cases as facts, round trips, streaming, corruption."""
from __future__ import annotations

import itertools
import struct
import tracemalloc

import pytest

from tiering.errors import BadInput, CorruptObjectError
from tiering.format.block import (BLOCK_MAGIC, DEFAULT_BLOCK_SIZE, ENTRY_HEADER_LEN, HEADER_LEN, MIN_BLOCK_SIZE,
                                  PADDING, EndOfEntries, Entry, NeedMore, decode_block, encode_block_header,
                                  entries_size, iter_block_entries, parse_block_header, read_entry_at)
from tiering.format.packing import RUN_BYTES, pack_blocks


def entries(n, size=8, first=0):
    return [(first + i, bytes([i % 251]) * size) for i in range(n)]


def unpack_all(blocks):
    out = []
    for b in blocks:
        _, got = decode_block(b.data, f"part {b.part_id}", b.offset)
        out += [(e.entry_id, bytes(e.payload)) for e in got]
    return out


def test_constants():
    assert (HEADER_LEN, ENTRY_HEADER_LEN, BLOCK_MAGIC, PADDING) == (128, 12, 0xFBDBABCB, b"\xfe\xdc\xde\xad")
    assert (DEFAULT_BLOCK_SIZE, MIN_BLOCK_SIZE) == (8 << 20, 5 << 20)


def test_pulsar_3153_byte_block_holds_151_entries_then_5_padding_bytes():
    blocks = list(pack_blocks(entries(200), 3153))
    first = blocks[0]
    assert (first.part_id, first.first_entry_id, first.entry_count, first.offset) == (1, 0, 151, 0)
    assert len(first.data) == 3153
    assert first.data[128 + 151 * 20:] == b"\xfe\xdc\xde\xad\xfe"
    assert blocks[1].first_entry_id == 151 and blocks[1].entry_count == 49 and blocks[1].offset == 3153
    assert len(blocks[1].data) == 128 + 49 * 20  # last block: exact size
    assert unpack_all(blocks) == entries(200)


def test_pulsar_2148_byte_block_holds_101_entries_and_no_padding():
    blocks = list(pack_blocks(entries(150), 2148))
    assert blocks[0].entry_count == 101 and len(blocks[0].data) == 2148
    _, got = decode_block(blocks[0].data)
    assert got[-1].end == 2148  # the last entry ends the block: no padding at all
    assert unpack_all(blocks) == entries(150)


def test_pulsar_entries_larger_than_a_block_get_exact_blocks_of_their_own():
    blocks = list(pack_blocks(entries(5, size=1000), 1128))
    assert [b.entry_count for b in blocks] == [1] * 5
    assert [len(b.data) for b in blocks] == [128 + 12 + 1000] * 5
    assert [b.part_id for b in blocks] == [1, 2, 3, 4, 5]
    assert [b.offset for b in blocks] == [i * 1140 for i in range(5)]
    assert unpack_all(blocks) == entries(5, size=1000)


def test_header_fields_and_zero_padding():
    (block,) = pack_blocks(entries(3, first=7), 1000)
    magic, header_len, block_len, first = struct.unpack_from(">Iqqq", block.data)
    assert (magic, header_len, block_len, first) == (BLOCK_MAGIC, 128, len(block.data), 7)
    assert bytes(block.data[28:128]) == bytes(100)
    assert parse_block_header(block.data).first_entry_id == 7
    assert block.data[:128] == encode_block_header(len(block.data), 7)


@pytest.mark.parametrize("n,size,block_size", [(1, 0, 140), (1, 5, 1 << 20), (50, 0, 200), (1000, 37, 4096),
                                               (10, 118, 256), (3, 10_000, 2048)])
def test_round_trip_and_sizes(n, size, block_size):
    src = entries(n, size, first=42)
    blocks = list(pack_blocks(src, block_size))
    assert unpack_all(blocks) == src
    assert [b.part_id for b in blocks] == list(range(1, len(blocks) + 1))
    assert sum(b.entry_count for b in blocks) == n
    offset = 0
    for b in blocks:
        assert b.offset == offset
        offset += b.length
    framed = 12 + size
    for b in blocks[:-1]:
        assert b.length == block_size or (b.entry_count == 1 and b.length == 128 + framed > block_size)
    assert blocks[-1].length == 128 + blocks[-1].entry_count * framed  # exact, never padded
    assert blocks[-1].last_entry_id == 42 + n - 1


def test_single_entry_and_zero_byte_entries():
    (only,) = pack_blocks([(0, b"x")], DEFAULT_BLOCK_SIZE)
    assert bytes(only.data) == encode_block_header(141, 0) + struct.pack(">iq", 1, 0) + b"x"
    (zeros,) = pack_blocks([(i, b"") for i in range(10)], 1000)
    assert zeros.length == 128 + 120 and unpack_all([zeros]) == [(i, b"") for i in range(10)]


def test_entry_exactly_filling_a_block_is_not_oversized():
    blocks = list(pack_blocks([(0, bytes(88)), (1, b"a")], 228))  # 128 + 12 + 88 == 228
    assert [b.length for b in blocks] == [228, 141]


def test_oversized_entry_between_small_ones():
    src = [(0, b"a"), (1, b"b"), (2, bytes(500)), (3, b"c")]
    blocks = list(pack_blocks(src, 200))
    assert [(b.first_entry_id, b.entry_count, b.length) for b in blocks] == [(0, 2, 200), (2, 1, 640), (3, 1, 141)]
    assert blocks[0].data[128 + 26:] == (PADDING * 12)[:200 - 154]
    assert unpack_all(blocks) == src


@pytest.mark.parametrize("slack", range(1, 20))
def test_padding_is_the_pattern_cut_to_fit(slack):
    block_size = 128 + 20 * 5 + slack  # 8-byte entries take 20 bytes framed
    first = next(iter(pack_blocks(entries(6), block_size)))
    assert first.entry_count == 5
    assert bytes(first.data[228:]) == (PADDING * 5)[:slack]
    decode_block(first.data)


def test_no_entries_no_blocks():
    assert list(pack_blocks([], 1000)) == []


def test_memoryview_and_bytearray_payloads():
    src = [(0, memoryview(b"abc")), (1, bytearray(b"de"))]
    assert unpack_all(pack_blocks(src, 1000)) == [(0, b"abc"), (1, b"de")]


@pytest.mark.parametrize("bad", [[(0, b""), (2, b"")], [(1, b""), (0, b"")], [(-1, b"")], [(True, b"")],
                                 [(0, "text")], [(0, b""), (0, b"")], [(2**63, b"")]])
def test_packer_rejects_bad_entries(bad):
    with pytest.raises(BadInput):
        list(pack_blocks(bad, 1000))


@pytest.mark.parametrize("size", [0, 139, -5, 1.5, None, True])
def test_packer_rejects_bad_block_size(size):
    with pytest.raises(BadInput):
        list(pack_blocks(entries(1), size))


def test_packer_streams_lazily():
    pulled = []

    def source():
        for i in itertools.count():
            pulled.append(i)
            yield i, b"12345678"

    gen = pack_blocks(source(), 3153)
    first = next(gen)
    # one block, and at most the run of entries (RUN_BYTES of them framed) being cut into it
    assert first.entry_count == 151 and 152 <= len(pulled) <= 151 + RUN_BYTES // 20 + 1
    assert [b.part_id for b in itertools.islice(gen, 3)] == [2, 3, 4]


def test_packer_holds_one_block_at_a_time():
    payload = bytes(10_000)
    block_size = 1 << 20
    total = 0
    tracemalloc.start()
    try:
        for block in pack_blocks(((i, payload) for i in range(3000)), block_size):  # ~30 MiB in all
            total += block.length
            del block
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total > 28 * block_size
    # one block, the runs it is cut from (the one being cut held twice, as a run and in the block's pieces)
    # and a 64 KiB padding chunk: not the input's 30 MiB
    assert peak < 3 * block_size + RUN_BYTES


def test_block_can_be_kept_while_the_next_is_built():
    blocks = list(pack_blocks(entries(300), 500))
    assert all(parse_block_header(b.data).first_entry_id == b.first_entry_id for b in blocks)


def test_entries_size():
    assert entries_size([0, 8, 100]) == 36 + 108


# --- corruption -------------------------------------------------------------------------------------------

def good_block(n=10, block_size=500):
    return bytearray(next(iter(pack_blocks(entries(n + 100), block_size))).data)


def corrupt(fn, *args, **kwargs) -> CorruptObjectError:
    with pytest.raises(CorruptObjectError) as info:
        fn(*args, **kwargs)
    return info.value


def test_bad_magic():
    buf = good_block()
    buf[0] ^= 0xFF
    err = corrupt(parse_block_header, buf, "data t/x-ledger-1", 4096)
    assert err.what == "block header" and err.where == "data t/x-ledger-1, offset 4096" and "magic" in err.detail


@pytest.mark.parametrize("n", [0, 1, 27, 28, 127])
def test_short_header(n):
    err = corrupt(parse_block_header, bytes(good_block()[:n]))
    assert "short header" in err.detail and err.where == "offset 0"


@pytest.mark.parametrize("field_offset,value,word", [(4, 64, "header_len"), (12, 100, "block_len"),
                                                     (12, -1, "block_len"), (20, -3, "first_entry_id")])
def test_bad_header_fields(field_offset, value, word):
    buf = good_block()
    struct.pack_into(">q", buf, field_offset, value)
    err = corrupt(parse_block_header, buf, "b", 10)
    assert word in err.detail and err.where == f"b, offset {10 + field_offset}"


def test_nonzero_header_padding():
    buf = good_block()
    buf[100] = 1
    assert "padding" in corrupt(parse_block_header, buf).detail


def test_block_len_must_match_the_buffer():
    buf = good_block()
    assert "block_len" in corrupt(decode_block, buf[:-1]).detail
    assert "block_len" in corrupt(decode_block, buf + b"\xfe").detail


def test_bad_padding_byte_reports_its_offset():
    buf = good_block()  # 18 entries (488 bytes) + 12 padding bytes
    buf[495] = 0x00
    err = corrupt(decode_block, buf, "d", 1000)
    assert err.what == "block padding" and err.where == "d, offset 1495"


def test_too_few_bytes_for_an_entry_at_the_block_end_is_corrupt():
    buf = good_block(block_size=493)  # 18 entries, then 5 padding bytes
    buf[488] = 0x00  # the padding's first byte no longer says padding, yet 12 bytes do not fit
    assert "neither an entry nor padding" in corrupt(decode_block, buf).detail


def test_entry_id_out_of_sequence():
    buf = good_block()
    struct.pack_into(">q", buf, 128 + 20 + 4, 5)
    err = corrupt(decode_block, buf)
    assert "out of sequence" in err.detail and err.where == f"offset {128 + 20 + 4}"


def test_negative_length_that_is_not_padding():
    buf = good_block()
    struct.pack_into(">i", buf, 128 + 40, -2)
    assert "negative entry length" in corrupt(decode_block, buf).detail


def test_entry_overrunning_the_block():
    buf = good_block()
    struct.pack_into(">i", buf, 128 + 40, 400)
    assert "past the block end" in corrupt(decode_block, buf).detail


def test_negative_entry_id():
    buf = good_block()
    struct.pack_into(">q", buf, 128 + 4, -1)
    assert "negative entry id" in corrupt(list, iter_block_entries(buf)).detail


def test_block_without_entries():
    buf = bytearray(encode_block_header(140, 0)) + PADDING * 3
    assert "no entry" in corrupt(decode_block, buf).detail


# --- partial (ranged) buffers -----------------------------------------------------------------------------

def test_read_entry_at_whole_entry_and_end_markers():
    buf = good_block()
    got = read_entry_at(buf, 128)
    assert isinstance(got, Entry) and got.entry_id == 0 and bytes(got.payload) == bytes(8) and got.end == 148
    assert read_entry_at(buf, 488) == EndOfEntries(488)  # padding
    assert read_entry_at(buf, 500, block_end=500) == EndOfEntries(500)
    exact = next(iter(pack_blocks(entries(1), 1000))).data
    assert read_entry_at(exact, 148, block_end=148) == EndOfEntries(148)


@pytest.mark.parametrize("cut,needed", [(128, 12), (129, 12), (139, 12), (140, 20), (147, 20)])
def test_read_entry_at_reports_need_more(cut, needed):
    buf = bytes(good_block()[:cut])
    assert read_entry_at(buf, 128) == NeedMore(128, needed)


def test_need_more_never_reaches_past_a_known_block_end():
    full = bytes(good_block(block_size=493))  # 18 entries end at 488, then 5 padding bytes
    assert read_entry_at(full[:488], 488) == NeedMore(488, 12)
    assert read_entry_at(full[:488], 488, block_end=493) == NeedMore(488, 5)
    assert read_entry_at(full[:490], 488, block_end=493) == EndOfEntries(488)


def test_read_entry_at_rejects_negative_offset():
    with pytest.raises(BadInput):
        read_entry_at(b"", -1)


def test_iter_on_a_prefix_then_resume_with_more_bytes():
    full = bytes(good_block())
    part = full[:300]
    got = list(iter_block_entries(part, first_entry_id=0))
    assert [e.entry_id for e in got] == list(range(8))  # 128 + 8 * 20 = 288 <= 300 < 308
    assert read_entry_at(part, got[-1].end) == NeedMore(288, 20)
    rest = list(iter_block_entries(full[288:], 0, first_entry_id=8, base=288))
    assert [e.entry_id for e in rest] == list(range(8, 18))
    assert read_entry_at(full[288:], rest[-1].end, base=288) == EndOfEntries(200)


def test_padding_prefix_at_the_end_of_a_prefix_is_end_of_entries():
    full = bytes(good_block())
    assert read_entry_at(full[:489], 488) == EndOfEntries(488)  # first padding byte alone is unambiguous
