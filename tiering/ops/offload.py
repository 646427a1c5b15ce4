"""Offload sealed ledgers to tier 2 (PIP-17), crash- and race-safe: which ledgers (the plans), and running
them (offload_many). Each attempt, of one ledger or of a batch of a topic's small ones, is
tiering/ops/offload_batch.py's: one begin transaction, the upload, one commit transaction, undone on failure.

A ledger is reported offloaded, skipped only when another worker holds or finished it (checked against its
current row), or failed with its reason: a failure is never reported as skipped.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from tiering import policy
from tiering.errors import (BadInput, ConditionalUpdateFailed, CorruptObjectError, LedgerStorageError, Tier2Error,
                            TieringError, TopicNotFound)
from tiering.model import Ledger, LedgerState, Position
from tiering.ops.context import Deps
from tiering.ops.offload_batch import batches, in_background, offload_batch
from tiering.tier2.multipart import StepHook
from tiering.tier2.objects import check_bucket

log = logging.getLogger(__name__)


@dataclass
class OffloadReport:
    offloaded: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    bytes: int = 0
    first_error: str | None = None

    def merge_failure(self, ledger_id: int, exc: BaseException) -> None:
        msg = str(exc) or type(exc).__name__
        self.failed[ledger_id] = msg
        if self.first_error is None:
            self.first_error = f"ledger {ledger_id}: {msg}"


def offload_ledger(deps: Deps, led: Ledger, hook: StepHook = None,
                   before_claim: Callable[[], None] | None = None) -> Ledger:
    """Offload one ledger (SEALED, or OFFLOADING older than the offload timeout): a batch of one. Returns it
    OFFLOADED; ConditionalUpdateFailed, changing nothing, if it moved on since `led` was read."""
    if led.entry_count == 0:
        raise TieringError(f"ledger {led.topic}/{led.ledger_id} is empty: nothing to offload")
    [done] = offload_batch(deps, [led], hook, before_claim)
    return done


def offload_many(deps: Deps, ledgers: list[Ledger], hook: StepHook = None,
                 on_done: Callable[[Ledger], None] | None = None, bucket_checked: bool = False) -> OffloadReport:
    """Offload each ledger, small ones of a topic in batches (one object pair each); a failing ledger or
    batch does not stop the others. A batch undone whole (one of its ledgers failed or moved on) is retried
    ledger by ledger. Skipped: only a ledger another worker holds or finished, by its current row; anything
    else that did not offload is failed, with its reason. Tier 2 unreachable: `Tier2Error` before any
    metadata changes; unreachable after a ledger or batch failed mid-run: the rest are reported failed
    without being attempted."""
    report = OffloadReport()
    # offload_by_topic checks once per run, not once per topic. The HEAD goes beside the first attempt's
    # packing; that attempt's begin transaction waits for it, so with tier 2 down nothing changes
    check = in_background(lambda: check_bucket(deps.bucket), "offload-bucket-check") \
        if ledgers and not bucket_checked else None
    before_claim = check.result if check is not None else None

    def down() -> None:
        """Tier 2 was down from the start: raise as before any ledger's metadata changed (none did)."""
        if check is not None and check.exception() is not None:
            raise check.exception()
    knobs = deps.knobs
    groups, alone = batches(ledgers, knobs.batch_small_bytes, knobs.batch_max_bytes, knobs.batch_max_ledgers) \
        if knobs.batch_small_bytes > 0 else ([], list(ledgers))

    def finished(done: Ledger) -> None:
        offloaded.append(done)
        report.bytes += done.size_bytes
        if on_done:
            on_done(done)

    def unreachable(failed: list[Ledger], exc: TieringError, rest: list[Ledger]) -> bool:
        """Tier 2 went down: `failed` failed with `exc`, the rest would each change metadata and fail the
        same way, so they are reported failed, not attempted."""
        if not isinstance(exc, Tier2Error) or _reachable(deps):
            return False
        for led in failed:
            report.merge_failure(led.ledger_id, exc)
        for led in rest:
            report.failed[led.ledger_id] = "not attempted: tier 2 became unreachable during the run"
        return True

    offloaded: list[Ledger] = []  # as they finished
    rank = {(led.topic, led.ledger_id): i for i, led in enumerate(ledgers)}

    def in_order() -> OffloadReport:
        """The offloaded ledgers in the caller's order, as its dry run lists them (batches finish before
        the ledgers that go alone)."""
        offloaded.sort(key=lambda led: rank.get((led.topic, led.ledger_id), len(rank)))
        report.offloaded = [led.ledger_id for led in offloaded]
        return report

    for i, group in enumerate(groups):
        try:
            for done in offload_batch(deps, group, hook, before_claim):
                finished(done)
        except TieringError as exc:
            down()
            if unreachable(group, exc, [led for g in groups[i + 1:] for led in g] + alone):
                return in_order()
            # undone whole: each goes alone, so only the culprit fails (_offload_current re-reads the rows the
            # batch's begin and undo moved on)
            alone.extend(group)
    # the caller's order (a failed batch's ledgers go back to their places, not to the end)
    position = {(led.topic, led.ledger_id): i for i, led in enumerate(ledgers)}
    alone = sorted(alone, key=lambda x: position[(x.topic, x.ledger_id)])
    for i, led in enumerate(alone):
        try:
            done = _offload_current(deps, led, hook, before_claim)
        except TieringError as exc:
            down()
            if not unreachable([led], exc, alone[i + 1:]):
                report.merge_failure(led.ledger_id, exc)
                continue
            break
        if done is None:
            report.skipped.append(led.ledger_id)
        else:
            finished(done)
    if check is not None:
        check.result()  # every ledger failed before its claim: the bucket's state still decides the outcome
    return in_order()


