"""Rebuild topic, ledger and chunk rows of offloaded ledgers from the bucket alone (the database is lost).

Each index object holds its ledger's metadata (topic, ledger id, entry count, payload length, seal time,
offload uuid, data object length), so listing the prefix and reading the index objects is enough:

1. List the objects under the prefix (or under one topic's prefix); keys that `parse_key` does not
   recognise are not ours and are skipped. S3 lists keys in order, so each topic's keys arrive together and
   are handled one topic at a time.
2. Read every index object. A defrag (merged) index object is several ledgers' index objects concatenated;
   they are decoded one after the other (each has its own index_len). Every index must decode and name
   the topic it lies under.
3. The data object (the index key without `-index`) must exist with the length the index(es) say. For a
   merged object, the offset of each ledger inside it is found by walking its block headers (a ledger's
   bytes start at a block whose first entry is 0) and matching each run of blocks to the index with the
   same block layout, so recovery does not depend on the order defrag concatenated them in.
4. When a ledger has several copies (a dead attempt's leftovers, the pre-defrag objects not collected
   yet), the newest valid one wins (LastModified of the index object, which is written last); invalid
   ones (missing or short data object, corrupt index) never win.
5. One transaction per topic: the topic is created with the given (default) policy if missing, each
   recovered ledger becomes OFFLOADED with `tier1_present = false` and its chunk row, ledgers the database
   already has are left alone (so a second run adds nothing), and `next_ledger_id` moves past the largest
   id seen.

What the bucket cannot tell: ledgers never offloaded (tier-1 only, open, empty) and ledgers removed by
retention whose objects GC collected are reported as `unknown` id ranges; ledgers removed by retention
whose bytes are still in the bucket (GC not run yet, or a merged object still shared with live ledgers)
come back as OFFLOADED; topic policies, attributes, job history and the GC queue are not in the bucket
(objects no recovered chunk references are left to GC's orphan sweep). The recovered ledger's creation
time is its seal time, its offload times the objects' LastModified times (milliseconds, as stored).
"""
from __future__ import annotations

import uuid as _uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator

from tiering.errors import CorruptObjectError, DataLossError, TieringError
from tiering.format.block import HEADER_LEN, parse_block_header
from tiering.format.index import INDEX_HEADER_LEN, OffloadIndex, decode_index
from tiering.format.keys import INDEX_SUFFIX, ParsedKey, encode_topic, parse_key
from tiering.metadata.recovery import RecoveredLedger, restore_topic
from tiering.model import Chunk, TopicPolicy
from tiering.tier2.markers import read_trim_marker
from tiering.tier2.objects import Bucket, get_range, list_objects
from tiering.tier2.reader import check_stored_pages

# offload uuids that are not UUIDs (keys allow [0-9A-Za-z_-]) get a stable name-based one
_UUID_NS = _uuid.UUID("6f1d3c2e-8a43-4f0e-9d7c-2b6a5e1f0c11")


@dataclass
class RecoverReport:
    topics_created: list[str] = field(default_factory=list)
    ledgers_recovered: list[tuple[str, int]] = field(default_factory=list)
    already_known: list[tuple[str, int]] = field(default_factory=list)  # in the database already: untouched
    # ledger ids below the largest known one that neither the bucket nor the database holds, as ranges
    unknown: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (key, why) objects not used
    errors: list[str] = field(default_factory=list)  # S3 failures: rerun to finish (recovery is idempotent)
    objects_listed: int = 0
    foreign_objects: int = 0  # keys under the prefix that are not ledger objects
    without_page_index: int = 0  # ledger copies offloaded before page indexes: their bytes were not checked

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class _Obj:
    key: str
    size: int
    last_modified: datetime


@dataclass(frozen=True)
class _Copy:
    """One ledger as one index object (maybe merged) describes it."""

    ledger_id: int
    entry_count: int
    length: int
    sealed_at: datetime
    offload_uuid: str
    chunk: Chunk
    started_at: datetime
    finished_at: datetime
    topic: str = ""


@dataclass
class _Group:
    """One index object (plain or merged) and the ledger copies it proves valid."""

    index: _Obj
    copies: list[_Copy] = field(default_factory=list)
    problem: str | None = None
    error: str | None = None
    unchecked: int = 0  # ledgers whose index has no page index (offloaded before it existed)


def recover_from_bucket(engine, bucket: Bucket, topic: str | None = None,
                        policy: TopicPolicy = TopicPolicy(), concurrency: int = 8,
                        check_pages: bool = True) -> RecoverReport:
    """Rebuild the rows of every offloaded ledger the bucket holds (or only `topic`'s). With `check_pages`
    every page of every candidate copy is downloaded and its CRC32C checked (a full read of the bucket):
    a copy with a bad page is not recovered."""
    report = RecoverReport()
    prefix = bucket.prefix + (encode_topic(topic) + "/" if topic is not None else "")
    with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="recover") as pool:
        for segment, objects in _by_topic(bucket, prefix, report):
            if topic is not None and segment != encode_topic(topic):
                continue
            _recover_topic(engine, bucket, segment, objects, policy, pool, report, check_pages)
    return report


