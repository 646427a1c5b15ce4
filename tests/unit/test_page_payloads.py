"""format/pages.page_payloads and run_payloads: every page, and every run of consecutive pages of one block, of
packed blocks parses back to exactly the entries packed, whether its entries have one length (the vectorised
pass) or several (the per-entry loop), and a page whose structure is wrong fails with CorruptObjectError naming
the place, on either path."""
from __future__ import annotations

import struct

import pyarrow as pa
import pytest

from tiering.errors import CorruptObjectError
from tiering.format.block import ENTRY_HEADER_LEN, HEADER_LEN
from tiering.format.packing import pack_blocks
from tiering.format.pages import page_entries, page_payloads, run_payloads
from tiering.tier2.reader_arrays import run_payload_array


def packed(payloads, block_size=64 * 1024, page_size=4096):
    """The blocks' bytes joined, with every page as (first entry, last entry, start, end, block start, end)."""
    blocks = list(pack_blocks(enumerate(payloads), block_size, page_size))
    data, pages, off = b"", [], 0
    for block in blocks:
        firsts = block.pages
        for i, (first, start, _crc) in enumerate(firsts):
            end = firsts[i + 1][1] if i + 1 < len(firsts) else len(block.data)
            last = (firsts[i + 1][0] if i + 1 < len(firsts) else block.first_entry_id + block.entry_count) - 1
            pages.append((first, last, off + start, off + end, start == 0, end == len(block.data)))
        data += block.data
        off += len(block.data)
    return data, pages


def parse(data, page):
    first, last, start, end, bstart, bend = page
    return page_payloads(data, start, end, first, last, block_start=bstart, block_end=bend, where="t", base=0)


@pytest.mark.parametrize("sizes", [[100] * 3000, [0] * 500, [4096] * 100, [10, 2000, 7, 7, 7] * 300,
                                   [100] * 50 + [101] + [100] * 50])
def test_every_page_parses_back_to_the_entries_packed(sizes):
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    data, pages = packed(payloads)
    got = []
    for page in pages:
        got += parse(data, page)
        assert page_entries(data, *page[2:4], page[0], page[1], block_start=page[4], block_end=page[5],
                            where="t", base=0) == list(zip(range(page[0], page[1] + 1), parse(data, page)))
    assert got == payloads


def _uniform_page(data, pages):
    return next(p for p in pages if p[1] - p[0] >= 20)


def test_a_wrong_id_inside_a_uniform_page_is_corruption():
    data, pages = packed([b"x" * 100] * 500)
    first, last, start, end, bstart, _ = page = _uniform_page(data, pages)
    pos = start + (HEADER_LEN if bstart else 0) + 10 * (ENTRY_HEADER_LEN + 100)
    bad = data[:pos + 4] + struct.pack(">q", first + 99) + data[pos + 12:]
    with pytest.raises(CorruptObjectError, match=f"entry {first + 99} of 100 bytes where entry {first + 10}"):
        parse(bad, page)


def test_a_wrong_length_inside_a_uniform_page_is_corruption():
    data, pages = packed([b"x" * 100] * 500)
    first, last, start, end, bstart, _ = page = _uniform_page(data, pages)
    pos = start + (HEADER_LEN if bstart else 0) + 3 * (ENTRY_HEADER_LEN + 100)
    bad = data[:pos] + struct.pack(">i", 90) + data[pos + 4:]
    with pytest.raises(CorruptObjectError):
        parse(bad, page)


def test_bytes_after_the_last_entry_of_a_page_that_ends_no_block_are_corruption():
    data, pages = packed([b"x" * 100] * 500)
    first, last, start, end, bstart, bend = next(p for p in pages if not p[5] and p[1] - p[0] >= 20)
    with pytest.raises(CorruptObjectError):  # one entry fewer than the page holds: 112 bytes left over
        page_payloads(data, start, end, first, last - 1, block_start=bstart, block_end=False, where="t", base=0)


def runs_of_one_block(pages, length):
    """Every run of `length` consecutive pages that stays inside one block."""
    for i in range(len(pages) - length + 1):
        run = pages[i:i + length]
        if not any(p[4] for p in run[1:]):  # no page after the first starts a block
            yield run


def parse_run(data, run, fn=run_payloads):
    return fn(data, [p[2] for p in run], run[-1][3], [p[0] for p in run], run[-1][1], block_start=run[0][4],
              block_end=run[-1][5], where="t", base=0)


def parse_run_array(data, run):
    got = parse_run(data, run, run_payload_array)
    assert got.type == pa.binary()
    return got.to_pylist()


@pytest.mark.parametrize("sizes", [[100] * 3000, [0] * 500, [4096] * 100, [10, 2000, 7, 7, 7] * 300,
                                   [100] * 50 + [101] + [100] * 50, [1000] * 400])
