"""Rebuild topic, ledger and chunk rows from the bucket (and tier 1) when the database is lost.

Each index object holds its ledger's metadata (topic, ledger id, entry count, payload length, seal time,
offload uuid, data object length), so listing the prefix and reading the index objects is enough:

1. List the objects under the prefix (or under one topic's prefix); keys that `parse_key` does not
   recognise are not ours and are skipped (and a key in our form that no index backs counts only when its
   data starts as a ledger's does: _keys_with_ledger_data). S3 lists keys in order, so each topic's keys arrive together.
   Topics are recovered concurrently (`topic_concurrency`), their index objects read by one shared pool
   (`concurrency`); the Spark job (tiering/jobs/recover.py) instead lists the topic segments on the
   driver and recovers each topic on an executor with `recover_topic`, the same code.
2. Read every index object. A defrag (merged) or batch index object is several ledgers' index objects
   concatenated; they are decoded one after the other (each has its own index_len). Every index must
   decode and name the topic it lies under.
3. The data object (the index key without `-index`) must exist with the length the index(es) say (from
   the listing: no HEAD). For a merged object, the offset of each ledger inside it is found by walking its
   block headers (a ledger's bytes start at a block whose first entry is 0) and matching each run of
   blocks to the index with the same block layout, so recovery does not depend on the concatenation order.
   A corrupt block header loses only its own ledger: the ones before it are placed by the walk, the ones
   after it from the object's end backwards (tiering/ops/recover_merged.py).
   With `check_pages` every page of every copy is also downloaded and its CRC32C checked (the bucket's
   whole size); it is off by default: see `recover_from_bucket`.
4. When a ledger has several copies (a dead attempt's leftovers, the pre-defrag objects not collected
   yet), the newest valid one wins (LastModified of the index object, which is written last); invalid
   ones (missing or short data object, corrupt index, a bad page when checked) never win. A topic where
   an index object could not be read (an S3 error) is not committed at all: an older copy must not win
   because the newer one was unreadable for a moment. The error is reported; a rerun finishes it.
5. Tier 1 (recover_tier1.py): ledger files the bucket does not hold are adopted as SEALED (open ones
   sealed first), the copy of an offloaded ledger is recorded, and `next_ledger_id` moves past every file.
6. One transaction per topic: the topic is created with the given (default) policy if missing, each
   recovered ledger becomes OFFLOADED with its chunk row, ledgers the database already has are left alone
   (so a second run adds nothing), and `next_ledger_id` moves past the largest id seen.

What neither tells: ledgers removed by retention whose objects GC collected (and ledgers lost with a tier-1
disk) are reported as `unknown` id ranges; those at or above the trim marker are recorded as ledgers marked
lost without a chunk row (`lost_ledger`), so reads give their DATALOSS gap and verify and stats count them;
ledgers removed by retention whose bytes are still in the bucket come back as OFFLOADED unless the retention trim marker says otherwise; topic policies, attributes, job
history and the GC queue are in neither (objects no recovered chunk references are left to GC's orphan
sweep). The recovered ledger's creation time is its seal time, its offload times the objects' LastModified
times (milliseconds, as stored).
"""
from __future__ import annotations

import logging
import threading
import uuid as _uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable, Iterator

from tiering.errors import CorruptObjectError, DataLossError, TieringError
from tiering.format.block import HEADER_LEN, parse_block_header
from tiering.format.index import INDEX_HEADER_LEN, OffloadIndex
from tiering.format.keys import INDEX_SUFFIX, ParsedKey, encode_topic, is_trim_marker, parse_key
from tiering.format.merged import split_indexes
from tiering.format.metadata import last_ledger_of
from tiering.metadata import gc_sweep
from tiering.metadata.recovery import (MAX_LOST_ROWS, AdoptedLedger, RecoveredLedger, gaps, known_ledgers, lost_ledger,
                                       restore_topic, topic_names)
