"""Property tests: packing round-trips for any entries and block size; decoders given any bytes either
return or raise CorruptObjectError, never anything else."""
from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tiering.errors import CorruptObjectError
from tiering.format.keys import MAX_SEGMENT, encode_topic
from tiering.format import (HEADER_LEN, PADDING, EndOfEntries, IndexEntry, LedgerOffloadMetadata, NeedMore,
                            data_key, decode_block, decode_index, decode_metadata, encode_index, encode_metadata,
                            index_key, iter_block_entries, pack_blocks, parse_block_header, parse_key,
                            read_entry_at)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

payloads = st.lists(st.binary(max_size=300), min_size=1, max_size=60)
block_sizes = st.integers(min_value=140, max_value=2000)
first_ids = st.integers(min_value=0, max_value=2**62)


def make_meta(entry_count: int, data_object_len: int) -> bytes:
    return encode_metadata(LedgerOffloadMetadata("t", 1, entry_count, 0, 0, "u", data_object_len, 1000))


@SETTINGS
@given(payloads, block_sizes, first_ids)
def test_pack_then_iterate_round_trips(data, block_size, first):
    src = [(first + i, p) for i, p in enumerate(data)]
    blocks = list(pack_blocks(src, block_size))
    got, offset = [], 0
    for n, b in enumerate(blocks):
        assert (b.part_id, b.offset) == (n + 1, offset)
        offset += b.length
        entries = list(iter_block_entries(b.data, first_entry_id=b.first_entry_id, block_end=b.length))
        assert len(entries) == b.entry_count and decode_block(b.data)[0].block_len == b.length
        got += [(e.entry_id, bytes(e.payload)) for e in entries]
        used = entries[-1].end
        if n == len(blocks) - 1 or b.length != block_size:  # last or oversized: exact, no padding
            assert used == b.length
            assert n == len(blocks) - 1 or (b.entry_count == 1 and b.length > block_size)
        else:  # padded: the next entry did not fit
            assert b.data[used:] == (PADDING * block_size)[:b.length - used]
            assert used + 12 + len(src[b.last_entry_id - first + 1][1]) > block_size
    assert got == src


@SETTINGS
@given(payloads, block_sizes, st.data())
def test_any_prefix_of_a_block_reads_as_whole_entries_then_need_more(data, block_size, draw):
    block = next(iter(pack_blocks(enumerate(data), block_size)))
    full = bytes(block.data)
    cut = draw.draw(st.integers(min_value=HEADER_LEN, max_value=len(full)))
    part = full[:cut]
    entries = list(iter_block_entries(part, first_entry_id=0))
    end = entries[-1].end if entries else HEADER_LEN
    assert [bytes(e.payload) for e in entries] == data[:len(entries)]
    stop = read_entry_at(part, end)
    if end == len(full):  # an exact block ends without padding: only block_end tells that from a short read
        assert stop == NeedMore(end, 12) and read_entry_at(part, end, block_end=len(full)) == EndOfEntries(end)
        assert len(entries) == block.entry_count
    elif isinstance(stop, NeedMore):
        whole = read_entry_at(full, end)
        assert end + stop.needed > cut
        assert isinstance(whole, EndOfEntries) or end + stop.needed <= len(full)
        bounded = read_entry_at(part, end, block_end=len(full))  # never asks for bytes past the block
        assert isinstance(bounded, NeedMore) and cut < end + bounded.needed <= len(full)
    else:
        assert isinstance(stop, EndOfEntries) and len(entries) == block.entry_count


@SETTINGS
@given(payloads, block_sizes, st.data())
def test_index_lookup_matches_a_linear_scan(data, block_size, draw):
    blocks = list(pack_blocks(enumerate(data), block_size))
    length = sum(b.length for b in blocks)
    idx = decode_index(encode_index([IndexEntry.of(b) for b in blocks], length, make_meta(len(data), length)))
    entry_id = draw.draw(st.integers(min_value=0, max_value=len(data) - 1))
    expect = next(b for b in blocks if b.first_entry_id <= entry_id <= b.last_entry_id)
    i = idx.find(entry_id)
    assert idx.entries[i] == IndexEntry.of(expect) and idx.block_length(i) == expect.length


