"""Subscription rows (migration 0006): a named reader position per topic, changed only by compare-and-set on
`version`, and the losses recorded when entries a subscription had not read are deleted.

The locking order every writer follows (so none waits in a cycle): the topic row, then its subscriptions,
then ledger and chunk rows (retention, truncate and topic deletion: metadata/trim.py). Creating a subscription
takes the topic row FOR SHARE, so it is ordered with retention's FOR NO KEY UPDATE: a subscription created
while retention runs sees the trimmed head, never a position retention is deleting under it. An ack locks its
subscription row only: retention, holding that row, decides on the acked position or the ack waits and then
sees retention's move.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from tiering.errors import (BadInput, BeforeHead, ConditionalUpdateFailed, LedgerTrimmed, SubscriptionNotFound,
                            TopicNotFound)
from tiering.metadata.planning import _ACTIVE, _NOW
from tiering.metadata.tables import attribute, ledger, subscription, subscription_loss, topic
from tiering.model import ACTIVE, Position, Subscription, Topic, check_subscription_name, check_topic_name
from tiering.policy import UnreadLoss

_STATE = f"CASE WHEN {_ACTIVE} THEN 'ACTIVE' ELSE 'EXPIRED' END"
_COLS = f"""s.subscription_id, s.topic_id, t.name AS topic, s.name, s.ack_ledger_id, s.ack_entry_id, s.created_at,
    s.last_ack_at, {_STATE} AS state, s.entries_deleted_unread, s.bytes_deleted_unread, s.last_loss_at,
    s.last_loss_reason, s.version"""


def _sub(r) -> Subscription:
    pos = None if r.ack_ledger_id is None else Position(r.ack_ledger_id, r.ack_entry_id)
    return Subscription(r.subscription_id, r.topic_id, r.topic, r.name, pos, r.created_at, r.last_ack_at, r.state,
                        r.entries_deleted_unread, r.bytes_deleted_unread, r.last_loss_at, r.last_loss_reason,
                        r.version)


@dataclass(frozen=True)
class Backlog:
    """What a subscription has not read among the topic's sealed ledgers (the open ledger's length is in its
    tier-1 file: ops/subscriptions.py adds it), and the opening time of the ledger holding its first unread
    entry (None: nothing unread)."""
    entries: int
    bytes: int
    oldest_unread_at: object
    open_ledger_id: int | None  # the topic's OPEN ledger, if any, for the caller to add
    open_created_at: object = None  # its created_at (the oldest unread time when only it is unread)


# Per subscription: its unread part of each live ledger from its position on (index ledger_live_by_topic, a
# range from the position: the cost follows the backlog, not the topic's history). A partly read ledger's
# bytes are prorated by entries (policy.backlog is the specification). BACKLOG_LATERAL is that subquery for
# subscription `s` (entries, bytes, oldest_unread_at), shared with tiering/metrics.py and tiering/dashboard.py.
BACKLOG_LATERAL = """(
        SELECT COALESCE(sum(u.unread), 0)::bigint AS entries,
               COALESCE(sum(u.size_bytes * u.unread / u.entry_count), 0)::bigint AS bytes,
               min(u.created_at) FILTER (WHERE u.unread > 0) AS oldest_unread_at
        FROM (SELECT l.entry_count, l.size_bytes, l.created_at,
                     l.entry_count - CASE WHEN l.ledger_id = s.ack_ledger_id
                                          THEN least(s.ack_entry_id, l.entry_count - 1) + 1 ELSE 0 END AS unread
              FROM tiering.ledger l
              WHERE l.topic_id = s.topic_id AND l.state <> 'DELETED' AND l.entry_count > 0
                AND l.ledger_id >= COALESCE(s.ack_ledger_id, -1)) u)"""
_BACKLOG = f"""
    SELECT {_COLS}, b.entries, b.bytes, b.oldest_unread_at, o.ledger_id AS open_ledger_id,
           o.created_at AS open_created_at
    FROM tiering.subscription s JOIN tiering.topic t ON t.topic_id = s.topic_id
    CROSS JOIN LATERAL {BACKLOG_LATERAL} b
    LEFT JOIN tiering.ledger o ON o.topic_id = s.topic_id AND o.state = 'OPEN'
    WHERE (CAST(:topic AS text) IS NULL OR t.name = :topic)
    ORDER BY t.name, s.name"""


class Subscriptions:
    def __init__(self, engine: Engine):
        self.engine = engine

    # ------------------------------------------------------------------------------------------- reads
    def get(self, topic_name: str, name: str, conn: Connection | None = None, lock: bool = False) -> Subscription:
        check_topic_name(topic_name, existing=True)
        check_subscription_name(name)
        sql = f"""SELECT {_COLS} FROM tiering.subscription s
                  JOIN tiering.topic t ON t.topic_id = s.topic_id WHERE t.name = :topic AND s.name = :name"""
        if lock:
            sql += " FOR UPDATE OF s"
        params = {"topic": topic_name, "name": name, "now": None}
        if conn is None:
            with self.engine.connect() as c:
                row = c.execute(text(sql), params).one_or_none()
        else:
            row = conn.execute(text(sql), params).one_or_none()
        if row is None:
            self._topic(topic_name, conn)
            raise SubscriptionNotFound(topic_name, name)
        return _sub(row)

    def of_topic(self, conn: Connection, topic_id: int, lock: bool = False) -> list[Subscription]:
        """Every subscription of the topic, by id (FOR UPDATE with `lock`: the order every locker uses)."""
        sql = f"""SELECT {_COLS} FROM tiering.subscription s JOIN tiering.topic t ON t.topic_id = s.topic_id
                  WHERE s.topic_id = :tid ORDER BY s.subscription_id""" + (" FOR UPDATE OF s" if lock else "")
        return [_sub(r) for r in conn.execute(text(sql), {"tid": topic_id, "now": None})]

    def of_topics(self, names: Sequence[str]) -> dict[str, list[Subscription]]:
        """The subscriptions of the named topics, by topic name (one statement)."""
        if not names:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(text(f"""SELECT {_COLS} FROM tiering.subscription s
                                         JOIN tiering.topic t ON t.topic_id = s.topic_id
                                         WHERE t.name = ANY(CAST(:names AS text[])) ORDER BY t.name, s.name"""),
                                {"names": list(names), "now": None}).all()
        out: dict[str, list[Subscription]] = {}
        for r in rows:
            out.setdefault(r.topic, []).append(_sub(r))
        return out

    def with_backlog(self, topic_name: str | None = None) -> list[tuple[Subscription, Backlog]]:
        """Every subscription (of one topic, or all) with its backlog, ordered by topic and name; one
        statement in one snapshot."""
        if topic_name is not None:
            self._topic(topic_name)
        with self.engine.connect() as conn:
            rows = conn.execute(text(_BACKLOG), {"topic": topic_name, "now": None}).all()
        return [(_sub(r), Backlog(r.entries, r.bytes, r.oldest_unread_at, r.open_ledger_id,
                                             r.open_created_at)) for r in rows]

    # ------------------------------------------------------------------------------------------ writes
    def create(self, topic_name: str, name: str, position: Position | None,
               live_ledger: int | None = None) -> Subscription:
        """A new subscription at `position` (the last entry it counts as read; None: nothing). The topic row
        is held FOR SHARE: retention cannot trim meanwhile, and `live_ledger` (the ledger holding the first
        entry it will read, when the caller derived the position from one) must still be live."""
        check_subscription_name(name, new=True)
        try:
            with self.engine.begin() as conn:
                t = self._topic(topic_name, conn, "FOR SHARE")
                if live_ledger is not None:
                    state = conn.execute(select(ledger.c.state).where(
                        ledger.c.topic_id == t.topic_id, ledger.c.ledger_id == live_ledger)).scalar_one_or_none()
                    if state is None or state == "DELETED":
                        raise LedgerTrimmed(topic_name, live_ledger)
                conn.execute(insert(subscription).values(
                    topic_id=t.topic_id, name=name, ack_ledger_id=None if position is None else position.ledger_id,
                    ack_entry_id=None if position is None else position.entry_id))
                return self.get(topic_name, name, conn)
        except IntegrityError as exc:
            if "subscription_name_per_topic" in str(exc.orig):
                raise BadInput(f"subscription {name!r} of topic {topic_name!r} already exists") from None
            raise

    def set_position(self, sub: Subscription, position: Position | None) -> Subscription:
        """Compare-and-set the position (an ack, or a reset; None: nothing read): the row must still be at
        `sub.version`, and the position's ledger must not have been trimmed meanwhile (read after the row
        lock, which retention holds until it commits: a trim that raced this ack is seen here)."""
        with self.engine.begin() as conn:
            current = self.get(sub.topic, sub.name, conn, lock=True)
            # the same row, not only the same version: a subscription deleted and made again under its name
            # starts at version 0 too
            if (current.subscription_id, current.version) != (sub.subscription_id, sub.version):
                raise ConditionalUpdateFailed(f"subscription {sub.name!r} of topic {sub.topic!r}",
                                              f"id {sub.subscription_id} at version {sub.version}",
                                              f"id {current.subscription_id} at version {current.version}")
            if position is not None:
                state = conn.execute(select(ledger.c.state).where(
                    ledger.c.topic_id == sub.topic_id, ledger.c.ledger_id == position.ledger_id)).scalar_one_or_none()
                if position != current.position and (state is None or state == "DELETED"):
                    raise BeforeHead(position, sub.topic, f"ledger {position.ledger_id} was trimmed")
            done = conn.execute(update(subscription).where(subscription.c.subscription_id == sub.subscription_id)
                                .values(ack_ledger_id=None if position is None else position.ledger_id,
                                        ack_entry_id=None if position is None else position.entry_id,
                                        last_ack_at=func.now(), version=subscription.c.version + 1))
            if done.rowcount != 1:  # the row is locked above: cannot happen, and must not pass silently
                raise ConditionalUpdateFailed(f"subscription {sub.name!r} of topic {sub.topic!r}",
                                              "one row updated", f"{done.rowcount}")
            return self.get(sub.topic, sub.name, conn)

    def delete(self, topic_name: str, name: str) -> Subscription:
        with self.engine.begin() as conn:
            sub = self.get(topic_name, name, conn, lock=True)
            conn.execute(delete(subscription).where(subscription.c.subscription_id == sub.subscription_id))
            return sub

    def delete_all(self, conn: Connection, topic_id: int) -> int:
        return conn.execute(delete(subscription).where(subscription.c.topic_id == topic_id)).rowcount

    def record_loss(self, conn: Connection, sub: Subscription, loss: UnreadLoss, reason: str) -> None:
        """Entries `sub` had not read were deleted: move it to the last deleted entry, add to its counters, log
        the range (same transaction as the deletion; the caller holds the row locked)."""
        conn.execute(update(subscription).where(subscription.c.subscription_id == sub.subscription_id)
                     .values(ack_ledger_id=loss.new_position.ledger_id, ack_entry_id=loss.new_position.entry_id,
                             entries_deleted_unread=subscription.c.entries_deleted_unread + loss.entries,
                             bytes_deleted_unread=subscription.c.bytes_deleted_unread + loss.bytes,
                             last_loss_at=func.now(), last_loss_reason=reason,
                             version=subscription.c.version + 1))
        conn.execute(insert(subscription_loss).values(
            subscription_id=sub.subscription_id, reason=reason, from_ledger_id=loss.first.ledger_id,
            from_entry_id=loss.first.entry_id, to_ledger_id=loss.new_position.ledger_id,
            to_entry_id=loss.new_position.entry_id, entries=loss.entries, bytes=loss.bytes))

    def record_discard(self, topic_name: str, topic_id: int, ledger_id: int, kept: int, last: int,
                       payload_bytes: int) -> list[tuple[str, int]] | None:
        """Before an open ledger is sealed with `seal --discard-damaged` cutting entries `kept`..`last` (at
        least: a reader's position may show more): each subscription that had not read them all loses them
        (counted and logged as a deletion of unread entries is, its bytes prorated from `payload_bytes`), and
        one positioned inside the cut moves back to the last entry kept (a position names an entry that
        exists). One transaction, which also records the discard as the ledger's attribute DISCARD_KEY: a
        rerun after a kill before the cut finds it and changes nothing again (returns None). Returns
        (subscription, entries lost) for those that lost any."""
        with self.engine.begin() as conn:
            t = self._topic(topic_name, conn, "FOR SHARE")
            if t.topic_id != topic_id or conn.execute(select(attribute.c.value).where(
                    attribute.c.topic_id == topic_id, attribute.c.ledger_id == ledger_id,
                    attribute.c.key == DISCARD_KEY)).scalar_one_or_none() is not None:
                return None
            subs = self.of_topic(conn, topic_id, lock=True)
            last = max([last] + [s.position.entry_id for s in subs
                                 if s.position is not None and s.position.ledger_id == ledger_id])
            back = Position(ledger_id, kept - 1) if kept else _entry_before(conn, topic_id, ledger_id)
            reason = f"ledger {ledger_id} sealed with --discard-damaged: entries {kept} to {last} discarded"
            per_entry = payload_bytes / (last - kept + 1)
            lost = []
            for sub in subs:
                at = sub.position
                if at is None or at.ledger_id < ledger_id:
                    read_to = -1  # nothing of the ledger read
                elif at.ledger_id == ledger_id:
                    read_to = at.entry_id
                else:
                    read_to = last  # past it: all of it read
                unread = last - max(read_to, kept - 1)
                moved = back if read_to >= kept else sub.position
                if unread <= 0 and moved == sub.position:
                    continue
                values = {"version": subscription.c.version + 1,
                          "ack_ledger_id": None if moved is None else moved.ledger_id,
                          "ack_entry_id": None if moved is None else moved.entry_id}
                if unread > 0:
                    first = Position(ledger_id, max(read_to + 1, kept))
                    values.update(entries_deleted_unread=subscription.c.entries_deleted_unread + unread,
                                  bytes_deleted_unread=subscription.c.bytes_deleted_unread
                                  + round(per_entry * unread), last_loss_at=func.now(), last_loss_reason=reason)
                    conn.execute(insert(subscription_loss).values(
                        subscription_id=sub.subscription_id, reason=reason, from_ledger_id=first.ledger_id,
                        from_entry_id=first.entry_id, to_ledger_id=ledger_id, to_entry_id=last, entries=unread,
                        bytes=round(per_entry * unread)))
                    lost.append((sub.name, unread))
                conn.execute(update(subscription).where(subscription.c.subscription_id == sub.subscription_id)
                             .values(**values))
            conn.execute(insert(attribute).values(topic_id=topic_id, ledger_id=ledger_id, key=DISCARD_KEY,
                                                  value=kept))
            return lost

    # ----------------------------------------------------------------------------------------- helpers
    def _topic(self, name: str, conn: Connection | None = None, lock: str = "") -> Topic:
        if conn is None:
            with self.engine.connect() as c:
                return topic_row(c, name, lock)
        return topic_row(conn, name, lock)


# The row lock each writer takes on its topic, in the order of this module's docstring: FOR SHARE (a new
# subscription), FOR NO KEY UPDATE (retention, truncate: producers' ledger inserts still pass), FOR UPDATE
# (topic deletion's first and last steps; its step deleting the ledgers takes NO KEY UPDATE, as retention);
# "" reads without a lock.
_LOCKS = {"": {}, "FOR SHARE": {"read": True}, "NO KEY UPDATE": {"key_share": True}, "UPDATE": {}}


def topic_row(conn: Connection, name: str, lock: str = "") -> Topic:
    """The topic `name`, its row locked as `lock` says; TopicNotFound when there is none."""
    from tiering.metadata.repository import _topic_row  # one row mapper for topics

    check_topic_name(name, existing=True)
    q = select(topic).where(topic.c.name == name)
    if lock:
        q = q.with_for_update(**_LOCKS[lock])
    row = conn.execute(q).one_or_none()
    if row is None:
        raise TopicNotFound(name)
    return _topic_row(row)

# the attribute of a ledger sealed with `seal --discard-damaged`: the first entry it discarded
DISCARD_KEY = "tiering.discarded_from"


def _entry_before(conn: Connection, topic_id: int, ledger_id: int) -> Position | None:
    """The last entry of the topic before ledger `ledger_id` (of any state: a position may name a deleted
    ledger's, as retention leaves it), None when there is none: where a reader that has read nothing of the
    ledger stands."""
    row = conn.execute(select(ledger.c.ledger_id, ledger.c.entry_count).where(
        ledger.c.topic_id == topic_id, ledger.c.ledger_id < ledger_id, ledger.c.entry_count > 0)
        .order_by(ledger.c.ledger_id.desc()).limit(1)).one_or_none()
    return None if row is None else Position(row.ledger_id, row.entry_count - 1)


def active(subs: Sequence[Subscription]) -> list[Subscription]:
    return [s for s in subs if s.state == ACTIVE]


__all__ = ["BACKLOG_LATERAL", "Backlog", "Subscriptions", "active", "topic_row"]
