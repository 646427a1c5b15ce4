"""Delete tier-1 copies of ledgers offloaded longer ago than their topic's deletion lag (PIP-17: 4 h by
default), and leftover copies of ledgers retention already deleted.

The file goes first, then metadata: the file is renamed to a tombstone, metadata marks the copy deleted,
the tombstone is removed. Killed after the rename, metadata still says the copy exists, readers fall back
to tier 2 (the ledger is OFFLOADED), and a rerun finds the tombstone and marks it; killed after the mark,
the next plan sweeps the tombstone. The other order could leave a file nobody would ever delete. A copy
that is neither there nor renamed fails the item (`LedgerFileMissing` naming the path): it is what a worker
that does not see the tier-1 root finds, and reporting it deleted would leave the real file forever; unless
its row shows that another run deleted it since it was read (a skip, as for any ledger that moved on).

Before deleting the copy of an OFFLOADED ledger, the tier-2 objects its chunk row names are checked by
HEAD: each must exist and be at least offset + length long. One whose ETag is not the one its upload got
(the chunk row keeps both, migration 0012) was replaced since: a PUT over the key, a flipped byte, or the
same bytes restored from a backup. Only reading tells which, so that ledger's copy is then checked as
`tiering repair` checks it (its index, every page's CRC32C): sound, the new ETags are recorded (by
compare-and-set) and the copy goes; not, it fails. A failed ledger (`Tier2CopyMissing`) keeps its copy, the
one `tiering repair` re-offloads from, whatever metadata says; the other ledgers go on. A check that fails
once the chunk row moved (defrag, repair: GC may have collected the objects checked) says nothing of the
copy the row names now: that one is checked once more (moved again: a skip, as any ledger that changed).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tiering.errors import ConditionalUpdateFailed, LedgerStorageError, Tier2CopyMissing, TieringError
from tiering.model import Ledger, LedgerState
from tiering.ops.context import Deps, select_topics
from tiering.ops.repair import check_copy, check_lengths
from tiering.tier1 import LedgerFileMissing
from tiering.tier2.objects import object_head

log = logging.getLogger(__name__)


@dataclass
class DeleteLaggedReport:
    deleted: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[tuple[str, int]] = field(default_factory=list)
    failed: list[tuple[str, int, str]] = field(default_factory=list)
    bytes: int = 0


def plan_delete_lagged(deps: Deps, topic: str | None = None) -> list[Ledger]:
    """Copies past their topic's deletion lag and copies retention left, in one statement on the partial
    indexes (metadata/planning.py, policy.lagged_copies is its specification); tombstones are swept first."""
    topics = select_topics(deps.meta, topic)
    sweep_tombstones(deps, [t.name for t in topics])
    return deps.meta.planning.lagged_copies(topic)


def delete_copy(deps: Deps, led: Ledger, missing_ok: bool = False) -> bool:
    """Delete one tier-1 copy and record it. False when the ledger changed meanwhile (nothing done), its
    topic's deletion included: that finishes only once no tier-1 copy of the topic is left."""
    current = deps.meta.find_ledger(led.topic, led.ledger_id)
    if current is None or current.version != led.version or not current.tier1_present or \
            current.state not in (LedgerState.OFFLOADED, LedgerState.DELETED):
        return False
    if current.state == LedgerState.OFFLOADED:
        for again in (False, True):
            try:
                check_tier2_copy(deps, current)
                break
            except ConditionalUpdateFailed:
                # its chunk moved (repair, defrag) while it was checked: the copy it names now is checked once
                if again:
                    return False
    try:
        deps.tier1.retire(led.topic, led.ledger_id)
    except LedgerFileMissing:
        # Gone: another worker may have retired, recorded and purged this very copy since `current` was
        # read (concurrent delete-lagged, retention or truncate runs): then it is theirs, not a failure.
        # Otherwise the file is not where metadata says. An OFFLOADED ledger's copy stays a failure (a wrong
        # root must not be recorded as deleted copies). A DELETED ledger's copy was to go anyway: when the
        # caller saw this root hold the topic before removing any of its copies (`missing_ok`: the right
        # root, the file removed by hand), it is recorded as gone, or one lost file would fail every
        # retention run and keep the topic's deletion from finishing for ever.
        now = deps.meta.find_ledger(led.topic, led.ledger_id)
        if now is None or now.version != current.version or not now.tier1_present:
            return False
        if current.state != LedgerState.DELETED or not missing_ok:
            raise
        log.warning("tier-1 copy of deleted ledger %r/%d is already gone; recorded as deleted", led.topic,
                    led.ledger_id)  # recorded below as a removed copy is (no tombstone to purge)
    try:
        deps.meta.mark_tier1_deleted(current)
    except ConditionalUpdateFailed:
        return False  # another worker recorded it (and removes the tombstone) or the ledger changed
    deps.tier1.purge_retired(led.topic, led.ledger_id)
    return True


def delete_deleted_copies(deps: Deps, topic: str) -> tuple[int, list[tuple[int, TieringError]]]:
    """Remove the tier-1 copies of the topic's DELETED ledgers, each on its own: (copies removed, [(ledger,
    error)] of those that could not be). Whether this root holds the topic is asked once, before any copy
    goes: a copy already gone is then recorded as gone (removed by hand), while a root without the topic's
    directory (a wrong mount) records nothing. Removing copies never takes the directory (only a finished
    topic deletion does), so a run killed midway is asked the same on its rerun."""
    holds = deps.tier1.has_topic(topic)
    removed, failed = 0, []
    for led in deps.meta.planning.deleted_with_copy(topic):
        try:
            removed += delete_copy(deps, led, missing_ok=holds)
        except TieringError as exc:
            log.warning("tier-1 copy of %r/%d not removed: %s", topic, led.ledger_id, exc)
            failed.append((led.ledger_id, exc))
    return removed, failed


