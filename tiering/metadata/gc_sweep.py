"""The orphan sweep's persisted listing cursor (`gc_sweep`, one row per bucket and prefix) and the lock that
keeps two sweeps off the same pages.

- `exclusive` is a try-lock: a PostgreSQL session advisory lock held on a connection of its own for the
  whole sweep. A second sweep of the same bucket and prefix does not wait: it is told the sweep is taken.
  A sweep that is killed loses its connection and so the lock; the next one resumes from the cursor.
- `advance` moves the cursor in a compare-and-set on `version`, in one transaction, after a page was
  decided and its orphans deleted. The lock makes a lost CAS unexpected (a cursor reset by hand, or a lock
  lost with its connection); the sweep then stops, as the loser of a race would.

The cursor says where the next listing starts, nothing more: ops/gc.py explains why that is safe.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Iterator
from urllib.parse import unquote_to_bytes

from sqlalchemy import func, literal, select, tuple_, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from tiering.errors import ConditionalUpdateFailed, RecoveryRunning, TieringError
from tiering.format.keys import ParsedKey, encode_topic
from tiering.metadata import gc_queue
from tiering.metadata.attempt_locks import granted
from tiering.metadata.db import WAIT_POLL_SECONDS, session_lock, shared_session_lock
from tiering.metadata.tables import chunk, gc_sweep, ledger, topic

# Two-key advisory locks (class, object) live apart from job_run's one-key locks (metadata/job_runs.py).
LOCK_CLASS = 0x67637377  # "gcsw"
RECOVERY_CLASS = 0x72637672  # "rcvr": held by recovery beside the sweep's lock, so a sweep can tell who has it
# "gcqu": GC runs of the queue hold it shared, recovery exclusive (collecting, see `collecting`)
QUEUE_CLASS = 0x67637175
# "rctp": held shared by each worker of a recovery around one topic's listing and commit (`recovering`)
RECOVERING_CLASS = 0x72637470


@dataclass(frozen=True)
class SweepState:
    bucket: str
    prefix: str
    cursor: str  # '' : the next page starts a pass
    version: int
    pass_started_at: datetime | None
    last_pass_completed_at: datetime | None
    passes_completed: int


def _key(bucket: str, prefix: str):
    return func.hashtext(literal(bucket) + "/" + literal(prefix))


def exclusive(engine: Engine, bucket: str, prefix: str, recovery: bool = False):
    """`with exclusive(...) as held:` True while this process holds the sweep of (bucket, prefix), False when
    another session does (metadata/db.session_lock). `recovery`: also hold recovery's lock (see
    recovery_running)."""
    return session_lock(engine, LOCK_CLASS, _key(bucket, prefix), also=RECOVERY_CLASS if recovery else None)


def recovery_running(engine: Engine, bucket: str, prefix: str) -> bool:
    """Whether a recovery holds the sweep's lock (rather than another sweep): its second lock is held. Asked
    of pg_locks, which takes no lock: a try-lock here could make a recovery starting at that moment miss its
    second lock."""
    return _asked(engine, granted(RECOVERY_CLASS, _key(bucket, prefix)))


def _asked(engine: Engine, condition) -> bool:
    """One SQL condition's value now (a look at pg_locks: no lock taken)."""
    with engine.connect() as conn:
        return bool(conn.execute(select(condition)).scalar_one())


@contextmanager
def excluding_sweep(engine: Engine, bucket: str, prefix: str) -> Iterator[None]:
    """Held by recovery from the bucket for its whole run: recovery makes chunk rows reference objects that
    are in no GC queue, so a sweep deciding a page meanwhile would take them for orphans. The sweep's own
    lock is the guard: while either holds it, the other refuses to start."""
    with exclusive(engine, bucket, prefix, recovery=True) as held:
        if not held and recovery_running(engine, bucket, prefix):
            # not "taken by another worker": this run did not see that one's outcome, so it fails saying why
            raise TieringError(f"another recovery from the bucket {bucket}/{prefix} is running: rerun when it "
                               "has ended (a rerun finds what it recovered)")
        if not held:
            raise TieringError(f"an orphan sweep of {bucket}/{prefix} is running (tiering gc --sweep, DAG "
                               "tiering_gc_sweep): recovery must not run beside it; rerun when it has ended")
        # Nor a GC run of the queue: between recovery's listing and its commit one could delete a queued copy
        # recovery then points a ledger at. It waits for the runs under way (they end); later ones refuse.
        with session_lock(engine, QUEUE_CLASS, _key(bucket, prefix), wait=True):
            yield