def _only_corrupt(fn, *args, **kwargs):
    try:
        result = fn(*args, **kwargs)
        return list(result) if hasattr(result, "__next__") else result
    except CorruptObjectError as exc:
        assert exc.what and exc.where and exc.detail
        return None


@SETTINGS
@given(st.binary(max_size=400))
def test_arbitrary_bytes_only_raise_corrupt(buf):
    _only_corrupt(decode_index, buf, "i")
    _only_corrupt(parse_block_header, buf, "b")
    _only_corrupt(decode_block, buf, "b")
    _only_corrupt(iter_block_entries, buf, 0, "b")
    _only_corrupt(iter_block_entries, buf, 0, "b", block_end=len(buf) // 2)
    _only_corrupt(read_entry_at, buf, 0, "b")
    _only_corrupt(decode_metadata, buf, "m")


def _valid_index() -> bytes:
    blocks = list(pack_blocks(((i, bytes(i % 7)) for i in range(40)), 200))
    length = sum(b.length for b in blocks)
    return encode_index([IndexEntry.of(b) for b in blocks], length, make_meta(40, length))


VALID_INDEX = _valid_index()
VALID_BLOCK = bytes(next(iter(pack_blocks(((i, bytes(i % 7)) for i in range(40)), 300))).data)


@SETTINGS
@given(st.data())
def test_mutated_objects_only_raise_corrupt(draw):
    for valid, decode in ((VALID_INDEX, decode_index), (VALID_BLOCK, decode_block)):
        buf = bytearray(valid)
        for _ in range(draw.draw(st.integers(1, 4))):
            buf[draw.draw(st.integers(0, len(buf) - 1))] = draw.draw(st.integers(0, 255))
        cut = draw.draw(st.integers(0, len(buf)))
        _only_corrupt(decode, bytes(buf[:cut]), "x")
        _only_corrupt(decode, bytes(buf), "x")


@SETTINGS
@given(st.binary(max_size=200), st.integers(0, 2**31))
def test_metadata_with_unknown_trailing_fields(raw, field):
    assume(field > 10)
    _only_corrupt(decode_metadata, encode_metadata(LedgerOffloadMetadata("t", 1, 1, 0, 0, "u", 0, 0)) + raw)


@SETTINGS
@given(st.text(min_size=1), st.from_regex(r"[0-9A-Za-z_-]{1,40}", fullmatch=True), st.integers(0, 2**63 - 2),
       st.sampled_from(["", "p/", "tier/offload/", "a.b/"]))
def test_keys_round_trip_and_stay_under_the_prefix(topic, uuid, ledger_id, prefix):
    try:
        topic.encode("utf-8")
    except UnicodeEncodeError:
        assume(False)
    key, idx = data_key(prefix, topic, uuid, ledger_id), index_key(prefix, topic, uuid, ledger_id)
    segment = encode_topic(topic)
    named = topic if len(segment) <= MAX_SEGMENT else None  # a hashed segment: the index names the topic
    assert parse_key(prefix, key) == (named, uuid, ledger_id, False, segment)
    assert parse_key(prefix, idx) == (named, uuid, ledger_id, True, segment)
    assert len(idx.encode()) <= len(prefix.encode()) + MAX_SEGMENT + 17 + 1 + 40 + 8 + 19 + 6
    rest = key[len(prefix):].split("/")
    assert key.startswith(prefix) and key.isascii() and len(rest) == 2
    assert rest[0] not in ("", ".", "..") and "\0" not in key


@SETTINGS
@given(st.text(max_size=60))
def test_parse_key_never_raises(key):
    got = parse_key("p/", key)
    if got is not None:  # anything parsed is exactly what data_key/index_key would write
        again = (index_key if got.is_index else data_key)("p/", got.topic, got.uuid, got.ledger_id)
        assert again == key