def leftover_copies(deps: Deps, topic: str) -> int:
    """How many copies `delete_deleted_copies` would remove now: tier-1 files of the topic's DELETED ledgers
    that a run killed after its commit left (the dry runs of retention, truncate and topic deletion count
    them, as their runs remove them)."""
    return sum(1 for led in deps.meta.planning.deleted_with_copy(topic) if deps.tier1.exists(topic, led.ledger_id))


def check_tier2_copy(deps: Deps, led: Ledger, record: bool = True) -> None:
    """Raise `Tier2CopyMissing` unless both objects of the ledger's chunk exist, are long enough and are the
    objects written, or hold this ledger's bytes intact (then their ETags are recorded). A chunk whose ETags
    were never recorded (rows from before they were kept, or rebuilt by a recovery that did not check the
    pages) is checked whole once: an ETag read off the bucket proves nothing about the bytes. `record`
    False (a dry run): the ETags of a copy that passes are not written."""
    chunk = deps.meta.get_chunk(led)
    what = f"ledger {led.topic!r}/{led.ledger_id}"
    if chunk is None:
        raise Tier2CopyMissing(f"{what} is OFFLOADED but has no chunk row; tier-1 copy kept")
    heads = {key: object_head(deps.bucket, key) for key in (chunk.data_key, chunk.index_key)}

    def length(key: str) -> int | None:
        return None if heads[key] is None else heads[key][0]
    problem = check_lengths(chunk, length)
    if problem is not None:
        _unless_moved(deps, led, chunk)
        raise Tier2CopyMissing(f"{what}: {problem}; tier-1 copy kept")
    etags = (heads[chunk.data_key][1], heads[chunk.index_key][1])
    replaced = [f"tier-2 {kind} object {key!r} is not the one written (ETag {now}, written as {then})"
                for kind, key, then, now in (("data", chunk.data_key, chunk.data_etag, etags[0]),
                                             ("index", chunk.index_key, chunk.index_etag, etags[1]))
                if then is not None and now != then]
    unknown = chunk.data_etag is None or chunk.index_etag is None
    if not replaced and not unknown:
        return
    problem = check_copy(deps, led, chunk, lengths=length)
    again = [object_head(deps.bucket, key) for key in (chunk.data_key, chunk.index_key)]
    if problem is None and tuple(head and head[1] for head in again) != etags:
        problem = "it was replaced again while it was checked"
    if problem is not None:
        _unless_moved(deps, led, chunk)
        why = "; ".join(replaced) if replaced else "the objects written were never recorded (no ETags)"
        raise Tier2CopyMissing(f"{what}: {why} and it fails its check: {problem}; tier-1 copy kept: "
                               "run tiering repair")
    if record:
        deps.meta.repairs.adopt_etags(led, chunk, *etags)


def _unless_moved(deps: Deps, led: Ledger, checked) -> None:
    """ConditionalUpdateFailed when the ledger's chunk row is no longer the one checked: defrag or repair
    moved it meanwhile, and GC may have collected the objects checked; the copy it names now was not
    checked, so the failed check says nothing about it (the ledger changed, as for any other skip)."""
    checked.check_still(deps.meta.get_chunk(led), led.topic, led.ledger_id)


def sweep_tombstones(deps: Deps, topics: list[str]) -> int:
    """Remove tombstones left by a worker killed between recording a deletion and removing the renamed
    file. Only those whose ledger no longer has a tier-1 copy in metadata: the others are mid-deletion.
    Tier 1 is listed first (a directory read per topic); metadata is asked about the tombstones found only."""
    found = [(name, lid) for name in topics for lid in deps.tier1.retired_ids(name)]
    present = deps.meta.planning.tier1_present(found)
    swept = 0
    for name, lid in found:
        if (name, lid) in present:
            continue
        try:
            swept += deps.tier1.purge_retired(name, lid)
        except LedgerStorageError as exc:  # not a file this product renamed (a directory): one topic's oddity
            log.warning("tombstone of %r/%d not removed: %s", name, lid, exc)  # must not stop every topic's run
    return swept


def preview(deps: Deps, topic: str | None = None) -> DeleteLaggedReport:
    """What `delete_lagged` would do now (`delete-lagged --dry-run`): the same plan, without sweeping
    tombstones, and the same HEAD checks of the tier-2 copies (a copy that fails one would be kept and
    reported failed); nothing is written."""
    select_topics(deps.meta, topic)  # an unknown topic fails here
    report = DeleteLaggedReport()
    for led in deps.meta.planning.lagged_copies(topic):
        try:
            if led.state == LedgerState.OFFLOADED:
                check_tier2_copy(deps, led, record=False)
        except TieringError as exc:
            report.failed.append((led.topic, led.ledger_id, str(exc)))
            continue
        report.deleted.append((led.topic, led.ledger_id))
        report.bytes += led.size_bytes
    return report


def delete_lagged(deps: Deps, topic: str | None = None) -> DeleteLaggedReport:
    """Every due copy; a ledger whose tier-2 copy fails the check (or any other error) is reported in
    `failed` and does not stop the others."""
    report = DeleteLaggedReport()
    for led in plan_delete_lagged(deps, topic):
        try:
            done = delete_copy(deps, led)
        except TieringError as exc:
            report.failed.append((led.topic, led.ledger_id, str(exc)))
            continue
        if done:
            report.deleted.append((led.topic, led.ledger_id))
            report.bytes += led.size_bytes
        else:
            report.skipped.append((led.topic, led.ledger_id))
    return report
