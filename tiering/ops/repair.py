"""Repair: re-make a lost, short or corrupt tier-2 copy from a verified tier-1 copy; where no good copy is
left, mark the ledger lost so reads give a DATALOSS gap for its range at once.

Checking (plan_repair): for every OFFLOADED ledger not marked lost, its chunk's objects by HEAD (missing,
shorter than the chunk row says), its index (decodes, describes this ledger) and every page's CRC32C of its
data. No listing of the bucket: what is checked is what the chunk rows name. A ledger whose copy fails twice
(the second look caches nothing: a byte flipped on the way fails one check of a sound copy) is a finding; it is repairable when its tier-1 copy exists and verifies (every entry read, every CRC checked,
count and bytes as metadata says).

Repairing one finding (repair_ledger), safe to kill anywhere and to run again:
(1) the new pair's keys (a new attempt uuid; a batched ledger gets an object pair of its own) are queued for
GC not before the offload timeout; (2) the ledger streams from tier 1 into them (tier2/offloader.py, the
offload's writer); (3) the new pair is checked as (1) checks any copy; (4) one transaction moves the chunk
row to it by compare-and-set, dequeues the new keys and queues the old ones (metadata/repair.py). Until (4)
readers read the ledger as before (tier 1 while its copy exists); after it, from the new pair. Killed
before (4): the new objects are collected by GC and a rerun repairs with a new attempt; after it: the rerun
finds the copy sound. A lost race (retention deleted the ledger, defrag moved its chunk, another repair won)
discards the new pair and skips the ledger.

Where the tier-1 copy is absent or fails, the ledger is marked lost by compare-and-set on the same row and
chunk the check saw; nothing else changes (its chunk row stays for retention to collect). Tier 2 unreachable
is never a finding: the check raises before anything is marked.

An offloaded ledger whose tier-2 copy is sound and whose tier-1 copy (within the deletion lag) fails its
checks is a finding too (`tier1_copies`): repaired by deleting that copy as delete-lagged does (the tier-2
copy checked again, the row compared by version), ahead of the lag; readers read around it meanwhile.

A lost mark is undone when a good copy comes back (recover_lost; an operator restored the bucket from a
backup, or put the tier-1 file back): every ledger marked lost (read on the partial index `ledger_lost`,
never a scan of the topic's ledgers) is checked again first. Its chunk's objects present and every page
sound: the mark is cleared by compare-and-set on the row and chunk checked. Else a tier-1 file that verifies
(even one metadata recorded deleted: it was put back): the copy is re-made from it as above, the mark cleared
and the file recorded present (delete-lagged removes it after the lag) in the chunk move's transaction.
Killed anywhere, the ledger is still lost or recovered, never half: a rerun recovers it or finds it sound.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator

from tiering.errors import (ConditionalUpdateFailed, CorruptObjectError, DataLossError, EntryNotFound,
                            LedgerStorageError, TieringError)
from tiering.format.index import decode_index
from tiering.format.keys import data_key, index_key
from tiering.metadata.attempt_locks import REPAIR_CLASS, REPAIR_REASON
from tiering.model import Chunk, Ledger, LedgerState
from tiering.ops.context import Deps, select_topics
from tiering.ops.offload_batch import tier1_source
from tiering.tier2.errors import NotFound, ShortObject
from tiering.tier2.objects import check_bucket, delete_keys, get_range, object_length
from tiering.tier2.offloader import StepHook, packed_bytes, upload_ledgers
from tiering.tier2.reader import check_stored_pages, tier2_opener

log = logging.getLogger(__name__)
TIER1_UNSEEN = "metadata records a tier-1 copy; this process sees no file at"


@dataclass
class Finding:
    """An OFFLOADED ledger whose tier-2 copy failed its check. `tier1_problem` None: repairable."""
    led: Ledger
    chunk: Chunk | None
    problem: str
    tier1_problem: str | None
    # metadata says a tier-1 copy exists and this process does not see it (a worker without the tier-1 mount,
    # a copy being deleted): not proof of loss, so never marked lost on it
    tier1_unseen: bool = False
    # the tier-2 copy is sound and the tier-1 copy (`problem`) fails its checks: repaired by deleting it early
    # (reads already go on from tier 2 where it fails; delete-lagged would delete it after the lag)
    drop_tier1: bool = False

    @property
    def repairable(self) -> bool:
        return self.tier1_problem is None

    def as_dict(self) -> dict:
        return {"topic": self.led.topic, "ledger": self.led.ledger_id, "problem": self.problem,
                "repairable": self.repairable, "tier1_problem": self.tier1_problem,
                "repair": "delete the tier-1 copy" if self.drop_tier1 else
                "re-make the tier-2 copy" if self.repairable else "mark lost"}


@dataclass
class RepairReport:
    checked: int = 0
    findings: list[Finding] = field(default_factory=list)
    repaired: list[tuple[str, int]] = field(default_factory=list)
    lost: list[tuple[str, int]] = field(default_factory=list)  # marked now, or before and still no good copy
    recovered: list[tuple[str, int]] = field(default_factory=list)  # lost before, a good copy back: mark cleared
    skipped: list[tuple[str, int]] = field(default_factory=list)  # moved on meanwhile (a lost race)
    failed: list[dict] = field(default_factory=list)  # {"topic", "ledger", "error"}
    bytes: int = 0


class _Lengths:
    """Object lengths by HEAD, each key once per run (a batched object holds many ledgers)."""

    def __init__(self, deps: Deps):
        self.deps, self.known = deps, {}

    def __call__(self, key: str) -> int | None:
        if key not in self.known:
            self.known[key] = object_length(self.deps.bucket, key)
        return self.known[key]


def check_lengths(ch: Chunk, lengths: Callable[[str], int | None]) -> str | None:
    """Why the chunk's objects cannot hold its ranges (missing, or shorter than offset + length), or None."""
    for kind, key, end in (("data", ch.data_key, ch.data_offset + ch.data_length),
                           ("index", ch.index_key, ch.index_offset + ch.index_length)):
        length = lengths(key)
        if length is None:
            return f"tier-2 {kind} object {key!r} is missing"
        if length < end:
            return f"tier-2 {kind} object {key!r} has {length} bytes, the chunk row needs {end}"
    return None


