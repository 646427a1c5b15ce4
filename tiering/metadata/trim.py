"""The transactions that delete a topic's entries: retention, truncate, and a topic's deletion. Each decides
under locks (the topic row, then its subscriptions, then ledger and chunk rows: metadata/subscriptions.py) on
rows read in the same transaction, so what it deletes is what a consistent view allowed: a subscription
created, an ack landed or a policy changed before the locks is respected; one that comes after waits and
sees the trim. Entries a subscription had not read are deleted only past a ceiling, by a forced truncate,
from an EXPIRED subscription or without retain-unread, and every such loss is recorded with the deletion.
Each plans once more after locking the rows its plan names, so that its compare-and-set is on versions no
other writer can change before it commits (an offload running through the topic changes a row every few
milliseconds); one that still lost, because the plan named new rows each time, plans again (REPLANS).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from sqlalchemy import delete, func, literal, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Connection

from tiering import policy
from tiering.errors import (BadInput, ConditionalUpdateFailed, LedgerNotFound, TieringError, TopicBeingDeleted,
                            TopicReplaced)
from tiering.metadata.db import session_lock
from tiering.metadata.subscriptions import active, topic_row
from tiering.metadata.table_sync import WAIT_SECONDS, quiet_for_delete
from tiering.metadata.tables import topic, topic_table, topic_tombstone
from tiering.model import EXPIRED, Ledger, LedgerState, Position, Subscription, Topic

if TYPE_CHECKING:
    from tiering.metadata.repository import MetadataStore

S = LedgerState
R = TypeVar("R")

# A topic's delete holds this session lock (class, topic id) from before its first step to its end; a
# producer opening its next ledger takes it shared in that transaction, or is refused (TopicBeingDeleted). So
# a producer either opened its ledger before the delete began (and holds the ledger file's writer lock, which
# the delete's seal then fails on, before anything is deleted) or opens none until the delete has ended: a
# delete no longer deletes subscriptions and ledgers and then fails on a ledger a producer opened meanwhile.
DELETE_CLASS = 0x7464656c  # "tdel"


def topic_delete_fence(engine, topic_id: int):
    """`with topic_delete_fence(engine, topic_id):` held while a delete of the topic runs (waits for the
    producers opening a ledger right now; released with its connection if the process dies)."""
    return session_lock(engine, DELETE_CLASS, literal(topic_id), wait=True)


def refuse_while_deleted(conn: Connection, topic_name: str, topic_id: int) -> None:
    """In a producer's transaction opening a ledger: TopicBeingDeleted while a delete of the topic runs."""
    if not conn.execute(select(func.pg_try_advisory_xact_lock_shared(literal(DELETE_CLASS),
                                                                    literal(topic_id)))).scalar_one():
        raise TopicBeingDeleted(topic_name)


# A trim's first plan reads rows it has not locked: a repair moving a chunk, delete-lagged dropping a tier-1
# flag or an offload claiming or committing between the plan and the locks changes a planned row's version.
# So it locks the rows a plan names and plans again, until a plan names no row it has not locked (the plan
# may grow: an offload's commit can let retention take more); a bound keeps a trim whose plan keeps growing,
# or whose compare-and-set still lost, from spinning (it then fails, changing nothing).
REPLANS = 5


@dataclass(frozen=True)
class Loss:
    subscription: str
    entries: int
    bytes: int
    first: Position
    last: Position
    reason: str


@dataclass
class TrimResult:
    deleted: list[Ledger] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)  # ledger id -> why it went
    losses: list[Loss] = field(default_factory=list)