from tiering.model import Chunk, TopicPolicy
from tiering.ops.recover_merged import merged_offsets
from tiering.ops.recover_tier1 import Tier1Scan, scan_topic, topic_dirs, topic_of_dir
from tiering.tier1 import Tier1Store, topic_dir_name
from tiering.tier1.paths import NAME_FILE
from tiering.tier2.listing import segment_objects
from tiering.tier2.markers import read_trim_marker
from tiering.tier2.objects import Bucket, get_range, list_objects, object_head, object_metadata
from tiering.tier2.reader import check_stored_pages

log = logging.getLogger(__name__)
# offload uuids that are not UUIDs (keys allow [0-9A-Za-z_-]) get a stable name-based one
_UUID_NS = _uuid.UUID("6f1d3c2e-8a43-4f0e-9d7c-2b6a5e1f0c11")
_LIST_FIELDS = ("topics_created", "topics", "ledgers_recovered", "already_known", "ignored", "errors",
                "tier1_adopted", "tier1_sealed", "tier1_copies_recorded", "tier1_ignored", "unnamed_tier1_dirs",
                "tier1_copies_gone", "lost_recorded", "chunks_moved")


@dataclass
class RecoverReport:
    topics_created: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)  # every topic recovery looked at, by name
    ledgers_recovered: list[tuple[str, int]] = field(default_factory=list)  # from the bucket, OFFLOADED
    already_known: list[tuple[str, int]] = field(default_factory=list)  # in the database already: untouched
    # ledger ids below the largest known one (or the largest a key in the bucket names) that neither the
    # bucket, tier 1 nor the database holds a good copy of
    unknown: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    # the unknown ids at or above the topic's trim point, recorded now as ledgers marked lost (no chunk row)
    lost_recorded: list[tuple[str, int]] = field(default_factory=list)
    # ledgers the database had whose chunk named objects gone, moved to the bucket's other whole copy (their
    # lost mark cleared); also in ledgers_recovered
    chunks_moved: list[tuple[str, int]] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (key, why) objects not used
    errors: list[str] = field(default_factory=list)  # failures: rerun to finish (recovery is idempotent)
    objects_listed: int = 0
    foreign_objects: int = 0  # keys under the prefix that are not ledger objects
    without_page_index: int = 0  # copies offloaded before page indexes: their bytes could not be checked
    pages_checked: bool = False
    tier1_adopted: list[tuple[str, int]] = field(default_factory=list)  # SEALED ledgers only tier 1 held
    tier1_sealed: list[tuple[str, int]] = field(default_factory=list)  # of those, open files sealed now
    tier1_copies_recorded: list[tuple[str, int]] = field(default_factory=list)  # OFFLOADED + tier-1 copy
    tier1_ignored: list[tuple[str, str]] = field(default_factory=list)  # ("topic/ledger", why) not used
    tier1_copies_gone: list[tuple[str, int]] = field(default_factory=list)  # OFFLOADED, recorded copy not there
    unnamed_tier1_dirs: list[str] = field(default_factory=list)  # tier-1 directories of topics not named

    @property
    def ok(self) -> bool:
        return not self.errors

    def merge(self, other: RecoverReport) -> None:
        for name in _LIST_FIELDS:
            getattr(self, name).extend(getattr(other, name))
        self.unknown.update(other.unknown)
        self.objects_listed += other.objects_listed
        self.foreign_objects += other.foreign_objects
        self.without_page_index += other.without_page_index


def unnamed_dirs_error(dirs: list[str]) -> str:
    """Why a recovery that met tier-1 directories it could not name did not finish: a long topic's directory
    name holds a cut of its name and a hash, which cannot be read back; without its name file (a directory
    made before tier 1 wrote one, or the file lost) its ledgers come back only with the name given."""
    shown = ", ".join(dirs[:3]) + (f" and {len(dirs) - 3} more" if len(dirs) > 3 else "")
    return (f"{len(dirs)} tier-1 director{'y' if len(dirs) == 1 else 'ies'} not recovered: {shown} (a long topic's "
            f"name is cut in its directory's name, and no {NAME_FILE} file there holds it whole: recover each by "
            f"its name, recover-from-bucket --topic NAME)")


