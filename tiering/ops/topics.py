"""A topic's life after `topic create`: changing its policy and deleting it.

Changing a policy is a compare-and-set on the topic's version: the new policy is the one read plus the
changes asked for, and a concurrent change makes it fail (refused, not lost; run it again).

Deleting a topic (refused while ACTIVE subscriptions read it, unless forced) goes through the same steps as
retention, each one safe to kill and to run again: the open ledger is sealed through its writer's lock (a
producer still writing makes the delete fail, loudly, the subscriptions kept); every ledger becomes DELETED
with its tier-2 keys queued for GC and the subscriptions go, in one transaction; the tier-1 files are
deleted; the trim marker moves past the last ledger, so recovery from the bucket never brings the topic
back; then the topic row goes, leaving a tombstone: a topic created again under the name starts after the
old ledger ids, so nothing the old one left can be mistaken for the new one's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from tiering.errors import (BadInput, ConditionalUpdateFailed, LedgerStorageError, Tier2Error, TieringError,
                            TopicNotFound, TopicReplaced)
from tiering.model import Ledger, LedgerState, Topic, TopicPolicy
from tiering.ops.context import Deps
from tiering.ops.delete_lagged import delete_deleted_copies, leftover_copies, sweep_tombstones
from tiering.tier1 import LedgerFileMissing
from tiering.tier2.markers import record_trim
from tiering.writer import ManagedLedgerWriter


def set_policy(deps: Deps, name: str, changes: dict, expected_version: int | None = None,
               then: Callable | None = None) -> Topic:
    """The topic's policy with `changes` (policy field -> value) applied, written if the topic is still at
    the version read (or at `expected_version` when given). An unknown field or an invalid combination (a
    ceiling below the retention it caps, ...) is BadInput before anything is written. `then(conn, topic)`:
    the rest of the change (the topic's table policy) in the same transaction; with it `changes` may be
    empty (the version still moves: `--expect-version` guards every change)."""
    current = deps.meta.get_topic(name)
    unknown = sorted(set(changes) - set(TopicPolicy.__dataclass_fields__))
    if unknown:
        raise BadInput(f"unknown policy field(s): {', '.join(unknown)}")
    if not changes and then is None:
        raise BadInput("nothing to change: give at least one policy option")
    if expected_version is not None and current.version != expected_version:
        # the policy written is the one read, changed: it must be the one at the version the caller expects
        # (a compare-and-set on `expected_version` alone wrote back the policy read before another change)
        raise ConditionalUpdateFailed(f"topic {name!r}", f"version {expected_version}", f"version {current.version}")
    return deps.meta.set_policy(name, current.version, replace(current.policy, **changes), then, current.topic_id)


@dataclass
class TopicDeleteReport:
    topic: str
    subscriptions_deleted: list[str]
    ledgers_deleted: int
    bytes: int
    files_removed: int
    next_ledger_id: int
    # another delete of the same topic finished it while this one ran (what this one did is counted above)
    finished_elsewhere: bool = False
    tier2_ledgers: int = 0  # of the deleted, those offloaded or being offloaded: their objects are queued for GC


def delete_topic(deps: Deps, name: str, force: bool = False, dry_run: bool = False,
                 on_wait: Callable[[], None] | None = None) -> TopicDeleteReport:
    """`dry_run`: what the delete would do (the same refusal; the ledgers, bytes and tier-1 files it would
    delete, the open ledger included), nothing written: no row, no file, no marker. `on_wait`: called when
    the delete starts to wait for a running sync or maintenance of the topic's Iceberg table."""
    t, subs = deps.meta.trims.begin_topic_delete(name, force, dry_run)
    if dry_run:
        live = [led for led in deps.meta.list_ledgers(name) if led.state != LedgerState.DELETED]
        extents = [_extent(deps, led) for led in live]
        files = sum(1 for led in live if led.tier1_present and deps.tier1.exists(name, led.ledger_id)) \
            + leftover_copies(deps, name)
        return TopicDeleteReport(name, [s.name for s in subs], len(live), sum(b for _, b in extents), files,
                                 t.next_ledger_id)
    done = TopicDeleteReport(name, [], 0, 0, 0, t.next_ledger_id)
    try:
        # no producer opens a ledger while the steps run (its next one is refused): one writing now holds its
        # file, and the seal below fails on it before anything is deleted
        with deps.meta.trims.delete_fence(t.topic_id):
            return _delete_steps(deps, t, force, done, on_wait)
    except TopicNotFound:
        # The topic step 1 found is gone (the name unknown, or another topic's now): another delete of it ran
        # at the same time and finished first, which it does only once no live ledger and no tier-1 copy is
        # left. The work asked for is done; this run reports its own share (possibly nothing).
        return replace(done, finished_elsewhere=True)


def _delete_steps(deps: Deps, t: Topic, force: bool, done: TopicDeleteReport,
                  on_wait: Callable[[], None] | None = None) -> TopicDeleteReport:
    """Steps 2 to 4 of delete_topic; `done` is filled in as they go (what this run deleted so far)."""
    name = t.name
    # every step goes by name: each one checks that the name is still the topic step 1 found (another delete
    # of it may have finished meanwhile and a new topic taken the name), or it would delete the new one
    for tries_left in range(2, -1, -1):
        try:
            _seal_open_ledger(deps, t)
            break
        except ConditionalUpdateFailed:
            # its producer sealed it itself (a rollover) between this run's look and its seal; under the fence
            # it opens no other, so a second look finds none open
            if not tries_left:
                raise
    late = done.subscriptions_deleted  # those steps 2 and 3 delete (those created meanwhile too, with --force)
    deleted = deps.meta.trims.delete_all_ledgers(name, deps.knobs.gc_delay, force, late, t.topic_id,
                                                 on_wait=on_wait)
    done.ledgers_deleted, done.bytes = len(deleted), sum(led.size_bytes for led in deleted)
    done.tier2_ledgers = sum(1 for led in deleted if led.offload_uuid is not None)
    files, failed = delete_deleted_copies(deps, name)
    done.files_removed = files
    if failed:
        raise failed[0][1]  # the others were tried: the rerun has only the failed ones left
    # a run killed between recording a copy's deletion and removing its renamed file left that file; once
    # the topic is gone no delete-lagged run lists it, so it is swept here, before the delete is finished
    sweep_tombstones(deps, [name])
    now = deps.meta.get_topic(name)  # next_ledger_id after a seal or a producer's rollover
    if now.topic_id != t.topic_id:
        raise TopicReplaced(name)  # its marker would hide the new topic's ledgers
    _remove_unclaimed_files(deps, name, now.next_ledger_id)
    deps.tier1.remove_topic_dir(name)  # empty now; killed before the finish below, the rerun has no copy left
    with deps.meta.planning.marker_lock(name):  # a retention run's marker never lands over this one
        try:
            record_trim(deps.bucket, name, now.next_ledger_id)
        except Tier2Error as exc:  # what is deleted stays deleted: said, and how to finish
            raise Tier2Error(f"topic {name!r}: {done.ledgers_deleted} ledger(s) deleted by this run, but its trim marker "
                             f"was not written ({exc}); run the delete again to finish") from None
    done.next_ledger_id = deps.meta.trims.finish_topic_delete(name, now.next_ledger_id, force, late,
                                                              t.topic_id).next_ledger_id
    return done


def _seal_lost_open_ledger(deps: Deps, led: Ledger) -> None:
    """The open ledger's file is not in a root that holds the topic's directory: it was removed or lost (a
    producer makes the file before the row), its entries with it, and no writer can seal the ledger again, so
    the topic could never be deleted. It is sealed empty, to be deleted with the others (its copy recorded as
    gone, as a DELETED ledger's missing copy is)."""
    deps.meta.seal_ledger(led, 0, 0)


def _extent(deps: Deps, led: Ledger) -> tuple[int, int]:
    """A live ledger's entries and bytes for the dry run; an open one whose file is lost (as above): none."""
    try:
        return deps.tier1.extent(led)
    except LedgerFileMissing:
        if led.state != LedgerState.OPEN or not deps.tier1.has_topic(led.topic):
            raise
        return 0, 0


def _seal_open_ledger(deps: Deps, t: Topic) -> None:
    """Seal the topic's open ledger, if any, through its file's writer lock (LedgerStorageError while a
    producer writes it: nothing is deleted)."""
    name = t.name
    opened = deps.meta.list_ledgers(name, [LedgerState.OPEN])
    if any(led.topic_id != t.topic_id for led in opened):
        raise TopicReplaced(name)
    if not opened:
        return
    try:
        writer = ManagedLedgerWriter(deps.meta, deps.tier1, name)  # takes the open file's writer lock
    except LedgerFileMissing:
        if not deps.tier1.has_topic(name):
            raise  # a root without the topic's directory (a wrong mount): nothing is recorded
        _seal_lost_open_ledger(deps, opened[0])
        return
    try:
        if writer.topic.topic_id != t.topic_id:
            raise TopicReplaced(name)
        writer.seal()
    finally:
        writer.close()


def _unclaimed_writer(deps: Deps, name: str, ledger_id: int, wait_seconds: float = 10.0):
    """The writer of a file no row names, or None once it is gone. A producer holding it is one the delete's
    fence refuses a row: it removes the file and lets go within moments, so it is waited for (polled) rather
    than failing a delete that has already deleted the ledgers; one still holding it after `wait_seconds`
    raises LedgerStorageError (nothing removed)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return deps.tier1.open_writer(name, ledger_id, has_row=False)
        except LedgerFileMissing:
            return None
        except LedgerStorageError:
            if not deps.tier1.exists(name, ledger_id):
                return None
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


def _remove_unclaimed_files(deps: Deps, name: str, next_ledger_id: int) -> None:
    """A producer makes the next ledger's file before its OPEN row (writer.py); killed in between, it left an
    empty file no row names, which no run would ever remove once the topic is gone. Such a file is removed
    once its writer lock can be taken (a producer still holding it: LedgerStorageError, nothing removed);
    one holding entries is not a producer's leftover and is kept, failing the delete."""
    for ledger_id in deps.tier1.ledger_ids(name):
        if ledger_id < next_ledger_id:
            continue  # a ledger of the topic: its row says whether its copy is there
        writer = _unclaimed_writer(deps, name, ledger_id)
        if writer is None:
            continue  # its producer removed it, refused its row
        try:
            count = writer.entry_count
        finally:
            writer.close()
        if count:
            raise TieringError(f"tier-1 file of ledger {ledger_id} of topic {name!r} has {count} entries but no "
                               "row in metadata: kept; the topic's delete is not finished")
        deps.tier1.delete(name, ledger_id)
