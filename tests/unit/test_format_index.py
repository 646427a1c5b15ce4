"""Index objects: Pulsar's floor-lookup cases, round trips with the packer, and corruption."""
from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from tiering.errors import BadInput, CorruptObjectError, EntryNotFound
from tiering.format import (INDEX_ENTRY_LEN, INDEX_HEADER_LEN, INDEX_MAGIC, IndexEntry, LedgerOffloadMetadata,
                            decode_block, decode_index, encode_index, encode_metadata, pack_blocks)

MiB = 1 << 20


def meta(entry_count, data_object_len, **kw) -> bytes:
    fields = dict(topic="persistent://t/ns/orders", ledger_id=7, entry_count=entry_count, length=0,
                  sealed_time_ms=1_700_000_000_000, offload_uuid="0b7e0d2c-1111-4222-8333-444455556666",
                  data_object_len=data_object_len, block_size=MiB, properties={"k": "v"})
    fields.update(kw)
    return encode_metadata(LedgerOffloadMetadata(**fields))


PULSAR_ENTRIES = [IndexEntry(0, 1, 0), IndexEntry(1000, 2, MiB), IndexEntry(2000, 3, 2 * MiB)]
PULSAR_LEN = 2 * MiB + 128 + 1500 * 20


def pulsar_index():
    return decode_index(encode_index(PULSAR_ENTRIES, PULSAR_LEN, meta(3500, PULSAR_LEN)), "idx")


@pytest.mark.parametrize("entry_id,first", [(0, 0), (500, 0), (999, 0), (1000, 1000), (1300, 1000),
                                            (1999, 1000), (2000, 2000), (3000, 2000), (3499, 2000)])
def test_pulsar_floor_lookups(entry_id, first):
    assert pulsar_index().lookup(entry_id).first_entry_id == first


@pytest.mark.parametrize("entry_id", [3500, 10**12, -1, "3", None, True])
def test_entries_outside_the_ledger_are_not_found(entry_id):
    with pytest.raises(EntryNotFound) as info:
        pulsar_index().lookup(entry_id)
    assert "ledger 7" in str(info.value) and "0..3499" in str(info.value) and "orders" in str(info.value)


def test_block_geometry():
    idx = pulsar_index()
    assert [idx.block_length(i) for i in range(3)] == [MiB, MiB, 128 + 1500 * 20]
    assert [idx.block_last_entry(i) for i in range(3)] == [999, 1999, 3499]
    assert idx.find(1300) == 1 and idx.entry_count == 3500 and idx.data_header_len == 128
    assert idx.metadata.topic == "persistent://t/ns/orders" and idx.metadata.properties == {"k": "v"}


def test_layout_bytes():
    m = meta(3500, PULSAR_LEN)
    buf = encode_index(PULSAR_ENTRIES, PULSAR_LEN, m)
    n = len(m) + 5  # the metadata, then index_crc32c as its last field: tag 0x65 and 4 bytes
    assert len(buf) == INDEX_HEADER_LEN + n + 3 * INDEX_ENTRY_LEN
    assert struct.unpack_from(">Iiqqii", buf) == (INDEX_MAGIC, len(buf), PULSAR_LEN, 128, 3, n)
    assert buf[32:32 + len(m)] == m and buf[32 + len(m)] == 0x65
    crc = int.from_bytes(buf[32 + n - 4:32 + n], "little")
    assert crc == crc32c(buf[:32 + n - 4] + bytes(4) + buf[32 + n:])
    assert struct.unpack_from(">qiq", buf, 32 + n + 20) == (1000, 2, MiB)
    assert decode_index(buf).metadata_bytes == buf[32:32 + n]


def test_every_bit_of_the_index_is_checked():
    """Any one flipped bit of the index object, in the fields no structural check covers as well (the offload
    uuid, the seal time, a property), is refused."""
    buf = good()
    for i in range(len(buf)):
        for bit in range(8):
            bad = bytearray(buf)
            bad[i] ^= 1 << bit
            corrupt(bad)


def test_an_index_written_before_index_crcs_still_decodes():
    m = meta(3500, PULSAR_LEN)
    buf = good()
    legacy = buf[:28] + struct.pack(">i", len(m)) + m + buf[32 + len(m) + 5:]
    struct.pack_into(">i", legacy, 4, len(legacy))
    assert decode_index(bytes(legacy)).metadata == decode_index(bytes(buf)).metadata


def test_a_crc_field_that_is_not_last_is_refused():
    m = meta(3500, PULSAR_LEN)
    buf = good()
    tail = buf[32 + len(m):32 + len(m) + 5]
    moved = buf[:32] + tail + m + buf[32 + len(m) + 5:]  # the same bytes, the field first
    assert "last field" in corrupt(moved).detail


def test_round_trip_with_packed_blocks():
    src = [(i, bytes([i % 256]) * (i % 50)) for i in range(2000)]
    blocks = list(pack_blocks(src, 1000))
    data = b"".join(bytes(b.data) for b in blocks)
    entries = [IndexEntry.of(b) for b in blocks]
    m = meta(len(src), len(data), length=sum(len(p) for _, p in src))
    idx = decode_index(encode_index(entries, len(data), m))
    assert idx.entries == tuple(entries)
    for entry_id in (0, 1, 17, 999, 1998, 1999):
        i = idx.find(entry_id)
        e = idx.entries[i]
        _, got = decode_block(data[e.block_offset:e.block_offset + idx.block_length(i)])
        assert got[0].entry_id == e.first_entry_id and got[-1].entry_id == idx.block_last_entry(i)
        assert bytes(got[entry_id - e.first_entry_id].payload) == src[entry_id][1]


