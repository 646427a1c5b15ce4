"""ReadHandle.read_batches on PostgreSQL and the real S3 server: the same entries, order, gaps and checks as
`read`, with each run of entries in one Arrow binary array (from tier 2 straight from the checked pages)."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from tests.integration.helpers import entries, produce
from tiering.errors import CorruptObjectError
from tiering.model import LedgerState as S, Position
from tiering.ops.offload import offload_ledger
from tiering.ops.retention import truncate
from tiering.read import Entry, EntryBatch, Gap, ReadHandle
from tiering.tier2.reader import ReaderCaches, tier2_opener


def handle(deps, caches=None):
    return ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket, caches or ReaderCaches.new()))


def flattened(items):
    """Batches as their entries, gaps as they are: what `read` gives for the same range."""
    out = []
    for item in items:
        if isinstance(item, EntryBatch):
            assert item.payloads.type == pa.binary() and item.entry_count > 0
            assert item.last_entry_id == item.first_entry_id + item.entry_count - 1
            out += list(item.entries())
        else:
            out.append(item)
    return out


@pytest.fixture
def topic(deps):
    """Ledgers 0-1 in tier 2 only (equal-length entries over many pages; mixed lengths), 2 offloaded with its
    tier-1 copy, 3 sealed, 4 open."""
    mixed = [payload[:n] for payload, n in zip(entries("m", 400, 3000), random.Random(1).choices(range(3000), k=400))]
    produce(deps, "b", [entries("u", 3000, 1000), mixed, entries("o", 50, 700), entries("s", 30, 20)],
            open_tail=entries("open", 7, 10))
    for led in deps.meta.list_ledgers("b", [S.SEALED])[:3]:
        offload_ledger(deps, led)
    for lid in (0, 1):
        deps.tier1.delete("b", lid)
        deps.meta.mark_tier1_deleted(deps.meta.get_ledger("b", lid))
    return "b"


def test_batches_hold_what_read_gives_for_the_topic_and_any_range(deps, topic):
    whole = list(handle(deps).read(topic))
    assert len(whole) == 3000 + 400 + 50 + 30 + 7 and all(isinstance(e, Entry) for e in whole)
    batches = list(handle(deps).read_batches(topic))
    assert flattened(batches) == whole
    # a scan of the uniform ledger comes in runs of pages, not entry by entry nor as one ledger-sized batch
    assert 3 <= len([b for b in batches if b.ledger_id == 0]) <= 60
    keys = [(e.ledger_id, e.entry_id) for e in whole]
    rng, caches = random.Random(7), ReaderCaches.new()
    for _ in range(25):
        a, b = sorted(rng.sample(range(len(keys)), 2))
        start, end = Position(*keys[a]), Position(*keys[b])
        assert flattened(handle(deps, caches).read_batches(topic, start, end)) == whole[a:b + 1]


def test_a_trimmed_ledger_is_the_same_gap_in_both(deps, topic):
    truncate(deps, topic, Position(1, 0))
    got = flattened(handle(deps).read_batches(topic))
    assert got == list(handle(deps).read(topic))
    assert isinstance(got[0], Gap) and (got[0].start, got[0].end) == (Position(0, 0), Position(0, 2999))


def test_a_corrupt_page_fails_a_batch_read_before_any_of_its_entries(deps, topic):
    ch = deps.meta.get_chunk(deps.meta.get_ledger(topic, 0))
    s3, name = deps.bucket.s3, deps.bucket.name
    data = bytearray(s3.get_object(Bucket=name, Key=ch.data_key)["Body"].read())
    data[len(data) // 2] ^= 0x01  # one bit inside an entry's payload, mid-ledger
    s3.put_object(Bucket=name, Key=ch.data_key, Body=bytes(data))
    got = []
    with pytest.raises(CorruptObjectError, match="CRC32C"):
        for item in handle(deps).read_batches(topic):
            got.append(item)
    delivered = sum(b.entry_count for b in got)
    assert 0 < delivered < 3000  # the pages before the bad one, none after it
    assert flattened(got) == list(handle(deps).read(topic, end=Position(0, delivered - 1)))


def test_a_batch_read_closed_early_drops_its_get(deps, topic):
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(4)
    reading = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket, ReaderCaches.new(), pool)).read_batches(topic)
    first = next(reading)
    assert (first.ledger_id, first.first_entry_id) == (0, 0) and first.entry_count < 3000
    reading.close()
    with pytest.raises(StopIteration):
        next(reading)
    pool.shutdown(wait=True)


def test_runs_split_at_the_arrays_limit_read_the_same(deps, topic, monkeypatch):
    """A run whose payloads one Arrow array cannot hold (2 GiB: here made 50,000 bytes) is handed out as
    several batches, each one array: together the same entries."""
    import tiering.tier2.reader_arrays as arrays

    monkeypatch.setattr(arrays, "MAX_ARRAY_BYTES", 50_000)
    batches = list(handle(deps).read_batches(topic))
    assert flattened(batches) == list(handle(deps).read(topic))
    assert all(isinstance(b.payloads, pa.BinaryArray) for b in batches if isinstance(b, EntryBatch))
    assert len([b for b in batches if getattr(b, "ledger_id", None) == 0]) >= 3_000_000 // 50_000