def _by_topic(b: Bucket, prefix: str, report: RecoverReport) -> Iterator[tuple[str, dict[str, tuple]]]:
    """(topic's key segment, {key: (parsed, _Obj)}) per topic, streaming the listing (keys of a topic are
    contiguous)."""
    current, objects = None, {}
    for o in list_objects(b, prefix):
        report.objects_listed += 1
        parsed = parse_key(b.prefix, o["Key"])
        if parsed is None:
            report.foreign_objects += 1
            continue
        if parsed.segment != current:
            if objects:
                yield current, objects
            current, objects = parsed.segment, {}
        objects[o["Key"]] = (parsed, _Obj(o["Key"], o["Size"], o["LastModified"]))
    if objects:
        yield current, objects


def _recover_topic(engine, b: Bucket, segment: str, objects: dict[str, tuple], policy: TopicPolicy,
                   pool: ThreadPoolExecutor, report: RecoverReport, check_pages: bool = True) -> None:
    sizes = {k: obj for k, (_, obj) in objects.items()}
    indexes = [(p, obj) for p, obj in objects.values() if p.is_index]
    with_index = {obj.key[:-len(INDEX_SUFFIX)] for _, obj in indexes}
    for p, obj in objects.values():
        if not p.is_index and obj.key not in with_index:
            report.ignored.append((obj.key, "data object without an index object (a dead attempt's leftover)"))
    groups = list(pool.map(lambda item: _read_group(b, segment, item[0], item[1], sizes, check_pages), indexes))
    report.without_page_index += sum(g.unchecked for g in groups if not g.problem and not g.error)
    # newest first: the index object is written last, so its time is the copy's completion time
    groups.sort(key=lambda g: (g.index.last_modified, g.index.key), reverse=True)
    chosen: dict[int, _Copy] = {}
    for g in groups:
        if g.error:
            report.errors.append(g.error)
            continue
        if g.problem:
            report.ignored.append((g.index.key, g.problem))
            continue
        fresh = [c for c in g.copies if c.ledger_id not in chosen]
        for c in fresh:
            chosen[c.ledger_id] = c
        if not fresh:
            report.ignored.append((g.index.key, "superseded: a newer valid copy holds its ledger(s)"))
    if not chosen:
        return
    name = next(iter(chosen.values())).topic  # from the index metadata: a long topic's key is hashed
    trimmed_before = read_trim_marker(b, name)
    for lid in [lid for lid in chosen if lid < trimmed_before]:
        report.ignored.append((chosen.pop(lid).chunk.index_key,
                               f"ledger {lid} trimmed by retention (marker: before ledger {trimmed_before})"))
    if chosen:
        _commit_topic(engine, name, chosen, policy, report)


# ----------------------------------------------------------------------------------------------- reading
def _read_group(b: Bucket, segment: str, parsed: ParsedKey, index: _Obj, objects: dict[str, _Obj],
                check_pages: bool = True) -> _Group:
    g = _Group(index)
    data = objects.get(index.key[:-len(INDEX_SUFFIX)])
    try:
        if data is None:
            g.problem = "no data object (an incomplete or dead attempt)"
            return g
        if index.size < INDEX_HEADER_LEN:
            g.problem = f"index object of {index.size} bytes is too short"
            return g
        buf = get_range(b, index.key, 0, index.size)
        parts = _split_indexes(buf, index.key)
        problem = _check_indexes(segment, parsed, parts)
        if problem:
            g.problem = problem
            return g
        total = sum(ix.data_object_len for _, _, ix in parts)
        if data.size != total:
            g.problem = (f"data object {data.key} is {data.size} bytes, the index says {total} "
                         "(incomplete or not this index's)")
            return g
        offsets = [0] if len(parts) == 1 else _merged_offsets(b, data.key, data.size, [ix for _, _, ix in parts])
        if offsets is None:
            g.problem = f"merged data object {data.key} does not match the block layout of its indexes"
            return g
        for (ioff, ilen, ix), doff in zip(parts, offsets):
            # A copy whose bytes fail a page check must not win over a good one (or be recovered at all).
            if check_pages and not check_stored_pages(b, data.key, doff, ix):
                g.unchecked += 1
        for (ioff, ilen, ix), doff in zip(parts, offsets):
            m = ix.metadata
            g.copies.append(_Copy(
                m.ledger_id, m.entry_count, m.length, datetime.fromtimestamp(m.sealed_time_ms / 1000, timezone.utc),
                m.offload_uuid,
                Chunk(data.key, doff, ix.data_object_len, index.key, ioff, ilen, 0, m.entry_count - 1),
                min(data.last_modified, index.last_modified), max(data.last_modified, index.last_modified),
                m.topic))
    except CorruptObjectError as exc:
        g.problem = f"invalid: {exc}"
    except DataLossError:
        g.problem = "vanished while recovery read it"
    except TieringError as exc:
        g.error = str(exc)
    return g