def check_copy(deps: Deps, led: Ledger, ch: Chunk | None, lengths: Callable[[str], int | None] | None = None,
               opener=None) -> str | None:
    """Why the ledger's tier-2 copy at `ch` is not sound, or None. Tier 2 unreachable, access denied and the
    like raise (`Tier2Error`): only what the store answered about the objects is a finding."""
    if ch is None:
        return "metadata has no chunk for an offloaded ledger"
    problem = check_lengths(ch, lengths or _Lengths(deps))
    if problem is not None:
        return problem
    try:
        index = decode_index(get_range(deps.bucket, ch.index_key, ch.index_offset, ch.index_length),
                             f"index object {ch.index_key} at {ch.index_offset}")
        problem = index.mismatch(led.topic, led.ledger_id, led.entry_count, ch.data_length)
        if problem:
            return f"index object {ch.index_key!r} {problem}"
        if not check_stored_pages(deps.bucket, ch.data_key, ch.data_offset, index):
            # written before page checksums: the framing and the count are what can be checked
            count = sum(1 for _ in (opener or tier2_opener(deps.bucket))(led, ch).iter_entries(0, led.entry_count - 1))
            if count != led.entry_count:
                return f"tier-2 copy holds {count} entries, metadata says {led.entry_count}"
    except (CorruptObjectError, DataLossError, EntryNotFound, NotFound, ShortObject) as exc:
        return str(exc)
    return None


def check_tier1(deps: Deps, led: Ledger, put_back: bool = False) -> str | None:
    """Why the ledger's tier-1 copy cannot be repaired from, or None when it verifies. `put_back`: a file
    where metadata records the copy deleted counts too (an operator put it back to recover a lost ledger)."""
    if not led.tier1_present and not (put_back and deps.tier1.exists(led.topic, led.ledger_id)):
        return "no tier-1 copy (deleted after the deletion lag)"
    if not deps.tier1.exists(led.topic, led.ledger_id):
        return f"{TIER1_UNSEEN} {str(deps.tier1.path(led.topic, led.ledger_id))!r}"
    try:
        with deps.tier1.reader(led.topic, led.ledger_id) as reader:
            count = size = 0
            for _, data in reader.iter_entries(0, None) if led.entry_count else ():
                count += 1
                size += len(data)
    except (LedgerStorageError, EntryNotFound, CorruptObjectError) as exc:
        return f"tier-1 copy: {exc}"
    if (count, size) != (led.entry_count, led.size_bytes):
        return f"tier-1 copy holds {count} entries ({size} bytes), metadata says {led.entry_count} ({led.size_bytes})"
    return None