@dataclass(frozen=True)
class _Obj:
    key: str
    size: int
    last_modified: datetime
    etag: str | None = None


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
    bad: list[tuple[int, str]] = field(default_factory=list)  # (ledger id, why) copies failing their pages
    named: list[int] = field(default_factory=list)  # the ledgers its index object lists, valid or not
    described: dict[int, tuple] = field(default_factory=dict)  # (entries, bytes, seal time) of each, as listed
    # a problem (or a bad copy) found in the bytes read, not in the listing: a fault of the link can say so once
    from_bytes: bool = False


@dataclass
class _Listed:
    """One topic's objects as listed: {key: (parsed, _Obj)}, and whether its trim marker is among them."""

    segment: str
    objects: dict[str, tuple] = field(default_factory=dict)
    has_marker: bool = False


def recover_from_bucket(engine, bucket: Bucket, topic: str | None = None,
                        policy: TopicPolicy = TopicPolicy(), concurrency: int = 16,
                        check_pages: bool = False, tier1: Tier1Store | None = None,
                        topic_concurrency: int = 4, dry_run: bool = False) -> RecoverReport:
    """Rebuild the rows of every ledger the bucket (and `tier1`, when given) holds, or only `topic`'s.

    `dry_run`: what a run would do now, in the same report: each topic's transaction makes its decisions
    and writes as a run's would, then rolls back; no open tier-1 file is sealed. It takes no lock against
    GC (it deletes nothing a GC run relies on, and writes nothing), so a run afterwards may find more or
    less than the preview if GC, an offload or a producer moved in between.

    `check_pages` downloads every page of every copy and checks its CRC32C, so a copy with a bad page is
    not recovered (nor preferred to a good older one). Off by default: it reads the whole bucket, while
    without it each data object's existence and length are still checked (from the listing), every index
    is decoded and checked, and a bad page is still caught by every read (and by `tiering verify`), never
    served. Turn it on when the bucket itself is suspect."""
    with recovery_guard(engine, bucket, dry_run):
        return _recover(engine, bucket, topic, policy, concurrency, check_pages, tier1, topic_concurrency, dry_run)


def recovery_guard(engine, bucket: Bucket, dry_run: bool):
    """What a recovery holds for its whole run: the sweep's lock, which also keeps GC runs of the queue out
    (gc_sweep.excluding_sweep). A dry run writes nothing, so it keeps nothing out and holds nothing."""
    return nullcontext() if dry_run else gc_sweep.excluding_sweep(engine, bucket.name, bucket.prefix)


def _recover(engine, bucket: Bucket, topic: str | None, policy: TopicPolicy, concurrency: int,
             check_pages: bool, tier1: Tier1Store | None, topic_concurrency: int,
             dry_run: bool = False) -> RecoverReport:
    report = RecoverReport(pages_checked=check_pages)
    lock = threading.Lock()
    only = encode_topic(topic) if topic is not None else None
    prefix = bucket.prefix + (only + "/" if only is not None else "")

    unread: set[str] = set()  # segments whose recovery failed: what the bucket holds of them is not known

    def one(listed: _Listed, name: str | None = None) -> None:
        part = recover_topic(engine, bucket, listed, policy, reads, check_pages, tier1, name, dry_run)
        with lock:
            report.merge(part)
            if part.errors:
                unread.add(listed.segment)

    listing = RecoverReport()  # counted by this thread only; merged at the end
    with ThreadPoolExecutor(max(1, concurrency), thread_name_prefix="recover-read") as reads, \
            ThreadPoolExecutor(max(1, topic_concurrency), thread_name_prefix="recover-topic") as topics:
        pending: deque = deque()

        def submit(listed: _Listed, name: str | None = None) -> None:
            pending.append(topics.submit(one, listed, name))
            while len(pending) > 2 * topic_concurrency:  # bounded memory: a few topics' listings at a time
                pending.popleft().result()

        for listed in _by_topic(bucket, prefix, listing):
            if only is None or listed.segment == only:
                submit(listed)
        while pending:
            pending.popleft().result()
        if tier1 is not None:  # topics only tier 1 knows (never offloaded, or the bucket lost them)
            seen = {topic_dir_name(t) for t in report.topics}
            dirs = [topic_dir_name(topic)] if topic is not None else topic_dirs(tier1)
            for item in tier1_only_items(dirs, seen, report, topic, () if topic is not None else topic_names(engine),
                                         tier1):
                # a topic whose objects could not be read is not one "only tier 1 knows": taken so, the ledgers
                # before its tier-1 files would be recorded lost; the rerun that reads them recovers it whole
                if item["segment"] not in unread:
                    submit(_Listed(item["segment"]), item["topic"])
            while pending:
                pending.popleft().result()
    report.merge(listing)
    return report


