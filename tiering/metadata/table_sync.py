"""Rows of `topic_table`: a topic's Iceberg table policy and its sync state, and the ledger queries the sync
plans from. Every change is one transaction; the sync state moves only by compare-and-set on the table and
marks it was read at (`advance`); policy changes move `version`.

The Iceberg table is the source of truth for what it holds (its properties move in the same atomic commit
as its data files, tiering/tables/sync.py); this row mirrors them. `advance` is called after a commit, and
again by the next sync when a run died between the two."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, Iterator, TypeVar

from sqlalchemy import and_, delete, func, literal, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from tiering.errors import BadInput, ConditionalUpdateFailed, TieringError
from tiering.metadata.db import lock_taken, session_lock
from tiering.metadata.subscriptions import topic_row
from tiering.metadata.tables import ICEBERG_CATALOG, iceberg_tables, ledger, topic, topic_table
from tiering.model import Topic

# Ledgers whose entries are final and readable: what a table takes. OPEN is not yet; DELETED never.
SYNCABLE = ("SEALED", "OFFLOADING", "OFFLOADED")
T = TypeVar("T")


@dataclass(frozen=True)
class TableState:
    topic_id: int
    topic: str
    identifier: str
    retention: str
    decoder: dict | None
    synced_through: int
    trimmed_through: int
    ledgers_committed: int
    entries_committed: int
    snapshot_id: int | None
    metadata_location: str | None
    synced_at: datetime | None
    version: int


@dataclass(frozen=True)
class PendingLedger:
    ledger_id: int
    state: str
    entry_count: int
    size_bytes: int
    sealed_at: datetime | None
    offloaded_at: datetime | None
    lost: bool = False  # no tier holds a good copy (entry_count 0 then: not known, not empty)


_SELECT = select(topic_table, topic.c.name).join(topic, topic.c.topic_id == topic_table.c.topic_id)


def _state(row) -> TableState:
    m = row._mapping
    return TableState(m["topic_id"], m["name"], m["identifier"], m["retention"], m["decoder"], m["synced_through"],
                      m["trimmed_through"], m["ledgers_committed"], m["entries_committed"], m["snapshot_id"],
                      m["metadata_location"], m["synced_at"], m["version"])


class TableRows:
    def __init__(self, engine: Engine):
        self.engine = engine

    def held(self, topic_name: str, topic_id: int, nothing: str) -> TableState:
        """The topic's row read again by a sync or maintenance holding the table's lock. A topic delete drops
        the row with the ledgers it marks DELETED, under that lock: a row gone (or another topic's under the
        name) means the topic was deleted meanwhile, and those deletions are not retention's to follow;
        TieringError saying `nothing` was done and the table stays as it was."""
        state = self.get(topic_name)  # TopicNotFound once the delete has finished
        if state is None or state.topic_id != topic_id:
            raise TieringError(f"topic {topic_name!r} was deleted meanwhile: {nothing}; its table stays as it was")
        return state

    def get(self, topic_name: str) -> TableState | None:
        """The topic's table row; None when the topic has no table (TopicNotFound when no such topic)."""
        with self.engine.connect() as conn:
            t = topic_row(conn, topic_name)
            row = conn.execute(_SELECT.where(topic_table.c.topic_id == t.topic_id)).one_or_none()
        return None if row is None else _state(row)

    def owner(self, identifier: str) -> str | None:
        """The name of the topic whose table `identifier` is (one row at most: the identifier is unique)."""
        with self.engine.connect() as conn:
            row = conn.execute(_SELECT.where(topic_table.c.identifier == identifier)).one_or_none()
        return None if row is None else row._mapping["name"]

    def list(self, topic_name: str | None = None) -> list[TableState]:
        """Every topic with a table (or the one named, which must have one), by topic name."""
        if topic_name is not None:
            state = self.get(topic_name)
            if state is None:
                raise BadInput(f"topic {topic_name!r} has no table (set one with `tiering topic set "
                               f"{topic_name} --table NAMESPACE.TABLE`)")
            return [state]
        with self.engine.connect() as conn:
            return [_state(r) for r in conn.execute(_SELECT.order_by(topic.c.name))]

    def set_policy(self, topic_name: str, identifier: str | None, retention: str | None,
                   decoder: dict | None = None, check_decoder=None,
                   check_rename: Callable[[str, Topic], None] | None = None) -> TableState:
        """Create or change the topic's table policy in one transaction, the topic's row locked so that a
        concurrent topic deletion waits. A topic's table cannot be renamed once it holds ledgers (the old
        table would be abandoned half-synced, and the new one given the same ledgers again); a name another
        topic uses is refused. A rename holds the sync's lock for its transaction (a running sync: refused,
        try again) and asks `check_rename(old identifier, topic)` (the table's own marks, which a sync killed after
        its commit left ahead of this row) under it. The topic's version moves with it, as with every change
        `tiering topic set` makes, so a compare-and-set on the version read before sees this one."""
        with self.engine.begin() as conn:
            t = topic_row(conn, topic_name, lock="NO KEY UPDATE")
            state = self.apply(conn, t, identifier, retention, decoder, check_decoder, check_rename)
            conn.execute(update(topic).where(topic.c.topic_id == t.topic_id).values(version=topic.c.version + 1))
            return state

    def in_topic(self, topic_name: str, change: Callable[[Connection, Topic], T]) -> T:
        """`change(conn, topic)` in one transaction, the topic's row held FOR SHARE (a deletion waits)."""
        with self.engine.begin() as conn:
            return change(conn, topic_row(conn, topic_name, lock="FOR SHARE"))

    def apply(self, conn: Connection, t: Topic, identifier: str | None, retention: str | None,
              decoder: dict | None = None, check_decoder=None,
              check_rename: Callable[[str, Topic], None] | None = None) -> TableState:
        """set_policy's change inside a transaction the caller holds with the topic's row locked (a topic
        created or its policy changed in the same transaction: one refusal undoes both)."""
        topic_name = t.name
        cur = conn.execute(select(topic_table).where(topic_table.c.topic_id == t.topic_id)
                           .with_for_update()).one_or_none()
        if cur is None and identifier is None:
            raise BadInput(f"topic {topic_name!r} has no table: --table-retention and --table-json-fields "
                           "need --table")
        if cur is not None and identifier is not None and identifier != cur.identifier:
            if cur.synced_through >= 0 or cur.trimmed_through >= 0:
                raise BadInput(f"topic {topic_name!r} is already synced to table {cur.identifier!r}; "
                               "its table cannot be renamed")
            _no_sync_running(conn, t, "rename it")
            if check_rename is not None:
                check_rename(cur.identifier, t)
        if cur is not None and decoder is not None and decoder != cur.decoder:
            # a sync running decodes its rounds with the decoder it read: the rounds it commits after this
            # change would lack the new fields, and no later sync decodes those ledgers again
            _no_sync_running(conn, t, "change its JSON fields")
        if decoder is not None and check_decoder is not None:
            check_decoder(None if cur is None else cur.decoder, decoder)  # under the row lock
        values = {k: v for k, v in (("identifier", identifier), ("retention", retention),
                                    ("decoder", decoder)) if v is not None}
        try:
            with conn.begin_nested():
                if cur is None:
                    conn.execute(insert(topic_table).values(topic_id=t.topic_id, **values))
                else:
                    conn.execute(update(topic_table).where(topic_table.c.topic_id == t.topic_id)
                                 .values(version=topic_table.c.version + 1, updated_at=func.now(), **values))
        except IntegrityError:
            raise BadInput(f"table {identifier!r} is already the table of another topic") from None
        return _state(conn.execute(_SELECT.where(topic_table.c.topic_id == t.topic_id)).one())

    def advance(self, state: TableState, *, synced_through: int, trimmed_through: int, ledgers_added: int,
                entries_added: int, snapshot_id: int | None, metadata_location: str | None) -> TableState:
        """Record the table's progress if the row's marks and table are still those of `state`; else
        ConditionalUpdateFailed. The compare is on what a sync owns, not on the row's version, which a policy
        change (`topic set --table-retention`) also moves: such a change during a sync must not make a
        committed round look failed. The marks only move forward (a stale run cannot move them back)."""
        c = topic_table.c
        with self.engine.begin() as conn:
            row = conn.execute(
                update(topic_table).where(c.topic_id == state.topic_id, c.identifier == state.identifier,
                                          c.synced_through == state.synced_through,
                                          c.trimmed_through == state.trimmed_through,
                                          c.synced_through <= synced_through, c.trimmed_through <= trimmed_through)
                .values(synced_through=synced_through, trimmed_through=trimmed_through,
                        ledgers_committed=c.ledgers_committed + ledgers_added,
                        entries_committed=c.entries_committed + entries_added, snapshot_id=snapshot_id,
                        metadata_location=metadata_location, synced_at=func.now(), updated_at=func.now(),
                        version=c.version + 1)
                .returning(c.topic_id)).first()
            if row is None:
                found = conn.execute(select(c.identifier, c.synced_through, c.trimmed_through)
                                     .where(c.topic_id == state.topic_id)).one_or_none()
                if found is None:
                    raise ConditionalUpdateFailed(f"the table sync state of topic {state.topic!r}",
                                                  "the topic's table row", "none: the topic was deleted meanwhile")
                raise ConditionalUpdateFailed(
                    f"the table sync state of topic {state.topic!r}",
                    f"table {state.identifier!r} through {state.synced_through} (trimmed {state.trimmed_through})",
                    f"table {found.identifier!r} through {found.synced_through} (trimmed {found.trimmed_through})")
            return _state(conn.execute(_SELECT.where(c.topic_id == state.topic_id)).one())

    def pending(self, state: TableState, limit: int) -> list[PendingLedger]:
        """The ledgers after the table's high-water mark, in id order, at most `limit`: what a sync looks at
        (it stops at the first one still open, so no ledger is ever passed over)."""
        c = ledger.c
        with self.engine.connect() as conn:
            rows = conn.execute(select(c.ledger_id, c.state, c.entry_count, c.size_bytes, c.sealed_at, c.offloaded_at,
                                       c.lost_at.is_not(None).label("lost"))
                                .where(c.topic_id == state.topic_id, c.ledger_id > state.synced_through)
                                .order_by(c.ledger_id).limit(limit)).all()
        return [PendingLedger(r.ledger_id, str(getattr(r.state, "value", r.state)), r.entry_count, r.size_bytes,
                              r.sealed_at, r.offloaded_at, r.lost) for r in rows]

    def due(self, topic_name: str | None = None) -> list[TableState]:
        """The topics a sync has work for, in one statement whatever their number (an idle hourly run costs
        one query): the first ledger after the table's mark exists and is no longer open, or (retention
        'follow') a ledger at or below the mark and above the trimmed mark was deleted. Both probes walk
        the ledger primary key (topic_id, ledger_id)."""
        t, led = topic_table.c, ledger.alias("l")
        first = (select(led.c.state).where(led.c.topic_id == t.topic_id, led.c.ledger_id > t.synced_through)
                 .order_by(led.c.ledger_id).limit(1).scalar_subquery())
        deleted = select(led.c.ledger_id).where(
            led.c.topic_id == t.topic_id, led.c.ledger_id > t.trimmed_through, led.c.ledger_id <= t.synced_through,
            led.c.state == "DELETED").exists()
        q = _SELECT.where((first != "OPEN") | ((t.retention == "follow") & deleted)).order_by(topic.c.name)
        if topic_name is not None:
            self.list(topic_name)  # an unknown topic, or one without a table, is refused
            q = q.where(topic.c.name == topic_name)
        with self.engine.connect() as conn:
            return [_state(r) for r in conn.execute(q)]

    def lag(self, state: TableState) -> tuple[int, int]:
        """(ledgers, bytes) sealed but not yet in the table."""
        c = ledger.c
        with self.engine.connect() as conn:
            row = conn.execute(select(func.count(), func.coalesce(func.sum(c.size_bytes), 0)).where(
                c.topic_id == state.topic_id, c.ledger_id > state.synced_through, c.state.in_(SYNCABLE))).one()
        return int(row[0]), int(row[1])

    def deleted_since(self, state: TableState, after: int, through: int) -> list[int]:
        """Ids of DELETED ledgers in (after, through]: rows retention 'follow' deletes from the table."""
        c = ledger.c
        with self.engine.connect() as conn:
            return list(conn.execute(select(c.ledger_id).where(and_(
                c.topic_id == state.topic_id, c.ledger_id > after, c.ledger_id <= through,
                c.state == "DELETED")).order_by(c.ledger_id)).scalars())


    def catalog_locations(self, identifier: str, names: list[str]) -> dict[str, str | None]:
        """The metadata location the product's catalog records for each table `NAMESPACE.name` of `names`
        (the namespace is `identifier`'s), None for one it has no row of."""
        namespace = identifier.partition(".")[0]
        c = iceberg_tables.c
        with self.engine.connect() as conn:
            found = dict(conn.execute(select(c.table_name, c.metadata_location).where(
                c.catalog_name == ICEBERG_CATALOG, c.table_namespace == namespace, c.table_name.in_(names))).all())
        return {name: found.get(name) for name in names}

    def first_retained(self, state: TableState) -> int | None:
        """The first ledger of the topic that retention has not deleted (None: none): where a table made again
        from the log starts."""
        c = ledger.c
        with self.engine.connect() as conn:
            return conn.execute(select(func.min(c.ledger_id)).where(c.topic_id == state.topic_id,
                                                                    c.state != "DELETED")).scalar_one()

    def reset(self, state: TableState, catalog_rows: dict[str, str | None]) -> TableState:
        """Forget the topic's table, in one transaction: the product's catalog rows of the tables named in
        `catalog_rows` (in the namespace of `state.identifier`) deleted, each only if it still records the
        metadata location the caller checked (None: that there is none), and the sync state back to
        nothing, only if it is still `state`'s. Refused (ConditionalUpdateFailed, nothing changed) when any
        of that moved, or while a sync or maintenance of the table runs (they hold its lock). The next sync
        makes the table again from the retained log. The topic's row is held FOR SHARE: a deletion waits."""
        namespace = state.identifier.partition(".")[0]
        c, ic = topic_table.c, iceberg_tables.c
        what = f"the table of topic {state.topic!r}"
        with self.engine.begin() as conn:
            topic_now = topic_row(conn, state.topic, lock="FOR SHARE")
            cur = conn.execute(select(topic_table).where(c.topic_id == topic_now.topic_id)
                               .with_for_update()).one_or_none()
            if cur is None or (topic_now.topic_id, cur.identifier, cur.synced_through, cur.trimmed_through) != \
                    (state.topic_id, state.identifier, state.synced_through, state.trimmed_through):
                found = "none" if cur is None else f"table {cur.identifier!r} through {cur.synced_through}"
                raise ConditionalUpdateFailed(what, f"table {state.identifier!r} through {state.synced_through}",
                                              f"{found}: it changed meanwhile, run the rebuild again")
            if not conn.execute(select(func.pg_try_advisory_xact_lock(literal(LOCK_CLASS),
                                                                      literal(state.topic_id)))).scalar_one():
                raise ConditionalUpdateFailed(what, "no sync running", "a sync or maintenance of it running: "
                                              "rebuild it when that has ended")
            for name, expected in catalog_rows.items():
                where = and_(ic.catalog_name == ICEBERG_CATALOG, ic.table_namespace == namespace,
                             ic.table_name == name)
                now = conn.execute(select(ic.metadata_location).where(where).with_for_update()).one_or_none()
                if (None if now is None else now.metadata_location) != expected:
                    raise ConditionalUpdateFailed(f"the catalog row of table {namespace}.{name}",
                                                  expected or "none", (now and now.metadata_location) or "none")
                conn.execute(delete(iceberg_tables).where(where))
            conn.execute(update(topic_table).where(c.topic_id == state.topic_id).values(
                synced_through=-1, trimmed_through=-1, ledgers_committed=0, entries_committed=0, snapshot_id=None,
                metadata_location=None, synced_at=None, updated_at=func.now(), version=c.version + 1))
            return _state(conn.execute(_SELECT.where(c.topic_id == state.topic_id)).one())