def _split_indexes(buf: bytes, key: str) -> list[tuple[int, int, OffloadIndex]]:
    """(offset, length, index) of each index object concatenated in buf."""
    out, off = [], 0
    while off < len(buf):
        if len(buf) - off < INDEX_HEADER_LEN:
            raise CorruptObjectError("index", f"index object {key} at {off}",
                                     f"{len(buf) - off} trailing bytes, shorter than an index header")
        index_len = int.from_bytes(buf[off + 4:off + 8], "big", signed=True)
        if not INDEX_HEADER_LEN <= index_len <= len(buf) - off:
            raise CorruptObjectError("index", f"index object {key} at {off}",
                                     f"index_len {index_len} does not fit the {len(buf) - off} bytes left")
        out.append((off, index_len, decode_index(buf[off:off + index_len], f"index object {key} at {off}")))
        off += index_len
    return out


def _check_indexes(segment: str, parsed: ParsedKey, parts: list[tuple[int, int, OffloadIndex]]) -> str | None:
    seen = set()
    for _, _, ix in parts:
        m = ix.metadata
        if encode_topic(m.topic) != segment:
            return f"index names topic {m.topic!r} but lies under key segment {segment!r}"
        if m.entry_count == 0:
            return f"index of ledger {m.ledger_id} has no entries"
        if m.ledger_id in seen:
            return f"ledger {m.ledger_id} appears twice in one index object"
        seen.add(m.ledger_id)
    first = parts[0][2].metadata
    if first.ledger_id != parsed.ledger_id:  # plain and merged keys are named after their (first) ledger
        return f"key names ledger {parsed.ledger_id}, its (first) index describes ledger {first.ledger_id}"
    return None


def _shape(ix: OffloadIndex) -> tuple:
    return tuple((e.first_entry_id, e.block_offset, ix.block_length(i)) for i, e in enumerate(ix.entries))


def _merged_offsets(b: Bucket, key: str, size: int, indexes: list[OffloadIndex]) -> list[int] | None:
    """Where each ledger's bytes start in a merged data object, from its block headers; None if the
    object's blocks cannot be matched one to one with the indexes."""
    segments: list[tuple[int, list]] = []
    off = 0
    while off < size:
        hdr = parse_block_header(get_range(b, key, off, HEADER_LEN), f"data object {key}", off)
        if off + hdr.block_len > size:
            return None
        if hdr.first_entry_id == 0:
            segments.append((off, []))
        elif not segments:
            return None
        start, blocks = segments[-1]
        blocks.append((hdr.first_entry_id, off - start, hdr.block_len))
        off += hdr.block_len
    shapes = [_shape(ix) for ix in indexes]
    offsets: list[int | None] = [None] * len(indexes)
    for start, blocks in segments:
        # identical layouts are interchangeable as far as the headers tell: take them in index order
        j = next((j for j, s in enumerate(shapes) if offsets[j] is None and s == tuple(blocks)), None)
        if j is None:
            return None
        offsets[j] = start
    return None if any(o is None for o in offsets) else offsets


# ----------------------------------------------------------------------------------------------- writing
def _as_uuid(value: str, key: str) -> str:
    try:
        return str(_uuid.UUID(value))
    except ValueError:
        return str(_uuid.uuid5(_UUID_NS, f"{key}:{value}"))


def _gaps(known: set[int]) -> list[tuple[int, int]]:
    gaps, nxt = [], 0
    for i in sorted(known):
        if i > nxt:
            gaps.append((nxt, i - 1))
        nxt = i + 1
    return gaps


def _commit_topic(engine, name: str, chosen: dict[int, _Copy], policy: TopicPolicy,
                  report: RecoverReport) -> None:
    restored = restore_topic(engine, name, policy, {i: RecoveredLedger(
        c.ledger_id, c.entry_count, c.length, c.sealed_at, _as_uuid(c.offload_uuid, c.chunk.index_key),
        c.started_at, c.finished_at, c.chunk) for i, c in chosen.items()})
    existing = restored.existing
    if restored.created:
        report.topics_created.append(name)
    report.ledgers_recovered += [(name, i) for i in restored.restored]
    report.already_known += [(name, i) for i in sorted(chosen) if i in existing]
    gaps = _gaps(existing | set(chosen))
    if gaps:
        report.unknown[name] = gaps


__all__ = ["RecoverReport", "recover_from_bucket"]