def _offload_current(deps: Deps, led: Ledger, hook: StepHook,
                     before_claim: Callable[[], None] | None = None) -> Ledger | None:
    """offload_ledger; on a lost compare-and-set, judged by the ledger's CURRENT row: another worker finished
    (OFFLOADED), trimmed (DELETED) or holds it (an OFFLOADING attempt whose worker is alive and not older
    than the offload timeout) -> None, skipped; otherwise the row read earlier was stale (a failed batch's
    undo, another worker's failed attempt, a takeover) or its attempt's worker is dead (a lost executor),
    and the ledger is offloaded once more from the current row, whose failure is a failure."""
    for retry in (False, True):
        try:
            return offload_ledger(deps, led, hook, before_claim)
        except ConditionalUpdateFailed:
            now = deps.meta.find_ledger(led.topic, led.ledger_id)
            if now is None:
                return None  # its topic was deleted since the plan (the deletion trimmed the ledger)
            if now.state in (LedgerState.OFFLOADED, LedgerState.DELETED) or \
                    (retry and now.state == LedgerState.OFFLOADING):
                return None
            if retry:
                raise
            led = now
    raise AssertionError("unreachable")


def _reachable(deps: Deps) -> bool:
    try:
        check_bucket(deps.bucket)
    except Tier2Error:
        return False
    return True


def offload_prefix(deps: Deps, topic: str, position: Position, hook: StepHook = None,
                   on_done: Callable[[Ledger], None] | None = None,
                   planned: list[Ledger] | None = None) -> tuple[OffloadReport, Position | None]:
    """Pulsar's offloadPrefix: offload every sealed ledger before `position`'s ledger; already-offloaded
    and empty ledgers are skipped. Returns the report and the first position not offloaded. `planned`: the
    caller's `plan_offload_prefix` (the CLI sizes its progress bar with it), so the plan is made once. Ledgers
    before the position that another worker is offloading (a live attempt the plan left to it) are reported
    skipped, so a run that found everything taken says so instead of reporting nothing. A topic deleted
    since the plan took its ledgers with it: those not offloaded are skipped (as offload-by-age reports
    them), and the first position not offloaded is None (there is no topic to have one)."""
    targets = plan_offload_prefix(deps, topic, position) if planned is None else planned
    planned_ids = {led.ledger_id for led in targets}
    try:
        held = [led.ledger_id for led in deps.meta.list_ledgers(topic, [LedgerState.OFFLOADING])
                if policy.before(led, position) and led.ledger_id not in planned_ids]
    except TopicNotFound:
        held = []
    report = offload_many(deps, targets, hook, on_done)
    report.skipped = sorted(set(report.skipped) | set(held))
    try:
        return report, first_not_offloaded(deps, topic)
    except TopicNotFound:
        return report, None


def plan_offload_prefix(deps: Deps, topic: str, position: Position) -> list[Ledger]:
    """The ledgers offloadPrefix takes on, in ledger order: the sealed ones before `position`'s ledger, and
    attempts among them older than the offload timeout. An unknown topic fails here, before any write."""
    ledgers = deps.meta.list_ledgers(topic)
    # the open ledger's end is its tier-1 file's, read only when the position is in it past its start (N:0,
    # `--all-sealed` with an open ledger, needs no count: a broken open file must not stop the sealed ones)
    target = next((led for led in ledgers if led.ledger_id == position.ledger_id), None)
    open_entries = deps.tier1.extent(target)[0] \
        if target is not None and target.state == LedgerState.OPEN and position.entry_id > 0 else None
    targets = policy.offload_prefix(ledgers, position, open_entries,
                                    first_ledger=0 if ledgers else _first_ledger(deps, topic))
    targets += _stale(deps, topic, lambda led: policy.before(led, position))
    return sorted(targets, key=lambda x: x.ledger_id)