def _offloaded(deps: Deps, topic: str | None) -> Iterator[tuple[list[Ledger], dict[int, Chunk]]]:
    for t in select_topics(deps.meta, topic):
        leds, chunks = deps.meta.repairs.offloaded(t.name)  # one moment: no OFFLOADED ledger without its chunk
        if leds:
            yield leds, chunks


def plan_repair(deps: Deps, topic: str | None = None, report: RepairReport | None = None,
                on_ledger: Callable[[Ledger], None] | None = None,
                keep: Callable[[Ledger], bool] | None = None, tier1_copies: bool = True) -> list[Finding]:
    """Every OFFLOADED ledger (of `topic`, or all; those `keep` keeps) whose tier-2 copy fails its check, with
    whether its tier-1 copy verifies; with `tier1_copies`, also each whose tier-2 copy is sound and whose
    tier-1 copy (within the deletion lag) fails, to be deleted early. Ledgers already marked lost are skipped
    (recover_lost checks them). Nothing is written. An unknown topic fails here; tier 2 unreachable raises before any ledger is
    looked at (and the bucket is not even asked when no ledger is to be checked)."""
    report = report if report is not None else RepairReport()
    found: list[Finding] = []
    lengths, opener = _Lengths(deps), None
    for leds, chunks in _offloaded(deps, topic):
        for led in leds:
            if keep is not None and not keep(led):
                continue
            if led.lost:
                continue
            if opener is None:
                check_bucket(deps.bucket)
                opener = tier2_opener(deps.bucket)
            report.checked += 1
            ch = chunks.get(led.ledger_id)
            problem = check_copy(deps, led, ch, lengths, opener)
            if problem is not None:
                # a bit flipped on the way or a 404 of a busy gateway fails one check of a sound copy: it is a
                # finding (and, with no tier-1 copy, marked lost) only when a second look, nothing cached,
                # fails too
                log.warning("repair: ledger %s/%d: %s; checking its copy again", led.topic, led.ledger_id, problem)
                problem = check_copy(deps, led, ch, _Lengths(deps), opener)
            if problem is not None:
                tier1 = check_tier1(deps, led)
                found.append(Finding(led, ch, problem, tier1, tier1 is not None and tier1.startswith(TIER1_UNSEEN)))
            elif tier1_copies and led.tier1_present and deps.tier1.exists(led.topic, led.ledger_id):
                tier1 = check_tier1(deps, led)
                if tier1 is not None:  # (a copy this process does not see is no finding: exists() said it does)
                    found.append(Finding(led, ch, tier1, None, drop_tier1=True))
            if on_ledger:
                on_ledger(led)
    report.findings.extend(found)
    return found


def repair_ledger(deps: Deps, finding: Finding, hook: StepHook = None) -> str:
    """Repair one finding: "repaired", "lost" (marked), or "skipped" (the ledger or its chunk moved on since
    it was checked: nothing changed). Other failures raise, the new objects discarded."""
    if finding.tier1_unseen:
        if _changed(deps, finding.led):  # its copy was being deleted (retention, delete-lagged): a lost race
            return "skipped"
        raise TieringError(f"ledger {finding.led.topic}/{finding.led.ledger_id}: tier-2 copy: {finding.problem}; "
                           f"{finding.tier1_problem}: not marked lost (run where the tier-1 root is mounted)")
    step = hook or (lambda _step: None)
    if finding.drop_tier1:
        from tiering.ops.delete_lagged import delete_copy  # (it imports this module's checks)

        # delete-lagged's deletion, ahead of the lag: the tier-2 copy checked again, the row compared by version
        return "repaired" if delete_copy(deps, finding.led) else "skipped"
    if not finding.repairable:
        step("marking-lost")
        try:
            deps.meta.repairs.mark_lost(finding.led, finding.chunk, f"{finding.problem}; {finding.tier1_problem}")
        except ConditionalUpdateFailed:
            return "skipped"
        step("marked-lost")
        return "lost"
    return _rewrite(deps, finding, step)