@contextmanager
def collecting(engine: Engine, bucket: str, prefix: str) -> Iterator[None]:
    """Held (shared: GC runs may overlap) by a GC run of the queue for its deletes; RecoveryRunning, nothing
    done, while a recovery from the bucket runs or waits for the runs under way (excluding_sweep holds
    recovery's own lock while it waits: new runs are refused, so runs that overlap cannot keep it waiting)."""
    key = _key(bucket, prefix)
    with shared_session_lock(engine, QUEUE_CLASS, key, unless=_recovering(key)) as held:
        if not held:
            raise RecoveryRunning(f"GC of the queue did not run: recovery from the bucket {bucket}/{prefix} is "
                                  "running; the next run collects")
        yield


def _recovering(key):
    """A recovery runs or waits (its lock), or a recovery's worker holds a topic (`recovering`)."""
    return granted(RECOVERY_CLASS, key) | granted(RECOVERING_CLASS, key)


def collecting_refused(engine: Engine, bucket: str, prefix: str) -> bool:
    """Whether a GC run of the queue starting now would be refused (`collecting`), asked of pg_locks."""
    return _asked(engine, _recovering(_key(bucket, prefix)))


@contextmanager
def recovering(engine: Engine, bucket: str, prefix: str) -> Iterator[None]:
    """Held by a recovery's worker around one topic, from its listing to its commit (the Spark job's
    executors; the driver's `excluding_sweep` alone would leave them unguarded once it died, and executors
    already inside a topic then commit). Shared among the workers. It is announced first, then the worker
    waits while a GC run collects: a GC run starting after the announcement sees it and refuses
    (`collecting`), and one that started before is seen here, so the two never overlap."""
    key = _key(bucket, prefix)
    with shared_session_lock(engine, RECOVERING_CLASS, key):  # nobody takes it exclusive: always held
        with engine.connect() as conn:
            while conn.execute(select(granted(QUEUE_CLASS, key, shared_only=True))).scalar_one():
                conn.rollback()  # a fresh snapshot of pg_locks each time
                time.sleep(WAIT_POLL_SECONDS)
        yield


@dataclass(frozen=True)
class SweepView:
    """What one snapshot says about a page of listed keys (ops/gc.py decides with it). Topics and ledgers
    are named by the keys' topic segments, and given only for keys neither referenced nor queued."""
    kept: set[str]  # referenced by a chunk row or held by the queue
    trim_marks: dict[str, int]  # segment -> its topic's trim marker last written, for topics that exist
    states: dict[tuple[str, int], str]  # (segment, ledger id) -> state, for ledgers that exist
    # (segment, ledger id) -> its chunk's (data key, data ETag) and (index key, index ETag); an ETag is None
    # when the row never recorded one (a recovery that did not check pages, a row from before ETags)
    chunks: dict[tuple[str, int], tuple[tuple[str, str | None], tuple[str, str | None]]]


