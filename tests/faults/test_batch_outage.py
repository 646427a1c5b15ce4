"""S3 dies in the middle of a batch offload: the run reports every ledger of the batch
FAILED with its reason, not "skipped" with exit 0 (the batch's undo had moved each version on twice, so the
one-by-one retry lost every compare-and-set); after the restart a rerun offloads them all and GC leaves the
bucket holding exactly what metadata references. The private moto server of test_outages is the S3."""
from __future__ import annotations

import boto3
from botocore.config import Config

from tests.faults.harness import OFFLOAD_TIMEOUT, check_invariants, gc_all, settle
from tests.faults.test_outages import moto  # noqa: F401  (the fixture)
from tests.integration.helpers import MIB, entries, make_deps, produce
from tiering.model import LedgerState as S, TopicPolicy

KIB = 1024


def test_s3_dying_mid_batch_fails_the_batch_loudly(moto, db, tier1_root):  # noqa: F811
    from tiering.ops.offload import offload_many

    s3 = boto3.client("s3", endpoint_url=moto.url, aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1", config=Config(retries={"max_attempts": 2, "mode": "standard"},
                                                             connect_timeout=2, read_timeout=20))
    s3.create_bucket(Bucket="outage")
    deps = make_deps(db, s3, "outage", tier1_root, offload_timeout=OFFLOAD_TIMEOUT, batch_small_bytes=8 * MIB)
    expected = produce(deps, "k", [entries(f"s{i}", 5, KIB) for i in range(4)],
                       TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40), open_tail=[b"tail"])
    ledgers = deps.meta.list_ledgers("k", [S.SEALED])

    def stop_s3(step):
        if step == "completed":  # the batch's data object is stored; its index PUT meets a dead endpoint
            moto.stop()

    report = offload_many(deps, ledgers, stop_s3)
    assert report.offloaded == [] and report.skipped == [], report
    assert sorted(report.failed) == [0, 1, 2, 3], report
    assert report.first_error.startswith("ledger 0: S3 "), report.first_error
    assert "testing" not in str(report.failed)
    assert all(deps.meta.get_ledger("k", i).state in (S.SEALED, S.OFFLOADING) for i in range(4))

    moto.start()  # in-memory: the bucket is gone
    s3.create_bucket(Bucket="outage")
    settle(db)
    rerun = offload_many(deps, deps.meta.list_ledgers("k", [S.SEALED]) + deps.meta.stale_offloads(OFFLOAD_TIMEOUT))
    assert sorted(rerun.offloaded) == [0, 1, 2, 3] and not rerun.failed and not rerun.skipped
    gc_all(deps)
    check_invariants(deps, db, {"k": expected})
