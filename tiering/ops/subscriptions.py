"""Subscriptions: a named reader position per topic (Pulsar's subscription cursor, Pravega's reader group
position). The position is the last entry read (acknowledged); it moves forward only, by compare-and-set
(metadata/subscriptions.py), except by an explicit reset or when entries it had not read are deleted (then it
moves to the last deleted entry and the loss is recorded: metadata/trim.py).

An ack names the last entry read: it must be an entry of a live ledger (not trimmed, not past the end of
its ledger; an open ledger's end is its tier-1 file's), and not before the current position unless reset.
Acking the current position again changes only the ack time (an ack retried after a lost reply, or after
retention moved the subscription to exactly there): the reader is alive, so an EXPIRED subscription is ACTIVE
again.
"""
from __future__ import annotations

from dataclasses import dataclass
from tiering.errors import (BadInput, BeforeHead, ConditionalUpdateFailed, CorruptObjectError, LedgerNotFound,
                            LedgerStorageError, LedgerTrimmed, SubscriptionNotFound, TieringError, TopicNotFound)
from tiering.metadata.subscriptions import Backlog
from tiering.model import UNKNOWN_ENTRY_COUNT, Ledger, LedgerState, Position, Subscription
from tiering.ops.context import Deps
from tiering.policy import check_within_ledger
from tiering.read import ledger_extent, open_ledger_now

S = LedgerState
CAS_ATTEMPTS = 5  # an ack that keeps losing its compare-and-set to other acks or trims gives up, saying so


def open_entries(deps: Deps, led: Ledger) -> int:
    """Entries of the ledger: an open ledger's from its tier-1 file (metadata learns the count at seal). An
    open ledger without its file (a wrong TIERING_TIER1_ROOT, a lost file) is LedgerFileMissing, as for
    `read`: counted empty, an ack or a bound inside it would be refused as past its end."""
    if led.state == S.OPEN:
        return ledger_extent(deps.meta, deps.tier1, led)[1]
    return deps.tier1.extent(led)[0]


def _bound(deps: Deps, led: Ledger) -> int:
    """How many entries a position may name in the ledger: for a lost ledger whose entry count nobody knows
    (recovery found its id, no index), every entry a read counts in it but the last id, since a reader goes
    on at the entry after the position; its DATALOSS gap covers them."""
    return UNKNOWN_ENTRY_COUNT - 1 if led.entries_unknown else open_entries(deps, led)


def _last_entry(deps: Deps, topic: str, ledgers: list[Ledger]) -> Position | None:
    for led in reversed(ledgers):
        n = open_entries(deps, led)
        if n:
            return Position(led.ledger_id, n - 1)
    return None


def create(deps: Deps, topic: str, name: str, start: str = "earliest") -> Subscription:
    """`start`: "earliest" (nothing read: every live entry is unread), "latest" (everything written so far
    counts as read) or a position L:E, the first entry the subscription will read (L a live ledger, E at most
    its entry count; or N:0 of the ledger the topic writes next)."""
    # retention trimming the ledger the position was derived from, between the lookup and the insert: for
    # "latest" and N:0 of the next ledger a lost race, not bad input, so the lookup runs again (a ledger the
    # caller named is then refused as before the head)
    for _ in range(CAS_ATTEMPTS):
        try:
            return _create(deps, topic, name, start)
        except LedgerTrimmed:
            continue
    raise ConditionalUpdateFailed(f"subscription {name!r} of topic {topic!r}", "a stable end of the topic",
                                  f"{CAS_ATTEMPTS} trims meanwhile; create it again")


def _create(deps: Deps, topic: str, name: str, start: str) -> Subscription:
    ledgers = deps.meta.list_ledgers(topic)  # an unknown topic fails here
    if start == "earliest":
        return deps.meta.subs.create(topic, name, None)
    if start == "latest":
        live = [led for led in ledgers if led.state != S.DELETED]
        last = _last_entry(deps, topic, live)
        return deps.meta.subs.create(topic, name, last, live_ledger=None if last is None else last.ledger_id)
    first = Position.parse(start)
    led = next((x for x in ledgers if x.ledger_id == first.ledger_id), None)
    if led is None and first.entry_id == 0 and first.ledger_id == deps.meta.get_topic(topic).next_ledger_id:
        # N:0 of the ledger the topic writes next (as offload-prefix takes it): everything before counts as read
        before = _last_entry(deps, topic, [x for x in ledgers if x.state != S.DELETED])
        return deps.meta.subs.create(topic, name, before, live_ledger=None if before is None else before.ledger_id)
    if led is None:
        if ledgers and first.ledger_id < ledgers[0].ledger_id:
            raise BeforeHead(first, topic, f"its first ledger is {ledgers[0].ledger_id}")
        if ledgers and first.ledger_id < ledgers[-1].ledger_id:
            raise BadInput(f"topic {topic!r} has no ledger {first.ledger_id}")
        raise _no_ledger(deps, topic, first)
    if led.state == S.DELETED:
        raise BeforeHead(first, topic, f"ledger {led.ledger_id} was trimmed")
    check_within_ledger(first, led, _bound(deps, led))
    before = Position(first.ledger_id, first.entry_id - 1) if first.entry_id > 0 else \
        _last_entry(deps, topic, [x for x in ledgers if x.ledger_id < first.ledger_id])
    return deps.meta.subs.create(topic, name, before, live_ledger=first.ledger_id)


