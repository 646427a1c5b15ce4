"""The rows recovery restores (tiering/ops/recover.py finds them in the bucket, recover_tier1.py in tier 1):
one topic's topic, ledger and chunk rows in ONE transaction, so a kill leaves the topic as it was or fully
restored.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Mapping

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Engine

from tiering.metadata.tables import chunk as chunk_t, ledger as ledger_t, topic as topic_t
from tiering.model import Chunk, LedgerState, TopicPolicy

_POLICY_FIELDS = tuple(TopicPolicy.__dataclass_fields__)


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


@dataclass
class RestoredTopic:
    created: bool  # the topic row was created (with the given policy)
    existing: set[int] = field(default_factory=set)  # ledger ids the database had: left alone
    restored: list[int] = field(default_factory=list)  # offloaded ledger ids inserted, ascending
    adopted: list[int] = field(default_factory=list)  # sealed tier-1 ledger ids inserted, ascending
    tier1_gone: list[int] = field(default_factory=list)  # OFFLOADED ledgers whose missing tier-1 copy is recorded


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
                  tier1_has: Callable[[int], bool] | None = None, root_holds_topic: bool = False) -> RestoredTopic:
    """Create topic `name` if missing (with `policy`), insert each offloaded ledger it does not have as
    OFFLOADED with its chunk row (`tier1_present` as given), each adopted tier-1 ledger as SEALED with
    `tier1_present`, and move `next_ledger_id` past the largest id given and past `top` (the largest
    ledger file tier 1 holds); one transaction. Ledgers the database already has are untouched, so a
    second run adds nothing, except a SEALED one whose copy the bucket holds (metadata older than the
    store: an export taken before it was offloaded): it becomes OFFLOADED with that chunk, its tier-1 copy
    recorded as gone when `tier1_has` (the root recovery scanned) says the file is not there; and an OFFLOADED
    one whose row says tier 1 holds a copy that is not there, on a root that holds the topic's directory
    (`root_holds_topic`: the right mount, the file deleted since the metadata was taken), is recorded so."""
    adopted = adopted or {}
    with engine.begin() as conn:
        created = conn.execute(
            pg_insert(topic_t).values(name=name, **{f: getattr(policy, f) for f in _POLICY_FIELDS})
            .on_conflict_do_nothing(index_elements=[topic_t.c.name]).returning(topic_t.c.topic_id)).scalar()
        row = conn.execute(select(topic_t.c.topic_id, topic_t.c.next_ledger_id)
                           .where(topic_t.c.name == name).with_for_update()).one()
        have = {r.ledger_id: r for r in conn.execute(
            select(ledger_t.c.ledger_id, ledger_t.c.state, ledger_t.c.entry_count, ledger_t.c.size_bytes,
                   ledger_t.c.tier1_present).where(ledger_t.c.topic_id == row.topic_id).with_for_update())}
        existing = set(have)
        now = conn.execute(select(func.now())).scalar_one()
        upgraded = [ledgers[i] for i in sorted(ledgers) if i in have and _state(have[i]) == LedgerState.SEALED.value
                    and (have[i].entry_count, have[i].size_bytes) == (ledgers[i].entry_count, ledgers[i].size_bytes)]
        for c in upgraded:
            kept = have[c.ledger_id].tier1_present and (tier1_has is None or tier1_has(c.ledger_id))
            conn.execute(update(ledger_t).where(ledger_t.c.topic_id == row.topic_id,
                                                ledger_t.c.ledger_id == c.ledger_id,
                                                ledger_t.c.state == LedgerState.SEALED.value)
                         .values(state=LedgerState.OFFLOADED.value, tier1_present=kept,
                                 tier1_deleted_at=None if kept else now, offload_uuid=c.offload_uuid,
                                 offload_started_at=c.offload_started_at, offloaded_at=c.offloaded_at,
                                 version=ledger_t.c.version + 1))
        gone = sorted(i for i, r in have.items() if root_holds_topic and tier1_has is not None and r.tier1_present
                      and _state(r) == LedgerState.OFFLOADED.value and not tier1_has(i))
        for i in gone:
            conn.execute(update(ledger_t).where(ledger_t.c.topic_id == row.topic_id, ledger_t.c.ledger_id == i,
                                                ledger_t.c.state == LedgerState.OFFLOADED.value, ledger_t.c.tier1_present)
                         .values(tier1_present=False, tier1_deleted_at=now, version=ledger_t.c.version + 1))
        new = [ledgers[i] for i in sorted(ledgers) if i not in existing]
        sealed = [adopted[i] for i in sorted(adopted) if i not in existing and i not in ledgers]
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
        if new or upgraded:
            conn.execute(insert(chunk_t), [{
                "topic_id": row.topic_id, "ledger_id": c.ledger_id, "data_key": c.chunk.data_key,
                "data_offset": c.chunk.data_offset, "data_length": c.chunk.data_length,
                "index_key": c.chunk.index_key, "index_offset": c.chunk.index_offset,
                "index_length": c.chunk.index_length, "first_entry_id": c.chunk.first_entry_id,
                "last_entry_id": c.chunk.last_entry_id, "data_etag": c.chunk.data_etag,
                "index_etag": c.chunk.index_etag, "created_at": now, "version": 0} for c in new + upgraded])
        top = max([top, *ledgers, *adopted])
        if row.next_ledger_id <= top:
            conn.execute(update(topic_t).where(topic_t.c.topic_id == row.topic_id)
                         .values(next_ledger_id=top + 1))
    return RestoredTopic(created is not None, existing - {c.ledger_id for c in upgraded},
                         sorted(c.ledger_id for c in new + upgraded), [a.ledger_id for a in sealed], gone)


def _state(r) -> str:
    return r.state if isinstance(r.state, str) else r.state.value


__all__ = ["AdoptedLedger", "RecoveredLedger", "RestoredTopic", "known_ledgers", "restore_topic"]
