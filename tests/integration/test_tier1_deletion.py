"""Deleting tier-1 copies never reports a deletion that did not happen: a worker that does not
see the tier-1 files (another machine, an unmounted share) fails the item, naming the path, and leaves
metadata saying the copy exists; a rerun on the right root finishes. Real PostgreSQL and S3."""
from __future__ import annotations

from dataclasses import replace

import pytest

from tests.integration.helpers import entries, make_deps, produce
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.delete_lagged import delete_copy, delete_lagged
from tiering.ops.offload import offload_many
from tiering.ops.retention import retention
from tiering.errors import LedgerStorageError, TopicNotFound
from tiering.tier1 import LedgerFileMissing

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)


@pytest.fixture
def elsewhere(db, s3_client, bucket, tmp_path):
    """The same metadata and bucket seen from a worker whose tier-1 root is an empty directory."""
    other = tmp_path / "other-machine-tier1"
    other.mkdir()
    return make_deps(db, s3_client, bucket, other)


def _offloaded(deps, topic, n=2, policy=None):
    produce(deps, topic, [entries(f"{topic}{i}", 3, 100) for i in range(n)],
            policy or TopicPolicy(deletion_lag_seconds=0, **BIG), open_tail=[b"open"])
    offload_many(deps, deps.meta.list_ledgers(topic, [S.SEALED]))


def test_delete_lagged_fails_where_the_file_is_not(deps, elsewhere):
    _offloaded(deps, "dl")
    report = delete_lagged(elsewhere, "dl")
    assert report.deleted == [] and [(t, i) for t, i, _ in report.failed] == [("dl", 0), ("dl", 1)]
    assert str(elsewhere.tier1.path("dl", 0)) in report.failed[0][2]
    with pytest.raises(LedgerFileMissing):  # what the Spark job's item sees
        delete_copy(elsewhere, deps.meta.get_ledger("dl", 0))
    # nothing recorded: the copies still exist, in metadata and on disk
    assert [led.tier1_present for led in deps.meta.list_ledgers("dl")] == [True, True, True]
    assert deps.tier1.exists("dl", 0) and deps.tier1.exists("dl", 1)
    assert sorted(delete_lagged(deps, "dl").deleted) == [("dl", 0), ("dl", 1)]
    assert not deps.tier1.exists("dl", 0) and deps.tier1.retired_ids("dl") == []


def test_retention_fails_where_the_file_is_not_and_a_rerun_removes_it(deps, elsewhere):
    _offloaded(deps, "rt", n=3, policy=TopicPolicy(retention_bytes=300, **BIG))
    report = retention(elsewhere, "rt")  # each copy on its own, reported; the run's other topics go on
    assert sorted(report.deleted) == [("rt", 0), ("rt", 1)] and report.files_removed == 0
    assert [(t, i) for t, i, _ in report.failed] == [("rt", 0), ("rt", 1)]
    assert str(elsewhere.tier1.path("rt", 0)) in report.failed[0][2]
    from tiering.jobs.retention import work
    with pytest.raises(LedgerStorageError, match="2 step.s. not done; first, ledger 0's tier-1 copy"):  # the job's item fails
        work(elsewhere, {"topic": "rt"})
    # the trim itself is committed (metadata first), the files are still owed
    leds = deps.meta.list_ledgers("rt")
    assert [led.state for led in leds][:2] == [S.DELETED, S.DELETED]
    assert all(led.tier1_present for led in leds[:2]) and deps.tier1.exists("rt", 0)
    report = retention(deps, "rt")
    assert report.files_removed == 2 and not deps.tier1.exists("rt", 0) and not deps.tier1.exists("rt", 1)