class Trims:
    def __init__(self, store: "MetadataStore"):
        self.store = store
        self.engine = store.engine

    # ----------------------------------------------------------------------------------------- retention
    def retention(self, topic_name: str, gc_delay: timedelta) -> TrimResult:
        """Delete what retention allows now for one topic (policy.retention_plan, planned again under the
        locks), recording the unread entries it took from each subscription."""
        return _replanning(lambda: self._retention(topic_name, gc_delay))

    def _retention(self, topic_name: str, gc_delay: timedelta) -> TrimResult:
        with self.engine.begin() as conn:
            t = topic_row(conn, topic_name, "NO KEY UPDATE")
            subs = self.store.subs.of_topic(conn, t.topic_id, lock=True)
            plan = _under_row_locks(self.store, conn, lambda: self.store.planning.retention_plan(
                topic_name, conn=conn).get(topic_name, []), lambda p: [led for led, _ in p])
            if not plan:
                return TrimResult()
            _check_holds(t, subs, plan)
            reasons = {led.ledger_id: why for led, why in plan}
            deleted = self.store.delete_ledgers_in(conn, [led for led, _ in plan], "retention", gc_delay,
                                                   states=(S.SEALED, S.OFFLOADING, S.OFFLOADED))
            losses = []
            done = [(led, reasons[led.ledger_id]) for led in deleted]
            for sub in subs:
                loss = policy.unread_loss(sub.position, deleted)
                if loss.entries:
                    losses.append(self._record(conn, sub, loss, policy.retention_loss_reason(
                        sub.position, done, t.policy.retain_unread, sub.state == EXPIRED)))
            return TrimResult(deleted, reasons, losses)

    # ------------------------------------------------------------------------------------------ truncate
    def truncate(self, topic_name: str, before: Position, force: bool, gc_delay: timedelta,
                 dry_run: bool = False, open_entries: Callable[[Ledger], int] | None = None) -> TrimResult:
        """Delete every whole ledger before `before`'s ledger (never the open one). Refused (BadInput, nothing
        changed) when that deletes entries an ACTIVE subscription has not read, unless `force`, which records
        the loss. `dry_run`: the same decision, without locks, returning what it would delete and take from
        each subscription; nothing is written. A position past the end of its ledger is refused too (BadInput):
        a sealed or trimmed ledger's entry count, the open ledger's `open_entries(ledger)` (its tier-1 file's
        count: metadata learns it only at seal; without it the open ledger's entry id is not checked)."""
        return _replanning(lambda: self._truncate(topic_name, before, force, gc_delay, dry_run, open_entries))

    def _truncate(self, topic_name: str, before: Position, force: bool, gc_delay: timedelta,
                  dry_run: bool, open_entries: Callable[[Ledger], int] | None = None) -> TrimResult:
        with self.engine.begin() as conn:
            t = topic_row(conn, topic_name, "" if dry_run else "NO KEY UPDATE")
            subs = self.store.subs.of_topic(conn, t.topic_id, lock=not dry_run)
            def plan() -> tuple[int | None, list[Ledger]]:
                return self.store.planning.truncate_before(t.topic_id, t.name, before.ledger_id, conn=conn)
            # (a dry run locks nothing: it answers from one read)
            last, doomed = plan() if dry_run else _under_row_locks(self.store, conn, plan, lambda p: p[1])
            # with no ledger left (all trimmed, or a topic made again under a deleted one's name), the ids
            # below the next one are the topic's past: a position there has nothing before it to delete
            end = last if last is not None else t.next_ledger_id - 1
            if before.ledger_id > end and not _at_sealed_end(self.store, conn, t, last, before):
                raise BadInput(f"position {before} is beyond the end of the topic")
            _check_entry(self.store, conn, t.name, before, open_entries)
            if not force:
                for sub in active(subs):
                    loss = policy.unread_loss(sub.position, doomed)
                    if loss.entries:
                        raise BadInput(
                            f"truncate before {before} would delete {loss.entries} entries subscription {sub.name!r} "
                            f"has not read (its position: {sub.position or 'nothing read'}); use --force to delete "
                            "them anyway (the loss is recorded)")
            if dry_run:
                return TrimResult(list(doomed), {led.ledger_id: "truncate" for led in doomed},
                                  _unrecorded(subs, doomed, f"truncate before {before}", force))
            # an OFFLOADING ledger goes too, as topic deletion takes it: its attempt's commit loses its
            # compare-and-set and the attempt's objects are collected (its keys stay queued)
            deleted = self.store.delete_ledgers_in(conn, doomed, f"truncate before {before}", gc_delay,
                                                   states=(S.SEALED, S.OFFLOADING, S.OFFLOADED))
            losses = []
            for sub in subs:
                loss = policy.unread_loss(sub.position, deleted)
                if loss.entries:
                    note = " (subscription expired)" if sub.state == EXPIRED else " --force" if force else ""
                    losses.append(self._record(conn, sub, loss, f"truncate before {before}{note}"))
            return TrimResult(deleted, {led.ledger_id: "truncate" for led in deleted}, losses)

    # ---------------------------------------------------------------------------------- topic deletion
    def begin_topic_delete(self, topic_name: str, force: bool, dry_run: bool = False
                           ) -> tuple[Topic, list[Subscription]]:
        """Step 1 of deleting a topic: refused (BadInput, nothing changed) while ACTIVE subscriptions read it,
        unless `force`; returns the topic and its subscriptions. Nothing is deleted here: the subscriptions
        go in step 2, with the ledgers they read, so a delete that fails before (a producer still writing)
        leaves them with the topic. `dry_run`: the same refusal and answer, no lock taken."""
        with self.engine.connect() if dry_run else self.engine.begin() as conn:
            t = topic_row(conn, topic_name, "" if dry_run else "UPDATE")
            subs = self.store.subs.of_topic(conn, t.topic_id, lock=not dry_run)
            readers = active(subs)
            if readers and not force:
                raise BadInput(_readers_refusal(topic_name, readers) + "; delete them first or use --force")
            return t, subs

    def delete_fence(self, topic_id: int):
        """`with trims.delete_fence(topic_id):` around a topic delete's steps (topic_delete_fence)."""
        return topic_delete_fence(self.engine, topic_id)

    def _no_new_readers(self, conn: Connection, t: Topic, force: bool, late: list[str] | None) -> None:
        """Steps 2 and 3, under the topic row's lock (which a subscription's creation shares): the topic's
        subscriptions are deleted (their names appended to `late`), an ACTIVE one only with `force`; one
        ACTIVE without it was created (or acknowledged) since step 1 refused those, and is refused as step 1
        refuses one (its reader would lose what the step deletes)."""
        subs = self.store.subs.of_topic(conn, t.topic_id, lock=True)
        if not subs:
            return
        readers = active(subs)
        if readers and not force:
            raise TieringError(_readers_refusal(t.name, readers) + " created while the topic was being deleted; "
                               "delete them or use --force, and run topic delete again")
        self.store.subs.delete_all(conn, t.topic_id)
        if late is not None:
            late += [s.name for s in subs]

    def delete_all_ledgers(self, topic_name: str, gc_delay: timedelta, force: bool = False,
                           late: list[str] | None = None, topic_id: int | None = None,
                           table_wait_seconds: float = WAIT_SECONDS,
                           on_wait: Callable[[], None] | None = None) -> list[Ledger]:
        """Step 2: every live ledger DELETED, chunks removed, keys queued for GC, the table's sync row
        dropped (one transaction; the Iceberg table itself stays), while no sync or maintenance of the
        topic's table runs (it waits up to `table_wait_seconds` for one, calling `on_wait` when it starts
        to: quiet_for_delete). The open
        ledger must have been sealed (by its writer's lock: ops/topics.py); an offload in flight loses its
        commit and its objects are collected. `topic_id`: the topic step 1 found (TopicReplaced when the
        name is another topic's now)."""
        if topic_id is None:
            topic_id = self.store.get_topic(topic_name).topic_id
        with quiet_for_delete(self.engine, topic_name, topic_id, table_wait_seconds, on_wait=on_wait):
            return _replanning(lambda: self._delete_all_ledgers(topic_name, gc_delay, force, late, topic_id))

    def _delete_all_ledgers(self, topic_name: str, gc_delay: timedelta, force: bool,
                            late: list[str] | None, topic_id: int | None = None) -> list[Ledger]:
        with self.engine.begin() as conn:
            # NO KEY UPDATE, as retention: it keeps out new subscriptions (FOR SHARE) and producers' next
            # ledger (an UPDATE of the row) but not the FOR KEY SHARE a commit holding planned ledger rows
            # takes through its totals trigger, which FOR UPDATE would deadlock with while this waits for
            # those rows (the commit wins, the compare-and-set below loses and the step plans again)
            t = _same_topic(topic_row(conn, topic_name, "NO KEY UPDATE"), topic_id)
            self._no_new_readers(conn, t, force, late)
            live = _under_row_locks(self.store, conn, lambda: [
                led for led in self.store.list_ledgers(topic_name, conn=conn) if led.state != S.DELETED])
            if any(led.state == S.OPEN for led in live):
                raise TieringError(f"topic {topic_name!r} has an open ledger again (a producer is writing); stop it "
                                   "and run topic delete again")
            deleted = self.store.delete_ledgers_in(conn, live, f"topic {t.name} deleted", gc_delay,
                                                   states=(S.SEALED, S.OFFLOADING, S.OFFLOADED))
            # with the ledgers: a sync finding the row later would follow their deletion as retention's
            conn.execute(delete(topic_table).where(topic_table.c.topic_id == t.topic_id))
            return deleted

    def finish_topic_delete(self, topic_name: str, marker: int, force: bool = False,
                            late: list[str] | None = None, topic_id: int | None = None) -> Topic:
        """Step 3: the topic row goes (its ledgers, subscriptions, attributes and totals with it), leaving a
        tombstone with the next ledger id and the trim marker written (`marker`), once nothing live and no
        tier-1 copy is left. `topic_id` as in delete_all_ledgers."""
        with self.engine.begin() as conn:
            t = _same_topic(topic_row(conn, topic_name, "UPDATE"), topic_id)
            self._no_new_readers(conn, t, force, late)
            left = conn.execute(text("""
                SELECT count(*) FILTER (WHERE state <> 'DELETED') AS live, count(*) FILTER (WHERE tier1_present) AS copies
                FROM tiering.ledger WHERE topic_id = :tid"""), {"tid": t.topic_id}).one()
            if left.live or left.copies:
                raise TieringError(f"topic {topic_name!r} still has {left.live} live ledger(s) and {left.copies} "
                                   "tier-1 cop(ies) (written meanwhile?); run topic delete again")
            conn.execute(pg_insert(topic_tombstone).values(name=t.name, next_ledger_id=t.next_ledger_id,
                                                           trim_marker_written=marker, version=t.version)
                         .on_conflict_do_update(index_elements=["name"], set_={
                             "next_ledger_id": t.next_ledger_id, "trim_marker_written": marker,
                             "version": t.version, "deleted_at": text("now()")}))
            conn.execute(delete(topic).where(topic.c.topic_id == t.topic_id))
            return t

    # ------------------------------------------------------------------------------------------ helpers
    def _record(self, conn: Connection, sub: Subscription, loss: policy.UnreadLoss, reason: str) -> Loss:
        self.store.subs.record_loss(conn, sub, loss, reason)
        return Loss(sub.name, loss.entries, loss.bytes, loss.first, loss.new_position, reason)


