"""Delete tier-1 copies of ledgers offloaded longer ago than their topic's deletion lag (PIP-17: 4 h by
default), and leftover copies of ledgers retention already deleted.

The file goes first, then metadata: killed in between, metadata still says the copy exists, readers fall
back to tier 2 (the ledger is OFFLOADED), and a rerun deletes nothing twice and marks it. The other order
could leave a file nobody would ever delete.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tiering import policy
from tiering.errors import ConditionalUpdateFailed
from tiering.model import Ledger, LedgerState
from tiering.ops.context import Deps


@dataclass
class DeleteLaggedReport:
    deleted: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[tuple[str, int]] = field(default_factory=list)
    bytes: int = 0


def plan_delete_lagged(deps: Deps, topic: str | None = None) -> list[Ledger]:
    now = deps.meta.now()
    topics = [deps.meta.get_topic(topic)] if topic else deps.meta.list_topics()
    out = []
    for t in topics:
        ledgers = deps.meta.list_ledgers(t.name)
        out += policy.lagged_copies(ledgers, t.policy, now)
        out += [led for led in ledgers if led.state == LedgerState.DELETED and led.tier1_present]
    return out


def delete_copy(deps: Deps, led: Ledger) -> bool:
    """Delete one tier-1 copy and record it. False when the ledger changed meanwhile (nothing done)."""
    current = deps.meta.get_ledger(led.topic, led.ledger_id)
    if current.version != led.version or not current.tier1_present or \
            current.state not in (LedgerState.OFFLOADED, LedgerState.DELETED):
        return False
    deps.tier1.delete(led.topic, led.ledger_id)
    try:
        deps.meta.mark_tier1_deleted(current)
    except ConditionalUpdateFailed:
        return False
    return True


def delete_lagged(deps: Deps, topic: str | None = None) -> DeleteLaggedReport:
    report = DeleteLaggedReport()
    for led in plan_delete_lagged(deps, topic):
        if delete_copy(deps, led):
            report.deleted.append((led.topic, led.ledger_id))
            report.bytes += led.size_bytes
        else:
            report.skipped.append((led.topic, led.ledger_id))
    return report
