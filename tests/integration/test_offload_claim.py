"""The offload's begin transaction runs beside the packing of the first part (tiering/ops/offload_batch.py),
on the real S3 endpoint and PostgreSQL: nothing becomes an object before the claim committed, a lost claim
leaves no object and no open upload after at most one part, and a claim that fails for another reason is
undone like any failure. Kills at every step are tests/faults' (test_kill9)."""
from __future__ import annotations

import dataclasses
import threading

import boto3
import pytest
from botocore.config import Config

from tests.integration.helpers import bucket_keys, entries, make_deps, open_uploads, produce
from tiering.errors import ConditionalUpdateFailed, TieringError
from tiering.model import LedgerState as S
from tiering.ops.offload import offload_ledger, offload_many
from tiering.tier2.objects import Bucket


@pytest.fixture
def deps(db, s3_client, bucket, tier1_root):
    return make_deps(db, s3_client, bucket, tier1_root)  # 5 MiB blocks and parts


def counting(deps, s3_settings):
    s3 = boto3.client("s3", **s3_settings, config=Config(max_pool_connections=16))
    ops: list[str] = []
    s3.meta.events.register("before-send.s3", lambda event_name="", **kw: ops.append(event_name.rsplit(".", 1)[-1]))
    return dataclasses.replace(deps, bucket=Bucket(s3, deps.bucket.name, deps.bucket.prefix)), ops


class HeldBegin:
    """deps.meta.begin_offload_batch, held until released (the claim of a slow database)."""

    def __init__(self, meta, fail: BaseException | None = None):
        self.meta, self.real, self.fail = meta, meta.begin_offload_batch, fail
        self.entered, self.release = threading.Event(), threading.Event()

    def __call__(self, *args, **kwargs):
        self.entered.set()
        assert self.release.wait(60)
        if self.fail is not None:
            raise self.fail
        return self.real(*args, **kwargs)


def test_nothing_is_an_object_before_the_claim_commits(deps, s3_settings, monkeypatch):
    # 15 MiB: 19 entries a 5 MiB block, 4 blocks; the last (3 entries) goes with the third: 3 parts
    produce(deps, "t", [entries("held", 60, 256 * 1024)])
    [led] = deps.meta.list_ledgers("t")
    own, ops = counting(deps, s3_settings)
    held = HeldBegin(deps.meta)
    monkeypatch.setattr(deps.meta, "begin_offload_batch", held)
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.update(done=offload_ledger(own, led)))
    worker.start()
    assert held.entered.wait(30)
    # the upload went ahead as far as the gate lets it: created, the first part, then it waits
    deadline = threading.Event()
    while ops.count("UploadPart") < 1 and not deadline.wait(0.05):
        pass
    deadline.wait(0.5)  # time enough for anything the gate did not stop
    assert ops.count("UploadPart") == 1 and "CompleteMultipartUpload" not in ops and "PutObject" not in ops, ops
    assert bucket_keys(deps) == set()  # an upload in progress is no object
    assert deps.meta.get_ledger("t", led.ledger_id).state == S.SEALED
    held.release.set()
    worker.join(60)
    assert outcome["done"].state == S.OFFLOADED and len(bucket_keys(deps)) == 2 and open_uploads(deps) == []
    assert ops.count("UploadPart") == 3


def test_a_lost_claim_spends_one_part_and_leaves_nothing(deps, s3_settings):
    produce(deps, "t", [entries("lost", 80, 256 * 1024)])  # 20 MiB: four parts if it went on
    [led] = deps.meta.list_ledgers("t")
    offload_ledger(deps, led)  # another worker took it meanwhile
    keys = bucket_keys(deps)
    own, ops = counting(deps, s3_settings)
    with pytest.raises(ConditionalUpdateFailed):
        offload_ledger(own, led)  # the row it read has moved on
    assert ops.count("UploadPart") <= 1 and "CompleteMultipartUpload" not in ops and "PutObject" not in ops, ops
    assert bucket_keys(deps) == keys and open_uploads(deps) == []
    # and offload_many calls it what it is: taken by another worker
    assert offload_many(deps, [led]).skipped == [led.ledger_id]


