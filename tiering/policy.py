"""Which ledgers qualify for each pipeline operation: pure functions over metadata rows (no I/O).

The rules follow Pulsar (offload by age/size, deletion lag, offloadPrefix) and Pravega PDP-19 (retention by
time and size as head truncation). Every function takes `now` explicitly so tests pin time.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable, Mapping, Sequence

from tiering.errors import BadInput
from tiering.model import Chunk, Ledger, LedgerState, Position, TopicPolicy

S = LedgerState
_LIVE = (S.OPEN, S.SEALED, S.OFFLOADING, S.OFFLOADED)


def _offloadable(led: Ledger) -> bool:
    return led.state == S.SEALED and led.entry_count > 0


def offload_by_age(ledgers: Sequence[Ledger], policy: TopicPolicy, now: datetime) -> list[Ledger]:
    """Sealed, non-empty ledgers sealed at least `offload_after_seconds` ago (-1: never; 0: at once)."""
    if policy.offload_after_seconds < 0:
        return []
    cutoff = now - timedelta(seconds=policy.offload_after_seconds)
    return [led for led in ledgers if _offloadable(led) and led.sealed_at <= cutoff]


def offload_by_size(ledgers: Sequence[Ledger], policy: TopicPolicy,
                    open_sizes: Mapping[int, int] | None = None) -> list[Ledger]:
    """Pulsar's rule: walk ledgers newest to oldest summing their sizes (offloaded ones included); every
    ledger not yet offloaded once the sum exceeds the threshold is offloaded, oldest first.

    `open_sizes` gives the live size of the open ledger (metadata records sizes at seal time)."""
    if policy.offload_threshold_bytes < 0:
        return []
    open_sizes = open_sizes or {}
    total, chosen = 0, []
    for led in sorted(ledgers, key=lambda x: x.ledger_id, reverse=True):
        if led.state not in _LIVE:
            continue
        total += open_sizes.get(led.ledger_id, led.size_bytes) if led.state == S.OPEN else led.size_bytes
        if total > policy.offload_threshold_bytes and _offloadable(led):
            chosen.append(led)
    return chosen[::-1]


def offload_prefix(ledgers: Sequence[Ledger], position: Position, open_entries: int | None = None,
                   first_ledger: int = 0) -> list[Ledger]:
    """Pulsar's offloadPrefix: every sealed, non-empty ledger wholly before the position: with an id below
    the position's ledger, or the position's own ledger when the position is one past its last entry (a
    sealed ledger's `L:<entry count>`, so the last sealed ledger can be offloaded by hand). The end of the
    topic is a position too: `end_of_sealed`, or the next ledger's `N:0` after a seal.

    A position before the first ledger or beyond the end of the topic is an error, as is one past the end of
    its ledger: a sealed ledger's entry count, the open ledger's `open_entries` (its tier-1 file's count, which
    metadata learns only at seal; None: not checked). `first_ledger`: the id the topic's first ledger will
    have while it has none (its next ledger id: 0, or past the ids of a topic deleted under its name)."""
    if not ledgers:  # nothing written yet: the end of the topic is its first ledger's N:0, before it nothing
        end = Position(first_ledger, 0)
        if position == end:
            return []
        where = f"before the first ledger {first_ledger}" if position < end else "beyond the end"
        raise BadInput(f"position {position} is {where} of the topic (nothing written yet: its end is {end})")
    live = [led for led in ledgers if led.state != S.DELETED]
    last = max(led.ledger_id for led in ledgers)
    newest = max(ledgers, key=lambda x: x.ledger_id)
    if not live:  # every ledger trimmed: the end of the topic is the one position left, with nothing before it
        if position in (Position(last + 1, 0), Position(last, newest.entry_count)):
            return []
        raise BadInput(f"position {position} is not the end of the topic, whose ledgers up to {last} were all "
                       f"trimmed (its end: {last + 1}:0)")
    first = min(led.ledger_id for led in live)
    # after a seal, the next ledger's first position is the end of the topic
    end = last + 1 if newest.state != S.OPEN else last
    if position.ledger_id < first:
        raise BadInput(f"position {position} is before the first ledger {first} of the topic")
    if position.ledger_id > end or (position.ledger_id == last + 1 and position.entry_id > 0):
        raise BadInput(f"position {position} is beyond the end of the topic (last ledger {last}"
                       + (f", {newest.entry_count} entries: its end is {last}:{newest.entry_count} or {last + 1}:0)"
                          if newest.state != S.OPEN else ", open)"))
    target = next((led for led in ledgers if led.ledger_id == position.ledger_id), None)
    count = None if target is None else open_entries if target.state == S.OPEN else target.entry_count
    if count is not None:
        check_within_ledger(position, target, count)
    return [led for led in sorted(ledgers, key=lambda x: x.ledger_id)
            if before(led, position) and _offloadable(led)]


def check_within_ledger(position: Position, led: Ledger, count: int) -> None:
    """A position is at most its ledger's `count` entries in (one past the last entry is the ledger's end):
    anything further is BadInput, whichever command names it. `count`: a sealed or trimmed ledger's from
    its row, the open ledger's from its tier-1 file (metadata learns it only at seal)."""
    if position.entry_id > count:
        state = {S.OPEN: ", open", S.DELETED: ", trimmed"}.get(led.state, "")
        raise BadInput(f"position {position} is beyond the end of ledger {led.ledger_id} ({count} entries{state})")