def tier1_only_items(dirs: Iterable[str], seen: set[str], report: RecoverReport, topic: str | None = None,
                     known: Iterable[str] = (), tier1: Tier1Store | None = None) -> list[dict]:
    """Items of the tier-1 directories no bucket topic covered: a topic name decoded from the directory
    name, or, for a long topic's cut name, the name `tier1` recorded in the directory or the name of a topic
    metadata knows (`known`) whose directory it is; else reported in `unnamed_tier1_dirs`."""
    named = {topic_dir_name(n): n for n in known}
    items = []
    for d in dirs:
        if d in seen:
            continue
        name = topic if topic is not None else topic_of_dir(d, tier1) or named.get(d)
        if name is None:
            report.unnamed_tier1_dirs.append(d)
        else:
            items.append({"segment": encode_topic(name), "topic": name})
    return items


def _by_topic(b: Bucket, prefix: str, report: RecoverReport) -> Iterator[_Listed]:
    """One _Listed per topic, streaming the listing (keys of a topic are contiguous)."""
    current: _Listed | None = None
    for o in list_objects(b, prefix):
        report.objects_listed += 1
        parsed = parse_key(b.prefix, o["Key"])
        segment = parsed.segment if parsed else o["Key"][len(b.prefix):].partition("/")[0]
        if current is None or segment != current.segment:
            if current is not None and (current.objects or current.has_marker):
                yield current
            current = _Listed(segment)
        if parsed is None:
            report.foreign_objects += 1
            current.has_marker |= is_trim_marker(b.prefix, o["Key"])
            continue
        current.objects[o["Key"]] = (parsed, _Obj(o["Key"], o["Size"], o["LastModified"], o.get("ETag")))
    if current is not None and (current.objects or current.has_marker):
        yield current


def list_segment(b: Bucket, segment: str) -> tuple[_Listed, int, int]:
    """One topic's objects (an executor lists them itself): (_Listed, objects listed, foreign objects)."""
    listed, n, foreign = _Listed(segment), 0, 0
    for o in segment_objects(b, segment):
        n += 1
        parsed = parse_key(b.prefix, o["Key"])
        if parsed is None or parsed.segment != segment:
            foreign += 1
            listed.has_marker |= is_trim_marker(b.prefix, o["Key"])
            continue
        listed.objects[o["Key"]] = (parsed, _Obj(o["Key"], o["Size"], o["LastModified"], o.get("ETag")))
    return listed, n, foreign


def recover_topic(engine, b: Bucket, listed: _Listed, policy: TopicPolicy, pool: ThreadPoolExecutor,
                  check_pages: bool = False, tier1: Tier1Store | None = None,
                  name: str | None = None, dry_run: bool = False) -> RecoverReport:
    """Recover one topic (its listed objects, and its tier-1 files when `tier1` is given) in one
    transaction (rolled back when `dry_run`). `name`: the topic's name when the caller knows it (a
    tier-1-only topic); otherwise it is read from the index metadata (a long topic's key segment is hashed)
    or the key. Failures are reported in the returned report's `errors`, naming the topic; nothing of that
    topic is committed then."""
    report = RecoverReport(pages_checked=check_pages)
    try:
        _recover_topic(engine, b, listed, policy, pool, check_pages, tier1, name, report, dry_run)
    except TieringError as exc:
        report.errors.append(f"topic {name or listed.segment!r}: {exc}")
    return report