def test_a_deleted_ledgers_file_removed_by_hand_does_not_wedge_retention_or_topic_delete(deps, elsewhere):
    """Under the right root (the topic's directory is there before any copy goes) a DELETED ledger's copy
    that is already gone is recorded as gone, whichever ledger it is (removing the others' files takes the
    directory with the last one); a topic the root does not hold fails alone, the run's other topics are
    retained, and deleting it fails too, with or without --force: nothing is recorded as removed there."""
    from tiering.ops.topics import delete_topic

    policy = TopicPolicy(retention_seconds=0, **BIG)
    for topic in ("ga", "gb"):
        produce(deps, topic, [entries(topic, 3, 100)], policy, open_tail=[b"open"])
    produce(deps, "gc", [entries("gc", 3, 100)], policy)  # sealed only: its directory can go whole
    produce(deps, "gd", [entries(f"gd{i}", 3, 100) for i in range(3)], policy)  # sealed only, three ledgers
    deps.tier1.path("ga", 0).unlink()  # removed by hand
    deps.tier1.path("gd", 2).unlink()  # the last one: the others' removal empties the directory before it
    moved = deps.tier1.path("gc", 0).parent
    away = moved.with_name(moved.name + ".away")
    moved.rename(away)  # this root does not hold gc at all
    report = retention(deps)
    assert sorted(report.deleted) == [("ga", 0), ("gb", 0), ("gc", 0), ("gd", 0), ("gd", 1), ("gd", 2)]
    assert [(t, i) for t, i, _ in report.failed] == [("gc", 0)]
    assert report.files_removed == 5 and not deps.tier1.exists("gb", 0)
    assert not any(led.tier1_present for led in deps.meta.list_ledgers("gd"))
    assert not deps.meta.get_ledger("ga", 0).tier1_present and deps.meta.get_ledger("gc", 0).tier1_present
    assert retention(deps).failed == report.failed  # still owed, still said
    for force in (False, True):  # a root that lacks the topic: its copies are not recorded as removed
        with pytest.raises(LedgerFileMissing):
            delete_topic(deps, "gc", force=force)
    assert deps.meta.get_ledger("gc", 0).tier1_present
    away.rename(moved)  # the right root again: the deletion finishes
    delete_topic(deps, "gc")
    with pytest.raises(TopicNotFound):
        deps.meta.get_topic("gc")
    assert not deps.tier1.has_topic("gc")  # the finished deletion takes the directory
    assert retention(deps).failed == []


class _Killed(BaseException):
    pass


def test_a_run_killed_after_removing_the_other_copies_still_records_the_one_removed_by_hand(deps, monkeypatch):
    """Killed once the topic's other copies are gone, before the hand-removed one is recorded: the rerun
    still sees this root hold the topic (removing copies leaves the directory) and records it as gone."""
    import tiering.ops.delete_lagged as dl

    produce(deps, "gk", [entries(f"gk{i}", 3, 100) for i in range(3)], TopicPolicy(retention_seconds=0, **BIG))
    deps.tier1.path("gk", 2).unlink()  # removed by hand
    real = dl.delete_copy

    def killed_at_the_last(d, led, missing_ok=False):
        if led.ledger_id == 2:
            raise _Killed()
        return real(d, led, missing_ok)
    monkeypatch.setattr(dl, "delete_copy", killed_at_the_last)
    with pytest.raises(_Killed):
        retention(deps, "gk")
    monkeypatch.setattr(dl, "delete_copy", real)
    assert [led.tier1_present for led in deps.meta.list_ledgers("gk")] == [False, False, True]
    report = retention(deps, "gk")
    assert report.failed == [] and report.files_removed == 1
    assert not any(led.tier1_present for led in deps.meta.list_ledgers("gk"))


def test_killed_after_the_rename_a_rerun_finishes(deps):
    _offloaded(deps, "k1", n=1)
    led = deps.meta.get_ledger("k1", 0)
    deps.tier1.retire("k1", 0)  # a worker stopped right after the first step
    assert not deps.tier1.exists("k1", 0) and deps.meta.get_ledger("k1", 0).tier1_present
    assert delete_copy(deps, led)
    assert not deps.meta.get_ledger("k1", 0).tier1_present and deps.tier1.retired_ids("k1") == []


def test_killed_after_the_metadata_update_the_next_plan_sweeps_the_tombstone(deps):
    _offloaded(deps, "k2", n=2)
    led = deps.meta.get_ledger("k2", 0)
    deps.tier1.retire("k2", 0)
    deps.meta.mark_tier1_deleted(led)  # stopped before removing the tombstone
    assert deps.tier1.retired_ids("k2") == [0]
    report = delete_lagged(deps, "k2")
    assert report.deleted == [("k2", 1)] and deps.tier1.retired_ids("k2") == []


def test_a_tombstone_of_a_copy_still_recorded_is_not_swept(deps):
    # lag not reached: the ledger is not planned, yet its tombstone marks a deletion in progress
    _offloaded(deps, "k3", n=1, policy=TopicPolicy(deletion_lag_seconds=3600, **BIG))
    deps.tier1.retire("k3", 0)
    assert delete_lagged(deps, "k3").deleted == []
    assert deps.tier1.retired_ids("k3") == [0]