def test_a_claim_failing_otherwise_is_undone_and_the_ledger_offloads_later(deps, monkeypatch):
    produce(deps, "t", [entries("odd", 40, 256 * 1024)])
    [led] = deps.meta.list_ledgers("t")
    held = HeldBegin(deps.meta, fail=TieringError("database went away mid-claim"))
    held.release.set()
    monkeypatch.setattr(deps.meta, "begin_offload_batch", held)
    with pytest.raises(TieringError, match="went away"):
        offload_ledger(deps, led)
    monkeypatch.undo()
    assert deps.meta.get_ledger("t", led.ledger_id).state == S.SEALED
    assert bucket_keys(deps) == set() and open_uploads(deps) == []
    assert offload_ledger(deps, deps.meta.get_ledger("t", led.ledger_id)).state == S.OFFLOADED


def test_an_attempt_lock_held_by_a_live_attempt_loses_the_claim_and_the_ledger_goes_again(deps, s3_settings,
                                                                                          monkeypatch):
    """The attempt's uuid is drawn before its lock is taken (the packing goes first): a lock that a live attempt
    whose uuid hashes alike holds (hashtext: one in 2**32) fails the claim as a lost compare-and-set does,
    with at most one part spent, and offload_many offloads the ledger under a fresh attempt."""
    from tiering.metadata.attempt_locks import AttemptLock

    produce(deps, "t", [entries("twin", 80, 256 * 1024)])  # 20 MiB: four parts if it went on
    [led] = deps.meta.list_ledgers("t")
    own, ops = counting(deps, s3_settings)
    real, taken = AttemptLock.take, []

    def take_once_held(lock):
        taken.append(lock.attempt)
        return False if len(taken) == 1 else real(lock)
    monkeypatch.setattr(AttemptLock, "take", take_once_held)
    with pytest.raises(ConditionalUpdateFailed, match="attempt lock"):
        offload_ledger(own, led)
    assert ops.count("UploadPart") <= 1 and "CompleteMultipartUpload" not in ops and "PutObject" not in ops, ops
    assert deps.meta.get_ledger("t", led.ledger_id).state == S.SEALED
    assert bucket_keys(deps) == set() and open_uploads(deps) == []
    taken.clear()
    report = offload_many(own, [led])
    assert report.offloaded == [led.ledger_id] and not report.failed and not report.skipped, report
    assert len(set(taken)) == 2  # the second attempt drew a uuid of its own
    assert deps.meta.get_ledger("t", led.ledger_id).offload_uuid == taken[1]


def test_a_small_ledger_is_one_put_after_the_claim(deps, s3_settings, monkeypatch):
    produce(deps, "t", [entries("small", 10, 1000)])
    [led] = deps.meta.list_ledgers("t")
    own, ops = counting(deps, s3_settings)
    held = HeldBegin(deps.meta)
    monkeypatch.setattr(deps.meta, "begin_offload_batch", held)
    worker = threading.Thread(target=offload_ledger, args=(own, led))
    worker.start()
    assert held.entered.wait(30)
    threading.Event().wait(0.3)
    assert ops == []  # too small for a multipart upload: nothing goes before the claim
    held.release.set()
    worker.join(60)
    assert ops == ["PutObject", "PutObject"] and len(bucket_keys(deps)) == 2


def test_a_ledger_taken_and_gone_from_tier_1_meanwhile_is_skipped_not_failed(deps):
    """Another worker offloaded the ledger and its tier-1 copy was deleted after the lag: this attempt's read
    of tier 1 fails beside its claim, which loses. The lost claim is the outcome (skipped), as when the begin
    transaction ran first."""
    from tiering.ops.delete_lagged import delete_lagged
    from tiering.model import TopicPolicy

    produce(deps, "t", [entries("gone", 30, 256 * 1024)], TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40,
                                                                      deletion_lag_seconds=0))
    [stale] = deps.meta.list_ledgers("t")
    offload_ledger(deps, stale)
    delete_lagged(deps, "t")
    assert not deps.tier1.exists("t", stale.ledger_id)
    with pytest.raises(ConditionalUpdateFailed):
        offload_ledger(deps, stale)
    report = offload_many(deps, [stale])
    assert report.skipped == [stale.ledger_id] and report.failed == {}
    assert open_uploads(deps) == []