def before(led: Ledger, position: Position) -> bool:
    """Whether every entry of `led` lies before `position` (offloadPrefix's choice)."""
    return led.ledger_id < position.ledger_id or (
        led.ledger_id == position.ledger_id and led.state != S.OPEN and position.entry_id >= led.entry_count)


def end_of_sealed(ledgers: Sequence[Ledger], first_ledger: int = 0) -> Position:
    """One past the last entry of the last sealed ledger: offloadPrefix there takes every sealed ledger
    (`offload-prefix --all-sealed`). `first_ledger` as in offload_prefix."""
    if not ledgers:
        return Position(first_ledger, 0)  # nothing written yet
    newest = max(ledgers, key=lambda x: x.ledger_id)
    if newest.state == S.OPEN:
        return Position(newest.ledger_id, 0)
    return Position(newest.ledger_id, newest.entry_count)


def lagged_copies(ledgers: Sequence[Ledger], policy: TopicPolicy, now: datetime) -> list[Ledger]:
    """Offloaded ledgers whose tier-1 copy has outlived the deletion lag."""
    cutoff = now - timedelta(seconds=policy.deletion_lag_seconds)
    return [led for led in ledgers
            if led.state == S.OFFLOADED and led.tier1_present and led.offloaded_at <= cutoff]


def is_read(position: Position | None, led: Ledger) -> bool:
    """Whether a reader whose last entry read is `position` (None: nothing yet) has read all of `led`."""
    return led.entry_count == 0 or (position is not None and position >= Position(led.ledger_id, led.entry_count - 1))


def retention_loss_reason(position: Position | None, plan: Sequence[tuple[Ledger, str]], retain_unread: bool,
                          expired: bool) -> str:
    """How a retention run words the unread entries it takes from a reader at `position` (recorded with the
    loss, printed by the run and by its dry run): the reasons of the planned ledgers it had not read, and why
    those were not held back (an expired subscription, or a topic not retaining unread data; a ceiling needs
    no note: it deletes unread data by definition)."""
    why = sorted({reason for led, reason in plan if not is_read(position, led)})
    note = " (subscription expired)" if expired else (
        "" if retain_unread or set(why) <= {"ceiling-time", "ceiling-size"} else " (retain-unread off)")
    return f"retention by {'/'.join(why)}{note}"


def retention_plan(ledgers: Sequence[Ledger], policy: TopicPolicy, now: datetime,
                   holders: Sequence[Position | None] = ()) -> list[tuple[Ledger, str]]:
    """Head truncation (PDP-19) bounded by readers (Pulsar, Pravega PDP-47): from the oldest ledger on, each
    with the reason it goes, while a ledger is

    - due by retention: older than the retention time ("time") or the topic still holds more than the
      retention size without it ("size") -- and, when the policy retains unread data, read in full by every
      position in `holders` (the ACTIVE subscriptions' last entries read; None: nothing read yet); or
    - past a ceiling: older than max-retention-time ("ceiling-time") or the topic holds more than
      max-retention-size without it ("ceiling-size"), read or not.

    Whole ledgers, never the open one, and always a prefix: the first ledger to keep stops the walk."""
    if all(v < 0 for v in (policy.retention_seconds, policy.retention_bytes, policy.max_retention_seconds,
                           policy.max_retention_bytes)):
        return []
    live = sorted((led for led in ledgers if led.state in _LIVE), key=lambda x: x.ledger_id)
    total = sum(led.size_bytes for led in live)

    def cutoff(seconds: int) -> datetime | None:
        return now - timedelta(seconds=seconds) if seconds >= 0 else None

    keep_until, cap_until = cutoff(policy.retention_seconds), cutoff(policy.max_retention_seconds)
    doomed = []
    for led in live:
        if led.state == S.OPEN:
            # never the open ledger. An offload in flight goes as truncate takes it (its commit then loses its
            # compare-and-set and its objects are collected): waiting for it let one whose worker died hold
            # the head, ceilings included, until another offload took the attempt over
            break
        rest = total - led.size_bytes
        read = not policy.retain_unread or all(is_read(p, led) for p in holders)
        if read and keep_until is not None and led.sealed_at <= keep_until:
            reason = "time"
        elif read and 0 <= policy.retention_bytes <= rest:
            reason = "size"
        elif cap_until is not None and led.sealed_at <= cap_until:
            reason = "ceiling-time"
        elif 0 <= policy.max_retention_bytes <= rest:
            reason = "ceiling-size"
        else:
            break
        doomed.append((led, reason))
        total = rest
    return doomed


def retention(ledgers: Sequence[Ledger], policy: TopicPolicy, now: datetime,
              holders: Sequence[Position | None] = ()) -> list[Ledger]:
    """The ledgers of retention_plan, without their reasons."""
    return [led for led, _ in retention_plan(ledgers, policy, now, holders)]