def _recover_topic(engine, b: Bucket, listed: _Listed, policy: TopicPolicy, pool: ThreadPoolExecutor,
                   check_pages: bool, tier1: Tier1Store | None, name: str | None, report: RecoverReport,
                   dry_run: bool = False) -> None:
    objects, segment = listed.objects, listed.segment
    sizes = {k: obj for k, (_, obj) in objects.items()}
    indexes = [(p, obj) for p, obj in objects.values() if p.is_index]
    with_index = {obj.key[:-len(INDEX_SUFFIX)] for _, obj in indexes}
    for p, obj in objects.values():
        if not p.is_index and obj.key not in with_index:
            report.ignored.append((obj.key, "data object without an index object (a dead attempt's leftover)"))
    groups = list(pool.map(lambda item: _read_group(b, segment, item[0], item[1], sizes, check_pages), indexes))
    errors = [g.error for g in groups if g.error]
    if errors:  # an older copy must not win because a newer one could not be read: nothing committed
        report.errors += [f"topic segment {segment!r} not recovered: {e}" for e in errors]
        return
    report.without_page_index += sum(g.unchecked for g in groups if not g.problem)
    # newest first: the index object is written last, so its time is the copy's completion time
    groups.sort(key=lambda g: (g.index.last_modified, g.index.key), reverse=True)
    chosen: dict[int, _Copy] = {}
    for g in groups:
        if g.problem:
            report.ignored.append((g.index.key, g.problem))
            continue
        report.ignored += [(g.index.key, f"ledger {lid}: {why}") for lid, why in g.bad]
        if not g.copies:
            continue
        fresh = [c for c in g.copies if c.ledger_id not in chosen]
        for c in fresh:
            chosen[c.ledger_id] = c
        if not fresh:
            report.ignored.append((g.index.key, "superseded: a newer valid copy holds its ledger(s)"))
    if chosen:
        name = next(iter(chosen.values())).topic  # from the index metadata: a long topic's key is hashed
    elif name is None:  # the key segment names the topic unless it is hashed
        parsed = parse_key(b.prefix, f"{b.prefix}{segment}/x-ledger-0")
        name = parsed.topic if parsed else None
    if name is None:
        return  # a hashed segment with no valid index: nothing names the topic
    report.topics.append(name)  # looked at (even if it fails below): the tier-1 pass must not take it again
    trimmed_before = read_trim_marker(b, name) if listed.has_marker else -1
    for lid in [lid for lid in chosen if lid < trimmed_before]:
        report.ignored.append((chosen.pop(lid).chunk.index_key,
                               f"ledger {lid} trimmed by retention (marker: before ledger {trimmed_before})"))
    scan = _scan_tier1(engine, tier1, name, chosen, trimmed_before, report, seal=not dry_run,
                       check_entries=check_pages)
    # A key names the ledger it holds (the first, for a shared object; its index object lists them all)
    # whether or not its copy is valid: a ledger whose only copy is corrupt or incomplete existed all the
    # same. Its id must not be handed out again to a new ledger, and it is reported unknown rather than left
    # out unsaid. A key no index object backs counts only when its data object starts as a ledger's does.
    by_index = [lid for g in groups for lid in g.named]
    decoded = {g.index.key[:-len(INDEX_SUFFIX)] for g in groups if g.named}
    named_top = max(by_index + _keys_with_ledger_data(b, objects, max(by_index, default=-1), report, decoded),
                    default=-1)
    named_top = named_top if named_top >= trimmed_before else -1
    if chosen or scan.ledgers or scan.top >= 0 or named_top >= 0:
        _commit_topic(engine, name, chosen, scan, policy, report,
                      None if tier1 is None else (lambda lid: tier1.exists(name, lid)),
                      tier1 is not None and tier1.has_topic(name), named_top, max(trimmed_before, 0),
                      lost_ledger(name, [(i, c.sealed_at) for i, c in chosen.items()] + [
                          (i, f.sealed_at) for i, f in scan.ledgers.items()],
                          {i: d for g in groups for i, d in g.described.items()}),
                      # a key a row names: not listed, and not there now either (the listing may be older than
                      # the row; a HEAD that fails stops the topic, as any read error does)
                      lambda key: key not in objects and object_head(b, key) is None,
                      lambda key: object_head(b, key) is not None, dry_run, check_pages)


