"""The metadata repository: topics, ledgers and chunks, every state change a conditional update.

Each transition is `UPDATE ... WHERE version = :expected AND state IN (...)` that bumps `version`, inside
one transaction with everything it touches; a lost race raises `ConditionalUpdateFailed` naming what was
expected and what was found (PDP-34's conditional, transactional metadata updates).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Callable, Iterable, Sequence

from sqlalchemy import and_, delete, func, insert, or_, select, tuple_, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from tiering.errors import (ConditionalUpdateFailed, LedgerNotFound, TieringError, TopicExists, TopicNotFound,
                            TopicReplaced)
from tiering.metadata import attempt_locks, gc_queue
from tiering.metadata.planning import Planning
from tiering.metadata.repair import Repairs
from tiering.metadata.subscriptions import Subscriptions
from tiering.metadata import trim
from tiering.metadata.trim import Trims
from tiering.metadata.tables import chunk, chunk_values, gc_task, ledger, topic, topic_tombstone
from tiering.model import Chunk, Ledger, LedgerState, Topic, TopicPolicy, check_topic_name

S = LedgerState
_POLICY_FIELDS = tuple(TopicPolicy.__dataclass_fields__)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _topic_row(row) -> Topic:
    return Topic(row.topic_id, row.name, TopicPolicy(**{f: getattr(row, f) for f in _POLICY_FIELDS}),
                 row.next_ledger_id, row.version)


def _ledger_row(row, name: str | None = None) -> Ledger:
    return Ledger(row.topic_id, row.name if name is None else name, row.ledger_id, S(row.state), row.entry_count, row.size_bytes,
                  row.created_at, row.sealed_at, row.tier1_present, row.offload_uuid, row.offload_started_at,
                  row.offloaded_at, row.deleted_at, row.version, row.lost_at)


def _chunk_row(row) -> Chunk:
    return Chunk(row.data_key, row.data_offset, row.data_length, row.index_key, row.index_offset,
                 row.index_length, row.first_entry_id, row.last_entry_id, row.version, row.data_etag, row.index_etag)


class AttemptKeysCollected(TieringError):
    """An attempt's own queued keys left the queue before its commit (GC collected its objects): no other
    worker took its work, so it is a failure of the attempt, not a lost race (not a ConditionalUpdateFailed)."""


_LEDGER_SELECT = select(ledger, topic.c.name).join(topic, topic.c.topic_id == ledger.c.topic_id)


class MetadataStore:
    """All reads and conditional writes of topic, ledger, chunk (and the gc keys they queue)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.planning = Planning(engine)  # set-based planning queries
        self.subs = Subscriptions(engine)  # reader positions (metadata/subscriptions.py)
        self.trims = Trims(self)  # retention, truncate, topic deletion under locks (metadata/trim.py)
        self.repairs = Repairs(self)  # a tier-2 copy re-made or a ledger marked lost (metadata/repair.py)

    # ---------------------------------------------------------------- topics
    def create_topic(self, name: str, policy: TopicPolicy = TopicPolicy(),
                     then: Callable[[Connection, Topic], None] | None = None) -> Topic:
        """`then(conn, topic)`: more of the same change in the same transaction (the topic's table policy),
        so that its refusal leaves no topic behind."""
        check_topic_name(name, new=True)
        try:
            with self.engine.begin() as conn:
                # The row first: while a delete of the name commits (its tombstone written, its topic row
                # removed), this insert waits for it, and the tombstone is read after, by a statement that
                # sees the delete's commit. Read before, it would be missed and the new topic would start
                # at ledger 0, below the old topic's trim marker.
                row = conn.execute(
                    insert(topic).values(name=name, **{f: getattr(policy, f) for f in _POLICY_FIELDS})
                    .returning(topic)).one()
                # a deleted topic's name: ledger ids go on from the old topic's (metadata/trim.py), and so
                # does the version, so that a version read from the old topic is not the new one's
                tomb = conn.execute(delete(topic_tombstone).where(topic_tombstone.c.name == name)
                                    .returning(topic_tombstone)).one_or_none()
                if tomb is not None:
                    row = conn.execute(
                        update(topic).where(topic.c.topic_id == row.topic_id)
                        .values(next_ledger_id=tomb.next_ledger_id, trim_marker_written=tomb.trim_marker_written,
                                version=tomb.version + 1)
                        .returning(topic)).one()
                if then is not None:
                    then(conn, _topic_row(row))
        except IntegrityError as exc:
            if "topic_name_key" in str(exc.orig):
                raise TopicExists(name) from None
            raise
        return _topic_row(row)

    def get_topic(self, name: str, conn: Connection | None = None) -> Topic:
        check_topic_name(name, existing=True)
        with self._conn(conn) as c:
            row = c.execute(select(topic).where(topic.c.name == name)).one_or_none()
        if row is None:
            raise TopicNotFound(name)
        return _topic_row(row)

    def list_topics(self) -> list[Topic]:
        with self.engine.connect() as conn:
            return [_topic_row(r) for r in conn.execute(select(topic).order_by(topic.c.name))]

    def set_policy(self, name: str, expected_version: int, policy: TopicPolicy,
                   then: Callable[[Connection, Topic], None] | None = None, topic_id: int | None = None) -> Topic:
        """Compare-and-set the topic's policy on its version; `then(conn, topic)` as in create_topic.
        `topic_id`: the topic the policy was read from. A topic deleted and created again under its name
        starts at version 0 again, so the version alone would let the old topic's policy, read before the
        delete, be written over the new one's."""
        check_topic_name(name, existing=True)
        cond = [topic.c.name == name, topic.c.version == expected_version]
        if topic_id is not None:
            cond.append(topic.c.topic_id == topic_id)
        with self.engine.begin() as conn:
            row = conn.execute(
                update(topic).where(*cond)
                .values(version=topic.c.version + 1, **{f: getattr(policy, f) for f in _POLICY_FIELDS})
                .returning(topic)).one_or_none()
            if row is None:
                current = self.get_topic(name, conn)
                if topic_id is not None and current.topic_id != topic_id:
                    raise ConditionalUpdateFailed(f"topic {name!r}", f"the topic read (id {topic_id})",
                                                  f"another topic of that name (id {current.topic_id}, version "
                                                  f"{current.version}): it was deleted and created again")
                raise ConditionalUpdateFailed(f"topic {name!r}", f"version {expected_version}",
                                              f"version {current.version}")
            if then is not None:
                then(conn, _topic_row(row))
        return _topic_row(row)

    def now(self) -> datetime:
        """The database's clock: every worker decides ages against the same time."""
        with self.engine.connect() as conn:
            return conn.execute(select(func.now())).scalar_one()

    # ---------------------------------------------------------------- ledgers: reads
    def get_ledger(self, topic_name: str, ledger_id: int, conn: Connection | None = None) -> Ledger:
        check_topic_name(topic_name, existing=True)
        with self._conn(conn) as c:
            row = c.execute(_LEDGER_SELECT.where(topic.c.name == topic_name,
                                                 ledger.c.ledger_id == ledger_id)).one_or_none()
        if row is None:
            self.get_topic(topic_name, conn)  # an unknown topic says so rather than "no ledger"
            raise LedgerNotFound(topic_name, ledger_id)
        return _ledger_row(row)

    def find_ledger(self, topic_name: str, ledger_id: int) -> Ledger | None:
        """The ledger's row now; None when it or its topic is gone (the topic deleted since the ledger was
        read: only a topic's deletion removes ledger rows)."""
        try:
            return self.get_ledger(topic_name, ledger_id)
        except (TopicNotFound, LedgerNotFound):
            return None

    def list_ledgers(self, topic_name: str, states: Iterable[LedgerState] | None = None,
                     conn: Connection | None = None) -> list[Ledger]:
        check_topic_name(topic_name, existing=True)
        query = _LEDGER_SELECT.where(topic.c.name == topic_name).order_by(ledger.c.ledger_id)
        if states is not None:
            query = query.where(ledger.c.state.in_([s.value for s in states]))
        with self._conn(conn) as c:
            rows = c.execute(query).all()
            if not rows:
                self.get_topic(topic_name, c)
        return [_ledger_row(r) for r in rows]

    def get_chunk(self, led: Ledger, conn: Connection | None = None) -> Chunk | None:
        with self._conn(conn) as c:
            row = c.execute(select(chunk).where(chunk.c.topic_id == led.topic_id,
                                                chunk.c.ledger_id == led.ledger_id)).one_or_none()
        return None if row is None else _chunk_row(row)

    def chunks(self, topic_name: str, conn: Connection | None = None) -> dict[int, Chunk]:
        check_topic_name(topic_name, existing=True)
        q = (select(chunk).join(topic, topic.c.topic_id == chunk.c.topic_id)
             .where(topic.c.name == topic_name).order_by(chunk.c.ledger_id))
        with self._conn(conn) as c:
            return {r.ledger_id: _chunk_row(r) for r in c.execute(q)}

    def offload_candidates_by_age(self, topic_name: str | None = None, limit: int = 10_000,
                                  conn: Connection | None = None) -> list[Ledger]:
        """SEALED, non-empty ledgers sealed longer ago than their topic's offload-after (-1: never),
        oldest first. Served by the partial index `ledger_offload_candidates`."""
        query = (_LEDGER_SELECT.where(ledger.c.state == S.SEALED.value, ledger.c.entry_count > 0,
                                      topic.c.offload_after_seconds >= 0,
                                      ledger.c.sealed_at <= func.now() - func.make_interval(
                                          0, 0, 0, 0, 0, 0, topic.c.offload_after_seconds))
                 .order_by(ledger.c.sealed_at, ledger.c.topic_id, ledger.c.ledger_id).limit(limit))
        if topic_name is not None:
            query = query.where(topic.c.name == check_topic_name(topic_name, existing=True))
        with self._conn(conn) as c:
            return [_ledger_row(r) for r in c.execute(query)]

    def stale_offloads(self, older_than: timedelta, topic_name: str | None = None) -> list[Ledger]:
        """OFFLOADING attempts a new attempt may take over: started longer ago than `older_than` (their worker
        is presumed dead), or whose worker is known dead (nobody holds the attempt's lock:
        metadata/attempt_locks.py). Reads the in-flight rows only (a partial index)."""
        query = _LEDGER_SELECT.where(ledger.c.state == S.OFFLOADING.value,
                                     or_(ledger.c.offload_started_at <= func.now() - older_than,
                                         attempt_locks.holder_gone_sql(ledger.c.offload_uuid)))
        if topic_name is not None:
            query = query.where(topic.c.name == check_topic_name(topic_name, existing=True))
        with self.engine.begin() as c:  # the locks the check takes end with this transaction
            return [_ledger_row(r) for r in c.execute(query.order_by(ledger.c.offload_started_at))]

    def new_attempt(self, lock_class: int = attempt_locks.OFFLOAD_CLASS):
        """`with meta.new_attempt() as attempt:` a fresh offload attempt uuid whose lock this process holds
        for the block (metadata/attempt_locks.py): while it runs, no other worker takes its ledgers over
        (a defrag's or a repair's, `attempt_locks.DEFRAG_CLASS`/`REPAIR_CLASS`: while it runs, GC leaves its
        queued keys alone)."""
        return attempt_locks.new_attempt(self.engine, lock_class)

    def attempt_lock(self) -> attempt_locks.AttemptLock:
        """`with meta.attempt_lock() as lock:` a fresh offload attempt uuid (`lock.attempt`) whose lock is
        taken later (`lock.take()`, False if a live attempt's uuid hashes alike) and held for the block."""
        return attempt_locks.AttemptLock(self.engine)

    # ---------------------------------------------------------------- ledgers: transitions
    def open_ledger(self, topic_name: str, ledger_id: int | None = None, topic_id: int | None = None) -> Ledger:
        """Allocate the topic's next ledger id and create it OPEN (at most one OPEN ledger per topic).
        `ledger_id`: the id the caller read as next (and made the tier-1 file of), taken only while it still
        is the next one (compare-and-set); ConditionalUpdateFailed otherwise. `topic_id`: the topic the caller
        writes to, TopicReplaced when the name now belongs to another one (deleted and created again)."""
        check_topic_name(topic_name, existing=True)
        try:
            with self.engine.begin() as conn:
                cond = [topic.c.name == topic_name]
                if ledger_id is not None:
                    cond.append(topic.c.next_ledger_id == ledger_id)
                if topic_id is not None:
                    cond.append(topic.c.topic_id == topic_id)
                row = conn.execute(
                    update(topic).where(*cond)
                    .values(next_ledger_id=topic.c.next_ledger_id + 1)
                    .returning(topic.c.topic_id, topic.c.next_ledger_id)).one_or_none()
                if row is None:
                    now = self.get_topic(topic_name, conn)  # an unknown topic says so
                    if topic_id is not None and now.topic_id != topic_id:
                        raise TopicReplaced(topic_name)
                    raise ConditionalUpdateFailed(f"topic {topic_name!r}", f"next ledger id {ledger_id}",
                                                  f"next ledger id {now.next_ledger_id}")
                trim.refuse_while_deleted(conn, topic_name, row.topic_id)
                conn.execute(insert(ledger).values(topic_id=row.topic_id, ledger_id=row.next_ledger_id - 1,
                                                   state=S.OPEN.value))
                return self.get_ledger(topic_name, row.next_ledger_id - 1, conn)
        except IntegrityError as exc:
            if "ledger_one_open_per_topic" in str(exc.orig):
                raise ConditionalUpdateFailed(f"topic {topic_name!r}", "no OPEN ledger",
                                              "an OPEN ledger already") from None
            raise

    def seal_ledger(self, led: Ledger, entry_count: int, size_bytes: int,
                    sealed_at: datetime | None = None) -> Ledger:
        with self.engine.begin() as conn:
            return self._cas(conn, led, [S.OPEN], state=S.SEALED.value, entry_count=entry_count,
                             size_bytes=size_bytes, sealed_at=sealed_at or _now())

    def begin_offload(self, led: Ledger, attempt: str, keys: Sequence[str], gc_delay: timedelta,
                      stale_after: timedelta | None = None) -> Ledger:
        """SEALED (or an OFFLOADING attempt older than `stale_after`) -> OFFLOADING(attempt), and the
        attempt's keys queued for GC not before now + gc_delay, in one transaction."""
        return self.begin_offload_batch([led], attempt, keys, gc_delay, stale_after)[0]

    def begin_offload_batch(self, leds: Sequence[Ledger], attempt: str, keys: Sequence[str], gc_delay: timedelta,
                            stale_after: timedelta | None = None,
                            taken_over_delay: timedelta = timedelta(0)) -> list[Ledger]:
        """begin_offload for several ledgers sharing one attempt (one data and one index object): all of
        them or none (a lost compare-and-set rolls the transaction back). The queued keys of an attempt
        taken over here become due `taken_over_delay` from now (gc_queue.due_sooner)."""
        with self.engine.begin() as conn:
            allowed = {S.SEALED}
            if any(led.state == S.OFFLOADING for led in leds) and stale_after is not None:
                now = conn.execute(select(func.now())).scalar_one()
                for led in leds:
                    if led.state != S.OFFLOADING:
                        continue
                    if led.offload_started_at is not None and now - led.offload_started_at >= stale_after:
                        continue  # older than the timeout: presumed dead
                    if led.offload_uuid is not None and attempt_locks.holder_gone(conn, led.offload_uuid):
                        continue  # its worker is dead: its lock went with its connection
                    raise ConditionalUpdateFailed(
                        f"ledger {led.topic}/{led.ledger_id}",
                        f"SEALED, an attempt older than {stale_after} or one whose worker is gone",
                        f"attempt {led.offload_uuid} started {led.offload_started_at}, its worker alive")
                # each row must still be at the version seen, so it is still in the state seen
                allowed.add(S.OFFLOADING)
            out = self._cas_many(conn, leds, sorted(allowed, key=lambda x: x.value), state=S.OFFLOADING.value,
                                 offload_uuid=attempt, offload_started_at=func.now())
            self._enqueue(conn, keys, reason=attempt_locks.OFFLOAD_REASON, owner=attempt, delay=gc_delay)
            # the attempts taken over here lost their ledgers (a batch commits all of its ledgers or none)
            gc_queue.due_sooner(conn, (led.offload_uuid for led in leds
                                       if led.state == S.OFFLOADING and led.offload_uuid is not None),
                                taken_over_delay)
            return out

    def complete_offload(self, led: Ledger, attempt: str, ch: Chunk) -> Ledger:
        """OFFLOADING(attempt) -> OFFLOADED with its chunk; dequeue the attempt's keys: all or nothing.

        Fails if another attempt took the ledger over, or if GC already claimed one of the keys."""
        return self.complete_offload_batch([(led, ch)], attempt)[0]

    def complete_offload_batch(self, items: Sequence[tuple[Ledger, Chunk]], attempt: str) -> list[Ledger]:
        """complete_offload for every ledger of one attempt, in one transaction (chunk rows in one INSERT)."""
        with self.engine.begin() as conn:
            out = self._cas_many(conn, [led for led, _ in items], [S.OFFLOADING], attempt=attempt,
                                 state=S.OFFLOADED.value, offloaded_at=func.now())
            # rows as parameters, not a VALUES list: the statement compiles once per process (SQLAlchemy
            # caches it; a VALUES list is compiled afresh on every call, 1.7 ms of a 12 ms commit)
            if items:  # an empty parameter list would be INSERT ... DEFAULT VALUES
                conn.execute(insert(chunk), [{"topic_id": led.topic_id, "ledger_id": led.ledger_id,
                                              **chunk_values(ch)} for led, ch in items])
            keys = sorted({k for _, ch in items for k in (ch.data_key, ch.index_key)})
            gone = conn.execute(delete(gc_task).where(gc_task.c.owner_uuid == attempt,
                                                      gc_task.c.key.in_(keys))).rowcount
            if gone != len(keys):
                raise ConditionalUpdateFailed(f"gc queue of attempt {attempt}", f"{len(keys)} queued keys",
                                              f"{gone} (collected meanwhile)")
            return out

    def abort_offload(self, led: Ledger, attempt: str, objects_deleted: bool) -> Ledger:
        """OFFLOADING(attempt) -> SEALED. When the attempt deleted its own objects its GC keys go too;
        otherwise they stay queued and GC collects them."""
        with self.engine.begin() as conn:
            new = self._cas(conn, led, [S.OFFLOADING], attempt=attempt, state=S.SEALED.value,
                            offload_uuid=None, offload_started_at=None)
            if objects_deleted:
                conn.execute(delete(gc_task).where(gc_task.c.owner_uuid == attempt))
            return new

    def abort_offload_batch(self, leds: Sequence[Ledger], attempt: str, objects_deleted: bool) -> int:
        """abort_offload for the ledgers of one attempt still holding it (others were taken over: left
        alone); returns how many went back to SEALED."""
        with self.engine.begin() as conn:
            self.lock_rows(conn, leds)
            back = 0
            for led in leds:
                try:
                    self._cas(conn, led, [S.OFFLOADING], attempt=attempt, state=S.SEALED.value,
                              offload_uuid=None, offload_started_at=None)
                    back += 1
                except ConditionalUpdateFailed:
                    pass  # a failed UPDATE changes nothing and leaves the transaction usable
            if objects_deleted:
                conn.execute(delete(gc_task).where(gc_task.c.owner_uuid == attempt))
            return back

    def mark_tier1_deleted(self, led: Ledger) -> Ledger:
        with self.engine.begin() as conn:
            return self._cas(conn, led, [S.OFFLOADED, S.DELETED], tier1_present=False,
                             tier1_deleted_at=func.now())

    def delete_ledgers(self, leds: Sequence[Ledger], reason: str, gc_delay: timedelta) -> list[Ledger]:
        """Retention: SEALED/OFFLOADED ledgers -> DELETED, their chunks removed and the chunks' keys queued
        for GC (GC skips keys another chunk still references), all in one transaction."""
        with self.engine.begin() as conn:
            return self.delete_ledgers_in(conn, leds, reason, gc_delay)

    def delete_ledgers_in(self, conn: Connection, leds: Sequence[Ledger], reason: str, gc_delay: timedelta,
                          states: Sequence[LedgerState] = (S.SEALED, S.OFFLOADED)) -> list[Ledger]:
        """delete_ledgers inside the caller's transaction (retention's and topic deletion's, which hold the
        topic and its subscriptions locked). `states`: what a ledger may be in (topic deletion also takes an
        OFFLOADING one: the attempt's commit then loses its compare-and-set, and its queued objects become
        due `gc_delay` from now, not when the rest of its offload timeout has passed)."""
        out = []
        self.lock_rows(conn, leds, chunks=True)
        for led in leds:
            # RETURNING: the keys of the chunk row as deleted, even if defrag switched it just before
            gone = conn.execute(delete(chunk).where(chunk.c.topic_id == led.topic_id,
                                                    chunk.c.ledger_id == led.ledger_id)
                                .returning(chunk.c.data_key, chunk.c.index_key)).one_or_none()
            if gone is not None:
                self._enqueue(conn, [gone.data_key, gone.index_key], reason=reason, owner=None,
                              delay=gc_delay)
            out.append(self._cas(conn, led, list(states), state=S.DELETED.value, deleted_at=func.now()))
        # (the compare-and-set held each row at the version read, so an OFFLOADING one was in that attempt;
        # a batch commits all of its ledgers or none, so one ledger gone is the whole attempt lost)
        gc_queue.due_sooner(conn, (led.offload_uuid for led in leds
                                   if led.state == S.OFFLOADING and led.offload_uuid is not None), gc_delay)
        return out

    def replace_chunks(self, moves: Sequence[tuple[Ledger, Chunk, Chunk]], attempt: str,
                       old_keys_delay: timedelta) -> None:
        """Defrag: switch each ledger's chunk from old to new if it is still `old` (version compare),
        dequeue the merged objects' keys (queued under `attempt`) and queue the old keys, atomically.
        A moved chunk row raises ConditionalUpdateFailed (a lost race); merged keys no longer queued raise
        AttemptKeysCollected (GC deleted the merged objects: committing would reference deleted objects)."""
        with self.engine.begin() as conn:
            self.lock_rows(conn, [led for led, _, _ in moves], ledgers=False, chunks=True)
            old_keys = set()
            for led, old, new in moves:
                res = conn.execute(
                    update(chunk).where(chunk.c.topic_id == led.topic_id, chunk.c.ledger_id == led.ledger_id,
                                        chunk.c.version == old.version, chunk.c.data_key == old.data_key)
                    .values(version=chunk.c.version + 1, **chunk_values(new)))
                if res.rowcount != 1:
                    found = self.get_chunk(led, conn)
                    raise ConditionalUpdateFailed(f"chunk of {led.topic}/{led.ledger_id}",
                                                  f"version {old.version} at {old.data_key}",
                                                  "no chunk" if found is None else
                                                  f"version {found.version} at {found.data_key}")
                old_keys.update((old.data_key, old.index_key))
            new_keys = {k for _, _, n in moves for k in (n.data_key, n.index_key)}
            gone = conn.execute(delete(gc_task).where(gc_task.c.owner_uuid == attempt,
                                                      gc_task.c.key.in_(sorted(new_keys)))).rowcount
            if gone != len(new_keys):  # the rows' versions held: nobody else took the ledgers
                raise AttemptKeysCollected(f"gc queue of defrag {attempt}: expected {len(new_keys)} queued keys, "
                                           f"found {gone} (collected meanwhile)")
            self._enqueue(conn, sorted(old_keys), reason="defrag: merged away", owner=None, delay=old_keys_delay)

    def enqueue_gc(self, keys: Iterable[str], reason: str, owner: str | None = None,
                   delay: timedelta = timedelta(0)) -> None:
        with self.engine.begin() as conn:
            self._enqueue(conn, keys, reason, owner, delay)

    def dequeue_gc(self, owner: str) -> None:
        """Drop an attempt's queued keys once the attempt itself deleted its objects."""
        with self.engine.begin() as conn:
            conn.execute(delete(gc_task).where(gc_task.c.owner_uuid == owner))

    def chunks_referencing(self, key: str) -> int:
        with self.engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(chunk).where(
                (chunk.c.data_key == key) | (chunk.c.index_key == key))).scalar_one()

    # ---------------------------------------------------------------- helpers
    def lock_rows(self, conn: Connection, leds: Sequence[Ledger], ledgers: bool = True,
                   chunks: bool = False) -> None:
        """Lock every ledger (and chunk) row a multi-statement transaction is about to change, in ONE
        statement each, before its first change. The topic_usage triggers (migration 0003) lock the topic's
        totals row at the end of each changing statement; a transaction that took that lock and then waited
        for a ledger row a single-statement writer holds (which waits for the totals row in turn) would
        deadlock. Taking every row lock first means a transaction holding a totals row never waits for a
        ledger or chunk row again. FOR UPDATE waits; the compare-and-set that follows still decides.
        `chunks` also locks the chunk rows of other ledgers whose data object one of these chunks shares: a
        chunk deleted or moved makes the data_alone recount (migration 0007) update those, after the totals
        row is held."""
        pairs = sorted({(led.topic_id, led.ledger_id) for led in leds})
        if not pairs:
            return
        if ledgers:
            conn.execute(select(ledger.c.ledger_id).where(tuple_(ledger.c.topic_id, ledger.c.ledger_id).in_(pairs))
                         .order_by(ledger.c.topic_id, ledger.c.ledger_id).with_for_update()).all()
        if chunks:
            mine = chunk.alias("mine")  # (an alias: the same table in a subquery would be correlated)
            shared = select(mine.c.data_key).where(tuple_(mine.c.topic_id, mine.c.ledger_id).in_(pairs))
            conn.execute(select(chunk.c.ledger_id)
                         .where(or_(tuple_(chunk.c.topic_id, chunk.c.ledger_id).in_(pairs), chunk.c.data_key.in_(shared)))
                         .order_by(chunk.c.topic_id, chunk.c.ledger_id).with_for_update(of=chunk)).all()

    def _enqueue(self, conn: Connection, keys: Iterable[str], reason: str, owner: str | None,
                 delay: timedelta) -> None:
        gc_queue.enqueue(conn, keys, reason, owner, delay)

    def _cas(self, conn: Connection, led: Ledger, from_states: Sequence[LedgerState],
             attempt: str | None = None, **values) -> Ledger:
        cond = [ledger.c.topic_id == led.topic_id, ledger.c.ledger_id == led.ledger_id,
                ledger.c.version == led.version, ledger.c.state.in_([s.value for s in from_states])]
        if attempt is not None:
            cond.append(ledger.c.offload_uuid == attempt)
        # RETURNING: the new row comes back with the UPDATE (no second SELECT); the topic name never changes
        row = conn.execute(update(ledger).where(and_(*cond)).values(version=ledger.c.version + 1, **values)
                           .returning(*ledger.c)).one_or_none()
        if row is None:
            current = conn.execute(_LEDGER_SELECT.where(ledger.c.topic_id == led.topic_id,
                                                        ledger.c.ledger_id == led.ledger_id)).one_or_none()
            expected = f"version {led.version} in {'/'.join(s.value for s in from_states)}"
            if attempt is not None:
                expected += f" with attempt {attempt}"
            found = "no such ledger" if current is None else (
                f"version {current.version} in {current.state}"
                + (f" with attempt {current.offload_uuid}" if current.offload_uuid else ""))
            raise ConditionalUpdateFailed(f"ledger {led.topic}/{led.ledger_id}", expected, found)
        return _ledger_row(row, led.topic)

    def _cas_many(self, conn: Connection, leds: Sequence[Ledger], from_states: Sequence[LedgerState],
                  attempt: str | None = None, **values) -> list[Ledger]:
        """_cas of several ledgers in ONE statement (UPDATE ... WHERE (topic, ledger, version) IN ... RETURNING);
        if any row did not match, the caller's transaction is rolled back by the error _cas raises for it."""
        if len(leds) <= 1:
            return [self._cas(conn, led, from_states, attempt, **values) for led in leds]
        cond = [tuple_(ledger.c.topic_id, ledger.c.ledger_id, ledger.c.version).in_(
                    [(led.topic_id, led.ledger_id, led.version) for led in leds]),
                ledger.c.state.in_([s.value for s in from_states])]
        if attempt is not None:
            cond.append(ledger.c.offload_uuid == attempt)
        rows = conn.execute(update(ledger).where(and_(*cond)).values(version=ledger.c.version + 1, **values)
                            .returning(*ledger.c)).all()
        got = {(r.topic_id, r.ledger_id): r for r in rows}
        for led in leds:
            if (led.topic_id, led.ledger_id) not in got:
                self._cas(conn, led, from_states, attempt, **values)  # raises, saying what it found
        return [_ledger_row(got[(led.topic_id, led.ledger_id)], led.topic) for led in leds]

    def _conn(self, conn: Connection | None):
        if conn is not None:
            return _Borrowed(conn)
        return self.engine.connect()


class _Borrowed:
    """Context manager lending an open connection without closing it."""

    def __init__(self, conn: Connection):
        self.conn = conn

    def __enter__(self) -> Connection:
        return self.conn

    def __exit__(self, *exc) -> None:
        return None