@pytest.mark.parametrize("length", [1, 2, 5, 16])
def test_every_run_of_pages_parses_to_what_its_pages_parse_to(sizes, length):
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    data, pages = packed(payloads)
    runs = list(runs_of_one_block(pages, length))
    starts = [i for i, p in enumerate(pages) if p[4]] + [len(pages)]
    assert runs or length > max(b - a for a, b in zip(starts, starts[1:]))  # no block has that many pages
    for run in runs:
        assert parse_run(data, run) == [x for p in run for x in parse(data, p)] == payloads[run[0][0]:run[-1][1] + 1]
        assert parse_run_array(data, run) == payloads[run[0][0]:run[-1][1] + 1]


def test_a_page_boundary_the_index_misplaces_inside_a_uniform_run_is_corruption():
    """The entries are uniform across the run, but the page index puts a page's start inside an entry: the
    run's pass refuses it and the page-by-page parse names the page."""
    data, pages = packed([b"x" * 100] * 2000)
    run = next(r for r in runs_of_one_block(pages, 3) if not r[0][4] and not r[-1][5])
    shifted = [run[0], (run[1][0], run[1][1], run[1][2] + 50, *run[1][3:]), run[2]]
    with pytest.raises(CorruptObjectError):
        parse_run(data, shifted)


def test_a_wrong_id_inside_a_uniform_run_is_corruption():
    data, pages = packed([b"x" * 100] * 2000)
    run = next(r for r in runs_of_one_block(pages, 4) if not r[0][4])
    pos = run[2][2] + 5 * (ENTRY_HEADER_LEN + 100)  # inside the run's third page
    bad = data[:pos + 4] + struct.pack(">q", 7) + data[pos + 12:]
    with pytest.raises(CorruptObjectError, match="entry 7 of 100 bytes"):
        parse_run(bad, run)
    with pytest.raises(CorruptObjectError, match="entry 7 of 100 bytes"):
        parse_run_array(bad, run)


@pytest.mark.parametrize("fn", [run_payloads, run_payload_array])
def test_padding_overwritten_after_a_uniform_run_is_corruption(fn):
    """The run's last page ends its block: the bytes after its last entry must all be padding."""
    data, pages = packed([b"z" * 90] * 2000)  # 641 entries of 102 bytes leave 26 bytes of a block's 64 KiB
    run = next(r for r in runs_of_one_block(pages, 3) if r[-1][5])
    assert parse_run(data, run, fn)  # sound as written
    bad = data[:run[-1][3] - 1] + b"\0" + data[run[-1][3]:]  # the block's last byte, inside its padding
    with pytest.raises(CorruptObjectError):
        parse_run(bad, run, fn)


def test_a_uniform_run_is_parsed_in_one_pass_not_page_by_page(monkeypatch):
    import tiering.format.pages as pages_module

    data, pages = packed([b"y" * 1000] * 400)
    run = next(runs_of_one_block(pages, 5))
    monkeypatch.setattr(pages_module, "page_payloads", lambda *a, **k: pytest.fail("parsed page by page"))
    assert parse_run(data, run) == [b"y" * 1000] * (run[-1][1] - run[0][0] + 1)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_uniform_payloads_are_bytes_with_their_trailing_zero_bytes(kind):
    """The vectorised pass makes each payload as one opaque item of the page: it must come back as `bytes`
    (not an array scalar), keep trailing NUL bytes (a fixed-width string type would strip them) and not
    depend on the buffer type the caller holds."""
    payloads = [bytes([i % 7]) + b"\0" * 99 for i in range(2000)]
    data, pages = packed(payloads)
    run = next(runs_of_one_block(pages, 4))
    got = parse_run(kind(data), run)
    assert all(type(p) is bytes for p in got)
    assert got == payloads[run[0][0]:run[-1][1] + 1]
    assert parse_run_array(kind(data), run) == got


def test_a_batch_of_one_page_or_of_empty_payloads_is_an_arrow_array():
    data, pages = packed([b""] * 300 + [b"a" * 50] * 300)
    for page in pages:
        assert parse_run_array(data, [page]) == parse(data, page)


@pytest.mark.parametrize("sizes", [[1000] * 400, [10, 2000, 7, 7, 7] * 300, [0] * 500])
def test_a_run_whose_payloads_one_array_cannot_hold_is_split_into_arrays(monkeypatch, sizes):
    """Payloads of 2 GiB or more in one run (a page size that large) do not fit one `binary` array's 32-bit
    offsets: the run comes back as a ChunkedArray of arrays within the limit (here made 2,500 bytes), which
    `one_array_each` hands out as consecutive batches of one array each."""
    import tiering.tier2.reader_arrays as arrays

    monkeypatch.setattr(arrays, "MAX_ARRAY_BYTES", 2500)
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    data, pages = packed(payloads)
    for run in runs_of_one_block(pages, 3):
        got = parse_run(data, run, run_payload_array)
        assert got.to_pylist() == payloads[run[0][0]:run[-1][1] + 1]
        batches = list(arrays.one_array_each([(run[0][0], got)]))
        assert all(isinstance(a, pa.BinaryArray) for _, a in batches)
        assert all(sum(map(len, a.to_pylist())) <= 2500 or len(a) == 1 for _, a in batches)
        assert [(f, a.to_pylist()) for f, a in batches] == \
            [(f, payloads[f:f + len(a)]) for f, a in batches]
        assert sum(len(a) for _, a in batches) == len(got)