def _keys_with_ledger_data(b: Bucket, objects: dict, above: int, report: RecoverReport,
                           decoded: set[str] = frozenset()) -> list[int]:
    """The highest ledger id above `above` that data objects no decoded index object describes (`decoded`:
    the data keys of those that do) show existed, if any. Such an object counts only when it starts with a
    block header of entry 0, as every ledger's data does: a stray object named in the product's form, its
    content anything else, would otherwise have recovery record every id up to it as a lost ledger. It
    shows the ledger its key names and, when several ledgers share it (a batch's, a defrag's: named after
    the first), the largest its user metadata says it holds (at most MAX_LOST_ROWS past the first): its
    index object may be corrupt, and their ids must not be handed out again. Every such object is looked
    at, whatever its key's id (a shared one's last ledger may lie above every other): a ranged GET each, and
    a HEAD of those that start as a ledger's."""
    keys: dict[int, list] = {}
    for p, obj in objects.values():
        keys.setdefault(p.ledger_id, []).append(obj)
    top = -1
    for lid in sorted(keys, reverse=True):
        why, shown = "no data object of it is there", False
        for obj in sorted((o for o in keys[lid] if not o.key.endswith(INDEX_SUFFIX) and o.key not in decoded),
                          key=lambda o: o.key):
            try:
                start = get_range(b, obj.key, 0, HEADER_LEN) if obj.size >= HEADER_LEN else b""
                first = parse_block_header(start, obj.key).first_entry_id
                last = last_ledger_of(object_metadata(b, obj.key) or {}) if first == 0 else None
            except CorruptObjectError as exc:
                why = f"its data does not start with a block header ({exc})"
                continue
            except DataLossError:  # deleted since the listing (GC, a stray's owner): nothing to count
                why = "its data object vanished while recovery read it"
                continue
            if first != 0:
                why = f"its data's first block starts at entry {first}, not 0"
                continue
            shown = True
            top = max(top, last if last is not None and lid < last <= lid + MAX_LOST_ROWS else lid)
        if not shown and lid > above:  # (no index object above `above` decoded)
            said = {key for key, _ in report.ignored}  # (a data object alone is already named a dead attempt's)
            report.ignored += [(o.key, f"names ledger {lid}, but no index object lists it and {why}: not taken "
                                       "as a ledger's") for o in sorted(keys[lid], key=lambda o: o.key)
                               if o.key not in said]
    return [top] if top > above else []


