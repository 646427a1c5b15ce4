"""Batched offload of small ledgers on the real S3 endpoint and PostgreSQL: one data object and one
index object per batch, chunk rows pointing inside them, byte-exact reads, few PUTs, recovery, retention +
GC of a shared object, defrag leaving it alone, failures at each step undone. Kill -9 and race cases of the
batch path are in tests/faults (test_kill9 `offload-batch@*`, test_races `batches`)."""
from __future__ import annotations

import dataclasses

import boto3
import pytest
from botocore.config import Config

from tests.integration.helpers import MIB, bucket_keys, entries, make_deps, open_uploads, produce
from tests.integration.test_export_recover import new_database  # noqa: F401  (extra databases)
from tiering.errors import ConditionalUpdateFailed
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.defrag import defrag
from tiering.ops.gc import run_gc
from tiering.ops.offload import offload_many
from tiering.ops.offload_batch import batches, offload_batch
from tiering.ops.recover import recover_from_bucket
from tiering.ops.retention import truncate
from tiering.read import Entry, ReadHandle
from tiering.tier2.objects import Bucket
from tiering.tier2.reader import tier2_opener


@pytest.fixture
def deps(db, s3_client, bucket, tier1_root):
    return make_deps(db, s3_client, bucket, tier1_root, batch_small_bytes=8 * MIB)  # the product's default


def read_tier2(deps, topic):
    for led in deps.meta.list_ledgers(topic, [S.OFFLOADED]):
        if led.tier1_present:
            deps.tier1.delete(topic, led.ledger_id)
            deps.meta.mark_tier1_deleted(led)
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    return {(e.ledger_id, e.entry_id): e.data for e in handle.read(topic) if isinstance(e, Entry)}


def counting(deps, s3_settings):
    s3 = boto3.client("s3", **s3_settings, config=Config(max_pool_connections=16))
    ops: dict[str, int] = {}
    s3.meta.events.register("before-send.s3", lambda event_name="", **kw: ops.update(
        {event_name.rsplit(".", 1)[-1]: ops.get(event_name.rsplit(".", 1)[-1], 0) + 1}))
    return dataclasses.replace(deps, bucket=Bucket(s3, deps.bucket.name, deps.bucket.prefix)), ops


def test_batches_split_by_topic_size_and_count():
    from tests.unit.test_policy import L  # a Ledger with defaults
    leds = [L(i, size=100) for i in range(5)] + [L(5, size=10 * MIB)] + [L(6, size=100)]
    groups, alone = batches(leds, 8 * MIB, 250, 10)
    # a large ledger does not end a run: small ones around it share a batch (order inside is free)
    assert [[x.ledger_id for x in g] for g in groups] == [[0, 1], [2, 3], [4, 6]]
    assert [x.ledger_id for x in alone] == [5]


def test_small_ledgers_go_to_one_object_pair_and_read_back(deps, s3_settings):
    expected = produce(deps, "t", [entries(f"s{i}", 16, 1024) for i in range(40)], open_tail=[b"tail"])
    own, ops = counting(deps, s3_settings)
    report = offload_many(own, deps.meta.list_ledgers("t", [S.SEALED]))
    assert sorted(report.offloaded) == list(range(40)) and not report.failed
    chunks = deps.meta.chunks("t")
    assert len({c.data_key for c in chunks.values()}) == 1 and len({c.index_key for c in chunks.values()}) == 1
    assert bucket_keys(deps) == {chunks[0].data_key, chunks[0].index_key} and not open_uploads(deps)
    # one PUT of the data (it fits one part) and one of the index, for 40 ledgers
    assert ops.get("PutObject", 0) + ops.get("UploadPart", 0) == 2, ops
    offsets = [chunks[i].data_offset for i in range(40)]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert read_tier2(deps, "t") == expected  # the open tail (ledger 40) from tier 1


def test_a_batch_larger_than_a_part_is_a_multipart_upload(deps, s3_settings):
    expected = produce(deps, "t", [entries(f"m{i}", 10, 100 * 1024) for i in range(12)])  # ~12 MiB
    own, ops = counting(deps, s3_settings)
    assert len(offload_many(own, deps.meta.list_ledgers("t", [S.SEALED])).offloaded) == 12
    # ~1,000 KiB per ledger: a part is cut once 5 MiB are pending, i.e. after 6 ledgers -> 2 parts
    assert ops.get("UploadPart") == 2 and ops.get("PutObject") == 1 and ops.get("CreateMultipartUpload") == 1, ops
    assert read_tier2(deps, "t") == expected