def _same_topic(t: Topic, topic_id: int | None) -> Topic:
    """`t`, unless the delete began on another topic of that name: two deletes ran at once and the faster
    one's topic was created again since; everything here goes by name, so going on would delete the new one."""
    if topic_id is not None and t.topic_id != topic_id:
        raise TopicReplaced(t.name)
    return t


def _under_row_locks(store: "MetadataStore", conn: Connection, plan: Callable[[], R],
                     ledgers_of: Callable[[R], Sequence[Ledger]] = lambda p: p) -> R:
    """`plan()`, made again in `conn`'s transaction once every ledger and chunk row it names is locked (FOR
    UPDATE, before the trim's first change: repository.lock_rows), until a plan names no row not yet locked.
    The versions that plan read are then the rows' own until the transaction ends: no claim or commit of an
    offload can land between them and the compare-and-set. Rows a plan no longer names stay locked
    until the end of the transaction, changed by nothing."""
    locked: set[tuple[int, int]] = set()
    made = plan()
    for _ in range(REPLANS):
        new = [led for led in ledgers_of(made) if (led.topic_id, led.ledger_id) not in locked]
        if not new:
            break
        store.lock_rows(conn, new, chunks=True)
        locked.update((led.topic_id, led.ledger_id) for led in new)
        made = plan()
    return made


