"""Page index with CRC32C on the real S3 endpoint and PostgreSQL: one flipped byte in the header,
a payload or the padding of a tier-2 data object is refused by every read path (ReadHandle, `tiering read`,
`tiering verify`, defrag's download, recovery from the bucket); objects offloaded before page indexes still
read; a cold random read is at most two requests (index, page) at every entry position."""
from __future__ import annotations

import dataclasses

import boto3
import pytest
from botocore.config import Config
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tests.integration.test_cli import cli  # noqa: F401  (the CLI fixture, shared)
from tests.integration.test_export_recover import new_database  # noqa: F401  (extra databases)
from tiering.errors import CorruptObjectError, DataLossError
from tiering.format.block import HEADER_LEN
from tiering.format.index import decode_index, encode_index
from tiering.format.metadata import encode_metadata
from tiering.model import LedgerState as S, Position
from tiering.ops.defrag import defrag
from tiering.ops.offload import offload_ledger
from tiering.ops.recover import recover_from_bucket
from tiering.read import Entry, ReadHandle
from tiering.tier2.objects import Bucket
from tiering.tier2.reader import ReaderCaches, tier2_opener

ENTRY = 100 * 1024  # 51 entries fill a 5 MiB block, leaving ~19 KiB of padding before the second block


def offload_all(deps, topic):
    for led in deps.meta.list_ledgers(topic, [S.SEALED]):
        offload_ledger(deps, led)
    for led in deps.meta.list_ledgers(topic, [S.OFFLOADED]):
        deps.tier1.delete(topic, led.ledger_id)
        deps.meta.mark_tier1_deleted(led)
    return [deps.meta.get_chunk(led) for led in deps.meta.list_ledgers(topic, [S.OFFLOADED])]


def get(deps, key) -> bytes:
    return deps.bucket.s3.get_object(Bucket=deps.bucket.name, Key=key)["Body"].read()


def put(deps, key, body: bytes) -> None:
    deps.bucket.s3.put_object(Bucket=deps.bucket.name, Key=key, Body=body)


def flip(deps, key, offset) -> None:
    data = bytearray(get(deps, key))
    data[offset] ^= 0x01
    put(deps, key, bytes(data))


def read_all(deps, topic, start=None, end=None):
    return [e for e in ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket)).read(topic, start, end)
            if isinstance(e, Entry)]


def strip_page_index(deps, ch) -> None:
    """Rewrite the index object as it was before page indexes existed (same PIP-17 bytes otherwise)."""
    ix = decode_index(get(deps, ch.index_key))
    old = encode_index(ix.entries, ix.data_object_len, encode_metadata(dataclasses.replace(ix.metadata, pages=None)))
    put(deps, ch.index_key, old)
    return len(old)


def places(ch, ix) -> dict[str, int]:
    """An offset in each part of the (two-block) data object."""
    first_block_end = ix.entries[1].block_offset
    return {"header": first_block_end + 40,                     # the second block's header (zero padding)
            "payload": HEADER_LEN + 12 + 777,                   # inside entry 0's payload
            "padding": first_block_end - 3}                     # the first block's padding


@pytest.fixture
def two_blocks(deps):
    produce(deps, "t", [entries("p", 60, ENTRY)])
    [ch] = offload_all(deps, "t")
    ix = decode_index(get(deps, ch.index_key))
    assert len(ix.entries) == 2 and ix.pages is not None and len(ix.pages) > 60 // 2
    assert ix.entries[1].block_offset - HEADER_LEN - 51 * (ENTRY + 12) > 1000  # there is padding to flip
    return ch, ix


