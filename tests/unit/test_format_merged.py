"""Merged objects (format/merged.py) and page-run checks (format/index.py): splitting concatenated index
objects, finding each ledger's start in a merged data object from its block headers, checking page CRCs."""
from __future__ import annotations

import pytest

from tiering.errors import CorruptObjectError
from tiering.format import HEADER_LEN, IndexEntry, LedgerOffloadMetadata, encode_index, encode_metadata, pack_blocks
from tiering.format.block import parse_block_header
from tiering.format.index import block_pages, check_ledger_pages, check_page_run, decode_index, page_index
from tiering.format.merged import block_layout, ledger_offsets, offsets_before_break, split_indexes


def ledger(ledger_id: int, payload_sizes: list[int], block_size: int = 400, page_size: int = 100):
    """(data, index bytes) of one offloaded ledger, with a page index."""
    blocks = list(pack_blocks([(i, bytes([ledger_id]) * n) for i, n in enumerate(payload_sizes)], block_size,
                              page_size))
    data = b"".join(bytes(b.data) for b in blocks)
    pages = page_index([p for b in blocks for p in block_pages(b)], page_size)
    meta = encode_metadata(LedgerOffloadMetadata("t", ledger_id, len(payload_sizes), sum(payload_sizes), 0, "u",
                                                 len(data), block_size, pages=pages))
    return data, encode_index([IndexEntry.of(b) for b in blocks], len(data), meta)


def headers(data: bytes):
    """(offset, header) of every block of `data`, as a caller fetching them would hand them over."""
    off = 0
    while off < len(data):
        hdr = parse_block_header(data[off:off + HEADER_LEN], "data", off)
        yield off, hdr
        off += hdr.block_len


def test_split_indexes_finds_each_concatenated_index():
    (_, a), (_, b) = ledger(1, [10] * 30), ledger(2, [50] * 3)
    parts = split_indexes(a + b, "k")
    assert [(off, n, ix.metadata.ledger_id) for off, n, ix in parts] == [(0, len(a), 1), (len(a), len(b), 2)]
    assert split_indexes(b"", "k") == []


@pytest.mark.parametrize("cut,word", [(5, "trailing bytes"), (None, "does not fit")])
def test_split_indexes_rejects_a_truncated_tail(cut, word):
    (_, a), (_, b) = ledger(1, [10] * 30), ledger(2, [50] * 3)
    buf = a + (b[:cut] if cut else b[:-1])
    with pytest.raises(CorruptObjectError, match=word) as info:
        split_indexes(buf, "k")
    assert f"index object k at {len(a)}" in str(info.value)


def test_block_layout_lists_first_entry_offset_and_length():
    data, ix = ledger(1, [10] * 30)
    index = decode_index(ix)
    layout = block_layout(index)
    assert [off for _, off, _ in layout] == [e.block_offset for e in index.entries]
    assert sum(n for _, _, n in layout) == len(data) and layout[0][0] == 0


def test_ledger_offsets_match_layouts_whatever_the_order():
    (d1, i1), (d2, i2) = ledger(1, [10] * 30), ledger(2, [50] * 9)
    data = d2 + d1  # concatenated in the other order than the indexes
    indexes = [decode_index(i1), decode_index(i2)]
    assert ledger_offsets(headers(data), len(data), indexes) == [len(d2), 0]


def test_ledger_offsets_none_when_blocks_do_not_match():
    (d1, i1), (d2, i2) = ledger(1, [10] * 30), ledger(2, [50] * 9)
    indexes = [decode_index(i1), decode_index(i2)]
    assert ledger_offsets(headers(d1), len(d1), indexes) is None  # a ledger missing
    assert ledger_offsets(headers(d1 + d2), len(d1 + d2) - 1, indexes) is None  # a block past the end
    (d3, i3) = ledger(3, [10] * 31)
    assert ledger_offsets(headers(d1 + d3), len(d1 + d3), [decode_index(i1), decode_index(i2)]) is None


