"""Offload sealed ledgers to tier 2 (PIP-17), crash- and race-safe.

For one ledger: (1) one transaction moves it SEALED -> OFFLOADING with a new attempt UUID and queues the
attempt's two keys in gc_task (not before the offload timeout); (2) the ledger streams from tier 1 into a
multipart upload, then the index object is written; (3) one transaction moves it to OFFLOADED only while the
row still holds this attempt's UUID, writes its chunk row and dequeues the keys. Any failure aborts the
upload, deletes what was written and returns the ledger to SEALED; a process killed anywhere leaves either
a SEALED ledger, an OFFLOADING attempt that a later run takes over after the timeout, or an OFFLOADED one,
and in every case objects nobody references are still queued for GC.
"""
from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Callable

from tiering import policy
from tiering.errors import BadInput, ConditionalUpdateFailed, Tier2Error, TieringError
from tiering.format.keys import data_key, index_key
from tiering.model import Chunk, Ledger, LedgerState, Position
from tiering.ops.context import Deps
from tiering.tier2.objects import check_bucket, delete_keys
from tiering.tier2.offloader import LedgerToUpload, StepHook, upload_ledger

# What an operator should see of a swallowed cleanup failure (the exception's type only: messages of
# database drivers may carry connection details).
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


def offload_ledger(deps: Deps, led: Ledger, hook: StepHook = None) -> Ledger:
    """Offload one ledger (SEALED, or OFFLOADING older than the offload timeout). Returns it OFFLOADED."""
    if led.entry_count == 0:
        raise TieringError(f"ledger {led.topic}/{led.ledger_id} is empty: nothing to offload")
    knobs, b = deps.knobs, deps.bucket
    attempt = str(uuid.uuid4())
    keys = (data_key(b.prefix, led.topic, attempt, led.ledger_id),
            index_key(b.prefix, led.topic, attempt, led.ledger_id))
    started = deps.meta.begin_offload(
        led, attempt, keys, gc_delay=knobs.offload_timeout,
        stale_after=knobs.offload_timeout if led.state == LedgerState.OFFLOADING else None)
    try:
        with deps.tier1.reader(led.topic, led.ledger_id) as reader:
            uploaded = upload_ledger(
                b, LedgerToUpload(led.topic, led.ledger_id, led.entry_count,
                                  int(led.sealed_at.timestamp() * 1000), attempt, *keys),
                reader.iter_entries(0, led.entry_count - 1), knobs.block_size, knobs.upload_concurrency, hook,
                knobs.page_size)
        chunk = Chunk(uploaded.data_key, 0, uploaded.data_length, uploaded.index_key, 0, uploaded.index_length,
                      0, led.entry_count - 1)
        return deps.meta.complete_offload(started, attempt, chunk)
    except BaseException:
        _undo(deps, started, attempt, keys)
        raise


def _undo(deps: Deps, started: Ledger, attempt: str, keys: tuple[str, str]) -> None:
    """Delete the attempt's objects and return the ledger to SEALED, unless the commit did land (a lost
    reply is not a failed commit) or we cannot tell — then GC's queue and reference check decide."""
    try:
        now = deps.meta.get_ledger(started.topic, started.ledger_id)
    except Exception as exc:
        # metadata unreachable: leave the keys queued; GC deletes them only if unreferenced
        log.warning("offload of %s/%s attempt %s not undone (%s): its objects stay queued for GC",
                    started.topic, started.ledger_id, attempt, type(exc).__name__)
        return
    if now.state == LedgerState.OFFLOADED and now.offload_uuid == attempt:
        return
    failed = delete_keys(deps.bucket, keys)
    if now.state == LedgerState.OFFLOADING and now.offload_uuid == attempt:
        try:
            deps.meta.abort_offload(now, attempt, objects_deleted=not failed)
        except Exception as exc:
            # taken over meanwhile, or metadata gone: the attempt times out and is taken over
            log.warning("offload of %s/%s attempt %s left OFFLOADING (%s): taken over after the offload timeout",
                        started.topic, started.ledger_id, attempt, type(exc).__name__)