def test_empty_ledger():
    idx = decode_index(encode_index([], 0, meta(0, 0)))
    assert idx.entries == () and idx.entry_count == 0
    with pytest.raises(EntryNotFound, match="no entries"):
        idx.lookup(0)


# --- corruption -------------------------------------------------------------------------------------------

def good() -> bytearray:
    return bytearray(encode_index(PULSAR_ENTRIES, PULSAR_LEN, meta(3500, PULSAR_LEN)))


def resealed(buf: bytearray) -> bytearray:
    """The index with its CRC32C computed again over what was changed: a structural check is reached, as it
    is for an index written before index CRCs (or one whose CRC was forged along with its damage)."""
    end = 32 + struct.unpack_from(">i", buf, 28)[0]
    buf[end - 4:end] = bytes(4)
    buf[end - 4:end] = crc32c(bytes(buf)).to_bytes(4, "little")
    return buf


def corrupt(buf, where="t/x-ledger-7-index") -> CorruptObjectError:
    with pytest.raises(CorruptObjectError) as info:
        decode_index(bytes(buf), where)
    assert info.value.where.startswith(where)
    return info.value


def test_every_truncation_is_corrupt():
    buf = good()
    for n in range(len(buf)):
        err = corrupt(buf[:n])
        assert err.what in ("index", "ledger metadata")


def test_truncated_header():
    err = corrupt(good()[:20])
    assert err.what == "index" and err.where == "t/x-ledger-7-index, offset 0" and "truncated" in err.detail


def test_bad_magic():
    buf = good()
    buf[3] ^= 1
    assert "magic" in corrupt(buf).detail


def test_index_len_mismatch():
    buf = good()
    struct.pack_into(">i", buf, 4, len(buf) + 1)
    assert "index_len" in corrupt(buf).detail
    assert "index_len" in corrupt(good() + b"\0").detail


@pytest.mark.parametrize("meta_len", [-1, 10**6, 2**31 - 1])
def test_metadata_len_out_of_range(meta_len):
    buf = good()
    struct.pack_into(">i", buf, 28, meta_len)
    assert "metadata_len" in corrupt(buf).detail


def test_metadata_len_inconsistent_with_entry_count():
    buf = good()
    struct.pack_into(">i", buf, 24, 2)
    assert "need" in corrupt(buf).detail
    struct.pack_into(">i", buf, 24, -1)
    assert "negative" in corrupt(buf).detail


def test_data_header_len_must_be_128():
    buf = good()
    struct.pack_into(">q", buf, 16, 64)
    assert "data_header_len" in corrupt(buf).detail


def test_garbage_metadata():
    buf = good()
    buf[32] = 0xFF  # an invalid protobuf tag
    err = corrupt(buf)
    assert err.what == "ledger metadata" and err.where == "t/x-ledger-7-index, offset 32"


def test_data_object_len_must_match_metadata():
    m = meta(3500, PULSAR_LEN)
    buf = bytearray(encode_index(PULSAR_ENTRIES, PULSAR_LEN, m))
    struct.pack_into(">q", buf, 8, PULSAR_LEN + 1)
    assert "data_object_len" in corrupt(resealed(buf)).detail


def _entry_offset(buf, i):
    return 32 + struct.unpack_from(">i", buf, 28)[0] + 20 * i


@pytest.mark.parametrize("i,fmt,rel,value,word", [
    (1, ">q", 0, 2000, "not increasing"),       # first entry ids unsorted
    (2, ">q", 0, 1000, "not increasing"),       # duplicated
    (1, ">q", 12, 10, "too small"),             # block offsets too close for 1000 entries
    (2, ">q", 12, MiB - 1, "too small"),        # offsets unsorted
    (0, ">q", 0, 5, "entry 0"),                 # first block must hold entry 0
    (0, ">q", 12, 64, "offset 0"),              # ... and start the data object
    (1, ">i", 8, 0, "part id"),
])
def test_bad_index_entries(i, fmt, rel, value, word):
    buf = good()
    struct.pack_into(fmt, buf, _entry_offset(buf, i) + rel, value)
    assert "CRC32C" in corrupt(buf).detail
    assert word in corrupt(resealed(buf)).detail


def test_last_block_must_hold_the_remaining_entries():
    m = meta(10**6, PULSAR_LEN)  # 998,000 entries cannot fit in the last block's 30 KiB
    with pytest.raises(BadInput, match="too small"):
        encode_index(PULSAR_ENTRIES, PULSAR_LEN, m)


def test_entries_without_blocks_are_rejected():
    with pytest.raises(BadInput, match="no blocks"):
        encode_index([], 0, meta(5, 0))


@pytest.mark.parametrize("entries,length", [
    ([IndexEntry(1000, 2, MiB), IndexEntry(0, 1, 0)], PULSAR_LEN),
    (PULSAR_ENTRIES, PULSAR_LEN + 1),           # disagrees with the metadata
    ([IndexEntry(0, 0, 0)], PULSAR_LEN),
])
def test_encode_rejects_inconsistent_input(entries, length):
    with pytest.raises(BadInput):
        encode_index(entries, length, meta(3500, PULSAR_LEN))


def test_encode_rejects_garbage_metadata():
    with pytest.raises(BadInput, match="metadata"):
        encode_index(PULSAR_ENTRIES, PULSAR_LEN, b"\xff\xff")