@dataclass(frozen=True)
class UnreadLoss:
    """What deleting `ledgers` takes from a reader at a position: entries and bytes it had not read (bytes of
    a partly read ledger prorated by entries, as Pulsar estimates a backlog's size), the first of those
    entries, and the last deleted entry, where the reader's position moves."""
    entries: int
    bytes: int
    first: Position | None
    new_position: Position | None


def unread_loss(position: Position | None, ledgers: Sequence[Ledger]) -> UnreadLoss:
    entries = size = 0
    first = last = None
    for led in sorted(ledgers, key=lambda x: x.ledger_id):
        if led.entry_count == 0:
            continue
        last = Position(led.ledger_id, led.entry_count - 1)
        read = 0 if position is None or position.ledger_id < led.ledger_id else (
            led.entry_count if position.ledger_id > led.ledger_id else min(position.entry_id + 1, led.entry_count))
        unread = led.entry_count - read
        if unread > 0:
            first = first or Position(led.ledger_id, read)
            entries += unread
            size += led.size_bytes * unread // led.entry_count
    return UnreadLoss(entries, size, first, last if entries else None)


def backlog(position: Position | None, ledgers: Sequence[Ledger]) -> tuple[int, int]:
    """(entries, bytes) a reader at `position` has not read among the live `ledgers`; a partly read ledger's
    bytes prorated by entries. The specification of the subscription listing's SQL."""
    loss = unread_loss(position, [led for led in ledgers if led.state != S.DELETED])
    return loss.entries, loss.bytes


def truncate_before(ledgers: Sequence[Ledger], position: Position) -> list[Ledger]:
    """`tiering truncate NAME L:E`: every whole ledger before the position's ledger (never the open one), an
    offload in flight included (its commit then loses; skipping it would leave a hole in the trimmed head)."""
    ids = [led.ledger_id for led in ledgers]
    if not ids or position.ledger_id > max(ids):
        raise BadInput(f"position {position} is beyond the end of the topic")
    return [led for led in sorted(ledgers, key=lambda x: x.ledger_id)
            if led.ledger_id < position.ledger_id and led.state in (S.SEALED, S.OFFLOADING, S.OFFLOADED)]


@dataclass(frozen=True)
class DefragGroup:
    ledgers: tuple[Ledger, ...]
    chunks: tuple[Chunk, ...]

    @property
    def data_bytes(self) -> int:
        return sum(c.data_length for c in self.chunks)


def defrag_groups(ledgers: Sequence[Ledger], chunks: Mapping[int, Chunk], small_bytes: int,
                  max_merged_bytes: int, min_group: int = 2) -> list[DefragGroup]:
    """Runs of consecutive offloaded ledgers whose data object is small (and not already shared), cut so a
    merged object stays within `max_merged_bytes`; runs shorter than `min_group` are left alone."""
    if small_bytes <= 0 or max_merged_bytes <= 0:
        raise BadInput("defrag thresholds must be positive")
    shared = _shared_keys(chunks)
    candidates: list[tuple[Ledger, Chunk, bool]] = []
    previous_small = False
    for led in sorted(ledgers, key=lambda x: x.ledger_id):
        ch = chunks.get(led.ledger_id)
        if led.state == S.DELETED or (led.state == S.SEALED and led.entry_count == 0):
            continue  # gaps of trimmed or empty ledgers do not break a run
        small = (led.state == S.OFFLOADED and ch is not None and ch.data_length < small_bytes
                 and ch.data_key not in shared)
        if small:
            candidates.append((led, ch, previous_small))
        previous_small = small
    return defrag_runs(candidates, max_merged_bytes, min_group)


def defrag_runs(candidates: Iterable[tuple[Ledger, Chunk, bool]], max_merged_bytes: int,
                min_group: int = 2) -> list[DefragGroup]:
    """Cut defrag's candidates, in order, into groups: (ledger, its small unshared chunk, whether the
    previous ledger of its topic that is not a gap was a candidate too). A run breaks where that is false
    and where the merged object would pass `max_merged_bytes`. The set-based planner (metadata/planning.py)
    computes the same triples from candidate rows only."""
    groups: list[DefragGroup] = []
    run: list[tuple[Ledger, Chunk]] = []
    run_bytes = 0

    def close_run():
        nonlocal run_bytes
        if len(run) >= min_group:
            groups.append(DefragGroup(tuple(led for led, _ in run), tuple(c for _, c in run)))
        run.clear()
        run_bytes = 0

    for led, ch, joins_previous in candidates:
        if not joins_previous or (run and run_bytes + ch.data_length > max_merged_bytes):
            close_run()
        run.append((led, ch))
        run_bytes += ch.data_length
    close_run()
    return groups


def _shared_keys(chunks: Mapping[int, Chunk]) -> set[str]:
    seen, shared = set(), set()
    for c in chunks.values():
        (shared if c.data_key in seen else seen).add(c.data_key)
    return shared
