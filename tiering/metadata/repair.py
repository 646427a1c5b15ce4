"""The rows `tiering repair` changes (tiering/ops/repair.py): a ledger's chunk moved to a new object pair, the
ledger marked lost, or a lost ledger's mark cleared once a good copy is back. Each is one transaction of
compare-and-sets: the ledger row at the version the repair read, still OFFLOADED and lost or not as the
repair saw it, and its chunk row still the one the repair checked (version and
data key), so a repair racing retention (the ledger DELETED, its chunk gone), defrag (the chunk moved) or
another repair changes nothing and says so (`ConditionalUpdateFailed`).
"""
from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Iterator

from sqlalchemy import and_, delete, func, select, update
from sqlalchemy.engine import Connection

from tiering.errors import ConditionalUpdateFailed
from tiering.metadata.tables import chunk, chunk_values, gc_task, ledger, topic
from tiering.model import Chunk, Ledger, LedgerState

if TYPE_CHECKING:  # the store is passed in; importing it here would be circular
    from tiering.metadata.repository import MetadataStore

S = LedgerState


class Repairs:
    def __init__(self, store: "MetadataStore"):
        self.store = store
        self.engine = store.engine

    def move_chunk(self, led: Ledger, old: Chunk, new: Chunk, attempt: str, old_keys_delay: timedelta,
                   recover: bool = False, tier1_present: bool | None = None) -> Ledger:
        """The ledger's chunk from `old` to `new` (the repair's object pair, queued under `attempt` for GC
        until now), the new keys dequeued and the old ones queued, the ledger's row bumped with the new
        attempt (`recover`: a lost ledger, its mark cleared; `tier1_present`: recorded so, for a tier-1 file
        put back that the repair read at this row's version): all or nothing. Returns the ledger's new row."""
        from tiering.metadata.repository import AttemptKeysCollected

        with self.engine.begin() as conn:
            self._lock(conn, led)
            self._check_chunk(conn, led, old)
            res = conn.execute(
                update(chunk).where(chunk.c.topic_id == led.topic_id, chunk.c.ledger_id == led.ledger_id,
                                    chunk.c.version == old.version, chunk.c.data_key == old.data_key)
                .values(version=chunk.c.version + 1, **chunk_values(new)))
            assert res.rowcount == 1  # the chunk row is locked and was just compared
            values = {"lost_at": None, "lost_reason": None} if recover else {}
            if tier1_present is not None:
                values["tier1_present"] = tier1_present
            done = self._cas_ledger(conn, led, lost=recover, offload_uuid=attempt, offloaded_at=func.now(), **values)
            keys = sorted({new.data_key, new.index_key})
            gone = conn.execute(delete(gc_task).where(gc_task.c.owner_uuid == attempt,
                                                      gc_task.c.key.in_(keys))).rowcount
            if gone != len(keys):  # the rows held: no other worker took the ledger, GC deleted the new copy
                raise AttemptKeysCollected(f"gc queue of repair {attempt}: expected {len(keys)} queued keys, "
                                           f"found {gone} (collected meanwhile)")
            # GC skips a key another chunk still references (the other ledgers of a batched object)
            self.store._enqueue(conn, sorted({old.data_key, old.index_key}), reason="repair: replaced",
                                owner=None, delay=old_keys_delay)
            return done

    def mark_lost(self, led: Ledger, checked: Chunk | None, reason: str) -> Ledger:
        """The ledger marked lost (reads give a DATALOSS gap at once), if its row and chunk are still what the
        repair found broken."""
        with self.engine.begin() as conn:
            self._lock(conn, led)
            if checked is not None:
                self._check_chunk(conn, led, checked)
            return self._cas_ledger(conn, led, lost_at=func.now(), lost_reason=reason[:1000])

    def clear_lost(self, led: Ledger, checked: Chunk) -> Ledger:
        """A lost ledger's mark cleared (reads go to its tier-2 copy again), if its row is still the lost one
        the repair read and its chunk still the one whose copy the repair found sound."""
        with self.engine.begin() as conn:
            self._lock(conn, led)
            self._check_chunk(conn, led, checked)
            return self._cas_ledger(conn, led, lost=True, lost_at=None, lost_reason=None)

    def adopt_etags(self, led: Ledger, checked: Chunk, data_etag: str | None, index_etag: str | None) -> None:
        """The ETags of the objects the chunk names, recorded after its ledger's bytes in them were checked
        (objects replaced since they were written, with this ledger's bytes intact), if the chunk row is still
        the one checked. Where the bytes lie is unchanged, so the chunk's version is too."""
        with self.engine.begin() as conn:
            self._lock(conn, led)
            self._check_chunk(conn, led, checked)
            conn.execute(update(chunk).where(chunk.c.topic_id == led.topic_id, chunk.c.ledger_id == led.ledger_id)
                         .values(data_etag=data_etag, index_etag=index_etag))

    def lost_ledgers(self, topic_name: str | None = None) -> list[tuple[Ledger, Chunk | None]]:
        """OFFLOADED ledgers marked lost (of `topic_name`, or all) with their chunk rows: what the marked rows
        cost, not the topics' size (lost_select)."""
        from tiering.metadata.repository import _ledger_row

        with self._one_moment() as conn:
            leds = [_ledger_row(r) for r in conn.execute(self.lost_select(topic_name))]
            return [(led, self.store.get_chunk(led, conn)) for led in leds]

    def offloaded(self, topic_name: str) -> tuple[list[Ledger], dict[int, Chunk]]:
        """The topic's OFFLOADED ledgers and its chunk rows, as of one moment: a retention or defrag
        committing between the two reads would otherwise leave an OFFLOADED ledger with no chunk row."""
        with self._one_moment() as conn:
            leds = self.store.list_ledgers(topic_name, [S.OFFLOADED], conn)
            return leds, self.store.chunks(topic_name, conn) if leds else {}

    @contextmanager
    def _one_moment(self) -> Iterator[Connection]:
        """A read-only REPEATABLE READ transaction: every statement in it sees the same commits."""
        with self.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with conn.begin():
                yield conn

    @staticmethod
    def lost_select(topic_name: str | None = None):
        """The lost ledgers' query, on the partial index `ledger_lost` (its predicate is in the WHERE)."""
        from tiering.metadata.repository import _LEDGER_SELECT

        q = (_LEDGER_SELECT.where(ledger.c.lost_at.is_not(None), ledger.c.state == S.OFFLOADED.value)
             .order_by(topic.c.name, ledger.c.ledger_id))
        return q if topic_name is None else q.where(topic.c.name == topic_name)

    def lost_count(self, topic_name: str | None = None) -> int:
        """Lost ledgers not deleted since (on the partial index `ledger_lost`)."""
        q = select(func.count()).select_from(ledger).where(ledger.c.lost_at.is_not(None),
                                                           ledger.c.state != S.DELETED.value)
        if topic_name is not None:
            q = q.join(topic, topic.c.topic_id == ledger.c.topic_id).where(topic.c.name == topic_name)
        with self.engine.connect() as conn:
            return conn.execute(q).scalar_one()

    def _lock(self, conn: Connection, led: Ledger) -> None:
        # every row first, in one order (repository.lock_rows: the topic_usage triggers' deadlock rule)
        self.store.lock_rows(conn, [led], chunks=True)

    def _check_chunk(self, conn: Connection, led: Ledger, expected: Chunk) -> None:
        expected.check_still(self.store.get_chunk(led, conn), led.topic, led.ledger_id)

    def _cas_ledger(self, conn: Connection, led: Ledger, lost: bool = False, **values) -> Ledger:
        """OFFLOADED, not lost (`lost`: lost), at the version read -> values, version + 1."""
        from tiering.metadata.repository import _ledger_row

        row = conn.execute(update(ledger).where(and_(
            ledger.c.topic_id == led.topic_id, ledger.c.ledger_id == led.ledger_id, ledger.c.version == led.version,
            ledger.c.state == S.OFFLOADED.value,
            ledger.c.lost_at.is_not(None) if lost else ledger.c.lost_at.is_(None)))
            .values(version=ledger.c.version + 1, **values).returning(*ledger.c)).one_or_none()
        if row is None:
            now = self.store.get_ledger(led.topic, led.ledger_id, conn)
            raise ConditionalUpdateFailed(f"ledger {led.topic}/{led.ledger_id}",
                                          f"version {led.version}, OFFLOADED, {'lost' if lost else 'not lost'}",
                                          f"version {now.version}, {now.state.value}"
                                          + (", lost" if now.lost else ""))
        return _ledger_row(row, led.topic)
