"""Retention (Pravega PDP-19): truncate a topic's head by time and by size, bounded by its readers, or at a
position by hand.

Whole ledgers, never the open one. Metadata first -- one transaction (metadata/trim.py) locks the topic and
its subscriptions, plans again under the locks, marks the ledgers DELETED, removes their chunk rows, queues
their tier-2 keys for GC and records what each subscription lost unread -- then the trim marker, then the
tier-1 files (as delete-lagged does). A trimmed range then reads as a TRIMMED gap. Killed after the metadata
commit, the marker and the files are done by the next run of retention (the files also by delete-lagged).

With the topic policy retain-unread, time/size retention deletes a ledger only once every ACTIVE
subscription has read all of it (Pulsar keeps unacknowledged messages; Pravega PDP-47 truncates at the
slowest reader group); the ceilings max-retention-time/-size delete even unread data, and the loss is
recorded on the subscription (entries, bytes, when, why) and in `subscription_loss`.

Planning is set-based (metadata/planning.py; policy.retention_plan and policy.truncate_before are its
specification): a run visits only topics with something due -- ledgers to delete, a trim marker behind the
trim point, or a leftover tier-1 copy of a DELETED ledger.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from tiering import policy
from tiering.errors import BadInput, TieringError, TopicNotFound
from tiering.metadata.trim import TrimResult
from tiering.model import ACTIVE, EXPIRED, Ledger, Position
from tiering.ops.context import Deps
from tiering.ops.delete_lagged import delete_deleted_copies, leftover_copies, sweep_tombstones
from tiering.read import ledger_extent
from tiering.tier2.markers import record_trim

log = logging.getLogger(__name__)


@dataclass
class RetentionReport:
    deleted: list[tuple[str, int]] = field(default_factory=list)
    files_removed: int = 0
    bytes: int = 0
    reasons: Counter = field(default_factory=Counter)  # why ledgers went: time, size, ceiling-*, truncate
    losses: list[dict] = field(default_factory=list)  # unread entries deleted, per subscription
    failed: list[tuple[str, int | None, str]] = field(default_factory=list)  # (topic, ledger or None, error)
    tier2_ledgers: int = 0  # of the deleted, those offloaded or being offloaded: their objects are queued for GC

    def add(self, other: "RetentionReport") -> None:
        self.deleted += other.deleted
        self.tier2_ledgers += other.tier2_ledgers
        self.files_removed += other.files_removed
        self.bytes += other.bytes
        self.reasons.update(other.reasons)
        self.losses += other.losses
        self.failed += other.failed


def plan_retention(deps: Deps, topic: str | None = None) -> dict[str, list[Ledger]]:
    """The topics retention has work on, each with the ledgers to delete (possibly none: a marker or a
    leftover copy is due), by name. Two statements, whatever the store's history."""
    if topic is not None:
        deps.meta.get_topic(topic)  # an unknown topic fails here
    due = deps.meta.planning.retention(topic)
    for name in deps.meta.planning.retention_housekeeping(topic):
        due.setdefault(name, [])
    return dict(sorted(due.items()))


def apply_retention(deps: Deps, topic: str) -> RetentionReport:
    """One topic: delete what retention allows now (decided again under the topic's locks), then the trim
    marker and the tier-1 files. A topic deleted since the plan has nothing due: an empty report (its
    deletion removed its ledgers, marker and files), and the run goes on with the other topics."""
    try:
        trim = deps.meta.trims.retention(topic, deps.knobs.gc_delay)
    except TopicNotFound:
        log.info("topic %r was deleted since retention planned it: nothing due", topic)
        return RetentionReport()
    return _finish(deps, topic, trim)


def _report(topic: str, trim: TrimResult) -> RetentionReport:
    report = RetentionReport()
    report.deleted += [(topic, led.ledger_id) for led in trim.deleted]
    report.bytes += sum(led.size_bytes for led in trim.deleted)
    report.tier2_ledgers += sum(1 for led in trim.deleted if led.offload_uuid is not None)
    report.reasons.update(trim.reasons.values())
    report.losses += [_loss_item(topic, x.subscription, x.entries, x.bytes, x.first, x.last, x.reason)
                      for x in trim.losses]
    return report