class _Overtaken:
    """A tier-1 store whose `retire` first lets another worker delete the same copy to the end (rename,
    record, purge): the interleaving of two runs that planned the same ledger."""

    def __init__(self, tier1, other):
        self._tier1, self._other, self.overtaken = tier1, other, 0

    def __getattr__(self, name):
        return getattr(self._tier1, name)

    def retire(self, topic, ledger_id):
        assert delete_copy(self._other, self._other.meta.get_ledger(topic, ledger_id))
        self.overtaken += 1
        return self._tier1.retire(topic, ledger_id)


def test_a_copy_another_run_deleted_meanwhile_is_skipped_not_failed(deps, db, s3_client, bucket):
    _offloaded(deps, "race", n=2)
    other = make_deps(db, s3_client, bucket, deps.tier1.root)
    slow = make_deps(db, s3_client, bucket, deps.tier1.root)
    slow = replace(slow, tier1=_Overtaken(slow.tier1, other))
    report = delete_lagged(slow, "race")
    assert slow.tier1.overtaken == 2
    assert report.failed == [] and report.deleted == [] and sorted(report.skipped) == [("race", 0), ("race", 1)]
    assert [led.tier1_present for led in deps.meta.list_ledgers("race")] == [False, False, True]
    assert not deps.tier1.exists("race", 0) and deps.tier1.retired_ids("race") == []


def test_retention_racing_another_run_removes_each_file_once_and_does_not_fail(deps, db, s3_client, bucket):
    _offloaded(deps, "rrace", n=3, policy=TopicPolicy(retention_bytes=300, **BIG))
    other = make_deps(db, s3_client, bucket, deps.tier1.root)
    slow = make_deps(db, s3_client, bucket, deps.tier1.root)
    slow = replace(slow, tier1=_Overtaken(slow.tier1, other))
    report = retention(slow, "rrace")
    assert slow.tier1.overtaken == 2 and report.files_removed == 0
    assert not deps.tier1.exists("rrace", 0) and not deps.tier1.exists("rrace", 1) and deps.tier1.exists("rrace", 2)


def test_topic_delete_removes_the_empty_file_a_producer_killed_before_its_row_left(deps, tier1_root):
    # a producer makes the next ledger's empty file, then its OPEN row; killed in between, the file has no
    # row. The topic's deletion must not leave it (nor the directory) behind; a live producer's is refused.
    from tiering.errors import TieringError
    from tiering.ops.topics import delete_topic

    produce(deps, "k", [entries("k0", 3, 100)], TopicPolicy(**BIG))
    nxt = deps.meta.get_topic("k").next_ledger_id
    live = deps.tier1.create_ledger("k", nxt)  # a producer between its file and its row
    with pytest.raises(TieringError, match="being written"):
        delete_topic(deps, "k")
    assert deps.tier1.exists("k", nxt)
    live.close()  # ... and killed there
    delete_topic(deps, "k")
    assert not any(tier1_root.rglob("*.ledger*")) and not deps.tier1.has_topic("k")
    produce(deps, "k", [entries("k1", 2, 100)], TopicPolicy(**BIG))  # the name again: ids go on
    assert [led.ledger_id for led in deps.meta.list_ledgers("k")] == [nxt]


def test_a_topic_whose_open_ledgers_file_is_lost_can_still_be_deleted(deps, elsewhere):
    """No writer can seal an open ledger whose file is gone, so the delete's seal step failed for ever: the
    topic could never be deleted. Under a root that holds the topic, the lost file's ledger is deleted with
    the others (its entries went with the file); a root without the topic still records nothing."""
    from tiering.ops.topics import delete_topic

    produce(deps, "lo", [entries("lo", 3, 100)], TopicPolicy(**BIG), open_tail=[b"open", b"tail"])
    deps.tier1.path("lo", 1).unlink()  # the open ledger's file, lost
    with pytest.raises(LedgerFileMissing):
        delete_topic(elsewhere, "lo", force=True)
    assert [led.state for led in deps.meta.list_ledgers("lo")] == [S.SEALED, S.OPEN]
    preview = delete_topic(deps, "lo", dry_run=True)
    assert (preview.ledgers_deleted, preview.bytes, preview.files_removed) == (2, 300, 1)
    report = delete_topic(deps, "lo")
    assert (report.ledgers_deleted, report.files_removed) == (2, 2)
    with pytest.raises(TopicNotFound):
        deps.meta.get_topic("lo")
    assert not deps.tier1.has_topic("lo")
