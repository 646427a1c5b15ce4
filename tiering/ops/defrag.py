"""Defrag (PDP-34's concat): merge runs of small offloaded ledgers of a topic into one data object and
one index object.

Sources of at least 5 MiB are copied server-side (UploadPartCopy with a byte range; on servers whose
UploadPartCopy cannot find keys holding '%', such sources are downloaded, see tier2/multipart.py); smaller
ones are downloaded, their page CRCs checked, and written into parts of at least 5 MiB (S3 parts but the last
must be; tier2/multipart.py cuts them, and a merge under 5 MiB is one PUT). The index objects are
concatenated too (page indexes included: their offsets are ledger-relative), so each ledger's chunk row says
where in the merged objects its bytes and its index lie; readers need nothing else. The merged keys are queued for GC before the upload; one transaction
switches every chunk row conditionally (version and key compare) and dequeues them; the old objects go to
GC with a delay so readers holding old metadata finish. Losing a race with retention, repair or another
defrag aborts the merge whole: nothing is lost, the merged objects are deleted. What is left of the group is
then planned again from the current rows and merged (merge_replanning, up to REPLANS times): a run ends
with its groups merged, by it or by another worker, or gone (trimmed), never with a lost race taken for
work done.

The merged keys are queued under the attempt, whose advisory lock (metadata/attempt_locks.py) the process
holds until it committed or discarded them: GC leaves them alone meanwhile however long the merge takes,
and collects a dead defrag's once due (the offload timeout). Should they be collected anyway (the lock's
connection lost), the commit finds them gone and the group fails (AttemptKeysCollected): that is no lost
race, as nobody else did the work, and committing would make chunks reference deleted objects.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from tiering import policy
from tiering.errors import BadInput, ConditionalUpdateFailed, CorruptObjectError, TieringError, TopicNotFound
from tiering.format.index import OffloadIndex, check_ledger_pages, decode_index
from tiering.format.keys import data_key, index_key
from tiering.format.metadata import user_metadata
from tiering.metadata.attempt_locks import DEFRAG_CLASS, DEFRAG_REASON
from tiering.metadata.repository import AttemptKeysCollected
from tiering.model import MIB, Chunk
from tiering.ops.context import Deps
from tiering.tier2.multipart import MIN_PART_SIZE, MultipartUpload, StepHook
from tiering.tier2.objects import Bucket, check_bucket, delete_keys, object_head, prefetch_ranges, put_bytes

# What an operator should see of a swallowed cleanup failure (the exception's type only: messages of
# database drivers may carry connection details).
log = logging.getLogger(__name__)


@dataclass
class DefragReport:
    groups: int = 0
    ledgers: int = 0
    objects_before: int = 0
    objects_after: int = 0
    bytes_copied_server_side: int = 0
    bytes_downloaded: int = 0
    lost_races: int = 0
    errors: list[str] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)  # per failed group: {"topic", "ledger" (its first), "error"}


def plan_defrag(deps: Deps, topic: str | None = None, small_bytes: int = 8 * MIB,
                max_merged_bytes: int = 256 * MIB) -> list[policy.DefragGroup]:
    """policy.defrag_groups over every topic, from candidate rows only (metadata/planning.py: small chunks
    alone in their object, found on a partial index, each with whether it continues the previous one's run)."""
    if small_bytes <= 0 or max_merged_bytes <= 0:
        raise BadInput("defrag thresholds must be positive")
    if small_bytes > max_merged_bytes:
        # every merged object would be refused by its cap; an empty plan would read as "nothing to merge"
        raise BadInput(f"--small-bytes ({small_bytes}) is larger than --max-merged-bytes ({max_merged_bytes}): "
                       "a merged object must be able to hold a small one")
    if topic is not None:
        deps.meta.get_topic(topic)  # an unknown topic fails here
    candidates = deps.meta.planning.defrag_candidates(small_bytes, topic)
    groups = policy.defrag_runs([(c.ledger, c.chunk, c.joins_previous) for c in candidates], max_merged_bytes)
    if groups:
        check_bucket(deps.bucket)  # tier 2 down: fail before queueing each group's merged keys for GC
    return groups


def merge_group(deps: Deps, group: policy.DefragGroup, report: DefragReport, hook: StepHook = None) -> bool:
    """Merge one group; False when it lost a race (another worker changed its ledgers' chunks meanwhile).
    The attempt's lock is held until its objects are committed or discarded: GC keeps them meanwhile."""
    with deps.meta.new_attempt(DEFRAG_CLASS) as attempt:
        return _merge_group(deps, group, report, hook, attempt)


def _merge_group(deps: Deps, group: policy.DefragGroup, report: DefragReport, hook: StepHook, attempt: str) -> bool:
    step = hook or (lambda _n: None)
    b, first = deps.bucket, group.ledgers[0]
    new_data = data_key(b.prefix, first.topic, attempt, first.ledger_id)
    new_index = index_key(b.prefix, first.topic, attempt, first.ledger_id)
    # Due after the offload timeout, but not collected while this process holds the attempt's lock: only a
    # dead defrag's objects go (metadata/gc_queue.py).
    deps.meta.enqueue_gc([new_data, new_index], DEFRAG_REASON, owner=attempt, delay=deps.knobs.offload_timeout)
    try:
        # Indexes first: their page indexes check every byte downloaded for the merged data object.
        indexes = _fetch_indexes(deps, group, report)
        data_offsets, data_etag = _merge_data(deps, group, indexes, new_data, report, step)
        index_offsets, index_etag = _put_index(deps, group, indexes, new_index)
        step("merged")
        moves = [(led, old, Chunk(new_data, d_off, old.data_length, new_index, i_off, old.index_length,
                                  old.first_entry_id, old.last_entry_id, old.version, data_etag, index_etag))
                 for led, old, d_off, i_off in zip(group.ledgers, group.chunks, data_offsets, index_offsets)]
        deps.meta.replace_chunks(moves, attempt, deps.knobs.gc_delay)
    except ConditionalUpdateFailed:
        report.lost_races += 1
        _discard(deps, attempt, new_data, new_index)
        return False
    except AttemptKeysCollected:
        # Not a lost race: the ledgers are as planned and nobody merged them; the work is not done.
        _discard(deps, attempt, new_data, new_index)
        timeout = int(deps.knobs.offload_timeout.total_seconds())
        raise TieringError(f"merged objects collected before the commit: the merge took longer than "
                           f"TIERING_OFFLOAD_TIMEOUT_SECONDS ({timeout}s) and lost its attempt lock, so GC "
                           "deleted them; nothing changed, rerun defrag") from None
    except TieringError:
        _discard(deps, attempt, new_data, new_index)
        # Sources read after another worker moved the ledgers (merged them, trimmed them) may be collected
        # already: whatever failed, this merge's commit would have lost, so it is that race, not a failure.
        if _moved(deps, group):
            report.lost_races += 1
            return False
        raise
    except BaseException:
        _discard(deps, attempt, new_data, new_index)
        raise
    report.groups += 1
    report.ledgers += len(group.ledgers)
    report.objects_before += 2 * len(group.ledgers)
    report.objects_after += 2
    return True


REPLANS = 5


def merge_replanning(deps: Deps, group: policy.DefragGroup, report: DefragReport, small_bytes: int,
                     max_merged_bytes: int, hook: StepHook = None) -> bool:
    """Merge one group as planned; when it loses a race, plan its topic again and merge the groups that
    hold any of its ledgers still, up to REPLANS rounds (TieringError after that: the work is not done).
    True when this worker merged something; False when the group's ledgers were all merged by another
    worker, trimmed or no longer small meanwhile (no group holds any of them any more)."""
    merged_before, pending = report.groups, [group]
    topic = group.ledgers[0].topic
    for _ in range(REPLANS):
        lost = [g for g in pending if not merge_group(deps, g, report, hook)]
        if not lost:
            return report.groups > merged_before
        ids = {led.ledger_id for g in lost for led in g.ledgers}
        try:
            replanned = plan_defrag(deps, topic, small_bytes, max_merged_bytes)
        except TopicNotFound:  # deleted meanwhile: its ledgers need no merge
            return report.groups > merged_before
        pending = [g for g in replanned if any(led.ledger_id in ids for led in g.ledgers)]
        if not pending:
            return report.groups > merged_before
    first, last = group.ledgers[0].ledger_id, group.ledgers[-1].ledger_id
    raise TieringError(f"topic {topic!r} ledgers {first}..{last}: other workers changed them {REPLANS} times "
                       "while this defrag merged them (planned again each time): not merged, rerun defrag")


def _moved(deps: Deps, group: policy.DefragGroup) -> bool:
    """Whether any of the group's chunk rows fails the compare the commit makes (version, data key), i.e.
    another worker changed it since the plan (False when it cannot be read)."""
    try:
        now = [deps.meta.get_chunk(led) for led in group.ledgers]
    except Exception:
        return False
    return any(old.moved(ch) for ch, old in zip(now, group.chunks))


def _discard(deps: Deps, attempt: str, *keys: str) -> None:
    """Delete the merged objects unless a commit references them (a lost reply); GC is the safety net."""
    try:
        if any(deps.meta.chunks_referencing(k) for k in keys):
            return
    except Exception as exc:
        log.warning("defrag attempt %s not discarded (%s): its merged objects stay queued for GC", attempt,
                    type(exc).__name__)
        return
    if not delete_keys(deps.bucket, keys):
        deps.meta.dequeue_gc(attempt)


def _merge_data(deps: Deps, group: policy.DefragGroup, indexes: list[tuple[bytes, OffloadIndex]], key: str,
                report: DefragReport, step) -> tuple[list[int], str | None]:
    b = deps.bucket
    with MultipartUpload(b, key=key, metadata=_metadata(group), op="defrag upload",
                         part_size=MIN_PART_SIZE, concurrency=deps.knobs.upload_concurrency, hook=step) as up:
        # Large sources first, each one server-side copied part; then the small ones written (cut into parts
        # of at least 5 MiB, the last may be smaller). Chunk rows carry offsets, so order is free.
        large = [i for i, ch in enumerate(group.chunks) if _one_part(ch)]
        small = [i for i, ch in enumerate(group.chunks) if not _one_part(ch)]
        offsets = [0] * len(group.chunks)
        escaped_copy_fails = False
        for i in large:
            ch = group.chunks[i]
            offsets[i] = up.size
            if not _unreplaced(b, ch):  # copied unread, it would hide damage under a fresh ETag: download it
                small.append(i)
                continue
            # A server that cannot copy from keys holding '%' (MultipartUpload.copy): download those instead.
            if (escaped_copy_fails and "%" in ch.data_key) or not up.copy(ch.data_key, ch.data_offset,
                                                                          ch.data_length, ch.data_etag):
                escaped_copy_fails = True
                small.append(i)
                continue
            report.bytes_copied_server_side += ch.data_length
        sources = ((group.chunks[i].data_key, group.chunks[i].data_offset, group.chunks[i].data_length)
                   for i in small)
        for i, data in zip(small, prefetch_ranges(b, sources, deps.knobs.upload_concurrency)):
            ch = group.chunks[i]
            # A corrupt source must not be copied into a merged object under a fresh checksum.
            check_ledger_pages(indexes[i][1], data, f"data object {ch.data_key}", ch.data_offset)
            offsets[i] = up.size
            up.write(data)
            report.bytes_downloaded += len(data)
        up.finish()
        return offsets, up.etag


def _one_part(ch: Chunk) -> bool:
    """Whether a source's data is large enough to be a part of its own (S3's minimum): copied server-side."""
    return ch.data_length >= MIN_PART_SIZE


def planned_transfer(groups: list[policy.DefragGroup]) -> tuple[int, int]:
    """(bytes a run would copy server-side, bytes it would download) for these groups, as `_merge_data` and
    `_fetch_indexes` decide with every source as its chunk row records it: a data object of 5 MiB or more
    whose ETag is known is copied, the others and every index are downloaded (a run downloads a large one too
    when its ETag changed since, or the server cannot copy its key). For the dry run."""
    copied = downloaded = 0
    for ch in (ch for g in groups for ch in g.chunks):
        big = _one_part(ch) and ch.data_etag is not None  # as `_unreplaced` takes it, the HEAD aside
        copied += ch.data_length if big else 0
        downloaded += ch.index_length + (0 if big else ch.data_length)
    return copied, downloaded


def _fetch_indexes(deps: Deps, group: policy.DefragGroup, report: DefragReport) -> list[tuple[bytes, OffloadIndex]]:
    """Each source's index object bytes (copied verbatim: page offsets are ledger-relative) and decoded."""
    out = []
    sources = ((ch.index_key, ch.index_offset, ch.index_length) for ch in group.chunks)
    for led, ch, data in zip(group.ledgers, group.chunks,
                             prefetch_ranges(deps.bucket, sources, deps.knobs.upload_concurrency)):
        index = decode_index(data, f"index object {ch.index_key} at {ch.index_offset}")
        # Another ledger's intact pair at these keys passes its own page checks: merged, it would get a fresh
        # ETag under this ledger's chunk row, and delete-lagged would then trust it.
        problem = index.mismatch(led.topic, led.ledger_id, led.entry_count, ch.data_length)
        if problem:
            raise CorruptObjectError("index object", ch.index_key, problem)
        out.append((data, index))
        report.bytes_downloaded += len(data)
    return out


def _unreplaced(b: Bucket, ch: Chunk) -> bool:
    """The data object still has the ETag its upload got (HEAD: Ceph RGW ignores the copy's own
    x-amz-copy-source-if-match, which MultipartUpload.copy sends as well); False when it is not known."""
    if ch.data_etag is None:
        return False
    head = object_head(b, ch.data_key)
    return head is not None and head[1] == ch.data_etag


def _metadata(group: policy.DefragGroup) -> dict[str, str]:
    return user_metadata(group.ledgers[0].topic, max(led.ledger_id for led in group.ledgers))


def _put_index(deps: Deps, group: policy.DefragGroup, indexes: list[tuple[bytes, OffloadIndex]],
               key: str) -> tuple[list[int], str | None]:
    body, offsets = bytearray(), []
    for data, _ in indexes:
        offsets.append(len(body))
        body += data
    return offsets, put_bytes(deps.bucket, key, bytes(body), _metadata(group))


def defrag(deps: Deps, topic: str | None = None, small_bytes: int = 8 * MIB, max_merged_bytes: int = 256 * MIB,
           hook: StepHook = None) -> DefragReport:
    report = DefragReport()
    for group in plan_defrag(deps, topic, small_bytes, max_merged_bytes):
        merge_replanning(deps, group, report, small_bytes, max_merged_bytes, hook)
    return report


def merge_groups(deps: Deps, groups: list[policy.DefragGroup], small_bytes: int = 8 * MIB,
                 max_merged_bytes: int = 256 * MIB,
                 on_group: Callable[[policy.DefragGroup], None] | None = None) -> DefragReport:
    """As defrag, but a failing group does not stop the others: its error goes to `report.errors`. The
    thresholds are those the groups were planned with (a lost race plans again with them)."""
    report = DefragReport()
    for group in groups:
        try:
            merge_replanning(deps, group, report, small_bytes, max_merged_bytes)
        except TieringError as exc:
            first, last = group.ledgers[0], group.ledgers[-1]
            report.errors.append(f"topic {first.topic!r} ledgers {first.ledger_id}..{last.ledger_id}: {exc}")
            report.failures.append({"topic": first.topic, "ledger": first.ledger_id, "error": str(exc)})
        if on_group:
            on_group(group)
    return report