def sweep_view(engine: Engine, keys: list[str], parsed: dict[str, ParsedKey],
               held: dict[str, list[int]] | None = None) -> SweepView:
    """The keys kept, then the rows of the topics and ledgers that the other keys hold (`parsed`: the keys
    that are ledger objects; `held`: the ledger ids each one's index object lists, the one its name gives
    when not given), in ONE REPEATABLE READ snapshot: a commit that moves a key or a ledger is seen whole or
    not at all. A cut (hashed) segment's topic is found among the names that start with its readable part."""
    held = held or {}
    keys = sorted(set(keys))
    if not keys:
        return SweepView(set(), {}, {}, {})
    with engine.connect().execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True) as conn:
        with conn.begin():
            kept = gc_queue.kept(conn, keys)
            wanted = [p for k, p in parsed.items() if k not in kept]
            names = {p.segment: p.topic for p in wanted if p.topic is not None}
            for seg in {p.segment for p in wanted if p.topic is None}:
                start = unquote_to_bytes(seg.rsplit("-", 1)[0]).decode("utf-8", "ignore")  # a cut may split a char
                for name in conn.execute(select(topic.c.name).where(topic.c.name.startswith(start, autoescape=True)))\
                        .scalars():
                    if encode_topic(name) == seg:
                        names[seg] = name
            segment_of = {name: seg for seg, name in names.items()}
            marks, states, chunks = {}, {}, {}
            if names:
                marks = {segment_of[r.name]: r.trim_marker_written for r in conn.execute(
                    select(topic.c.name, topic.c.trim_marker_written).where(topic.c.name.in_(sorted(segment_of))))}
            pairs = sorted({(names[p.segment], lid) for k, p in parsed.items() if k not in kept and p.segment in names
                            for lid in held.get(k, [p.ledger_id])})
            if pairs:
                rows = conn.execute(
                    select(topic.c.name, ledger.c.ledger_id, ledger.c.state, chunk.c.data_key, chunk.c.index_key,
                           chunk.c.data_etag, chunk.c.index_etag)
                    .select_from(ledger.join(topic, topic.c.topic_id == ledger.c.topic_id)
                                 .outerjoin(chunk, (chunk.c.topic_id == ledger.c.topic_id)
                                            & (chunk.c.ledger_id == ledger.c.ledger_id)))
                    .where(tuple_(topic.c.name, ledger.c.ledger_id).in_(pairs)))
                for r in rows:
                    at = (segment_of[r.name], r.ledger_id)
                    states[at] = r.state
                    if r.data_key is not None:
                        chunks[at] = ((r.data_key, r.data_etag), (r.index_key, r.index_etag))
    return SweepView(kept, marks, states, chunks)


def references_any(engine: Engine) -> bool:
    """Whether any chunk row references a tier-2 object (one index probe)."""
    with engine.connect() as conn:
        return bool(conn.execute(select(select(chunk.c.topic_id).limit(1).exists())).scalar())


def load(engine: Engine, bucket: str, prefix: str) -> SweepState:
    """The sweep's row, created at the start of a first pass if there is none."""
    with engine.begin() as conn:
        conn.execute(insert(gc_sweep).values(bucket=bucket, prefix=prefix).on_conflict_do_nothing())
        row = conn.execute(select(gc_sweep).where(gc_sweep.c.bucket == bucket, gc_sweep.c.prefix == prefix)).one()
    return _state(row)


def peek(engine: Engine, bucket: str, prefix: str) -> SweepState:
    """The sweep's row as it is, without creating it (a first pass's state when there is none): for
    `gc --sweep --dry-run`, which writes nothing."""
    with engine.connect() as conn:
        row = conn.execute(select(gc_sweep).where(gc_sweep.c.bucket == bucket, gc_sweep.c.prefix == prefix)).first()
    return _state(row) if row is not None else SweepState(bucket, prefix, "", 0, None, None, 0)


def advance(engine: Engine, state: SweepState, cursor: str, pass_complete: bool, orphans: int) -> SweepState:
    """Move the cursor past a decided page (to '' when the page was the prefix's last: a pass completed),
    if the row is still at `state.version`; else ConditionalUpdateFailed."""
    t = gc_sweep.c
    values = {"cursor": "" if pass_complete else cursor, "version": t.version + 1, "updated_at": func.now(),
              "pages_listed": t.pages_listed + 1, "orphans_deleted": t.orphans_deleted + orphans}
    if state.cursor == "":
        values["pass_started_at"] = func.now()
    if pass_complete:
        values.update(last_pass_completed_at=func.now(), passes_completed=t.passes_completed + 1)
    with engine.begin() as conn:
        row = conn.execute(update(gc_sweep).where(
            t.bucket == state.bucket, t.prefix == state.prefix, t.version == state.version)
            .values(**values).returning(*gc_sweep.c)).first()
        if row is None:
            found = conn.execute(select(t.version).where(t.bucket == state.bucket, t.prefix == state.prefix)).scalar()
            raise ConditionalUpdateFailed(f"the gc sweep cursor of {state.bucket}/{state.prefix}",
                                          f"version {state.version}", f"version {found}")
    return _state(row)


def _state(row) -> SweepState:
    m = row._mapping
    return SweepState(m["bucket"], m["prefix"], m["cursor"], m["version"], m["pass_started_at"],
                      m["last_pass_completed_at"], m["passes_completed"])