def _loss_item(topic: str, subscription: str, entries: int, size: int, first: Position | None,
               last: Position | None, reason: str) -> dict:
    """One subscription's unread entries a run deletes (or its dry run would), as both report them."""
    return {"topic": topic, "subscription": subscription, "entry_count": entries, "bytes": size,
            "from": str(first), "to": str(last), "reason": reason}


def _finish(deps: Deps, topic: str, trim: TrimResult) -> RetentionReport:
    """After the trim's commit: the marker, then the tier-1 copies, each on its own (a copy that cannot be
    removed is in `failed`; the deletion it follows is committed and reported all the same), then the renamed
    files a run killed between recording a copy's deletion and removing the file left. A marker that cannot
    be written (tier 2 down) is in `failed` too, beside the committed deletion it follows; the copies then
    stay for the next run, which writes the marker first (a recovery from the bucket reads the trim point
    there, so files go only once it is written)."""
    report = _report(topic, trim)
    try:
        _move_trim_marker(deps, topic)
    except TieringError as exc:
        if isinstance(exc, BadInput):
            raise
        log.warning("trim marker of topic %r not written: %s", topic, exc)
        report.failed.append((topic, None, f"trim marker not written (the deletion is committed; the next run "
                                           f"writes it and removes the tier-1 copies): {exc}"))
        return report
    report.files_removed, failed = delete_deleted_copies(deps, topic)
    report.failed += [(topic, ledger_id, str(exc)) for ledger_id, exc in failed]
    sweep_tombstones(deps, [topic])
    return report


def _move_trim_marker(deps: Deps, topic: str) -> None:
    """PUT the marker when the trim point passed the one last written, then record it: killed in between,
    the next run PUTs the same marker again (record_trim never moves it back)."""
    with deps.meta.planning.marker_lock(topic):
        point, written = deps.meta.planning.trim_point(topic)
        if point > written:
            record_trim(deps.bucket, topic, point)
            deps.meta.planning.record_trim_marker(topic, point)


def retention(deps: Deps, topic: str | None = None) -> RetentionReport:
    """Every topic with something due, each on its own: one that fails (a tier-1 file that cannot be
    removed, tier 2 down for its marker) is reported in `failed` and the others go on, as the Spark job's
    items do; what the failed one committed stays committed and its next run finishes it."""
    total = RetentionReport()
    for name in plan_retention(deps, topic):
        try:
            total.add(apply_retention(deps, name))
        except BadInput:
            raise
        except TieringError as exc:
            log.warning("retention of topic %r failed: %s", name, exc)
            total.failed.append((name, None, str(exc)))
    return total


def truncate(deps: Deps, topic: str, position: Position, force: bool = False,
             dry_run: bool = False) -> RetentionReport:
    """`tiering truncate NAME L:E`: delete every whole ledger before the position's ledger. Refused when it
    would delete entries an ACTIVE subscription has not read, unless `force` (the loss is recorded).
    `dry_run`: the same decision and refusals, reporting what it would delete; nothing is written."""
    deps.meta.get_topic(topic)  # an unknown topic fails here
    # the open ledger's length is in its tier-1 file only: a position past it is refused as past any end
    # (its first entry needs no length: the ledgers before it go whatever the file holds)
    trim = deps.meta.trims.truncate(topic, position, force, deps.knobs.gc_delay, dry_run=dry_run,
                                    open_entries=lambda led: 0 if position == Position(led.ledger_id, 0)
                                    else ledger_extent(deps.meta, deps.tier1, led)[1])
    if dry_run:
        report = _report(topic, trim)
        report.files_removed = sum(1 for led in trim.deleted if led.tier1_present) + leftover_copies(deps, topic)
        return report
    return _finish(deps, topic, trim)


# ------------------------------------------------------------------------------------------------ dry run
def _sums(ledgers) -> dict:
    return {"ledger_count": len(ledgers), "entry_count": sum(led.entry_count for led in ledgers),
            "bytes": sum(led.size_bytes for led in ledgers)}


