"""Which offload, defrag and repair attempts still have a live worker.

An attempt's worker holds a PostgreSQL session advisory lock keyed on the attempt's uuid, on a connection of
its own, from before the ledgers move to OFFLOADING(attempt) until the attempt committed or was undone. A
worker that dies (kill -9, OOM, a Spark executor lost with its node) loses its connection and so the lock:
PostgreSQL drops it as soon as the backend sees the connection close. So an OFFLOADING row whose lock
nobody holds belongs to a dead worker and is taken over at once, not after the offload timeout.

The offload timeout still applies on its own: a worker that is alive but frozen, or a machine that vanished
without closing its TCP connections (PostgreSQL holds the lock until its keepalive gives up: about a minute
with the session settings of metadata/db.py), is taken over when its attempt is older than the timeout, as
before. Takeover is safe either way: every transition is a
compare-and-set on the attempt, so a worker that was wrongly presumed dead loses its commit and cleans up.

Defrag and repair attempts hold a lock of their own class the same way, from before their new keys are
queued until their commit or discard: GC leaves the queued keys of such an attempt alone while its worker
holds that lock (metadata/gc_queue.py), so a merge or a repair upload that outlives its queue delay (the
offload timeout) keeps its objects; a dead worker's keys are collected once due. The lock is taken before
the keys are queued and its uuid is fresh, so an attempt found without a holder never gets one again.

Locks are two-key (class, hashtext(uuid)), apart from job_run's one-key locks and the GC sweep's classes
(metadata/gc_sweep.py). Two live attempts whose uuids hash alike cannot both hold the lock: the second
draws a new uuid. A dead attempt that hashes like a live one only waits for the timeout, as before.
"""
from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Iterable, Iterator

from sqlalchemy import BigInteger, Text, bindparam, cast, exists, func, literal, literal_column, select, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.engine import Connection, Engine

OFFLOAD_CLASS = 0x6f66666c  # "offl"
DEFRAG_CLASS = 0x64667267  # "dfrg"
DEFRAG_REASON = "defrag attempt"  # the reason of a defrag attempt's queued keys: those GC checks the lock of
REPAIR_CLASS = 0x72707172  # "rpqr": a repair's new copy, protected as a defrag's merged objects are
REPAIR_REASON = "repair attempt"
OFFLOAD_REASON = "offload attempt"
# the queue reasons whose rows GC leaves alone while the attempt's worker holds the lock of their class
LIVE_ATTEMPT_CLASSES = {DEFRAG_REASON: DEFRAG_CLASS, REPAIR_REASON: REPAIR_CLASS}
# the queue reasons whose keys' multipart uploads GC leaves alone while the worker holds the lock: an offload's
# too (its upload is created only once it holds its lock: tiering/tier2/multipart.py, Gate.owned), though its
# queued keys are collected past the offload timeout, or the GC delay after a takeover (a worker that slow, or
# taken over, loses its commit)
UPLOADING_ATTEMPT_CLASSES = {OFFLOAD_REASON: OFFLOAD_CLASS, **LIVE_ATTEMPT_CLASSES}
_DRAWS = 8


def _key(attempt_uuid_expr):
    # the uuid's canonical text (lower case, hyphens) whatever form the caller passed
    return func.hashtext(cast(cast(attempt_uuid_expr, UUID(as_uuid=False)), Text))