LOCK_CLASS = 0x74626c73  # "tbls": one sync of a topic's table at a time (two-key advisory locks)
MAINTENANCE_CLASS = 0x74626d74  # "tbmt": also held by a maintenance holding LOCK_CLASS (maintenance_running)
DELETE_MARK_CLASS = 0x7462646c  # "tbdl": also held by a topic delete's step holding LOCK_CLASS (delete_running)
# how long a sync waits for the table's running maintenance to end, a maintenance for a sync, and a topic
# delete's step for either (turn, quiet_for_delete); a sync or maintenance can take minutes on a large table
WAIT_SECONDS = 600.0


def _no_sync_running(conn: Connection, t: Topic, what: str) -> None:
    """Hold the table's sync lock for the caller's transaction, or refuse: a sync or maintenance of the
    topic's table is running (ConditionalUpdateFailed: nothing changed, try again)."""
    if not conn.execute(select(func.pg_try_advisory_xact_lock(literal(LOCK_CLASS), literal(t.topic_id)))).scalar_one():
        raise ConditionalUpdateFailed(f"the table of topic {t.name!r}", "no sync running",
                                      f"a sync or maintenance of it running: {what} when that has ended")


def exclusive(engine: Engine, topic_id: int, maintenance: bool = False):
    """`with exclusive(...) as held:` True while this process holds the sync of the topic's table, False when
    another session does (it does not wait; metadata/db.session_lock: a killed sync loses it with its
    connection). It saves a second sync's work; exactly once does not rest on it (the table's own commit
    checks its high-water mark, tiering/tables/sync.py). `maintenance`: also hold maintenance's lock, so
    that a sync refused meanwhile knows it was not another sync's work (maintenance_running)."""
    return session_lock(engine, LOCK_CLASS, literal(topic_id), also=MAINTENANCE_CLASS if maintenance else None)