def ack(deps: Deps, topic: str, name: str, position: Position | None, reset: bool = False,
        reader: Subscription | None = None) -> Subscription:
    """Everything up to and including `position` is read. Refused (BadInput, nothing changed): a position
    before the current one without `reset`, in a trimmed ledger, or past the end of its ledger or topic.
    None with `reset`: nothing read, the next read starts at the topic's head (a replay of all it retains:
    an entry before the head, which a position would have to name, is always in a trimmed ledger).

    `reader`: the ack of a reader that has just delivered entries up to `position` (`read --ack`), with the
    subscription's row as it read it (or as its previous ack left it). Its position was right when it read:
    - the subscription is past it now (retention deleting entries it had not read, another reader): no
      mistake of the reader; the subscription stays where it is and only its ack time moves;
    - the subscription is behind where the reader found it (an `ack --reset` meanwhile: a replay asked for)
      or is another subscription of that name (deleted and created again) or gone: the reader's ack must not
      undo that. The first is left as it is (returned unchanged); the other two are a TieringError: what
      was printed is not acknowledged."""
    if position is None:  # (a reader acks what it printed: never None)
        if not reset:
            raise BadInput("earliest moves a subscription back to the topic's head: use --reset")
        for _ in range(CAS_ATTEMPTS):
            try:
                return deps.meta.subs.set_position(deps.meta.subs.get(topic, name), None)
            except ConditionalUpdateFailed:
                continue
        raise ConditionalUpdateFailed(f"subscription {name!r} of topic {topic!r}", "a stable position",
                                      f"{CAS_ATTEMPTS} concurrent changes; reset it again")
    for _ in range(CAS_ATTEMPTS):
        if reader is not None:
            sub = _readers_subscription(deps, reader)
            if reader.position is not None and (sub.position is None or sub.position < reader.position):
                return sub  # reset meanwhile: the replay the operator asked for stays
            if sub.position is not None and position < sub.position:
                position = sub.position
        else:
            sub = deps.meta.subs.get(topic, name)
        if sub.position is not None and position < sub.position and not reset:
            raise BadInput(f"position {position} is before the position of subscription {name!r} ({sub.position}): "
                           "a position never moves backwards (use --reset to move it back on purpose)"
                           + (f"; entries it had not read were deleted ({sub.last_loss_reason})"
                              if sub.last_loss_reason else ""))
        try:
            if position != sub.position:  # the same position again: only the ack time moves (the reader is alive)
                _check_entry(deps, topic, position)
            return deps.meta.subs.set_position(sub, position)
        except ConditionalUpdateFailed:
            continue  # another ack or a trim moved it meanwhile: decide again on the new row
        except BadInput:
            # a reader's position was right when it read: refused now, its subscription (or topic) went since
            # (a delete committed between the look above and these), which is that failure, not bad input
            if reader is not None:
                _readers_subscription(deps, reader)
            raise
    raise ConditionalUpdateFailed(f"subscription {name!r} of topic {topic!r}", "a stable position",
                                  f"{CAS_ATTEMPTS} concurrent changes; ack again")


def _readers_subscription(deps: Deps, reader: Subscription) -> Subscription:
    """The reader's subscription now: TieringError when it was deleted (and maybe created again: a new
    subscription of that name starts where it was created, not where this reader's old one was)."""
    what = f"subscription {reader.name!r} of topic {reader.topic!r}"
    try:
        sub = deps.meta.subs.get(reader.topic, reader.name)
    except (SubscriptionNotFound, TopicNotFound):
        raise TieringError(f"{what} was deleted while this read ran: the entries printed are not "
                           "acknowledged") from None
    if sub.subscription_id != reader.subscription_id:
        raise TieringError(f"{what} was deleted and created again while this read ran: the entries printed "
                           "are not acknowledged on the new one") from None
    return sub