class AttemptLock:
    """A fresh attempt uuid now and its lock (of `lock_class`) taken later by `take`, on a connection of its
    own, held until the block ends (the connection's check-in releases it: metadata/db.py) or the process
    dies. For an offload, whose packing and upload start under the uuid before its claim: the lock is the
    claim's first step, before the rows move to OFFLOADING(attempt)."""

    def __init__(self, engine: Engine, lock_class: int = OFFLOAD_CLASS):
        self._engine, self._class = engine, lock_class
        self.attempt = str(uuid.uuid4())
        self._conn: Connection | None = None

    def take(self) -> bool:
        """Take the lock; False, holding nothing, when a live attempt whose uuid hashes alike holds it."""
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            got = conn.execute(select(func.pg_try_advisory_lock(literal(self._class),
                                                                _key(literal(self.attempt))))).scalar_one()
        except BaseException:
            conn.close()
            raise
        if not got:
            conn.close()
            return False
        self._conn = conn
        return True

    def release(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def __enter__(self) -> "AttemptLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@contextmanager
def new_attempt(engine: Engine, lock_class: int = OFFLOAD_CLASS) -> Iterator[str]:
    """A fresh attempt uuid whose lock (of `lock_class`) this process holds until the block ends, or until
    the process dies."""
    for _ in range(_DRAWS):
        lock = AttemptLock(engine, lock_class)
        if lock.take():
            break
    else:  # only if _DRAWS fresh uuids all hash like live attempts: something else holds the class
        raise RuntimeError("no free attempt lock after several draws")
    with lock:
        yield lock.attempt


def holder_gone(conn: Connection, attempt: str) -> bool:
    """Whether no live worker holds `attempt` (inside the caller's transaction: the lock this takes is held
    until it ends, so the attempt cannot come back to life meanwhile)."""
    return bool(conn.execute(select(func.pg_try_advisory_xact_lock(literal(OFFLOAD_CLASS),
                                                                   _key(literal(attempt))))).scalar_one())


def holder_gone_sql(attempt_column, lock_class: int = OFFLOAD_CLASS):
    """holder_gone as an SQL condition on a row's attempt column (evaluate it inside a transaction)."""
    return func.pg_try_advisory_xact_lock(literal(lock_class), _key(attempt_column))


# a granted two-key advisory lock (classid, objid as unsigned 32-bit, objsubid 2) in this database, as
# pg_locks shows it: reading it takes no lock
_GRANTED_TWO_KEY = """l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"""

_HELD = text(f"""
    SELECT a::text FROM unnest(:attempts) AS a
    WHERE EXISTS (SELECT 1 FROM pg_locks l WHERE {_GRANTED_TWO_KEY}
                  AND l.classid::bigint = :lock_class AND l.objid::bigint = (hashtext(a::text)::bigint & 4294967295))
""").bindparams(bindparam("attempts", type_=ARRAY(UUID(as_uuid=False))))


def held(conn: Connection, lock_class: int, attempts: Iterable[str]) -> set[str]:
    """The attempts (canonical uuid text) whose lock of `lock_class` a live session holds now, from pg_locks.
    Takes no lock: a takeover's own try-lock at the same moment is not refused because of this look
    (holder_gone's would)."""
    attempts = sorted({str(uuid.UUID(a)) for a in attempts})
    if not attempts:
        return set()
    return set(conn.execute(_HELD, {"attempts": attempts, "lock_class": lock_class}).scalars())


def granted(lock_class: int, key, shared_only: bool = False):
    """An SQL condition: a live session holds the two-key advisory lock (`lock_class`, `key`: an SQL int
    expression) now (`shared_only`: in its shared mode), from pg_locks (asking takes no lock)."""
    return exists(select(literal(1)).select_from(text("pg_locks l")).where(
        text(_GRANTED_TWO_KEY), literal_column("l.classid::bigint") == lock_class,
        literal_column("l.objid::bigint") == cast(key, BigInteger).op("&")(4294967295),
        *([literal_column("l.mode") == "ShareLock"] if shared_only else [])))


_CLASSES_HELD = text(f"""
    SELECT DISTINCT l.classid::bigint FROM pg_locks l WHERE {_GRANTED_TWO_KEY} AND l.classid::bigint = ANY(:classes)
""").bindparams(bindparam("classes", type_=ARRAY(BigInteger)))


def classes_held(engine: Engine, classes: Iterable[int]) -> set[int]:
    """Which of the two-key advisory lock `classes` some live session holds a lock of now (any key), from
    pg_locks: no lock is taken."""
    classes = sorted(set(classes))
    if not classes:
        return set()
    with engine.connect() as conn:
        return set(conn.execute(_CLASSES_HELD, {"classes": classes}).scalars())