def _scan_tier1(engine, tier1: Tier1Store | None, name: str, chosen: dict[int, _Copy], trimmed_before: int,
                report: RecoverReport, seal: bool = True, check_entries: bool = False) -> Tier1Scan:
    """The topic's tier-1 files, sorted into: copies of chosen (offloaded) ledgers, ledgers to adopt, and
    reported ones. Only ledgers the database does not have are looked at (one SELECT, only when the topic
    has files). `check_entries` (with --check-pages): each sealed file's every entry is read and its CRC
    checked, so a damaged one is reported, not adopted."""
    if tier1 is None or not (tier1.ledger_ids(name) or tier1.retired_ids(name)):
        return Tier1Scan()
    known = known_ledgers(engine, name)
    scan = scan_topic(tier1, name, set(known), seal, check_entries)
    for lid, why in scan.unreadable:
        report.tier1_ignored.append((f"{name}/{lid}", why))
    for lid, (state, present) in sorted(known.items()):
        if not present and tier1.exists(name, lid):
            report.tier1_ignored.append((f"{name}/{lid}", f"the database has this {state} ledger without a "
                                                          "tier-1 copy: its file was left alone"))
    for lid, f in sorted(scan.ledgers.items()):
        if lid < trimmed_before:
            del scan.ledgers[lid]
            report.tier1_ignored.append((f"{name}/{lid}", f"trimmed by retention (marker: before ledger "
                                                          f"{trimmed_before}); the file was left alone"))
        elif lid in chosen:
            del scan.ledgers[lid]  # offloaded: the file is its tier-1 copy if it holds the same ledger
            c = chosen[lid]
            if (f.entry_count, f.size_bytes) == (c.entry_count, c.length) and not f.was_open:
                scan.copies.add(lid)
            else:
                report.tier1_ignored.append((f"{name}/{lid}", f"file holds {f.entry_count} entries, "
                                                              f"{f.size_bytes} bytes; the offloaded copy "
                                                              f"{c.entry_count}, {c.length}: left alone"))
    return scan

# ----------------------------------------------------------------------------------------------- reading
def _read_group(b: Bucket, segment: str, parsed: ParsedKey, index: _Obj, objects: dict[str, _Obj],
                check_pages: bool = True) -> _Group:
    """The copies one index object (and its data object) proves valid. What the bytes say is wrong is read
    again once: a bit flipped on the way or a 404 of a busy gateway would otherwise have a sound copy judged
    bad and, with no other copy, its ledger recorded lost."""
    g = _read_group_once(b, segment, parsed, index, objects, check_pages)
    if g.from_bytes:
        log.warning("recovery: %s failed its checks (%s); reading it again", index.key,
                    g.problem or "; ".join(why for _, why in g.bad))
        g = _read_group_once(b, segment, parsed, index, objects, check_pages)
    return g


def _read_group_once(b: Bucket, segment: str, parsed: ParsedKey, index: _Obj, objects: dict[str, _Obj],
                     check_pages: bool) -> _Group:
    g = _Group(index)
    data = objects.get(index.key[:-len(INDEX_SUFFIX)])
    try:
        if index.size < INDEX_HEADER_LEN:
            g.problem = f"index object of {index.size} bytes is too short"
            return g
        buf = get_range(b, index.key, 0, index.size)
        parts = split_indexes(buf, index.key)
        problem = _check_indexes(segment, parsed, parts)
        if problem:
            g.problem, g.from_bytes = problem, True
            return g
        g.named = [ix.metadata.ledger_id for _, _, ix in parts]
        g.described = {ix.metadata.ledger_id: (ix.metadata.entry_count, ix.metadata.length, _sealed_at(ix.metadata))
                       for _, _, ix in parts}
        if data is None:  # read all the same: the ledgers it names existed (they are lost, not unknown)
            g.problem = "no data object (an incomplete or dead attempt)"
            return g
        total = sum(ix.data_object_len for _, _, ix in parts)
        if data.size != total:
            g.problem = (f"data object {data.key} is {data.size} bytes, the index says {total} "
                         "(incomplete or not this index's)")
            return g
        offsets = [0] if len(parts) == 1 else merged_offsets(b, data.key, data.size, [ix for _, _, ix in parts],
                                                             check_pages)
        bad: dict[int, str] = {}
        for i, ((ioff, ilen, ix), doff) in enumerate(zip(parts, offsets)):
            if doff is None:
                bad[i] = (f"not found in shared data object {data.key}: no run of its blocks where its index "
                          "says (a corrupt block header)")
                continue
            # A copy whose bytes fail a page check must not win over a good one (or be recovered at all).
            # Only that ledger's copy: the others in a shared object have pages of their own, and may be
            # the only copies left.
            try:
                if check_pages and not check_stored_pages(b, data.key, doff, ix):
                    g.unchecked += 1
            except CorruptObjectError as exc:
                bad[i] = f"invalid: {exc}"
        g.from_bytes = bool(bad)
        for i, ((ioff, ilen, ix), doff) in enumerate(zip(parts, offsets)):
            m = ix.metadata
            if i in bad:
                g.bad.append((m.ledger_id, bad[i]))
                continue
            g.copies.append(_Copy(
                m.ledger_id, m.entry_count, m.length, _sealed_at(m), m.offload_uuid,
                # the ETags say which objects were written only once their bytes were checked: a
                # listing's ETag of a corrupt object would otherwise pass every later HEAD check
                Chunk(data.key, doff, ix.data_object_len, index.key, ioff, ilen, 0, m.entry_count - 1,
                      data_etag=data.etag if check_pages else None, index_etag=index.etag if check_pages else None),
                min(data.last_modified, index.last_modified), max(data.last_modified, index.last_modified),
                m.topic))
    except CorruptObjectError as exc:
        g.problem, g.from_bytes = f"invalid: {exc}", True
    except DataLossError:
        g.problem, g.from_bytes = "vanished while recovery read it", True
    except TieringError as exc:
        g.error = str(exc)
    return g