@pytest.mark.parametrize("step", ["initiated", "part", "completed", "index"])
def test_failure_at_each_step_undoes_the_whole_batch(deps, step):
    produce(deps, "t", [entries(f"f{i}", 10, 100 * 1024) for i in range(8)])

    def hook(name):
        if name == step:
            raise RuntimeError(f"injected at {name}")

    leds = deps.meta.list_ledgers("t")
    with pytest.raises(RuntimeError, match="injected"):
        offload_batch(deps, leds, hook)
    assert [led.state for led in deps.meta.list_ledgers("t")] == [S.SEALED] * 8
    assert bucket_keys(deps) == set() and not open_uploads(deps) and not deps.meta.chunks("t")
    with deps.meta.engine.connect() as conn:
        from sqlalchemy import text
        assert conn.execute(text("SELECT count(*) FROM tiering.gc_task")).scalar() == 0
    assert len(offload_batch(deps, deps.meta.list_ledgers("t"))) == 8  # and it can be offloaded again


def test_a_batch_is_all_or_nothing_at_begin(deps):
    produce(deps, "t", [entries(f"a{i}", 4, 1000) for i in range(4)])
    leds = deps.meta.list_ledgers("t")
    offload_batch(deps, leds[2:3])  # ... a single-ledger batch is allowed here, taking ledger 2
    with pytest.raises(ConditionalUpdateFailed):
        offload_batch(deps, leds)
    assert [led.state for led in deps.meta.list_ledgers("t")] == [S.SEALED, S.SEALED, S.OFFLOADED, S.SEALED]
    # offload_many falls back to one by one for the rest
    report = offload_many(deps, deps.meta.list_ledgers("t", [S.SEALED]))
    assert sorted(report.offloaded) == [0, 1, 3]


def test_recovery_retention_gc_and_defrag_work_on_batch_objects(deps, new_database):  # noqa: F811
    expected = produce(deps, "t", [entries(f"r{i}", 8, 2000) for i in range(6)] + [entries("big", 3, 100)],
                       TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40, deletion_lag_seconds=0),
                       open_tail=[b"tail"])
    offload_many(deps, deps.meta.list_ledgers("t", [S.SEALED]))
    chunks = deps.meta.chunks("t")
    data_key = chunks[0].data_key
    assert len({c.data_key for c in chunks.values()}) == 1
    # recovery from the bucket alone finds every ledger of the batch at its offset
    target = new_database()
    report = recover_from_bucket(target, deps.bucket)
    assert sorted(report.ledgers_recovered) == [("t", i) for i in range(7)], report.ignored
    from tiering.metadata.repository import MetadataStore
    # no ETags: recovery records them only after checking the pages
    assert MetadataStore(target).chunks("t") == {i: dataclasses.replace(c, version=0, data_etag=None, index_etag=None)
                                                 for i, c in chunks.items()}
    # defrag leaves a shared object alone
    assert defrag(deps, "t").groups == 0
    # retention of some ledgers keeps the shared object while others reference it; GC after all are gone
    truncate(deps, "t", Position(3, 0))
    run_gc(deps)
    assert data_key in bucket_keys(deps)
    assert read_tier2(deps, "t") == {k: v for k, v in expected.items() if k[0] >= 3}
    truncate(deps, "t", Position(7, 0))
    run_gc(deps)
    assert bucket_keys(deps) == set()  # (retention's trim marker aside)


def test_the_offload_job_plans_batches_and_its_work_runs_them(deps):
    """tiering/jobs/offload.py as Spark runs it, minus Spark: one item per batch, then work() per item."""
    import argparse

    from tiering.jobs import offload as job

    produce(deps, "t", [entries(f"j{i}", 4, 1000) for i in range(5)] + [[b"x" * (9 * MIB)]],
            TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40, offload_after_seconds=0))
    items = job.plan(deps, argparse.Namespace(prefix=None, by="age", topic="t", position=None))
    assert {"topic": "t", "ledger_ids": [0, 1, 2, 3, 4]} in items and {"topic": "t", "ledger_id": 5} in items
    assert len(items) == 2
    assert [job.work(deps, item)[1] for item in items] == [False, False]
    chunks = deps.meta.chunks("t")
    assert len({chunks[i].data_key for i in range(5)}) == 1 and chunks[5].data_key != chunks[0].data_key
    # a second run of the same items finds them done: skipped, nothing uploaded again
    keys = bucket_keys(deps)
    assert [job.work(deps, item) for item in items] == [(0, True), (0, True)]
    assert bucket_keys(deps) == keys