def _replanning(attempt: Callable[[], R]) -> R:
    """Run one trim transaction, planning it again when its compare-and-set lost (REPLANS)."""
    for _ in range(REPLANS - 1):
        try:
            return attempt()
        except ConditionalUpdateFailed:
            pass
    return attempt()


def _at_sealed_end(store: "MetadataStore", conn: Connection, t: Topic, last: int | None, before: Position) -> bool:
    """Whether `before` is the topic's end with no open ledger, the next ledger's `N:0` (as read and
    offload-prefix take it): truncating there deletes every sealed ledger."""
    if before != Position(t.next_ledger_id, 0):
        return False
    return last is None or store.get_ledger(t.name, last, conn).state != S.OPEN


def _check_entry(store: "MetadataStore", conn: Connection, topic_name: str, before: Position,
                 open_entries: Callable[[Ledger], int] | None) -> None:
    """The position's entry id must be within its ledger, as for a read: at most its entry count (one past its
    last entry is its end)."""
    try:
        led = store.get_ledger(topic_name, before.ledger_id, conn)
    except LedgerNotFound:
        return  # no row for that id below the last ledger: nothing to measure it against
    if led.state == S.OPEN and open_entries is None:
        return
    policy.check_within_ledger(before, led, open_entries(led) if led.state == S.OPEN else led.entry_count)


def _unrecorded(subs: Sequence[Subscription], doomed: Sequence[Ledger], reason: str, force: bool) -> list[Loss]:
    """The losses a truncate would record, for its dry run."""
    out = []
    for sub in subs:
        loss = policy.unread_loss(sub.position, doomed)
        if loss.entries:
            note = " (subscription expired)" if sub.state == EXPIRED else " --force" if force else ""
            out.append(Loss(sub.name, loss.entries, loss.bytes, loss.first, loss.new_position, reason + note))
    return out


def _check_holds(t: Topic, subs: Sequence[Subscription], plan: Sequence[tuple[Ledger, str]]) -> None:
    """The planning query and the specification agree that no ledger retention takes by time or size is
    unread by an ACTIVE subscription of a topic retaining unread data; a disagreement stops the deletion."""
    if not t.policy.retain_unread:
        return
    for led, why in plan:
        if why in ("time", "size"):
            for sub in active(subs):
                if not policy.is_read(sub.position, led):
                    raise TieringError(f"retention of {t.name!r} planned ledger {led.ledger_id} ({why}) which "
                                       f"subscription {sub.name!r} has not read; nothing deleted")


def _readers_refusal(topic_name: str, readers: list[Subscription]) -> str:
    names = ", ".join(repr(s.name) for s in readers[:5]) + (" ..." if len(readers) > 5 else "")
    return f"topic {topic_name!r} has {len(readers)} active subscription(s) ({names})"
