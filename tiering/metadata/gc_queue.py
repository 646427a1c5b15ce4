"""The GC queue (`gc_task`): claim due keys under row locks, finish or retry them.

GC holds the claimed rows locked (FOR UPDATE SKIP LOCKED) while it deletes their objects and commits the
outcome in the same transaction. An offload commit that dequeues one of those keys blocks on the lock and
then finds the row gone, so it fails whole: an object GC deletes is never one a committed chunk references.

A defrag or repair attempt's keys are not due while its worker lives (it holds the attempt's lock: metadata/
attempt_locks.py): a merge may outlast the queue delay, and collecting its objects then would only fail it.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Iterable, Iterator

from sqlalchemy import and_, case, delete, func, insert, or_, select, true, union, update
from sqlalchemy.engine import Connection, Engine

from tiering.metadata.attempt_locks import (LIVE_ATTEMPT_CLASSES, OFFLOAD_REASON, UPLOADING_ATTEMPT_CLASSES, held,
                                            holder_gone_sql)
from tiering.metadata.tables import chunk, gc_task


def _collectable():
    """Due rows may go unless they are a live defrag or repair attempt's (CASE: only those rows take a lock
    check, held to the end of the caller's transaction)."""
    return case(*[(and_(gc_task.c.owner_uuid.isnot(None), gc_task.c.reason == reason),
                   holder_gone_sql(gc_task.c.owner_uuid, lock_class))
                  for reason, lock_class in LIVE_ATTEMPT_CLASSES.items()], else_=true())


@dataclass(frozen=True)
class GcTask:
    task_id: int
    key: str
    attempts: int
    reason: str


@dataclass
class Claim:
    """Due tasks claimed in one open transaction (see the module's doc): their rows stay locked until the
    `claimed` block ends, which commits what was finished and retried (or rolls everything back)."""
    conn: Connection
    tasks: list[GcTask] = field(default_factory=list)

    def referenced(self) -> set[str]:
        return referenced(self.conn, (t.key for t in self.tasks))

    def finish(self, task_ids: Iterable[int]) -> None:
        finish(self.conn, task_ids)

    def retry(self, tasks: Iterable[GcTask], error: str, max_attempts: int, backoff: timedelta) -> int:
        return retry(self.conn, tasks, error, max_attempts, backoff)


@contextmanager
def claimed(engine: Engine, limit: int) -> Iterator[Claim]:
    """Claim up to `limit` due tasks; the transaction holding their locks spans the block."""
    with engine.begin() as conn:
        yield Claim(conn, claim_due(conn, limit))


def claim_due(conn: Connection, limit: int) -> list[GcTask]:
    rows = conn.execute(
        select(gc_task.c.task_id, gc_task.c.key, gc_task.c.attempts, gc_task.c.reason)
        .where(gc_task.c.state == "PENDING", gc_task.c.not_before <= func.now(), _collectable())
        .order_by(gc_task.c.not_before, gc_task.c.task_id).limit(limit)
        .with_for_update(skip_locked=True)).all()
    return [GcTask(*r) for r in rows]


def due_tasks(engine: Engine, limit: int | None = None, failed: bool = False) -> tuple[list[GcTask], set[str]]:
    """What a GC run would claim now, read without claiming (no row lock): the due tasks, in the order a run
    takes them, and those of their keys a chunk still references. For `gc --dry-run`; `failed`: the FAILED
    tasks too, as `requeue_failed` would make them due."""
    due = and_(gc_task.c.state == "PENDING", gc_task.c.not_before <= func.now())
    with engine.connect() as conn:
        q = (select(gc_task.c.task_id, gc_task.c.key, gc_task.c.attempts, gc_task.c.reason)
             .where(or_(due, gc_task.c.state == "FAILED") if failed else due, _collectable())
             .order_by(gc_task.c.not_before, gc_task.c.task_id))
        tasks = [GcTask(*r) for r in conn.execute(q.limit(limit) if limit else q).all()]
        return tasks, referenced(conn, (t.key for t in tasks))


def referenced(conn: Connection, keys: Iterable[str]) -> set[str]:
    keys = sorted(set(keys))
    if not keys:
        return set()
    rows = conn.execute(select(chunk.c.data_key, chunk.c.index_key)
                        .where(or_(chunk.c.data_key.in_(keys), chunk.c.index_key.in_(keys)))).all()
    wanted = set(keys)
    return {k for r in rows for k in r if k in wanted}


def live_attempt_keys(engine: Engine, keys: Iterable[str], offload_attempts: dict[str, str] | None = None) -> set[str]:
    """The keys among `keys` whose attempt's worker is alive (holds the lock of its class): those an offload,
    defrag or repair attempt queued, and those of `offload_attempts` ({key: the offload attempt uuid its name
    carries}: an offload creates its upload once it holds its lock, before its keys are queued). GC aborts no
    multipart upload of such a key however old, since an upload may outlast any grace period on a slow link
    (or `gc --orphan-grace-seconds 0` is run beside it)."""
    keys = sorted(set(keys))
    if not keys:
        return set()
    with engine.connect() as conn:
        rows = conn.execute(select(gc_task.c.key, gc_task.c.reason, gc_task.c.owner_uuid).where(
            gc_task.c.key.in_(keys), gc_task.c.state == "PENDING")).all()
        rows += [(key, OFFLOAD_REASON, attempt) for key, attempt in (offload_attempts or {}).items()]
        return live_owned(conn, rows, UPLOADING_ATTEMPT_CLASSES)