def offload_many(deps: Deps, ledgers: list[Ledger], hook: StepHook = None,
                 on_done: Callable[[Ledger], None] | None = None, bucket_checked: bool = False) -> OffloadReport:
    """Offload each ledger, small ones of a topic in batches (one object pair each); a failing ledger or
    batch does not stop the others. A ledger another worker holds or finished meanwhile is skipped. Tier 2
    unreachable: `Tier2Error` before any metadata changes; unreachable after a ledger failed mid-run: the
    rest are reported failed without being attempted."""
    from tiering.ops.offload_batch import batches, offload_batch

    report = OffloadReport()
    if ledgers and not bucket_checked:  # offload_by_topic checks once per run, not once per topic
        check_bucket(deps.bucket)  # tier 2 down: fail here, before any ledger's metadata changes
    knobs = deps.knobs
    groups, alone = batches(ledgers, knobs.batch_small_bytes, knobs.batch_max_bytes, knobs.batch_max_ledgers) \
        if knobs.batch_small_bytes > 0 else ([], list(ledgers))

    def finished(done: Ledger) -> None:
        report.offloaded.append(done.ledger_id)
        report.bytes += done.size_bytes
        if on_done:
            on_done(done)

    for group in groups:
        try:
            for done in offload_batch(deps, group, hook):
                finished(done)
            continue
        except TieringError:
            # one of them moved on since listing, or failed (its tier-1 copy is gone, ...): the batch was
            # undone whole, so each goes alone and only the culprit fails or is skipped
            alone.extend(group)
    # the caller's order (a failed batch's ledgers go back to their places, not to the end)
    position = {(led.topic, led.ledger_id): i for i, led in enumerate(ledgers)}
    alone = sorted(alone, key=lambda x: position[(x.topic, x.ledger_id)])
    for led in alone:
        try:
            done = offload_ledger(deps, led, hook)
        except ConditionalUpdateFailed:
            report.skipped.append(led.ledger_id)
            continue
        except TieringError as exc:
            report.merge_failure(led.ledger_id, exc)
            if isinstance(exc, Tier2Error) and not _reachable(deps):
                # tier 2 went down mid-run: the others would each change metadata and fail the same way
                for rest in alone[alone.index(led) + 1:]:
                    report.failed[rest.ledger_id] = "not attempted: tier 2 became unreachable during the run"
                break
            continue
        finished(done)
    return report


def _reachable(deps: Deps) -> bool:
    try:
        check_bucket(deps.bucket)
    except Tier2Error:
        return False
    return True


def offload_prefix(deps: Deps, topic: str, position: Position, hook: StepHook = None,
                   on_done: Callable[[Ledger], None] | None = None,
                   planned: list[Ledger] | None = None) -> tuple[OffloadReport, Position]:
    """Pulsar's offloadPrefix: offload every sealed ledger before `position`'s ledger; already-offloaded
    and empty ledgers are skipped. Returns the report and the first position not offloaded. `planned`: the
    caller's `plan_offload_prefix` (the CLI sizes its progress bar with it), so the plan is made once."""
    report = offload_many(deps, plan_offload_prefix(deps, topic, position) if planned is None else planned, hook,
                          on_done)
    return report, first_not_offloaded(deps, topic)


def plan_offload_prefix(deps: Deps, topic: str, position: Position) -> list[Ledger]:
    """The ledgers offloadPrefix takes on, in ledger order: the sealed ones before `position`'s ledger, and
    attempts among them older than the offload timeout. An unknown topic fails here, before any write."""
    targets = policy.offload_prefix(deps.meta.list_ledgers(topic), position)
    targets += _stale(deps, topic, lambda led: led.ledger_id < position.ledger_id)
    return sorted(targets, key=lambda x: x.ledger_id)


def _stale(deps: Deps, topic: str, keep: Callable[[Ledger], bool]) -> list[Ledger]:
    """OFFLOADING attempts older than the timeout: their worker died; a new attempt takes them over."""
    return [led for led in deps.meta.stale_offloads(deps.knobs.offload_timeout, topic) if keep(led)]


def first_not_offloaded(deps: Deps, topic: str) -> Position:
    """The first position whose entry is not in tier 2 (trimmed and empty ledgers count as done)."""
    ledgers = deps.meta.list_ledgers(topic)
    for led in ledgers:
        if led.state in (LedgerState.DELETED, LedgerState.OFFLOADED):
            continue
        if led.state != LedgerState.OPEN and led.entry_count == 0:
            continue
        return Position(led.ledger_id, 0)
    return Position(ledgers[-1].ledger_id + 1 if ledgers else 0, 0)


def plan_offload(deps: Deps, by: str, topic: str | None = None) -> list[Ledger]:
    """The ledgers a scheduled offload takes on: by age (offload-after) or by size (the tier-1 threshold,
    Pulsar's rule), plus attempts older than the offload timeout, whose worker is presumed dead. Both read
    candidate rows only (metadata/planning.py); by size stats the OPEN ledger of topics with candidates."""
    if by == "age":
        targets = deps.meta.offload_candidates_by_age(topic)
    elif by == "size":
        if topic is not None:
            deps.meta.get_topic(topic)  # an unknown topic fails, as before
        topics = deps.meta.planning.size_topics(topic)
        targets = deps.meta.planning.offload_by_size(topics, _open_sizes(deps, topics))
    else:
        raise BadInput(f"offload by {by!r}: expected 'age' or 'size'")
    return targets + _stale(deps, topic, lambda led: True)


def _open_sizes(deps: Deps, topics) -> dict[tuple[int, int], int]:
    """The live size of each OPEN ledger from its tier-1 file (metadata records sizes at seal time)."""
    sizes = {}
    for t in topics:
        if t.open_ledger_id is not None and deps.tier1.exists(t.name, t.open_ledger_id):
            with deps.tier1.reader(t.name, t.open_ledger_id) as r:
                sizes[(t.topic_id, t.open_ledger_id)] = r.size_bytes
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