def test_ledger_offsets_stops_at_a_block_that_starts_no_ledger():
    (d1, i1) = ledger(1, [10] * 30)
    first_len = decode_index(i1).block_length(0)
    consumed = []

    def lazily():
        for item in headers(d1[first_len:]):
            consumed.append(item)
            yield item

    assert ledger_offsets(lazily(), len(d1) - first_len, [decode_index(i1)]) is None
    assert len(consumed) == 1  # no header fetched after the one that decided


def test_check_page_run_checks_the_pages_of_a_slice():
    data, ix = ledger(1, [10] * 30)
    index = decode_index(ix)
    n = len(index.pages)
    assert n > 3
    start, end = index.page_span(1)[0], index.page_span(2)[1]
    check_page_run(index, 1, 2, data[start:end], start, "data object k", 1000)
    assert check_ledger_pages(index, data, "data object k")
    bad = bytearray(data)
    bad[index.page_span(2)[0] + 1] ^= 1
    with pytest.raises(CorruptObjectError) as info:
        check_page_run(index, 1, 2, bytes(bad[start:end]), start, "data object k", 1000)
    assert f"data object k, page 2, offset {1000 + index.page_span(2)[0]}" in str(info.value)
    check_page_run(index, 3, n - 1, bytes(bad[index.page_span(3)[0]:]), index.page_span(3)[0], "k")
    with pytest.raises(CorruptObjectError):
        check_ledger_pages(index, bytes(bad), "data object k")


def _walk_until_broken(data: bytes):
    """headers() as far as they parse: (the list, whether a header failed)."""
    out = []
    try:
        for item in headers(data):
            out.append(item)
    except CorruptObjectError:
        return out, True
    return out, False


def test_the_ledgers_before_a_header_that_does_not_parse_are_placed():
    (d1, i1), (d2, i2), (d3, i3) = ledger(1, [10] * 30), ledger(2, [50] * 9), ledger(3, [10] * 30)
    indexes = [decode_index(i) for i in (i1, i2, i3)]
    broken = bytearray(d1 + d2 + d3)
    broken[len(d1) + 6] ^= 1  # ledger 2's first header
    walked, cut = _walk_until_broken(bytes(broken))
    assert cut and ledger_offsets(walked, len(broken), indexes) is None
    # ledger 1's run ends where the walk broke: nothing longer begins like it, so it is placed
    assert offsets_before_break(walked, indexes, cut=True, checked=False) == [0, None, None]


def test_a_run_cut_short_is_not_taken_for_a_shorter_ledger_of_the_same_start_unless_pages_are_checked():
    # ledger 2's first block equals ledger 1's only block: a walk broken at ledger 2's second header
    # cannot tell ledger 1 from the start of ledger 2
    # (eight 22-byte entries fill a 400-byte block exactly: a one-block ledger and a full block look alike)
    (d1, i1), (d2, i2) = ledger(1, [22] * 8, block_size=400), ledger(2, [22] * 24, block_size=400)
    indexes = [decode_index(i) for i in (i1, i2)]
    assert block_layout(indexes[1])[0] == block_layout(indexes[0])[0]
    broken = bytearray(d2 + d1)
    broken[block_layout(indexes[1])[1][1] + 6] ^= 1  # ledger 2's second header
    walked, cut = _walk_until_broken(bytes(broken))
    assert offsets_before_break(walked, indexes, cut=cut, checked=False) == [None, None]
    assert offsets_before_break(walked, indexes, cut=cut, checked=True) == [0, None]  # its pages then refuse


def test_a_header_naming_the_wrong_entry_ends_the_matching_runs():
    (d1, i1), (d2, i2), (d3, i3) = ledger(1, [10] * 30), ledger(2, [50] * 9), ledger(3, [10] * 30)
    indexes = [decode_index(i) for i in (i1, i2, i3)]
    broken = bytearray(d1 + d2 + d3)
    broken[len(d1) + 27] ^= 1  # ledger 2's first header now names entry 1: its blocks join ledger 1's run
    walked, cut = _walk_until_broken(bytes(broken))
    assert not cut and ledger_offsets(walked, len(broken), indexes) is None
    # ledger 3 would match its run, but what follows a break is placed from the object's end, not here
    assert offsets_before_break(walked, indexes, cut=False, checked=False) == [0, None, None]