def _sealed_at(m) -> datetime:
    return datetime.fromtimestamp(m.sealed_time_ms / 1000, timezone.utc)


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


# ----------------------------------------------------------------------------------------------- writing
def _as_uuid(value: str, key: str) -> str:
    try:
        return str(_uuid.UUID(value))
    except ValueError:
        return str(_uuid.uuid5(_UUID_NS, f"{key}:{value}"))


def _commit_topic(engine, name: str, chosen: dict[int, _Copy], scan: Tier1Scan, policy: TopicPolicy,
                  report: RecoverReport, tier1_has=None, root_holds_topic: bool = False,
                  named_top: int = -1, trim_point: int = 0, lost=None, gone=None, present=None,
                  dry_run: bool = False, checked: bool = False) -> None:
    restored = restore_topic(engine, name, policy, {i: RecoveredLedger(
        c.ledger_id, c.entry_count, c.length, c.sealed_at, _as_uuid(c.offload_uuid, c.chunk.index_key),
        c.started_at, c.finished_at, c.chunk, tier1_present=i in scan.copies) for i, c in chosen.items()},
        {i: AdoptedLedger(f.ledger_id, f.entry_count, f.size_bytes, f.sealed_at) for i, f in scan.ledgers.items()},
        top=max(scan.top, named_top), tier1_has=tier1_has, root_holds_topic=root_holds_topic,
        lost=lost, lost_from=trim_point, lost_to=named_top, gone=gone, present=present, dry_run=dry_run,
        checked=checked)
    existing = restored.existing
    if restored.created:
        report.topics_created.append(name)
    report.ledgers_recovered += [(name, i) for i in restored.restored]
    report.tier1_copies_recorded += [(name, i) for i in restored.restored if i in scan.copies]
    report.tier1_copies_gone += [(name, i) for i in restored.tier1_gone]
    report.lost_recorded += [(name, i) for i in restored.lost]
    report.chunks_moved += [(name, i) for i in restored.moved]
    if restored.lost_unrecorded:
        report.errors.append(
            f"topic {name!r}: {restored.lost_unrecorded} ledger ids from its trim point up to {named_top} (the "
            f"largest a key names) have no copy, more than the {MAX_LOST_ROWS} a recovery records as lost "
            "ledgers: none was recorded (a stray object naming a far ledger id does this: check the keys under "
            "the topic's prefix)")
    report.tier1_adopted += [(name, i) for i in restored.adopted]
    report.tier1_sealed += [(name, i) for i in restored.adopted if scan.ledgers[i].was_open]
    report.already_known += [(name, i) for i in sorted(chosen) if i in existing]
    unknown = gaps(existing | set(chosen) | set(scan.ledgers), named_top)
    if unknown:
        report.unknown[name] = unknown


__all__ = ["RecoverReport", "list_segment", "recover_from_bucket", "recover_topic", "tier1_only_items"]