def end_of_sealed(deps: Deps, topic: str) -> Position:
    """The position offloadPrefix takes every sealed ledger of the topic at (`--all-sealed`)."""
    ledgers = deps.meta.list_ledgers(topic)
    return policy.end_of_sealed(ledgers, first_ledger=0 if ledgers else _first_ledger(deps, topic))


def _stale(deps: Deps, topic: str, keep: Callable[[Ledger], bool]) -> list[Ledger]:
    """OFFLOADING attempts whose worker is dead (its attempt lock is free) or presumed dead (older than the
    timeout): a new attempt takes them over."""
    return [led for led in deps.meta.stale_offloads(deps.knobs.offload_timeout, topic) if keep(led)]


def first_not_offloaded(deps: Deps, topic: str, assume_offloaded: frozenset[int] | set[int] = frozenset()) -> Position:
    """The first position whose entry is not in tier 2 (trimmed and empty ledgers count as done);
    `assume_offloaded`: ledger ids to count as offloaded (a dry run's plan)."""
    ledgers = deps.meta.list_ledgers(topic)
    for led in ledgers:
        if led.state in (LedgerState.DELETED, LedgerState.OFFLOADED) or led.ledger_id in assume_offloaded:
            continue
        if led.state != LedgerState.OPEN and led.entry_count == 0:
            continue
        return Position(led.ledger_id, 0)
    return Position(ledgers[-1].ledger_id + 1 if ledgers else _first_ledger(deps, topic), 0)


def _first_ledger(deps: Deps, topic: str) -> int:
    """The id a topic without ledgers gives its first one: 0, or past the ids of a topic deleted under its name."""
    return deps.meta.get_topic(topic).next_ledger_id


def plan_offload(deps: Deps, by: str, topic: str | None = None) -> list[Ledger]:
    """The ledgers a scheduled offload takes on: by age (offload-after) or by size (the tier-1 threshold,
    Pulsar's rule), plus attempts older than the offload timeout, whose worker is presumed dead. Both read
    candidate rows only (metadata/planning.py); by size stats the OPEN ledger of topics with candidates.
    Attempts whose worker is known dead (metadata/attempt_locks.py) are taken over at once."""
    if topic is not None:
        # an unknown topic fails: a misspelt one would plan nothing, and the run would report success
        deps.meta.get_topic(topic)
    if by == "age":
        targets = deps.meta.offload_candidates_by_age(topic)
    elif by == "size":
        topics = deps.meta.planning.size_topics(topic)
        targets = deps.meta.planning.offload_by_size(topics, _open_sizes(deps, topics))
    else:
        raise BadInput(f"offload by {by!r}: expected 'age' or 'size'")
    return targets + _stale(deps, topic, lambda led: True)


def _open_sizes(deps: Deps, topics) -> dict[tuple[int, int], int]:
    """The live size of each OPEN ledger from its tier-1 file (metadata records sizes at seal time). A file
    that cannot be read counts 0 here (logged): one damaged open ledger, which no offload takes anyway, does
    not stop the planning of every topic (its readers are told: Tier1Store.written)."""
    sizes = {}
    for t in topics:
        if t.open_ledger_id is not None and deps.tier1.exists(t.name, t.open_ledger_id):
            try:
                sizes[(t.topic_id, t.open_ledger_id)] = deps.tier1.written(t.name, t.open_ledger_id)[1]
            except (LedgerStorageError, CorruptObjectError) as exc:
                log.warning("open ledger %s of topic %r counted as 0 bytes in tier 1: %s", t.open_ledger_id,
                            t.name, exc)
                sizes[(t.topic_id, t.open_ledger_id)] = 0
    return sizes


@dataclass
class TopicsOffloadReport:
    """offload_by_topic's outcome: (topic, ledger) pairs, failures with their message."""
    planned: int = 0
    offloaded: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[tuple[str, int]] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)  # {"topic", "ledger", "error"}
    bytes: int = 0


def offload_by_topic(deps: Deps, ledgers: list[Ledger],
                     on_done: Callable[[Ledger], None] | None = None) -> TopicsOffloadReport:
    """Offload a plan spanning topics (plan_offload's), topic by topic; a failing ledger or topic does not
    stop the others."""
    by_topic: dict[str, list[Ledger]] = {}
    for led in ledgers:
        by_topic.setdefault(led.topic, []).append(led)
    out = TopicsOffloadReport(planned=len(ledgers))
    if ledgers:
        check_bucket(deps.bucket)  # once per run (tier 2 down: Tier2Error before any metadata changes)
    for topic, leds in by_topic.items():
        report = offload_many(deps, leds, on_done=on_done, bucket_checked=True)
        out.offloaded += [(topic, i) for i in report.offloaded]
        out.skipped += [(topic, i) for i in report.skipped]
        out.failed += [{"topic": topic, "ledger": i, "error": msg} for i, msg in report.failed.items()]
        out.bytes += report.bytes
    return out