@pytest.mark.parametrize("part", ["header", "payload", "padding"])
def test_one_flipped_byte_is_refused_by_read_and_verify(deps, cli, two_blocks, part):  # noqa: F811
    ch, ix = two_blocks
    good = get(deps, ch.data_key)
    offset = places(ch, ix)[part]
    flip(deps, ch.data_key, offset)
    page = ix.pages.find(0) if part == "payload" else max(i for i in range(len(ix.pages))
                                                          if ix.pages.offsets[i] <= offset)
    where = f"{ch.data_key}, page {page}, offset {ix.pages.offsets[page]}: CRC32C"
    with pytest.raises(CorruptObjectError, match=where):
        read_all(deps, "t")
    line = cli("read", "t").one_line_error(1)
    assert where in line
    bad = cli("verify", "t", "--json")
    assert bad.returncode == 1 and any(where in p for p in bad.json["problems"])
    # only the bad page is refused: a point read elsewhere still works, from its own page
    other = 59 if page < ix.pages.find(30) else 0
    assert [e.entry_id for e in read_all(deps, "t", Position(0, other), Position(0, other))] == [other]
    put(deps, ch.data_key, good)
    assert len(read_all(deps, "t")) == 60
    assert cli("verify", "t").ok().stdout.endswith("OK\n")


@pytest.mark.parametrize("part", ["header", "payload"])
def test_defrag_refuses_a_corrupt_source_and_switches_nothing(deps, part):
    # small ledgers are downloaded (not server-side copied) and must pass their page checks first
    produce(deps, "s", [entries(f"d{i}", 20, 1000) for i in range(3)])
    chunks = offload_all(deps, "s")
    flip(deps, chunks[1].data_key, 30 if part == "header" else HEADER_LEN + 12 + 5)
    with pytest.raises(CorruptObjectError, match=f"{chunks[1].data_key}, page 0, offset 0: CRC32C"):
        defrag(deps, "s")
    assert [deps.meta.get_chunk(led) for led in deps.meta.list_ledgers("s")] == chunks


@pytest.mark.parametrize("how", ["flipped", "restored"])
def test_defrag_downloads_a_replaced_source_it_would_copy_server_side(deps, how):
    # a source of at least 5 MiB is copied by the server, unread: only its ETag (the chunk row's, as
    # written) tells that the object under the key is no longer the one offloaded. Replaced, it is
    # downloaded and its pages checked: a flipped byte fails the group, the same bytes merge.
    produce(deps, "s", [entries(f"l{i}", 11, 500_000) for i in range(2)])
    chunks = offload_all(deps, "s")
    assert all(ch.data_length >= 5 * 2**20 and ch.data_etag for ch in chunks)
    if how == "flipped":
        flip(deps, chunks[0].data_key, HEADER_LEN + 12 + 5)
        with pytest.raises(CorruptObjectError, match=f"{chunks[0].data_key}, page 0, offset 0: CRC32C"):
            defrag(deps, "s", small_bytes=8 * 2**20)
        assert [deps.meta.get_chunk(led) for led in deps.meta.list_ledgers("s")] == chunks
        return
    put(deps, chunks[0].data_key, get(deps, chunks[0].data_key))  # one PUT now: another ETag, same bytes
    report = defrag(deps, "s", small_bytes=8 * 2**20)
    assert report.groups == 1 and report.bytes_downloaded >= chunks[0].data_length
    assert report.bytes_copied_server_side == chunks[1].data_length
    assert len(read_all(deps, "s")) == 22


def test_defrag_carries_page_indexes_into_merged_objects(deps):
    produce(deps, "m", [entries(f"m{i}", 40, 3000) for i in range(3)])
    offload_all(deps, "m")
    report = defrag(deps, "m")
    assert report.groups == 1 and report.ledgers == 3
    merged = [deps.meta.get_chunk(led) for led in deps.meta.list_ledgers("m")]
    assert len({c.data_key for c in merged}) == 1 and merged[1].data_offset > 0
    assert len(read_all(deps, "m")) == 120
    # the page checks apply inside merged objects too, at offsets rebased by the chunk row
    ix = decode_index(get(deps, merged[1].index_key)[merged[1].index_offset:
                                                     merged[1].index_offset + merged[1].index_length])
    assert ix.pages is not None
    flip(deps, merged[1].data_key, merged[1].data_offset + ix.pages.offsets[-1] + 20)
    with pytest.raises(CorruptObjectError, match=f"page {len(ix.pages) - 1}, offset "
                                                 f"{merged[1].data_offset + ix.pages.offsets[-1]}: CRC32C"):
        read_all(deps, "m", Position(1, 0), Position(1, 39))