def recover_lost(deps: Deps, topic: str | None = None, report: RepairReport | None = None, dry_run: bool = False,
                 hook: StepHook = None, keep: Callable[[Ledger], bool] | None = None) -> RepairReport:
    """Every ledger marked lost (of `topic`, or all; those `keep` keeps) checked again: recovered (its mark
    cleared, the copy re-made from a verified tier-1 file first where the tier-2 copy still fails) into
    `report.recovered`, else still lost into `report.lost`. `dry_run`: what would be recovered, nothing
    written. The bucket is not asked when no ledger is marked lost."""
    report = report if report is not None else RepairReport()
    step = hook or (lambda _step: None)
    lengths, checked_bucket = _Lengths(deps), False
    for led, ch in deps.meta.repairs.lost_ledgers(topic):
        if keep is not None and not keep(led):
            continue
        if not checked_bucket:
            check_bucket(deps.bucket)
            checked_bucket = True
        ref = (led.topic, led.ledger_id)
        problem = check_copy(deps, led, ch, lengths)
        if problem is not None and (ch is None or check_tier1(deps, led, put_back=True) is not None):
            report.lost.append(ref)  # still no good copy
            continue
        if dry_run:
            report.recovered.append(ref)
            continue
        try:
            outcome = _recover(deps, led, ch, problem, step)
        except TieringError as exc:
            report.failed.append({"topic": led.topic, "ledger": led.ledger_id, "error": str(exc)})
            continue
        if outcome == "skipped":  # the ledger moved on since it was read (retention, another repair)
            report.skipped.append(ref)
            continue
        report.recovered.append(ref)
        report.bytes += led.size_bytes if outcome == "remade" else 0
    return report


def _recover(deps: Deps, led: Ledger, ch: Chunk, problem: str | None, step) -> str:
    """A lost ledger whose copy checks (`problem` None) or whose tier-1 file verifies: "recovered" (mark
    cleared), "remade" (copy re-made from tier 1, mark cleared with the chunk move) or "skipped"."""
    if problem is not None:
        return "remade" if _rewrite(deps, Finding(led, ch, problem, None), step, recover=True) == "repaired" \
            else "skipped"
    step("recovering")
    try:
        deps.meta.repairs.clear_lost(led, ch)
    except ConditionalUpdateFailed:
        return "skipped"
    step("recovered")
    return "recovered"


def _rewrite(deps: Deps, finding: Finding, step, recover: bool = False) -> str:
    led, old = finding.led, finding.chunk
    if old is None:  # nothing to compare-and-set against (no completed offload leaves this)
        if _changed(deps, led):  # retention deleted it between the reads of its row and of its chunk row
            return "skipped"
        raise TieringError(f"ledger {led.topic}/{led.ledger_id} is OFFLOADED with no chunk row: not repaired")
    # the attempt's lock is held until the new copy is committed or discarded: GC leaves it alone meanwhile,
    # however long the upload takes (a dead repair's copy is collected once due)
    with deps.meta.new_attempt(REPAIR_CLASS) as attempt:
        return _rewrite_as(deps, finding, step, recover, attempt)


def _rewrite_as(deps: Deps, finding: Finding, step, recover: bool, attempt: str) -> str:
    led, old, b, knobs = finding.led, finding.chunk, deps.bucket, deps.knobs
    keys = (data_key(b.prefix, led.topic, attempt, led.ledger_id), index_key(b.prefix, led.topic, attempt, led.ledger_id))
    # queued before the first byte: a repair killed from here on leaves GC the new objects, never an orphan
    deps.meta.enqueue_gc(keys, REPAIR_REASON, owner=attempt, delay=knobs.offload_timeout)
    step("queued")
    try:
        uploaded = upload_ledgers(b, topic=led.topic, attempt=attempt, data_key=keys[0], index_key=keys[1],
                                  sources=tier1_source(deps, led), block_size=knobs.block_size, page_size=knobs.page_size,
                                  concurrency=knobs.upload_concurrency, hook=step,
                                  max_bytes_per_second=knobs.max_bytes_per_second,
                                  expected_bytes=packed_bytes(led.size_bytes, led.entry_count))
        [p] = uploaded.ledgers
        new = Chunk(keys[0], p.data_offset, p.data_length, keys[1], p.index_offset, p.index_length, 0,
                    led.entry_count - 1, data_etag=uploaded.data_etag, index_etag=uploaded.index_etag)
        problem = check_copy(deps, led, new)  # checked as written before anything points at it
        if problem is not None:
            raise TieringError(f"ledger {led.topic}/{led.ledger_id}: the new tier-2 copy fails its check: {problem}")
        step("checked")
        _commit(deps, led, old, new, attempt, recover)
        step("committed")
    except ConditionalUpdateFailed:
        _discard(deps, attempt, keys)
        return "skipped"
    except TieringError:
        _discard(deps, attempt, keys)
        if _moved_on(deps, led, recover):  # e.g. retention deleted it, tier-1 copy included, while it was read
            return "skipped"
        raise
    except BaseException:
        _discard(deps, attempt, keys)
        raise
    return "repaired"