def maintenance_running(engine: Engine, topic_id: int) -> bool:
    """Whether a maintenance of the topic's table holds its lock (rather than another sync)."""
    return lock_taken(engine, MAINTENANCE_CLASS, literal(topic_id))


def delete_running(engine: Engine, topic_id: int) -> bool:
    """Whether a topic delete's step holds the table's lock (quiet_for_delete: neither sync's nor
    maintenance's work)."""
    return lock_taken(engine, DELETE_MARK_CLASS, literal(topic_id))


@contextmanager
def quiet_for_delete(engine: Engine, topic: str, topic_id: int, wait_seconds: float,
                     poll_seconds: float = 0.2, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """`with quiet_for_delete(...):` the table's lock for a topic deletion's step that marks the ledgers
    DELETED and drops the table row: a sync holding the lock has read the row and would take those ledgers
    for retention's (retention 'follow' deletes their rows: the whole table), so the step waits for it,
    polling (a killed sync's lock goes with its connection); TieringError, nothing changed, when a sync or
    maintenance held it for all of `wait_seconds`. A sync starting after the step finds no row. `on_wait`
    is called once, when the step first finds the lock held (an operator's delete would otherwise seem to
    hang for minutes)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        with session_lock(engine, LOCK_CLASS, literal(topic_id), also=DELETE_MARK_CLASS) as held:
            if held:
                yield
                return
        if on_wait is not None:
            on_wait()
            on_wait = None
        if time.monotonic() >= deadline:
            raise TieringError(f"a sync or maintenance of topic {topic!r}'s table ran on past the {wait_seconds:g} s "
                               "a topic delete waits for it: nothing deleted; run topic delete again when it has "
                               "ended")
        time.sleep(poll_seconds)


@contextmanager
def turn(engine: Engine, topic_id: int, wait_seconds: float, maintenance: bool = False,
         poll_seconds: float = 2.0) -> Iterator[str]:
    """`with turn(...) as got:` the table's lock for a sync (or, `maintenance`, a maintenance) of the topic.
    `got` is "held" while this process holds it; "taken" when a run of the same kind holds it (that run does
    this one's work); "busy" when the other kind held it for all of `wait_seconds` (polled every
    `poll_seconds`: a sync waits for a maintenance to end and a maintenance for a sync, since the hourly sync
    and the daily maintenance meet now and then, and neither does the other's work)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        with exclusive(engine, topic_id, maintenance) as held:
            if held:
                yield "held"
                return
        if not lock_taken(engine, LOCK_CLASS, literal(topic_id)):
            time.sleep(0.05)  # its holder let go meanwhile: try again soon
            continue
        # looked at after the table's lock: a maintenance (or a topic delete) takes its own lock right after
        # that one. A delete's step is short, and neither kind's work: waited for, as the other kind is (the
        # sync then finds the topic deleted and says so)
        if not delete_running(engine, topic_id) and maintenance_running(engine, topic_id) == maintenance:
            yield "taken"
            return
        if time.monotonic() >= deadline:
            yield "busy"
            return
        time.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))