def _no_ledger(deps: Deps, topic: str, position: Position) -> BadInput:
    """A position naming a ledger the topic does not hold: past its end, or below the ids it has made (a
    topic deleted and created again under its name starts after the old one's ledgers)."""
    if position.ledger_id < deps.meta.get_topic(topic).next_ledger_id:
        return BeforeHead(position, topic, f"it holds no ledger {position.ledger_id}")
    return BadInput(f"position {position} is beyond the end of topic {topic!r}")


def _check_entry(deps: Deps, topic: str, position: Position) -> None:
    try:
        led = deps.meta.get_ledger(topic, position.ledger_id)
    except LedgerNotFound:
        raise _no_ledger(deps, topic, position) from None
    if led.state == S.DELETED:
        raise BeforeHead(position, topic, f"ledger {led.ledger_id} was trimmed")
    count = _bound(deps, led)
    if position.entry_id >= count:
        raise BadInput(f"position {position} is beyond the end of ledger {led.ledger_id} ({count} entries)")


@dataclass(frozen=True)
class Listed:
    subscription: Subscription
    backlog_entries: int | None  # None: not known (`error` says why)
    backlog_bytes: int | None
    oldest_unread_at: object
    error: str | None = None  # why the backlog is not known: the topic's open ledger file could not be read


def list_subscriptions(deps: Deps, topic: str | None = None) -> list[Listed]:
    """Every subscription with its backlog; an open ledger's unread entries are counted from its tier-1 file
    (their bytes too: the file's payload bytes, prorated past a position inside it). A topic whose open
    ledger file is missing or unreadable has its subscriptions listed with the backlog unknown and `error`
    saying why (never counted as empty); the other topics' are listed as usual."""
    out = []
    opened: dict[tuple[str, int], tuple[int, int, object] | TieringError] = {}
    for sub, b in deps.meta.subs.with_backlog(topic):
        entries, size, oldest = b.entries, b.bytes, b.oldest_unread_at
        if b.open_ledger_id is not None:
            try:
                extra, extra_bytes, created = _open_part(deps, sub, b, opened)
            except (LedgerStorageError, CorruptObjectError) as exc:
                out.append(Listed(sub, None, None, oldest, str(exc)))
                continue
            entries += extra
            size += extra_bytes
            if extra and oldest is None:
                oldest = created
        out.append(Listed(sub, entries, size, oldest))
    return out


def _open_part(deps: Deps, sub: Subscription, b: Backlog, cache) -> tuple[int, int, object]:
    key = (sub.topic, b.open_ledger_id)
    if key not in cache:
        try:
            # the ledger's created_at came with the backlog: no statement per topic
            if deps.tier1.exists(sub.topic, b.open_ledger_id):
                counts = deps.tier1.written(sub.topic, b.open_ledger_id)
            else:  # sealed since (its row counts), or still open without its file: LedgerFileMissing, not empty
                now = open_ledger_now(deps.meta, deps.tier1, deps.meta.get_ledger(sub.topic, b.open_ledger_id))
                counts = (now.entry_count, now.size_bytes)
            cache[key] = (*counts, b.open_created_at)
        except (LedgerStorageError, CorruptObjectError) as exc:
            cache[key] = exc  # the topic's other subscriptions: the same error, the file not read again
    if isinstance(cache[key], TieringError):
        raise cache[key]
    count, size, created = cache[key]
    pos = sub.position
    read = 0 if pos is None or pos.ledger_id < b.open_ledger_id else (
        count if pos.ledger_id > b.open_ledger_id else min(pos.entry_id + 1, count))
    unread = count - read
    return unread, (size * unread // count if count else 0), created


def read_from(sub: Subscription) -> Position | None:
    """Where a read for the subscription starts: the entry after its position (None: the topic's start)."""
    return None if sub.position is None else Position(sub.position.ledger_id, sub.position.entry_id + 1)


def delete(deps: Deps, topic: str, name: str, dry_run: bool = False) -> Subscription:
    """The subscription deleted (it holds nothing back any more); `dry_run`: the same lookup and refusals,
    nothing deleted."""
    return deps.meta.subs.get(topic, name) if dry_run else deps.meta.subs.delete(topic, name)


__all__ = ["Listed", "ack", "create", "delete", "list_subscriptions", "open_entries", "read_from"]