def _current(deps: Deps, led: Ledger) -> Ledger | None:
    """The ledger's row now; None when its topic was deleted."""
    try:
        return deps.meta.get_ledger(led.topic, led.ledger_id)
    except TieringError:
        return None


def _changed(deps: Deps, led: Ledger) -> bool:
    """Whether the ledger's row moved on since `led` was read (or its topic is gone)."""
    now = _current(deps, led)
    return now is None or now.version != led.version


def _moved_on(deps: Deps, led: Ledger, recover: bool = False) -> bool:
    now = _current(deps, led)
    return now is None or now.state != LedgerState.OFFLOADED or now.lost != recover


def _commit(deps: Deps, led: Ledger, old: Chunk, new: Chunk, attempt: str, recover: bool) -> None:
    """The chunk move (`recover`: of a lost ledger, its mark cleared and the tier-1 file it was re-made from
    recorded present: a file put back is then metadata's again, delete-lagged removes it after the lag);
    when only the ledger's version moved on (delete-lagged recorded its tier-1 copy deleted meanwhile: the
    ledger's bytes never change), once more from its current row, the tier-1 record left as it now is."""
    try:
        deps.meta.repairs.move_chunk(led, old, new, attempt, deps.knobs.gc_delay, recover, True if recover else None)
    except ConditionalUpdateFailed:
        now = deps.meta.get_ledger(led.topic, led.ledger_id)
        if now.version == led.version or now.state != LedgerState.OFFLOADED or now.lost != recover:
            raise
        deps.meta.repairs.move_chunk(now, old, new, attempt, deps.knobs.gc_delay, recover)


def _discard(deps: Deps, attempt: str, keys: tuple[str, str]) -> None:
    """Delete the new objects unless a commit references them (a lost reply); GC is the safety net."""
    try:
        if any(deps.meta.chunks_referencing(k) for k in keys):
            return
        if not delete_keys(deps.bucket, keys):
            deps.meta.dequeue_gc(attempt)
    except Exception as exc:  # noqa: BLE001 - the keys stay queued for GC
        log.warning("repair attempt %s not discarded (%s): its objects stay queued for GC", attempt,
                    type(exc).__name__)


def repair(deps: Deps, topic: str | None = None, dry_run: bool = False, hook: StepHook = None,
           on_ledger: Callable[[Ledger], None] | None = None,
           keep: Callable[[Ledger], bool] | None = None, tier1_copies: bool = True) -> RepairReport:
    """Check the ledgers marked lost again (recover_lost) and every other offloaded ledger (plan_repair;
    those `keep` keeps) and repair each finding (unless `dry_run`: then nothing is written); one failing
    ledger does not stop the others. The lost ones first: a ledger marked in this run is not checked twice."""
    report = RepairReport()
    if topic is not None:
        deps.meta.get_topic(topic)  # an unknown topic fails before anything is checked
    recover_lost(deps, topic, report, dry_run, hook, keep)
    for finding in plan_repair(deps, topic, report, on_ledger, keep, tier1_copies):
        if dry_run:
            continue
        led = finding.led
        try:
            outcome = repair_ledger(deps, finding, hook)
        except TieringError as exc:
            report.failed.append({"topic": led.topic, "ledger": led.ledger_id, "error": str(exc)})
            continue
        if outcome == "repaired":
            report.repaired.append((led.topic, led.ledger_id))
            report.bytes += led.size_bytes
        elif outcome == "lost":
            report.lost.append((led.topic, led.ledger_id))
        else:
            report.skipped.append((led.topic, led.ledger_id))
    return report
