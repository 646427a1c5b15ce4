"""A scan of a topic of small offloaded ledgers sends the next ledger's index and data GET while it reads the
current one (ReadHandle with `tier2_opener`), on the real S3 endpoint and PostgreSQL: the requests go ahead,
every one is used or closed, and what is read does not change (a range ending inside a ledger, a ledger
with a tier-1 copy, a row that moved after its GET was sent, a reader that stops early)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.integration.helpers import entries, produce
from tests.integration.test_page_index import _counted, offload_all, stream_spy  # noqa: F401  (fixture)
from tiering import read as read_module
from tiering.model import LedgerState as S, Position
from tiering.ops.defrag import defrag
from tiering.read import Entry, ReadHandle
from tiering.tier2.reader import ReaderCaches, tier2_opener


def _handle(deps, pool, gc_delay_seconds=600):
    """As the CLI's: with the deployment's GC delay, so the read holds a snapshot of the chunk rows (without
    one nothing is sent ahead: each row is read when the read reaches it)."""
    return ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket, ReaderCaches.new(), pool),
                      gc_delay_seconds=gc_delay_seconds)


def _small_topic(deps, topic, n=5, count=20, size=3000):
    expected = produce(deps, topic, [entries(f"{topic}{i}", count, size) for i in range(n)])
    return expected, offload_all(deps, topic)


@pytest.mark.parametrize("ahead", [True, False])
def test_the_next_ledgers_data_get_is_sent_while_this_one_is_read(deps, s3_settings, bucket, stream_spy,
                                                                   monkeypatch, ahead):
    """A consumer that takes 0.3 s over each ledger: the next ledger's data GET is sent before the
    consumer is done with this one (without sending ahead, only after). Each ledger costs its two GETs
    and no more, and every stream opened is closed."""
    expected, chunks = _small_topic(deps, "sa")
    if not ahead:
        monkeypatch.setattr(read_module, "SEND_AHEAD_BELOW", 0)  # the control: nothing is sent ahead
    own, gets = _counted(deps, s3_settings, bucket)
    events = []
    data_keys = {ch.data_key: i for i, ch in enumerate(chunks)}

    def sent(request, **kw):
        for key, i in data_keys.items():
            if request.url.endswith(key):
                events.append(("sent", i))
    own.bucket.s3.meta.events.register("before-send.s3.GetObject", sent)
    pool = ThreadPoolExecutor(4)
    got = {}
    for e in _handle(own, pool).read("sa"):
        assert isinstance(e, Entry)
        got[(e.ledger_id, e.entry_id)] = e.data
        if e.entry_id == 0:
            time.sleep(0.3)
        if e.entry_id == 19:
            events.append(("done", e.ledger_id))
    pool.shutdown(wait=True)
    assert got == expected
    assert len(gets) == 2 * len(chunks)
    assert stream_spy["opened"] == stream_spy["closed"] == len(chunks), stream_spy
    for i in range(1, len(chunks)):
        assert (events.index(("sent", i)) < events.index(("done", i - 1))) == ahead, (i, events)


def test_a_reader_stopping_early_closes_what_was_sent_ahead(deps, stream_spy):
    _small_topic(deps, "sb")
    pool = ThreadPoolExecutor(4)
    reading = _handle(deps, pool).read("sb")
    assert next(reading).entry_id == 0
    time.sleep(0.2)  # the next ledger's GET is out
    reading.close()
    pool.shutdown(wait=True)
    # the first ledger's and the four sent ahead of it (SEND_AHEAD_LEDGERS), all closed
    assert stream_spy["opened"] == 5 and stream_spy["closed"] == 5, stream_spy


def test_nothing_is_sent_for_a_ledger_read_in_part_or_from_tier_1(deps, s3_settings, bucket, stream_spy):
    """Ledger 2 is read up to entry 5 only (its pages, not a whole-data GET), ledger 3 is past the range,
    and ledger 1 still has its tier-1 copy (read from there): no GET is sent for any of them."""
    expected = produce(deps, "sc", [entries(f"sc{i}", 20, 3000) for i in range(4)])
    for led in deps.meta.list_ledgers("sc", [S.SEALED]):
        from tiering.ops.offload import offload_ledger
        offload_ledger(deps, led)
    for led in deps.meta.list_ledgers("sc", [S.OFFLOADED]):
        if led.ledger_id != 1:
            deps.tier1.delete("sc", led.ledger_id)
            deps.meta.mark_tier1_deleted(led)
    chunks = {led.ledger_id: deps.meta.get_chunk(led) for led in deps.meta.list_ledgers("sc")}
    own, _ = _counted(deps, s3_settings, bucket)
    urls = []
    own.bucket.s3.meta.events.register("before-send.s3.GetObject", lambda request, **kw: urls.append(request.url))
    pool = ThreadPoolExecutor(4)
    got = {(e.ledger_id, e.entry_id): e.data for e in _handle(own, pool).read("sc", None, Position(2, 5))}
    pool.shutdown(wait=True)
    assert got == {k: v for k, v in expected.items() if k[0] < 2 or (k[0] == 2 and k[1] <= 5)}
    assert not any(u.endswith((chunks[1].data_key, chunks[3].data_key, chunks[3].index_key)) for u in urls)
    data_gets = [u for u in urls if u.endswith(chunks[2].data_key)]
    assert len(data_gets) == 1  # the pages of entries 0..5, fetched after its index
    assert stream_spy["opened"] == stream_spy["closed"], stream_spy


@pytest.mark.parametrize("reread", [False, True])
def test_a_row_that_moved_after_its_get_was_sent(deps, stream_spy, reread):
    """Defrag merges the topic's ledgers while the scan reads the first one, after the GETs for the second
    went out naming its old objects. Within the snapshot's age the read uses them (the old objects stay for
    the GC delay); once the snapshot is older (`reread`) the read takes the new rows and drops them. Every
    entry comes back either way and every stream is closed."""
    expected, _ = _small_topic(deps, "sd", n=3)
    pool = ThreadPoolExecutor(4)
    got = {}
    for e in _handle(deps, pool, gc_delay_seconds=0.4 if reread else 600).read("sd"):
        got[(e.ledger_id, e.entry_id)] = e.data
        if (e.ledger_id, e.entry_id) == (0, 0):
            time.sleep(0.2)
            assert defrag(deps, "sd", small_bytes=10**9, max_merged_bytes=10**9).groups == 1
            time.sleep(0.3)  # past a snapshot age of 0.2 s
    pool.shutdown(wait=True)
    assert got == expected
    assert stream_spy["opened"] == stream_spy["closed"], stream_spy
    # reread: the two sent for the old rows are dropped and each ledger GETs its new row's range
    assert stream_spy["opened"] == (5 if reread else 3), stream_spy


def _batched_topic(deps, topic, n=8):
    """`n` small ledgers offloaded as one batch: one data object and one index object hold them all."""
    from dataclasses import replace

    from tiering.ops.offload import offload_many

    expected = produce(deps, topic, [entries(f"{topic}{i}", 10, 2000) for i in range(n)])
    batched = replace(deps, knobs=replace(deps.knobs, batch_small_bytes=8 * 1024 * 1024))
    assert len(offload_many(batched, deps.meta.list_ledgers(topic, [S.SEALED])).offloaded) == n
    for led in deps.meta.list_ledgers(topic, [S.OFFLOADED]):
        deps.tier1.delete(topic, led.ledger_id)
        deps.meta.mark_tier1_deleted(led)
    chunks = [deps.meta.get_chunk(led) for led in deps.meta.list_ledgers(topic)]
    assert len({ch.index_key for ch in chunks}) == 1 and len({ch.data_key for ch in chunks}) == 1
    return expected, chunks


def test_indexes_of_ledgers_offloaded_together_come_in_one_get(deps, s3_settings, bucket, stream_spy):
    """Eight ledgers of one batch: the first ledger's index, then one GET for the indexes of all the others
    (back to back in the batch's index object), and one data GET per ledger."""
    expected, chunks = _batched_topic(deps, "sg")
    own, _ = _counted(deps, s3_settings, bucket)
    urls = []
    own.bucket.s3.meta.events.register("before-send.s3.GetObject", lambda request, **kw: urls.append(request.url))
    pool = ThreadPoolExecutor(4)
    got = {(e.ledger_id, e.entry_id): e.data for e in _handle(own, pool).read("sg")}
    pool.shutdown(wait=True)
    assert got == expected
    assert sum(u.endswith(chunks[0].index_key) for u in urls) == 2, urls
    assert sum(u.endswith(chunks[0].data_key) for u in urls) == len(chunks)
    assert stream_spy["opened"] == stream_spy["closed"] == len(chunks), stream_spy


def test_a_corrupt_index_inside_a_group_fails_that_ledger_alone(deps):
    """A flipped byte in the fourth ledger's index (inside the grouped GET): the three before it are read,
    and the read stops at the fourth with the error naming its index, as without the grouping."""
    from tiering.errors import CorruptObjectError

    from tests.integration.test_page_index import flip

    expected, chunks = _batched_topic(deps, "sh")
    flip(deps, chunks[3].index_key, chunks[3].index_offset + chunks[3].index_length // 2)
    pool = ThreadPoolExecutor(4)
    got = {}
    with pytest.raises(CorruptObjectError, match=f"at {chunks[3].index_offset}"):
        for e in _handle(deps, pool).read("sh"):
            got[(e.ledger_id, e.entry_id)] = e.data
    pool.shutdown(wait=True)
    assert got == {k: v for k, v in expected.items() if k[0] < 3}
