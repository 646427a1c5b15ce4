"""Retention (Pravega PDP-19): truncate a topic's head by time and by size, or at a position by hand.

Whole ledgers, never the open one. Metadata first — one transaction marks the ledgers DELETED, removes
their chunk rows and queues their tier-2 keys for GC — then the tier-1 files (as delete-lagged does). A
trimmed range then reads as a TRIMMED gap. Killed after the metadata commit, the files are deleted by the
next run of retention or delete-lagged.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tiering import policy
from tiering.model import Ledger, LedgerState, Position
from tiering.ops.context import Deps, select_topics
from tiering.ops.delete_lagged import delete_copy
from tiering.tier2.markers import record_trim


@dataclass
class RetentionReport:
    deleted: list[tuple[str, int]] = field(default_factory=list)
    files_removed: int = 0
    bytes: int = 0


def plan_retention(deps: Deps, topic: str | None = None) -> dict[str, list[Ledger]]:
    now = deps.meta.now()
    topics = select_topics(deps.meta, topic)
    return {t.name: policy.retention(deps.meta.list_ledgers(t.name), t.policy, now) for t in topics}


def apply_retention(deps: Deps, topic: str, doomed: list[Ledger], reason: str = "retention") -> RetentionReport:
    report = RetentionReport()
    if doomed:
        deleted = deps.meta.delete_ledgers(doomed, reason, deps.knobs.gc_delay)
        report.deleted += [(topic, led.ledger_id) for led in deleted]
        report.bytes += sum(led.size_bytes for led in deleted)
    trimmed = [led.ledger_id for led in deps.meta.list_ledgers(topic, [LedgerState.DELETED])]
    if trimmed:  # also on a rerun after a kill between the commit and this write
        record_trim(deps.bucket, topic, max(trimmed) + 1)
    for led in deps.meta.list_ledgers(topic, [LedgerState.DELETED]):
        if led.tier1_present and delete_copy(deps, led):
            report.files_removed += 1
    return report


def retention(deps: Deps, topic: str | None = None) -> RetentionReport:
    total = RetentionReport()
    for name, doomed in plan_retention(deps, topic).items():
        r = apply_retention(deps, name, doomed)
        total.deleted += r.deleted
        total.files_removed += r.files_removed
        total.bytes += r.bytes
    return total


def truncate(deps: Deps, topic: str, position: Position) -> RetentionReport:
    """`tiering truncate NAME L:E`: delete every whole ledger before the position's ledger."""
    doomed = policy.truncate_before(deps.meta.list_ledgers(topic), position)
    return apply_retention(deps, topic, doomed, reason=f"truncate before {position}")
