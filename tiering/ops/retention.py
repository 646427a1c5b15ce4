"""Retention (Pravega PDP-19): truncate a topic's head by time and by size, or at a position by hand.

Whole ledgers, never the open one. Metadata first — one transaction marks the ledgers DELETED, removes
their chunk rows and queues their tier-2 keys for GC — then the trim marker, then the tier-1 files (as
delete-lagged does). A trimmed range then reads as a TRIMMED gap. Killed after the metadata commit, the
marker and the files are done by the next run of retention (the files also by delete-lagged).

Planning is set-based (metadata/planning.py; policy.retention and policy.truncate_before are its
specification): a run visits only topics with something due — ledgers to delete, a trim marker behind the
trim point, or a leftover tier-1 copy of a DELETED ledger. The trim marker is written only when the trim
point (last DELETED ledger + 1) moved past the one last written, which metadata records after the PUT.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tiering.errors import BadInput
from tiering.model import Ledger, Position
from tiering.ops.context import Deps
from tiering.ops.delete_lagged import delete_copy
from tiering.tier2.markers import record_trim


@dataclass
class RetentionReport:
    deleted: list[tuple[str, int]] = field(default_factory=list)
    files_removed: int = 0
    bytes: int = 0


def plan_retention(deps: Deps, topic: str | None = None) -> dict[str, list[Ledger]]:
    """The topics retention has work on, each with the ledgers to delete (possibly none: a marker or a
    leftover copy is due), by name. Two statements, whatever the store's history."""
    if topic is not None:
        deps.meta.get_topic(topic)  # an unknown topic fails here
    due = deps.meta.planning.retention(topic)
    for name in deps.meta.planning.retention_housekeeping(topic):
        due.setdefault(name, [])
    return dict(sorted(due.items()))


def apply_retention(deps: Deps, topic: str, doomed: list[Ledger], reason: str = "retention") -> RetentionReport:
    report = RetentionReport()
    if doomed:
        deleted = deps.meta.delete_ledgers(doomed, reason, deps.knobs.gc_delay)
        report.deleted += [(topic, led.ledger_id) for led in deleted]
        report.bytes += sum(led.size_bytes for led in deleted)
    _move_trim_marker(deps, topic)
    for led in deps.meta.planning.deleted_with_copy(topic):
        if delete_copy(deps, led):
            report.files_removed += 1
    return report


def _move_trim_marker(deps: Deps, topic: str) -> None:
    """PUT the marker when the trim point passed the one last written, then record it: killed in between,
    the next run PUTs the same marker again (record_trim never moves it back)."""
    point, written = deps.meta.planning.trim_point(topic)
    if point > written:
        record_trim(deps.bucket, topic, point)
        deps.meta.planning.record_trim_marker(topic, point)


def retention(deps: Deps, topic: str | None = None) -> RetentionReport:
    total = RetentionReport()
    for name, doomed in plan_retention(deps, topic).items():
        r = apply_retention(deps, name, doomed)
        total.deleted += r.deleted
        total.files_removed += r.files_removed
        total.bytes += r.bytes
    return total


def truncate(deps: Deps, topic: str, position: Position) -> RetentionReport:
    """`tiering truncate NAME L:E`: delete every whole ledger before the position's ledger (policy.truncate_before,
    read on the live-ledger index)."""
    t = deps.meta.get_topic(topic)
    last, doomed = deps.meta.planning.truncate_before(t.topic_id, t.name, position.ledger_id)
    if last is None or position.ledger_id > last:
        raise BadInput(f"position {position} is beyond the end of the topic")
    return apply_retention(deps, topic, doomed, reason=f"truncate before {position}")
