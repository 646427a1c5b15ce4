"""What recovery costs in S3 requests, counted on the real endpoint: without the page check one
LIST per 1,000 keys and one GET per index object (an object's existence and length come from the listing:
no HEAD); the block-header walk of a shared (batch or defrag) object reads it in windows, not one GET per
block; the page check adds the data bytes. The figures of the README come from here."""
from __future__ import annotations

import dataclasses

import boto3
from botocore.config import Config

from tests.integration.helpers import MIB, entries, make_deps, produce
from tests.integration.test_export_recover import new_database  # noqa: F401  (extra databases)
from tiering.model import LedgerState as S
from tiering.ops.offload import offload_many
from tiering.ops.recover import recover_from_bucket
from tiering.tier2.objects import Bucket


def counted(deps, s3_settings):
    s3 = boto3.client("s3", **s3_settings, config=Config(max_pool_connections=32))
    ops: dict[str, int] = {}
    sent: dict[str, int] = {"bytes": 0}

    def on_send(event_name="", request=None, **_):
        op = event_name.rsplit(".", 1)[-1]
        ops[op] = ops.get(op, 0) + 1

    def on_after(event_name="", parsed=None, **_):
        if event_name.endswith("GetObject") and parsed:
            sent["bytes"] += int(parsed.get("ContentLength", 0))

    s3.meta.events.register("before-send.s3", on_send)
    s3.meta.events.register("after-call.s3", on_after)
    return Bucket(s3, deps.bucket.name, deps.bucket.prefix), ops, sent


def recover_counted(deps, s3_settings, target, **kwargs):
    b, ops, got = counted(deps, s3_settings)
    report = recover_from_bucket(target, b, **kwargs)
    assert report.ok, report.errors
    return report, ops, got["bytes"]


def test_one_object_pair_per_ledger(deps, s3_settings, new_database):  # noqa: F811
    for t in ("a", "b"):
        produce(deps, t, [entries(f"{t}{i}", 50, 1000) for i in range(5)])
        offload_many(deps, deps.meta.list_ledgers(t, [S.SEALED]))
    data_bytes = sum(led.size_bytes for t in ("a", "b") for led in deps.meta.list_ledgers(t))
    report, ops, got = recover_counted(deps, s3_settings, new_database())
    assert len(report.ledgers_recovered) == 10
    assert ops == {"ListObjectsV2": 1, "GetObject": 10}  # 1 GET per ledger: its index object
    assert got < data_bytes / 10  # index objects only
    report, ops, got = recover_counted(deps, s3_settings, new_database(), check_pages=True)
    assert len(report.ledgers_recovered) == 10 and report.pages_checked
    assert ops == {"ListObjectsV2": 1, "GetObject": 20}  # + the data, here one ranged GET per ledger
    assert got > data_bytes


def test_a_batch_object_is_walked_in_windows_not_per_block(db, s3_client, bucket, tier1_root, s3_settings,
                                                           new_database):  # noqa: F811
    deps = make_deps(db, s3_client, bucket, tier1_root, batch_small_bytes=8 * MIB)
    produce(deps, "s", [entries(f"s{i}", 20, 500) for i in range(40)])
    offload_many(deps, deps.meta.list_ledgers("s", [S.SEALED]))
    chunks = {deps.meta.get_chunk(led).data_key for led in deps.meta.list_ledgers("s")}
    assert len(chunks) == 1  # one batch: 40 ledgers, one block each, in one data object
    report, ops, _ = recover_counted(deps, s3_settings, new_database())
    assert len(report.ledgers_recovered) == 40
    assert ops == {"ListObjectsV2": 1, "GetObject": 2}, ops  # the index, then the headers in one window
    report, ops, _ = recover_counted(deps, s3_settings, new_database(), check_pages=True)
    assert len(report.ledgers_recovered) == 40
    assert ops["ListObjectsV2"] == 1 and ops["GetObject"] == 2 + 40, ops  # + one ranged GET per ledger


def test_the_cli_path_reads_index_objects_concurrently_and_topics_at_once(deps, s3_settings, new_database):  # noqa: F811
    """Concurrency shows as more than one request in flight; counted, not timed."""
    for t in range(6):
        produce(deps, f"c{t}", [entries(f"c{t}{i}", 5, 100) for i in range(4)])
        offload_many(deps, deps.meta.list_ledgers(f"c{t}", [S.SEALED]))
    b, _, _ = counted(deps, s3_settings)
    inflight, peak = [0], [0]
    import threading
    lock = threading.Lock()

    def before(**_):
        with lock:
            inflight[0] += 1
            peak[0] = max(peak[0], inflight[0])

    def after(**_):
        with lock:
            inflight[0] -= 1

    b.s3.meta.events.register("before-send.s3.GetObject", before)
    b.s3.meta.events.register("after-call.s3.GetObject", after)
    b.s3.meta.events.register("after-call-error.s3.GetObject", after)
    report = recover_from_bucket(new_database(), dataclasses.replace(deps, bucket=b).bucket)
    assert len(report.ledgers_recovered) == 24 and report.ok
    assert peak[0] > 1
