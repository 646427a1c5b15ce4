"""The rows recovery restores (tiering/ops/recover.py finds them in the bucket, recover_tier1.py in tier 1):
one topic's topic, ledger and chunk rows in ONE transaction, so a kill leaves the topic as it was or fully
restored.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Mapping

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Engine

from tiering.errors import TieringError
from tiering.metadata import gc_queue
from tiering.metadata.attempt_locks import LIVE_ATTEMPT_CLASSES, holder_gone
from tiering.metadata.tables import chunk as chunk_t, chunk_values, gc_task, ledger as ledger_t, topic as topic_t
from tiering.model import Chunk, LedgerState, TopicPolicy

_POLICY_FIELDS = tuple(TopicPolicy.__dataclass_fields__)
_LOST_NS = uuid.UUID("0b7e3f52-4c1a-4d8e-9a65-3f2d71c0e9b4")  # the offload uuid of a lost ledger's row


@dataclass(frozen=True)
class RecoveredLedger:
    """An offloaded ledger as its index object describes it."""

    ledger_id: int
    entry_count: int
    size_bytes: int
    sealed_at: datetime  # also its creation time: the bucket knows no other
    offload_uuid: str  # a UUID's text
    offload_started_at: datetime
    offloaded_at: datetime
    chunk: Chunk
    tier1_present: bool = False  # tier 1 still holds a verified copy (delete-lagged removes it later)


@dataclass(frozen=True)
class AdoptedLedger:
    """A sealed ledger only tier 1 holds (never offloaded), as its file describes it."""

    ledger_id: int
    entry_count: int
    size_bytes: int
    sealed_at: datetime  # also its creation time


@dataclass(frozen=True)
class LostLedger:
    """A ledger id above the topic's trim point that recovery found no good copy of: recorded OFFLOADED and
    marked lost, without a chunk row (migration 0013), so reads give its DATALOSS gap and nothing reads,
    moves or deletes bytes for it. `entry_count` 0: not known (no index object described it)."""

    ledger_id: int
    entry_count: int
    size_bytes: int
    sealed_at: datetime | None  # None: not known, recovery's time is recorded
    offload_uuid: str  # a UUID's text
    reason: str


@dataclass
class RestoredTopic:
    created: bool  # the topic row was created (with the given policy)
    existing: set[int] = field(default_factory=set)  # ledger ids the database had: left alone
    restored: list[int] = field(default_factory=list)  # offloaded ledger ids inserted, ascending
    adopted: list[int] = field(default_factory=list)  # sealed tier-1 ledger ids inserted, ascending
    tier1_gone: list[int] = field(default_factory=list)  # OFFLOADED ledgers whose missing tier-1 copy is recorded
    lost: list[int] = field(default_factory=list)  # ids recorded as lost ledgers (no copy), ascending
    lost_unrecorded: int = 0  # unknown ids not recorded: more than MAX_LOST_ROWS (unknown_ids)
    # ledgers whose chunk moved to another copy: off objects gone, or (checked) lost on a damaged copy; also
    # in restored
    moved: list[int] = field(default_factory=list)


def topic_names(engine: Engine) -> list[str]:
    """Every topic's name: what names a tier-1 directory whose own name is cut (a long topic's)."""
    with engine.connect() as conn:
        return list(conn.execute(select(topic_t.c.name)).scalars())


def known_ledgers(engine: Engine, name: str) -> dict[int, tuple[str, bool]]:
    """{ledger id: (state, tier1_present)} of the topic's rows ({} when the topic does not exist): recovery
    leaves these alone, and must not seal the tier-1 file of a ledger the database has (it may be open)."""
    with engine.connect() as conn:
        rows = conn.execute(select(ledger_t.c.ledger_id, ledger_t.c.state, ledger_t.c.tier1_present)
                            .join(topic_t, topic_t.c.topic_id == ledger_t.c.topic_id)
                            .where(topic_t.c.name == name)).all()
    return {r.ledger_id: (_state(r), r.tier1_present) for r in rows}


def restore_topic(engine: Engine, name: str, policy: TopicPolicy, ledgers: Mapping[int, RecoveredLedger],
                  adopted: Mapping[int, AdoptedLedger] | None = None, top: int = -1,
                  tier1_has: Callable[[int], bool] | None = None, root_holds_topic: bool = False,
                  lost: Callable[[int], LostLedger] | None = None, lost_from: int = 0,
                  lost_to: int = -1, gone: Callable[[str], bool] | None = None,
                  present: Callable[[str], bool] | None = None, dry_run: bool = False,
                  checked: bool = False) -> RestoredTopic:
    """Create topic `name` if missing (with `policy`), insert each offloaded ledger it does not have as
    OFFLOADED with its chunk row (`tier1_present` as given), each adopted tier-1 ledger as SEALED with
    `tier1_present`, and move `next_ledger_id` past the largest id given and past `top` (the largest
    ledger file tier 1 holds); one transaction. Ledgers the database already has are untouched, so a
    second run adds nothing, except a SEALED one whose copy the bucket holds (metadata older than the
    store: an export taken before it was offloaded): it becomes OFFLOADED with that chunk, its tier-1 copy
    recorded as gone when `tier1_has` (the root recovery scanned) says the file is not there; and an OFFLOADED
    one whose row says tier 1 holds a copy that is not there, on a root that holds the topic's directory
    (`root_holds_topic`: the right mount, the file deleted since the metadata was taken), is recorded so.
    The ids from `lost_from` (the trim point) that no row, copy or adopted file holds, up to the largest of
    those or `lost_to` (the largest a key names) (`unknown_ids`), are inserted as `lost(id)` describes them,
    marked lost without a chunk row; such a row (an earlier recovery's) whose copy the bucket now holds
    (restored from a backup) becomes an ordinary OFFLOADED ledger with that chunk, its mark cleared.

    Metadata older than the bucket (an import of an earlier export) also has: an OFFLOADING row whose
    attempt's worker is gone (the export caught the offload in flight) and whose copy the bucket holds,
    which becomes OFFLOADED with it as a SEALED one does; and an OFFLOADED row (marked lost or not) whose
    chunk names objects `gone` says are not there (called under the row's lock: a defrag cannot move it
    meanwhile, and GC never deletes what a row references) while the bucket holds another whole copy (a
    defrag's merged object, newer than the export): its chunk moves to that copy and a lost mark is cleared
    (the objects it named are queued for GC, which deletes what nothing references). With `checked` (every
    page of the copies given was read and checked: `--check-pages`) a ledger marked lost whose chunk names
    other objects than its checked copy moves to that copy too, objects gone or not: `repair` marked it lost
    on the copy its row named (a newer copy recovery chose unchecked, found corrupt), and a sound one was
    still in the bucket.

    Every key a recovered chunk names leaves GC's queue in this transaction, as an offload's commit takes
    its keys out (tiering/ops/gc.py, W2): the delete waits behind a GC run that claimed the key, and a key
    that was queued is then asked of the bucket (`present`); one GC deleted meanwhile fails the topic
    (TieringError, nothing committed: a rerun lists the bucket again).

    `dry_run`: the same statements, taking the same locks, then rolled back: what a run would do now."""
    adopted = adopted or {}
    with engine.connect() as conn, conn.begin() as trans:
        created = conn.execute(
            pg_insert(topic_t).values(name=name, **{f: getattr(policy, f) for f in _POLICY_FIELDS})
            .on_conflict_do_nothing(index_elements=[topic_t.c.name]).returning(topic_t.c.topic_id)).scalar()
        # NO KEY UPDATE, as retention takes it: a ledger writer holding its rows waits for the topic's totals
        # row only with FOR KEY SHARE (the counter trigger), which FOR UPDATE would block: a deadlock
        row = conn.execute(select(topic_t.c.topic_id, topic_t.c.next_ledger_id)
                           .where(topic_t.c.name == name).with_for_update(key_share=True)).one()
        have = {r.ledger_id: r for r in conn.execute(
            select(ledger_t.c.ledger_id, ledger_t.c.state, ledger_t.c.entry_count, ledger_t.c.size_bytes,
                   ledger_t.c.tier1_present, ledger_t.c.lost_at, ledger_t.c.offload_uuid)
            .where(ledger_t.c.topic_id == row.topic_id)
            .order_by(ledger_t.c.ledger_id).with_for_update())}  # in id order, as every ledger writer locks
        existing = set(have)
        # chunk rows locked before any write takes the totals row (the order every ledger writer keeps)
        moved_from = _moved_away(conn, row.topic_id, have, ledgers, gone, checked) if gone is not None else {}
        moved = [ledgers[i] for i in sorted(moved_from)]
        now = conn.execute(select(func.now())).scalar_one()
        found = _found_again(conn, row.topic_id, have, ledgers)
        for c in found:
            conn.execute(update(ledger_t).where(ledger_t.c.topic_id == row.topic_id,
                                                ledger_t.c.ledger_id == c.ledger_id, ledger_t.c.lost_at.is_not(None))
                         .values(entry_count=c.entry_count, size_bytes=c.size_bytes, sealed_at=c.sealed_at,
                                 offload_uuid=c.offload_uuid, offload_started_at=c.offload_started_at,
                                 offloaded_at=c.offloaded_at, lost_at=None, lost_reason=None,
                                 version=ledger_t.c.version + 1))
        upgraded = [ledgers[i] for i in sorted(ledgers) if i in have and _upgradable(conn, have[i])
                    and (have[i].entry_count, have[i].size_bytes) == (ledgers[i].entry_count, ledgers[i].size_bytes)]
        for c in upgraded:
            kept = have[c.ledger_id].tier1_present and (tier1_has is None or tier1_has(c.ledger_id))
            conn.execute(update(ledger_t).where(ledger_t.c.topic_id == row.topic_id,
                                                ledger_t.c.ledger_id == c.ledger_id,
                                                ledger_t.c.state == _state(have[c.ledger_id]))
                         .values(state=LedgerState.OFFLOADED.value, tier1_present=kept,
                                 tier1_deleted_at=None if kept else now, offload_uuid=c.offload_uuid,
                                 offload_started_at=c.offload_started_at, offloaded_at=c.offloaded_at,
                                 version=ledger_t.c.version + 1))
        for c in moved:
            conn.execute(update(chunk_t).where(chunk_t.c.topic_id == row.topic_id, chunk_t.c.ledger_id == c.ledger_id)
                         .values(version=chunk_t.c.version + 1, **chunk_values(c.chunk)))
            conn.execute(update(ledger_t).where(ledger_t.c.topic_id == row.topic_id,
                                                ledger_t.c.ledger_id == c.ledger_id)
                         .values(lost_at=None, lost_reason=None, version=ledger_t.c.version + 1))
        gone = sorted(i for i, r in have.items() if root_holds_topic and tier1_has is not None and r.tier1_present
                      and _state(r) == LedgerState.OFFLOADED.value and not tier1_has(i))
        for i in gone:
            conn.execute(update(ledger_t).where(ledger_t.c.topic_id == row.topic_id, ledger_t.c.ledger_id == i,
                                                ledger_t.c.state == LedgerState.OFFLOADED.value, ledger_t.c.tier1_present)
                         .values(tier1_present=False, tier1_deleted_at=now, version=ledger_t.c.version + 1))
        new = [ledgers[i] for i in sorted(ledgers) if i not in existing]
        sealed = [adopted[i] for i in sorted(adopted) if i not in existing and i not in ledgers]
        ids, unrecorded = unknown_ids(existing | set(ledgers) | set(adopted), lost_to, lost_from) \
            if lost is not None else ([], 0)
        marked = [lost(i) for i in ids]
        rows = [{
            "topic_id": row.topic_id, "ledger_id": c.ledger_id, "state": LedgerState.OFFLOADED.value,
            "entry_count": c.entry_count, "size_bytes": c.size_bytes, "created_at": c.sealed_at,
            "sealed_at": c.sealed_at, "tier1_present": c.tier1_present,
            "tier1_deleted_at": None if c.tier1_present else now,
            "offload_uuid": c.offload_uuid, "offload_started_at": c.offload_started_at,
            "offloaded_at": c.offloaded_at, "deleted_at": None, "version": 0} for c in new]
        rows += [{
            "topic_id": row.topic_id, "ledger_id": a.ledger_id, "state": LedgerState.SEALED.value,
            "entry_count": a.entry_count, "size_bytes": a.size_bytes, "created_at": a.sealed_at,
            "sealed_at": a.sealed_at, "tier1_present": True, "tier1_deleted_at": None, "offload_uuid": None,
            "offload_started_at": None, "offloaded_at": None, "deleted_at": None, "version": 0} for a in sealed]
        if rows:
            conn.execute(insert(ledger_t), rows)
        rows = [{  # in a statement of their own: an executemany takes its columns from its first row
            "topic_id": row.topic_id, "ledger_id": x.ledger_id, "state": LedgerState.OFFLOADED.value,
            "entry_count": x.entry_count, "size_bytes": x.size_bytes, "created_at": x.sealed_at or now,
            "sealed_at": x.sealed_at or now, "tier1_present": False, "tier1_deleted_at": now,
            "offload_uuid": x.offload_uuid, "offload_started_at": now, "offloaded_at": now, "deleted_at": None,
            "version": 0, "lost_at": now, "lost_reason": x.reason[:1000]} for x in marked]
        if rows:
            conn.execute(insert(ledger_t), rows)
        _take_out_of_queue(conn, [c.chunk for c in new + upgraded + found + moved], present)
        # the objects the moved chunks named: GC deletes whatever of them nothing references
        gc_queue.enqueue(conn, sorted({k for c in moved for k in moved_from[c.ledger_id]}), "recovery: moved away")
        if new or upgraded or found:
            conn.execute(insert(chunk_t), [{"topic_id": row.topic_id, "ledger_id": c.ledger_id, "created_at": now,
                                            "version": 0, **chunk_values(c.chunk)} for c in new + upgraded + found])
        top = max([top, *ledgers, *adopted, *(x.ledger_id for x in marked)])
        if row.next_ledger_id <= top:
            conn.execute(update(topic_t).where(topic_t.c.topic_id == row.topic_id)
                         .values(next_ledger_id=top + 1))
        if dry_run:
            trans.rollback()
    return RestoredTopic(created is not None, existing - {c.ledger_id for c in upgraded + found + moved},
                         sorted(c.ledger_id for c in new + upgraded + found + moved), [a.ledger_id for a in sealed], gone,
                         [x.ledger_id for x in marked], unrecorded, [c.ledger_id for c in moved])


def lost_ledger(name: str, seals: list[tuple[int, datetime]], described: Mapping[int, tuple]):
    """How recovery records an unknown id (restore_topic's `lost`): as an index object still describes it (a
    copy that failed its checks: entries, bytes, seal time), else of unknown entry count (0), sealed when the
    next ledger of `seals` (id, seal time) was, ledgers being sealed in id order (retention by time takes it
    no later than that one; none above it: recovery's time)."""
    seals = sorted(seals)

    def lost(lid: int) -> LostLedger:
        uid = str(uuid.uuid5(_LOST_NS, f"{name}:{lid}"))  # the row needs one; no object carries it
        if lid in described:
            return LostLedger(lid, *described[lid], uid, "recovery: no whole copy in the bucket or tier 1")
        return LostLedger(lid, 0, 0, next((at for i, at in seals if i > lid), None), uid,
                          "recovery: no copy in the bucket or tier 1; its entry count is unknown")
    return lost


def gaps(known: set[int], top: int = -1) -> list[tuple[int, int]]:
    """Runs of ids below the largest known one (or `top`, when larger) that `known` lacks."""
    out, nxt = [], 0
    for i in sorted(known | ({top + 1} if top >= 0 else set())):
        if i > nxt:
            out.append((nxt, i - 1))
        nxt = i + 1
    return out


# Lost-ledger rows one recovery records per topic at most: a stray key naming a far ledger id (a hostile or
# mistaken object) would otherwise have it insert a row for every id below it, in one transaction.
MAX_LOST_ROWS = 100_000


def unknown_ids(known: set[int], top: int, start: int, limit: int = MAX_LOST_ROWS) -> tuple[list[int], int]:
    """(the ids of `gaps(known, top)` from `start` on (below it: what retention trimmed), 0), or ([], how
    many they are) when they are more than `limit`."""
    runs = [(max(a, start), b) for a, b in gaps(known, top) if b >= start]
    count = sum(b - a + 1 for a, b in runs)
    if count > limit:
        return [], count
    return [i for a, b in runs for i in range(a, b + 1)], 0


def _found_again(conn, topic_id: int, have: Mapping, ledgers: Mapping[int, RecoveredLedger]) -> list[RecoveredLedger]:
    """The recovered copies of ledgers the database has as lost without a chunk row (recorded by an earlier
    recovery that found no copy): their copy is back."""
    lost = [i for i in sorted(ledgers) if i in have and have[i].lost_at is not None
            and _state(have[i]) == LedgerState.OFFLOADED.value]
    if not lost:
        return []
    chunked = set(conn.execute(select(chunk_t.c.ledger_id).where(chunk_t.c.topic_id == topic_id,
                                                                 chunk_t.c.ledger_id.in_(lost))).scalars())
    return [ledgers[i] for i in lost if i not in chunked]


def _upgradable(conn, r) -> bool:
    """SEALED, or OFFLOADING by an attempt whose worker is gone (its lock, taken here, is held to the end of
    the transaction: the attempt cannot come back meanwhile)."""
    state = _state(r)
    return state == LedgerState.SEALED.value or state == LedgerState.OFFLOADING.value and (
        r.offload_uuid is None or holder_gone(conn, str(r.offload_uuid)))


def _moved_away(conn, topic_id: int, have: Mapping, ledgers: Mapping[int, RecoveredLedger],
                gone: Callable[[str], bool], checked: bool = False) -> dict[int, tuple[str, str]]:
    """{ledger id: the (data, index) keys its chunk row names} of the OFFLOADED ledgers whose chunk row
    (locked here) names objects that are gone (or, `checked`, that is marked lost) while the copy found is
    another one of the same entries and bytes (restore_topic's docstring)."""
    offloaded = [i for i in sorted(ledgers) if i in have and _state(have[i]) == LedgerState.OFFLOADED.value
                 and (have[i].entry_count, have[i].size_bytes) == (ledgers[i].entry_count, ledgers[i].size_bytes)]
    if not offloaded:
        return {}

    def differ(r) -> bool:
        return (r.data_key, r.index_key) != (ledgers[r.ledger_id].chunk.data_key, ledgers[r.ledger_id].chunk.index_key)

    query = select(chunk_t.c.ledger_id, chunk_t.c.data_key, chunk_t.c.index_key).where(chunk_t.c.topic_id == topic_id)
    # only the rows naming other objects than the copy found are locked, in (topic, ledger) order as every
    # chunk writer locks them (heap order deadlocked with a defrag's commit), then looked at again
    wanted = [r.ledger_id for r in conn.execute(query.where(chunk_t.c.ledger_id.in_(offloaded))) if differ(r)]
    if not wanted:
        return {}
    rows = conn.execute(query.where(chunk_t.c.ledger_id.in_(wanted)).order_by(chunk_t.c.topic_id, chunk_t.c.ledger_id)
                        .with_for_update()).all()
    return {r.ledger_id: (r.data_key, r.index_key) for r in rows if differ(r) and (
        (checked and have[r.ledger_id].lost_at is not None) or gone(r.data_key) or gone(r.index_key))}


def _take_out_of_queue(conn, chunks: list[Chunk], present: Callable[[str], bool] | None) -> None:
    """The keys `chunks` name out of GC's queue (restore_topic's docstring); TieringError when one that was
    queued is not in the bucket any more."""
    keys = sorted({k for c in chunks for k in (c.data_key, c.index_key)})
    if not keys:
        return
    rows = conn.execute(select(gc_task.c.key, gc_task.c.reason, gc_task.c.owner_uuid).where(gc_task.c.key.in_(keys))).all()
    queued = {r.key for r in rows}
    if live := gc_queue.live_owned(conn, rows, LIVE_ATTEMPT_CLASSES):
        # a defrag or repair still writing it: its own discard would delete what recovery points at
        raise TieringError(f"a copy recovery chose is being written by a live attempt ({sorted(live)[0]}): "
                           "nothing of this topic was recovered; run recover-from-bucket again once it ended")
    taken = set(conn.execute(delete(gc_task).where(gc_task.c.key.in_(keys)).returning(gc_task.c.key)).scalars())
    for key in sorted(queued | taken):
        if present is not None and not present(key):
            raise TieringError(f"object {key!r} was deleted by GC while recovery chose it as a ledger's copy: "
                               "nothing of this topic was recovered; run recover-from-bucket again")


def _state(r) -> str:
    return r.state if isinstance(r.state, str) else r.state.value


__all__ = ["AdoptedLedger", "LostLedger", "MAX_LOST_ROWS", "RecoveredLedger", "gaps", "lost_ledger", "unknown_ids", "RestoredTopic", "known_ledgers", "restore_topic"]