def test_a_run_reports_its_ledgers_in_the_order_its_dry_run_lists_them(deps):
    """Batches finish before the ledgers that go alone; the report used to list them in that order."""
    produce(deps, "o", [entries(f"o{i}", 2, 9 * MIB if i in (1, 3) else 100) for i in range(5)])
    planned = deps.meta.list_ledgers("o", [S.SEALED])
    groups, alone = batches(planned, 8 * MIB, deps.knobs.batch_max_bytes, deps.knobs.batch_max_ledgers)
    assert [x.ledger_id for x in alone] == [1, 3] and groups  # some go alone, the others in a batch
    assert offload_many(deps, planned).offloaded == [0, 1, 2, 3, 4]


def test_a_batch_whose_index_object_is_corrupt_has_every_ledger_of_it_recorded_lost(deps, new_database):  # noqa: F811
    """The database lost and the batch's index object corrupt (the topic's last object): its ledgers after the
    first were in no report and their ids handed out again to new ledgers. The data object's user metadata
    names the batch's last ledger, so recovery records each of them lost and moves the next id past them."""
    from tiering.format.metadata import LAST_LEDGER_KEY
    from tiering.metadata.repository import MetadataStore

    produce(deps, "cb", [entries(f"c{i}", 4, 1000) for i in range(4)])
    offload_batch(deps, deps.meta.list_ledgers("cb")[1:])  # ledgers 1-3 in one object pair
    offload_many(deps, deps.meta.list_ledgers("cb", [S.SEALED]))  # ledger 0 alone
    batch = deps.meta.chunks("cb")[1]
    s3, name = deps.bucket.s3, deps.bucket.name
    assert s3.head_object(Bucket=name, Key=batch.data_key)["Metadata"][LAST_LEDGER_KEY] == "3"
    s3.put_object(Bucket=name, Key=batch.index_key, Body=b"\0" * 200)  # the index object corrupt
    target = new_database()
    report = recover_from_bucket(target, deps.bucket)
    assert report.ok, report.errors
    assert report.ledgers_recovered == [("cb", 0)]
    assert sorted(report.lost_recorded) == [("cb", 1), ("cb", 2), ("cb", 3)]
    assert MetadataStore(target).get_topic("cb").next_ledger_id == 4


@pytest.mark.parametrize("leftover", ["data only", "data and index"])
def test_a_corrupt_batch_counts_up_to_its_last_ledger_beside_another_attempts_copy_of_one_of_them(
        deps, new_database, leftover):  # noqa: F811
    """A dead attempt of one ledger of the batch left its objects: its data alone (a key naming ledger 3), or
    its data and index (a decodable copy of ledger 3). Either made recovery stop at ledger 3, above the
    batch's key, and hand ledger 4's id out again."""
    import uuid

    from tiering.format.keys import data_key, index_key
    from tiering.metadata.repository import MetadataStore
    from tiering.ops.offload_batch import tier1_source
    from tiering.tier2.offloader import upload_ledgers

    produce(deps, "cd", [entries(f"d{i}", 4, 1000) for i in range(5)])
    leds = deps.meta.list_ledgers("cd")
    attempt = str(uuid.uuid4())
    keys = (data_key(deps.bucket.prefix, "cd", attempt, 3), index_key(deps.bucket.prefix, "cd", attempt, 3))
    upload_ledgers(deps.bucket, topic="cd", attempt=attempt, data_key=keys[0], index_key=keys[1],
                   sources=tier1_source(deps, leds[3]), block_size=5 * MIB, concurrency=2)
    if leftover == "data only":
        deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=keys[1])
    offload_batch(deps, leds[1:])  # ledgers 1-4 in one object pair
    offload_many(deps, deps.meta.list_ledgers("cd", [S.SEALED]))  # ledger 0 alone
    batch = deps.meta.chunks("cd")[1]
    deps.bucket.s3.put_object(Bucket=deps.bucket.name, Key=batch.index_key, Body=b"\0" * 200)
    target = new_database()
    report = recover_from_bucket(target, deps.bucket)
    assert report.ok, report.errors
    recovered = [("cd", 0)] + ([("cd", 3)] if leftover == "data and index" else [])
    assert sorted(report.ledgers_recovered) == recovered
    assert sorted(report.lost_recorded) == [("cd", i) for i in (1, 2, 3, 4) if ("cd", i) not in recovered]
    assert MetadataStore(target).get_topic("cd").next_ledger_id == 5