def test_recovery_does_not_recover_a_copy_with_a_bad_page(deps, two_blocks, new_database):  # noqa: F811
    ch, ix = two_blocks
    produce(deps, "u", [entries("q", 5, 1000)])
    offload_all(deps, "u")
    flip(deps, ch.data_key, places(ch, ix)["payload"])
    target = new_database()
    report = recover_from_bucket(target, deps.bucket, check_pages=True)  # off by default: it GETs every data byte
    assert report.ok, report.errors
    assert report.ledgers_recovered == [("u", 0)]
    assert any(key == ch.index_key and "CRC32C" in why for key, why in report.ignored), report.ignored
    # without the check (the default) the copy comes back, and reads of it fail
    target2 = new_database()
    assert sorted(recover_from_bucket(target2, deps.bucket).ledgers_recovered) == \
        [("t", 0), ("u", 0)]


def test_objects_without_a_page_index_still_read_verify_defrag_and_recover(deps, cli, new_database):  # noqa: F811
    expected = produce(deps, "o", [entries(f"o{i}", 30, 2000) for i in range(3)])
    chunks = offload_all(deps, "o")
    for ch in chunks:
        n = strip_page_index(deps, ch)
        with deps.meta.engine.begin() as conn:  # the chunk row's index_length follows the shorter index
            conn.execute(text("UPDATE tiering.chunk SET index_length = :n WHERE index_key = :k"),
                         {"n": n, "k": ch.index_key})
    assert {(e.ledger_id, e.entry_id): e.data for e in read_all(deps, "o")} == expected
    out = cli("verify", "o").ok().stdout
    assert "3 ledger(s) with no page index" in out and out.endswith("OK\n")
    target = new_database()
    report = recover_from_bucket(target, deps.bucket, check_pages=True)
    assert len(report.ledgers_recovered) == 3 and report.without_page_index == 3
    assert defrag(deps, "o").ledgers == 3
    assert {(e.ledger_id, e.entry_id): e.data for e in read_all(deps, "o")} == expected


def test_cold_random_read_is_at_most_two_requests_at_every_entry(deps, s3_settings, bucket):
    # entries of varied sizes, some larger than a page, across two blocks
    sizes = [50, 70 * 1024, 3000, 200 * 1024] * 10 + [ENTRY] * 45
    produce(deps, "r", [[bytes([i % 251]) * n for i, n in enumerate(sizes)]])
    offload_all(deps, "r")
    s3 = boto3.client("s3", **s3_settings, config=Config(max_pool_connections=8))
    gets = []
    s3.meta.events.register("before-send.s3.GetObject", lambda **kw: gets.append(1))
    own = dataclasses.replace(deps, bucket=Bucket(s3, bucket, deps.bucket.prefix))
    worst = 0
    for entry_id in range(len(sizes)):
        gets.clear()
        handle = ReadHandle(own.meta, own.tier1, tier2_opener(own.bucket, ReaderCaches.new()))
        [e] = [x for x in handle.read("r", Position(0, entry_id), Position(0, entry_id)) if isinstance(x, Entry)]
        assert e.data == bytes([entry_id % 251]) * sizes[entry_id]
        worst = max(worst, len(gets))
    assert worst <= 2


def _counted(deps, s3_settings, bucket):
    s3 = boto3.client("s3", **s3_settings, config=Config(max_pool_connections=8))
    gets = []
    s3.meta.events.register("before-send.s3.GetObject", lambda **kw: gets.append(1))
    return dataclasses.replace(deps, bucket=Bucket(s3, bucket, deps.bucket.prefix)), gets


def test_a_scan_is_one_streaming_get_and_every_range_reads_exactly(deps, s3_settings, bucket):
    """A scan of many pages is ONE GET of its span (plus the index), read group by group; any
    [first, last] inside the ledger returns exactly those entries, pages at both ends cut right."""
    sizes = [50, 70 * 1024, 3000, 200 * 1024] * 10 + [ENTRY] * 45
    produce(deps, "s", [[bytes([i % 251]) * n for i, n in enumerate(sizes)]])
    [ch] = offload_all(deps, "s")
    own, gets = _counted(deps, s3_settings, bucket)
    n = len(sizes)
    for first, last in [(0, n - 1), (1, n - 2), (3, 44), (41, 80), (n - 3, n - 1)]:
        gets.clear()
        handle = ReadHandle(own.meta, own.tier1, tier2_opener(own.bucket, ReaderCaches.new()))
        got = [e for e in handle.read("s", Position(0, first), Position(0, last)) if isinstance(e, Entry)]
        assert [e.entry_id for e in got] == list(range(first, last + 1))
        assert all(e.data == bytes([e.entry_id % 251]) * sizes[e.entry_id] for e in got)
        assert len(gets) == 2, (first, last, len(gets))  # the index and one streaming GET