def live_owned(conn: Connection, rows: Iterable[tuple], classes: dict[str, int]) -> set[str]:
    """The keys of queue `rows` ((key, reason, owner uuid)) whose owner, an attempt of a reason in `classes`
    (reason -> lock class), has a live worker. Read from pg_locks: no lock is taken, so an offload taking a
    dead attempt over at the same moment is not refused."""
    owners: dict[int, dict[str, set[str]]] = {}  # lock class -> attempt -> its keys
    for key, reason, owner in rows:
        if owner is not None and reason in classes:
            owners.setdefault(classes[reason], {}).setdefault(str(owner), set()).add(key)
    return {key for lock_class, by_attempt in owners.items()
            for attempt in held(conn, lock_class, by_attempt) for key in by_attempt[attempt]}


def enqueue(conn: Connection, keys: Iterable[str], reason: str, owner: str | None = None,
            delay: timedelta = timedelta(0)) -> None:
    """Queue `keys` for GC, due `delay` after the transaction's time, in the caller's transaction."""
    rows = [{"key": k, "reason": reason, "owner_uuid": owner, "not_before": func.now() + delay} for k in keys]
    if rows:  # one multi-row INSERT (SQL expressions render inline in a VALUES list)
        conn.execute(insert(gc_task).values(rows))


def due_sooner(conn: Connection, attempts: Iterable[str], delay: timedelta) -> int:
    """The queued keys of offload `attempts` that can never commit (their ledgers taken over by another
    attempt: their compare-and-set is lost for good) made due `delay` from now (when later than that), in
    the caller's transaction: no chunk row will ever name those objects, so the rest of the offload timeout
    they were queued for only leaves them in the bucket. `delay` lets a request the dead worker had in
    flight land first (one landing later is the orphan sweep's)."""
    attempts = sorted(set(attempts))
    if not attempts:
        return 0
    return conn.execute(update(gc_task).where(
        gc_task.c.owner_uuid.in_(attempts), gc_task.c.reason == OFFLOAD_REASON, gc_task.c.state == "PENDING",
        gc_task.c.not_before > func.now() + delay).values(not_before=func.now() + delay)).rowcount


def queued(conn: Connection, keys: Iterable[str]) -> set[str]:
    keys = sorted(set(keys))
    if not keys:
        return set()
    return set(conn.execute(select(gc_task.c.key).where(gc_task.c.key.in_(keys))).scalars())


def kept_in_one_snapshot(engine: Engine, keys: Iterable[str]) -> set[str]:
    """The keys some chunk references or the queue holds, as ONE snapshot of the database sees them.

    One statement (a UNION) in a REPEATABLE READ, read-only transaction: every commit is wholly in or
    wholly out of the view. A commit that moves a key from the queue to a chunk row (offload, defrag) or
    from a chunk row to the queue (retention, defrag's old keys) therefore shows the key in one place or
    the other, never in neither, which two READ COMMITTED statements could (each sees its own snapshot).
    """
    keys = sorted(set(keys))
    if not keys:
        return set()
    with engine.connect().execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True) as conn:
        with conn.begin():
            return kept(conn, keys)


def kept(conn: Connection, keys: list[str]) -> set[str]:
    """The keys some chunk references or the queue holds, in one statement (`kept_in_one_snapshot`)."""
    query = union(select(chunk.c.data_key.label("key")).where(chunk.c.data_key.in_(keys)),
                  select(chunk.c.index_key).where(chunk.c.index_key.in_(keys)),
                  select(gc_task.c.key).where(gc_task.c.key.in_(keys)))
    return set(conn.execute(query).scalars())


def requeue_failed(engine: Engine) -> int:
    """Make every FAILED task due again, its attempts counted afresh (`gc --retry-failed`, once the cause of
    the failed deletes is mended: a permission, a bucket policy). Returns how many."""
    with engine.begin() as conn:
        return conn.execute(update(gc_task).where(gc_task.c.state == "FAILED").values(
            state="PENDING", attempts=0, not_before=func.now())).rowcount


def failed_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(gc_task).where(gc_task.c.state == "FAILED")).scalar_one()


def finish(conn: Connection, task_ids: Iterable[int]) -> None:
    ids = list(task_ids)
    if ids:
        conn.execute(delete(gc_task).where(gc_task.c.task_id.in_(ids)))


def retry(conn: Connection, tasks: Iterable[GcTask], error: str, max_attempts: int, backoff: timedelta) -> int:
    """Count a failed attempt; exponential backoff; FAILED after `max_attempts`. Returns how many failed for good."""
    failed_for_good = 0
    for t in tasks:
        attempts = t.attempts + 1
        state = "FAILED" if attempts >= max_attempts else "PENDING"
        failed_for_good += state == "FAILED"
        conn.execute(update(gc_task).where(gc_task.c.task_id == t.task_id).values(
            attempts=attempts, state=state, last_error=error[:1000],
            not_before=func.now() + backoff * (2 ** (attempts - 1))))
    return failed_for_good


def due_count(engine: Engine) -> int:
    """How many tasks a GC run would take now: one count on the partial index `gc_task_due` (the planning
    of the hourly run, whose cost follows the queue, not the bucket)."""
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(gc_task).where(
            gc_task.c.state == "PENDING", gc_task.c.not_before <= func.now())).scalar_one()


def pending_count(conn: Connection) -> int:
    return conn.execute(select(func.count()).select_from(gc_task).where(gc_task.c.state == "PENDING")).scalar_one()