def dry_run(deps: Deps, topic: str | None = None) -> list[dict]:
    """What a retention run would delete now, per topic with something due or held back: the ledgers, their
    entries and bytes by reason; the ledgers due by time/size that subscriptions hold back, and how much each
    ACTIVE subscription holds; the unread entries the run would take from each subscription (its state too),
    as the run reports them. Three statements (the plan with and without the holds, the positions of the topics
    concerned), and a topic's policy where a subscription would lose entries; nothing changes."""
    if topic is not None:
        deps.meta.get_topic(topic)
    planned = deps.meta.planning.retention_plan(topic)
    unbound = deps.meta.planning.retention_plan(topic, hold=False)
    # tier-1 copies of ledgers a killed run deleted, which the run removes first (topics with none skipped)
    left = {name: n for name in deps.meta.planning.retention_housekeeping(topic)
            if (n := leftover_copies(deps, name))}
    names = sorted(set(planned) | set(unbound) | set(left))
    subs = deps.meta.subs.of_topics(names)
    out = []
    for name in names:
        plan = planned.get(name, [])
        doomed = [led for led, _ in plan]
        gone = {led.ledger_id for led in doomed}
        held = [led for led, why in unbound.get(name, []) if led.ledger_id not in gone and why in ("time", "size")]
        by_reason: dict[str, list] = {}
        for led, why in plan:
            by_reason.setdefault(why, []).append(led)
        holders = []
        for sub in subs.get(name, []):
            if sub.state == ACTIVE and held:
                loss = policy.unread_loss(sub.position, held)
                if loss.entries:
                    holders.append({"subscription": sub.name, "position": _pos(sub.position),
                                    "entry_count": loss.entries, "bytes": loss.bytes})
        unread, retain_unread = [], None
        for sub in subs.get(name, []):
            loss = policy.unread_loss(sub.position, doomed)
            if loss.entries:
                if retain_unread is None:
                    retain_unread = deps.meta.get_topic(name).policy.retain_unread
                why = policy.retention_loss_reason(sub.position, plan, retain_unread, sub.state == EXPIRED)
                unread.append({**_loss_item(name, sub.name, loss.entries, loss.bytes, loss.first, loss.new_position,
                                            why), "state": sub.state})
        out.append({"topic": name, **_sums(doomed), "ledger_ids": [led.ledger_id for led in doomed],
                    "tier1_copy_count": sum(1 for led in doomed if led.tier1_present) + left.get(name, 0),
                    "leftover_tier1_copy_count": left.get(name, 0),
                    "reasons": {led.ledger_id: why for led, why in plan},
                    "by_reason": {why: _sums(leds) for why, leds in sorted(by_reason.items())},
                    "held_back": {**_sums(held), "by_subscription": holders},
                    "unread_deleted": unread})
    return out


def _pos(p: Position | None) -> str | None:
    return None if p is None else str(p)


def describe_plan(item: dict) -> str:
    """One line of a dry run (the CLI's text output and the retention DAG's plan log)."""
    reasons = ", ".join(f"{why} {r['ledger_count']}" for why, r in item["by_reason"].items())
    line = (f"{item['topic']!r}: delete {item['ledger_count']} ledger(s), {item['entry_count']} entries, "
            f"{item['bytes']} bytes"
            + (f" ({reasons})" if reasons else ""))
    if item["leftover_tier1_copy_count"]:
        line += f"; remove {item['leftover_tier1_copy_count']} tier-1 file(s) of ledgers an interrupted run deleted"
    held = item["held_back"]
    if held["ledger_count"]:
        who = "; ".join(f"{h['subscription']!r} {h['entry_count']} entries / {h['bytes']} bytes unread"
                        for h in held["by_subscription"])
        line += f"; held back by subscriptions: {held['ledger_count']} ledger(s), {held['bytes']} bytes ({who})"
    if item["unread_deleted"]:
        line += "; deletes unread: " + "; ".join(
            f"{u['subscription']!r} ({u['state']}) {u['entry_count']} entries / {u['bytes']} bytes"
            for u in item["unread_deleted"])
    return line