def test_a_scan_stopped_early_gives_its_thread_back(deps):
    """A reader that stops after a few entries of a long scan: closing it drops the scan's GET (the scan
    reads in the caller's thread), so the pool is free (a shutdown returns) and nothing keeps reading."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    produce(deps, "e", [entries("e", 120, ENTRY)])  # ~12 MiB: far more than the read-ahead holds
    offload_all(deps, "e")
    pool = ThreadPoolExecutor(4)
    it = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket, ReaderCaches.new(), pool)).read("e")
    assert [next(it).entry_id for _ in range(3)] == [0, 1, 2]
    it.close()
    t0 = time.monotonic()
    pool.shutdown(wait=True)
    assert time.monotonic() - t0 < 10


def test_a_truncated_object_fails_a_scan_with_the_typed_error(deps):
    produce(deps, "c", [entries("c", 60, ENTRY)])
    [ch] = offload_all(deps, "c")
    data = get(deps, ch.data_key)
    put(deps, ch.data_key, data[:len(data) // 2])
    with pytest.raises((CorruptObjectError, DataLossError)):
        read_all(deps, "c")


@pytest.fixture
def stream_spy(monkeypatch):
    """How many streaming GETs were opened and how many closed (RangeStream, the one streaming reader; not the
    ranged GETs get_range reads whole through it)."""
    import sys

    from tiering.tier2 import objects

    seen = {"opened": 0, "closed": 0}
    init, close = objects.RangeStream.__init__, objects.RangeStream.close
    whole = objects.get_range.__code__

    def opened(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.spied = sys._getframe(1).f_code is not whole
        seen["opened"] += self.spied

    def closed(self):
        if self._body is not None and self.spied:
            seen["closed"] += 1
        close(self)

    monkeypatch.setattr(objects.RangeStream, "__init__", opened)
    monkeypatch.setattr(objects.RangeStream, "close", closed)
    return seen


def test_a_whole_ledger_scan_sends_its_data_get_beside_the_index_get(deps, s3_settings, bucket):
    """Reading a whole ledger whose index is not cached, the data GET (its span is the chunk row's) does not
    wait for the index: with the index's response held back, the data GET is sent before it arrives. A
    range that is not the whole ledger waits for the index, as before."""
    import time

    produce(deps, "w", [entries("w", 40, ENTRY)])
    [ch] = offload_all(deps, "w")
    own, _ = _counted(deps, s3_settings, bucket)
    events = []

    def sent(request, **kw):
        events.append(("send", "index" if ch.index_key in request.url else "data"))

    def called(model, **kw):
        events.append(("done", "call"))

    def slow_index(request, **kw):
        if ch.index_key in request.url:
            time.sleep(0.5)  # the index's round trip, made long enough that nothing else can explain the order

    own.bucket.s3.meta.events.register("before-send.s3.GetObject", slow_index)
    own.bucket.s3.meta.events.register("before-send.s3.GetObject", sent)
    for first, last, early in [(0, 39, True), (0, 38, False), (1, 39, False)]:
        events.clear()
        handle = ReadHandle(own.meta, own.tier1, tier2_opener(own.bucket, ReaderCaches.new()))
        got = [e for e in handle.read("w", Position(0, first), Position(0, last)) if isinstance(e, Entry)]
        assert [e.entry_id for e in got] == list(range(first, last + 1))
        sends = [what for kind, what in events if kind == "send"]
        assert sorted(sends) == ["data", "index"], sends
        # the index's send sleeps 0.5 s before it goes: a data GET sent beside it is recorded first
        assert (sends[0] == "data") == early, (first, last, sends)


def test_a_ledger_without_a_page_index_is_read_whole_from_the_get_sent_beside_its_index(
        deps, two_blocks, stream_spy, s3_settings, bucket):
    """Blocks with padding, read one after the other from the one data GET (none dropped, none asked for
    again); a range that is not the whole ledger still reads by blocks."""
    ch, _ = two_blocks
    expected = {e.entry_id: e.data for e in read_all(deps, "t")}
    n = strip_page_index(deps, ch)
    with deps.meta.engine.begin() as conn:
        conn.execute(text("UPDATE tiering.chunk SET index_length = :n WHERE index_key = :k"),
                     {"n": n, "k": ch.index_key})
    own, gets = _counted(deps, s3_settings, bucket)
    stream_spy.update(opened=0, closed=0)
    got = [e for e in ReadHandle(own.meta, own.tier1, tier2_opener(own.bucket, ReaderCaches.new())).read("t")
           if isinstance(e, Entry)]
    assert {e.entry_id: e.data for e in got} == expected and len(expected) == 60
    assert len(gets) == 2 and stream_spy == {"opened": 1, "closed": 1}, (gets, stream_spy)  # index, data
    part = [e for e in ReadHandle(own.meta, own.tier1, tier2_opener(own.bucket, ReaderCaches.new())).read(
        "t", Position(0, 5), Position(0, 55)) if isinstance(e, Entry)]
    assert [e.entry_id for e in part] == list(range(5, 56)) and all(e.data == expected[e.entry_id] for e in part)


def test_a_data_get_sent_ahead_is_dropped_when_the_index_fails(deps, stream_spy):
    from concurrent.futures import ThreadPoolExecutor

    expected = produce(deps, "x", [entries("x", 30, 2000), entries("y", 30, 2000)])
    first, second = offload_all(deps, "x")
    put(deps, first.index_key, b"not an index at all")
    pool = ThreadPoolExecutor(4)
    with pytest.raises(CorruptObjectError):
        list(ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket, ReaderCaches.new(), pool)).read("x"))
    pool.shutdown(wait=True)
    assert stream_spy["opened"] == 1 and stream_spy["closed"] == 1, stream_spy
    # an index written before page indexes: the block path reads the ledger from the GET sent ahead
    n = strip_page_index(deps, second)
    with deps.meta.engine.begin() as conn:
        conn.execute(text("UPDATE tiering.chunk SET index_length = :n WHERE index_key = :k"),
                     {"n": n, "k": second.index_key})
    pool = ThreadPoolExecutor(4)
    got = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket, ReaderCaches.new(), pool)).read(
        "x", Position(1, 0))
    assert {(e.ledger_id, e.entry_id): e.data for e in got if isinstance(e, Entry)} == \
        {k: v for k, v in expected.items() if k[0] == 1}
    pool.shutdown(wait=True)
    assert stream_spy["opened"] == 2 and stream_spy["closed"] == 2, stream_spy


def test_a_missing_tier2_object_reads_as_a_dataloss_gap_and_the_read_goes_on(deps, cli):  # noqa: F811
    """A ledger whose data object is gone from the bucket (its chunk row unchanged) is a DATALOSS gap, as a
    ledger no tier holds is, and the ledgers after it are read; `--fail-on-dataloss` fails naming the key."""
    expected = produce(deps, "m", [entries(f"m{i}", 5, 300) for i in range(3)])
    chunks = offload_all(deps, "m")
    deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=chunks[1].data_key)
    got = cli("read", "m", "--json").ok().json_lines
    assert [(r["ledger"], r["entry"]) for r in got if "entry" in r] == [(0, i) for i in range(5)] + \
        [(2, i) for i in range(5)]
    assert {"gap": "DATALOSS", "from": "1:0", "to": "1:4"} in got
    line = cli("read", "m", "--fail-on-dataloss").one_line_error(1)
    assert chunks[1].data_key in line and "1 entries 0..4" in line, line
    assert chunks[1].data_key in cli("verify", "m").one_line_error(1)
    assert {(e.ledger_id, e.entry_id) for e in read_all(deps, "m")} == {k for k in expected if k[0] != 1}
