"""Offload to the real loopback S3 and PostgreSQL: layout, read-back, failures, races, corruption."""
from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
from sqlalchemy import text

from tests.integration.helpers import MIB, bucket_keys, entries, make_deps, open_uploads, produce
from tiering.errors import BadInput, ConditionalUpdateFailed, CorruptObjectError, TieringError, TopicNotFound
from tiering.format.block import decode_block
from tiering.format.index import decode_index
from tiering.format.metadata import FORMAT_VERSION_KEY
from tiering.model import LedgerState as S, Position
from tiering.ops.offload import offload_ledger, offload_prefix
from tiering.read import Entry, ReadHandle
from tiering.tier2.reader import ReaderCaches, tier2_opener


def read_all(deps, topic, start=None, end=None, caches=None):
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket, caches))
    return list(handle.read(topic, start, end))


def as_dict(items):
    return {(e.ledger_id, e.entry_id): e.data for e in items if isinstance(e, Entry)}


def drop_tier1(deps, topic):
    for led in deps.meta.list_ledgers(topic, [S.OFFLOADED]):
        deps.tier1.delete(topic, led.ledger_id)
        deps.meta.mark_tier1_deleted(led)


SHAPES = {
    "one-entry": [[b"x"]],
    "many-blocks": [entries("mb", 130, 100 * 1024)],          # ~13 MiB: 3 blocks of 5 MiB
    "zero-byte-entries": [[b""] * 50 + [b"z"] + [b""] * 5],
    "entry-larger-than-a-block": [[b"a" * 10, b"B" * (6 * MIB), b"c" * 10]],
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_offload_then_read_back_byte_exact_from_tier2(deps, shape):
    expected = produce(deps, "t", SHAPES[shape])
    [led] = deps.meta.list_ledgers("t")
    done = offload_ledger(deps, led)
    assert done.state == S.OFFLOADED
    ch = deps.meta.get_chunk(done)
    assert bucket_keys(deps) == {ch.data_key, ch.index_key} and not open_uploads(deps)
    assert ch.data_key == f"t/t/{done.offload_uuid}-ledger-{done.ledger_id}" and ch.index_key == ch.data_key + "-index"
    head = deps.bucket.s3.head_object(Bucket=deps.bucket.name, Key=ch.data_key)
    assert head["Metadata"][FORMAT_VERSION_KEY] == "1"
    drop_tier1(deps, "t")
    assert as_dict(read_all(deps, "t")) == expected


def test_data_object_layout_blocks_and_index(deps):
    produce(deps, "t", SHAPES["many-blocks"])
    [led] = deps.meta.list_ledgers("t")
    ch = deps.meta.get_chunk(offload_ledger(deps, led))
    s3, name = deps.bucket.s3, deps.bucket.name
    data = s3.get_object(Bucket=name, Key=ch.data_key)["Body"].read()
    index = decode_index(s3.get_object(Bucket=name, Key=ch.index_key)["Body"].read())
    assert index.data_object_len == len(data) and index.metadata.entry_count == 130
    assert index.metadata.topic == "t" and index.metadata.ledger_id == led.ledger_id
    assert [e.part_id for e in index.entries] == [1, 2, 3]
    ids = []
    for i, e in enumerate(index.entries):
        block = data[e.block_offset:e.block_offset + index.block_length(i)]
        if i < len(index.entries) - 1:
            assert len(block) == 5 * MIB  # every block but the last is exactly the block size
        ids += [x.entry_id for x in decode_block(block)[1]]
    assert ids == list(range(130))


def test_random_ranges_across_tiers_in_one_call(deps):
    # Given ledgers 0,1 only in tier 2, ledger 2 offloaded but still on tier 1, 3 sealed, 4 open
    expected = produce(deps, "t", [entries(f"l{i}", 40, 3000) for i in range(4)],
                       open_tail=entries("open", 7, 10))
    for led in deps.meta.list_ledgers("t", [S.SEALED])[:3]:
        offload_ledger(deps, led)
    for lid in (0, 1):
        led = deps.meta.get_ledger("t", lid)
        deps.tier1.delete("t", lid)
        deps.meta.mark_tier1_deleted(led)
    assert as_dict(read_all(deps, "t")) == expected  # whole topic, in order
    got = read_all(deps, "t")
    assert [(e.ledger_id, e.entry_id) for e in got] == sorted(expected)
    import random
    rng = random.Random(7)
    keys = sorted(expected)
    caches = ReaderCaches.new()
    for _ in range(25):
        a, b = sorted(rng.sample(range(len(keys)), 2))
        start, end = Position(*keys[a]), Position(*keys[b])
        assert as_dict(read_all(deps, "t", start, end, caches)) == {k: expected[k] for k in keys[a:b + 1]}
    assert caches.index.fetches <= 3  # each index fetched once, then cached


@pytest.mark.parametrize("step", ["initiated", "part", "completed", "index", "commit"])
def test_failure_at_each_step_leaves_nothing_and_ledger_offloadable(deps, db, step):
    produce(deps, "t", [entries("f", 120, 100 * 1024)])
    [led] = deps.meta.list_ledgers("t")

    def hook(name):
        if name == step:
            raise TieringError(f"injected failure at {name}")
        if step == "commit" and name == "index":  # GC claims a key: the commit must fail whole
            with db.begin() as conn:
                conn.execute(text("DELETE FROM tiering.gc_task WHERE key LIKE '%-index'"))

    with pytest.raises(TieringError):
        offload_ledger(deps, led, hook)
    after = deps.meta.get_ledger("t", led.ledger_id)
    assert after.state == S.SEALED and deps.meta.get_chunk(after) is None
    assert bucket_keys(deps) == set() and open_uploads(deps) == []
    done = offload_ledger(deps, after)  # and it offloads again
    assert done.state == S.OFFLOADED


def test_second_offloader_of_the_same_ledger_loses_at_begin(deps):
    produce(deps, "t", [[b"a", b"b"]])
    [led] = deps.meta.list_ledgers("t")
    offload_ledger(deps, led)
    with pytest.raises(ConditionalUpdateFailed):
        offload_ledger(deps, led)  # the same snapshot: version moved on
    assert len(bucket_keys(deps)) == 2


def test_takeover_of_a_stalled_attempt_one_commit_and_the_loser_cleans_up(db, s3_client, bucket, tier1_root):
    slow = make_deps(db, s3_client, bucket, tier1_root, offload_timeout=timedelta(0))
    produce(slow, "t", [entries("race", 20, 1000)])
    [led] = slow.meta.list_ledgers("t")
    stalled, release = threading.Event(), threading.Event()
    outcome = {}

    def hook(name):
        if name == "index":
            stalled.set()
            release.wait(30)

    def first():
        try:
            outcome["first"] = offload_ledger(slow, led, hook)
        except Exception as exc:  # noqa: BLE001 - recorded for the assertion
            outcome["first"] = exc

    t = threading.Thread(target=first)
    t.start()
    assert stalled.wait(30)
    # the attempt is older than the (zero) timeout: a second worker takes it over and commits
    taken = slow.meta.get_ledger("t", led.ledger_id)
    winner = offload_ledger(slow, taken)
    release.set()
    t.join(30)
    assert isinstance(outcome["first"], ConditionalUpdateFailed)
    ch = slow.meta.get_chunk(winner)
    assert bucket_keys(slow) == {ch.data_key, ch.index_key} and open_uploads(slow) == []
    drop_tier1(slow, "t")
    assert len(as_dict(read_all(slow, "t"))) == 20


def test_corrupt_index_and_data_objects_raise_corrupt_object_error(deps):
    produce(deps, "t", [entries("c", 30, 1000)])
    [led] = deps.meta.list_ledgers("t")
    ch = deps.meta.get_chunk(offload_ledger(deps, led))
    drop_tier1(deps, "t")
    s3, name = deps.bucket.s3, deps.bucket.name
    good_index = s3.get_object(Bucket=name, Key=ch.index_key)["Body"].read()
    s3.put_object(Bucket=name, Key=ch.index_key, Body=b"\x00" * len(good_index))
    with pytest.raises(CorruptObjectError, match="magic"):
        read_all(deps, "t")
    s3.put_object(Bucket=name, Key=ch.index_key, Body=good_index)
    data = bytearray(s3.get_object(Bucket=name, Key=ch.data_key)["Body"].read())
    data[128 + 4:128 + 12] = (999).to_bytes(8, "big")  # the first entry's id
    s3.put_object(Bucket=name, Key=ch.data_key, Body=bytes(data))
    # the page's CRC32C catches it before any framing check (tests/integration/test_page_index.py has more)
    with pytest.raises(CorruptObjectError, match=f"{ch.data_key}, page 0, offset 0: CRC32C"):
        read_all(deps, "t")


def test_offload_prefix_semantics_and_idempotence(deps):
    produce(deps, "t", [[b"a"], [], [b"b", b"c"], [b"d"]], open_tail=[b"e"])
    ledgers = deps.meta.list_ledgers("t")
    assert [led.state for led in ledgers] == [S.SEALED] * 4 + [S.OPEN]
    assert ledgers[1].entry_count == 0
    report, first = offload_prefix(deps, "t", Position(2, 0))
    assert report.offloaded == [0] and first == Position(2, 0)  # the empty ledger 1 is skipped
    report, first = offload_prefix(deps, "t", Position(3, 0))
    assert report.offloaded == [2] and first == Position(3, 0)
    report, _ = offload_prefix(deps, "t", Position(3, 0))
    assert report.offloaded == [] and report.first_error is None
    with pytest.raises(BadInput, match="beyond the end"):
        offload_prefix(deps, "t", Position(9, 0))
    with pytest.raises(TopicNotFound):
        offload_prefix(deps, "nope", Position(1, 0))



def test_offload_prefix_reports_what_another_worker_holds_as_skipped(deps):
    produce(deps, "h", [[b"a"], [b"b"], [b"c"]], open_tail=[b"d"])
    first, held, last = deps.meta.list_ledgers("h", [S.SEALED])
    with deps.meta.new_attempt() as alive:  # another worker, alive, in the middle of ledger 1
        deps.meta.begin_offload(held, alive, ["d1", "i1"], timedelta(hours=1))
        report, at = offload_prefix(deps, "h", Position(3, 0))
        assert (report.offloaded, report.skipped, report.failed) == ([0, 2], [1], {})
        assert at == Position(1, 0)
        report, _ = offload_prefix(deps, "h", Position(3, 0))  # all that is left is theirs: said, not silent
        assert (report.offloaded, report.skipped, report.failed) == ([], [1], {})

def test_offload_prefix_reports_first_error_and_continues(deps):
    produce(deps, "t", [[b"a"], [b"b"], [b"c"]], open_tail=[b"x"])
    deps.tier1.delete("t", 1)  # ledger 1's tier-1 copy is gone: it cannot be offloaded
    report, first = offload_prefix(deps, "t", Position(3, 0))
    assert report.offloaded == [0, 2] and list(report.failed) == [1]
    assert report.first_error.startswith("ledger 1") and first == Position(1, 0)
    assert deps.meta.get_ledger("t", 1).state == S.SEALED


def test_undo_that_cannot_read_metadata_leaves_a_warning(deps, monkeypatch, caplog):
    """A swallowed cleanup failure leaves a trace an operator sees: a log record naming the
    attempt and the exception type, not the driver's message (it may carry connection details)."""
    produce(deps, "t", [entries("w", 3, 100)])
    [led] = deps.meta.list_ledgers("t")

    def down(*_args):
        raise OSError("metadata down at host secret-host")

    def hook(name):
        if name == "index":  # the upload fails, and metadata is gone when the undo looks
            monkeypatch.setattr(deps.meta, "get_ledger", down)
            raise TieringError("injected failure")

    with caplog.at_level(logging.WARNING, logger="tiering.ops.offload_batch"), pytest.raises(TieringError):
        offload_ledger(deps, led, hook)  # a batch of one: its attempt is offload_batch's
    [record] = [r for r in caplog.records if r.name == "tiering.ops.offload_batch"]
    message = record.getMessage()
    assert record.levelno == logging.WARNING and "not undone (OSError)" in message
    assert "t/0" in message and "secret-host" not in message


def test_the_upload_limit_paces_every_byte_of_the_data_object_and_nothing_else(db, s3_client, bucket, tier1_root,
                                                                              monkeypatch):
    """Knobs.max_bytes_per_second reaches the process's limiter on the real upload path (parts and the single
    PUT of a batch); its clock is injected, so nothing sleeps: the reservations say what was paced."""
    from tests.unit.test_throttle import FakeClock
    from tiering.tier2 import throttle
    from tiering.tier2.throttle import RateLimiter

    rate, clock = 4 * MIB, FakeClock()
    asked: list[int] = []

    class Recording(RateLimiter):
        def acquire(self, nbytes):
            asked.append(nbytes)
            return super().acquire(nbytes)

    rec = Recording(rate, clock=clock, sleep=clock.sleep)
    monkeypatch.setitem(throttle._shared, rate, rec)
    paced = make_deps(db, s3_client, bucket, tier1_root, max_bytes_per_second=rate)
    produce(paced, "t", [entries("big", 130, 100 * 1024), [b"small"]])
    leds = paced.meta.list_ledgers("t")
    for led in leds:
        offload_ledger(paced, led)
    data = sorted(o["Size"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix="t/").get("Contents", [])
                  if not o["Key"].endswith("-index"))
    assert sum(asked) == sum(data), (asked, data)  # every data byte paced once, index objects not
    # 13 MiB of 5 MiB blocks in two parts (the 3 MiB tail goes with the second), the small ledger one PUT
    assert len(asked) == 2 + 1
    assert rec._tat - 1000.0 == pytest.approx(sum(data) / rate)  # the reservations end at the rate's pace
