"""Engine construction and error mapping (no environment reads: the URL is passed in)."""
from __future__ import annotations

import logging
import re
import select as _select
import time
from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import create_engine, event, func, literal, make_url, select
from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)
# The functions that take a session-level advisory lock (held past COMMIT and ROLLBACK until released or the
# session ends); the transaction-level ones are pg_(try_)advisory_xact_lock(_shared) and end with their
# transaction, so they need no release.
_SESSION_LOCK = re.compile(r"pg_(?:try_)?advisory_lock(?:_shared)?\s*\(", re.IGNORECASE)
_HOLDS_SESSION_LOCKS = "tiering.session_locks"


# libpq waits for ever by default: a connection to a host that vanished, or a server that never answers its
# startup, would hang a command (and its Ctrl-C: libpq waits in C). Connecting gives up after 30 s; TCP
# keepalives and tcp_user_timeout drop a connection whose peer stopped answering within about a minute, idle or
# with data unacknowledged (a live server's kernel acknowledges both however long its statement runs).
LINK_LIMITS = {"connect_timeout": 30, "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
               "keepalives_count": 3, "tcp_user_timeout": 60_000}


# The server's side: a session whose client vanished without closing its connection (a lost machine, a
# partition) ends within about a minute instead of after the server's default two hours, and with it the
# session's advisory locks, so an attempt's or a job run's lock frees its work for a takeover that soon.
SERVER_LINK_LIMITS = {"tcp_keepalives_idle": LINK_LIMITS["keepalives_idle"],
                      "tcp_keepalives_interval": LINK_LIMITS["keepalives_interval"],
                      "tcp_keepalives_count": LINK_LIMITS["keepalives_count"],
                      "tcp_user_timeout": LINK_LIMITS["tcp_user_timeout"]}


_OPTION = re.compile(r"(?:^|\s)(?:-c\s*|--)([A-Za-z_][A-Za-z0-9_.]*)\s*=")


def _option_names(options: str) -> set[str]:
    """The server settings a libpq `options` string sets (`-c name=value`, `-cname=value`, `--name=value`),
    lower-cased as the server takes them."""
    return {m.group(1).lower() for m in _OPTION.finditer(options)}


def make_engine(url: str, pool_size: int = 5, **kwargs) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg2://" + url[len("postgresql://"):]
    # jit off: PostgreSQL decides to JIT-compile from the planner's cost estimate, which grows with a topic's
    # history even where the plan reads a few index pages per topic (planning.py's walks); compiling then cost
    # tens of milliseconds to seconds on a loaded machine for statements that run in a few milliseconds.
    connect_args = dict(kwargs.pop("connect_args", {}))
    given = make_url(url).query
    # the URL's own `options` (`?options=-c search_path=...`) first: connect_args replaces the URL's value, so
    # it would be dropped otherwise, and every other client of the URL (pyiceberg's catalog, pgjdbc) keeps it
    url_options = given.get("options")
    url_options = url_options[-1] if isinstance(url_options, tuple) else url_options
    if url_options:
        connect_args["options"] = f"{url_options} {connect_args.get('options', '')}".strip()
    named = _option_names(connect_args.get("options", ""))  # the URL's or the caller's own settings win
    defaults = {"jit": "off", **SERVER_LINK_LIMITS}  # SERVER_LINK_LIMITS: the server's side of the link limits
    connect_args["options"] = " ".join([connect_args.get("options", "")] + [
        f"-c {name}={value}" for name, value in defaults.items() if name not in named]).strip()
    for name, value in LINK_LIMITS.items():  # the URL's or the caller's own win
        if name not in given and name not in connect_args:
            connect_args[name] = value
    # hide_parameters: a failed statement's parameters never reach logs or exceptions.
    engine = create_engine(url, pool_size=pool_size, pool_pre_ping=True, hide_parameters=True,
                           connect_args=connect_args, **kwargs)
    event.listen(engine, "before_cursor_execute", _note_session_locks)
    event.listen(engine.pool, "checkin", _release_session_locks)
    event.listen(engine, "connect", _utc_session)
    return engine


def _utc_session(dbapi_connection, connection_record) -> None:
    """Every session in UTC: timestamps come back in UTC and the counters' triggers bucket hours and days in
    UTC, whatever the server's, the database's or the client's (PGTZ, which a startup option does not
    override) default zone; a table partition is one UTC day."""
    with dbapi_connection.cursor() as cur:
        cur.execute("SET TIME ZONE 'UTC'")
    dbapi_connection.commit()


def _note_session_locks(conn, cursor, statement, parameters, context, executemany) -> None:
    """Marks a connection that ran a statement taking a session advisory lock (before it runs: a lock taken by
    a statement that then fails is held all the same). The mark lives as long as the DBAPI connection."""
    if _SESSION_LOCK.search(statement):
        conn.info[_HOLDS_SESSION_LOCKS] = True


def _release_session_locks(dbapi_connection, connection_record) -> None:
    """A connection going back to the pool drops every session advisory lock it holds.

    Session locks (a job_run row's owner lock, metadata/job_runs.py) outlive transactions, and the pool's
    reset on return is only a ROLLBACK: a connection dropped without releasing its lock would carry it to
    whichever caller checks it out next, and a later lock on the same key would wait on an idle connection
    forever. A connection that cannot be cleaned is discarded (closing it drops its locks). Only connections
    marked by _note_session_locks are cleaned: the release is a transaction of its own (three round trips),
    which doubled the cost of every short transaction when run on every check-in."""
    if dbapi_connection is None or not connection_record.info.pop(_HOLDS_SESSION_LOCKS, False):
        return
    try:
        cur = dbapi_connection.cursor()
        try:
            cur.execute("SELECT pg_advisory_unlock_all()")
        finally:
            cur.close()
        dbapi_connection.commit()
    except Exception:  # noqa: BLE001 - the connection is discarded instead; nothing else to do here
        log.warning("discarding a pooled connection whose session locks could not be released")
        connection_record.invalidate()


def interruptible_waits() -> None:
    """From now on this process waits for PostgreSQL in Python (select on the socket) instead of inside libpq.

    libpq waits in C and retries when a signal interrupts it, so a Python signal handler (Ctrl-C's
    KeyboardInterrupt) runs only once the server answers: a command waiting on a lock another worker holds,
    or on a server that stopped answering while its host's kernel keeps the connection up, ignored Ctrl-C.
    Waiting here, the handler runs at once: psycopg2 closes the connection (the server rolls the transaction
    back) and the command ends. libpq applies `connect_timeout` only to waits of its own, so the connection's
    wait keeps it (`_wait`). Process-wide (psycopg2's setting): for the CLI, whose user presses Ctrl-C; a pipeline
    job is stopped by its task's timeout or SIGTERM, which needs no handler."""
    from psycopg2 import extensions

    extensions.set_wait_callback(_wait)


def _wait(conn) -> None:
    """psycopg2's wait callback: poll the connection until its operation completes."""
    from psycopg2 import OperationalError, extensions

    deadline = None
    if conn.status == extensions.STATUS_SETUP:  # still connecting: libpq's own limit (0 or unset: none)
        limit = float(conn.get_dsn_parameters().get("connect_timeout") or 0)
        deadline = time.monotonic() + limit if limit > 0 else None
    while True:
        state = conn.poll()
        if state == extensions.POLL_OK:
            return
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        if state == extensions.POLL_READ:
            ready = _select.select([conn.fileno()], [], [], timeout)[0]
        elif state == extensions.POLL_WRITE:
            ready = _select.select([], [conn.fileno()], [], timeout)[1]
        else:
            raise OperationalError(f"unexpected state {state} of a PostgreSQL connection")
        if not ready:
            raise OperationalError("timeout expired")  # libpq's own words for its connect_timeout


@contextmanager
def session_lock(engine: Engine, lock_class: int, key, also: int | None = None, wait: bool = False) -> Iterator[bool]:
    """Yields True while this process holds the session advisory lock (`lock_class`, `key`: an SQL int
    expression), False when another session does (it does not wait). It is held on a connection of its own,
    released when the block ends (the pool's check-in, above) or when the process dies (its connection
    closes). `also`: a second class on the same key, taken with the first, which tells a caller refused the
    first who holds it (`lock_taken`), e.g. recovery rather than another sweep. `wait`: wait while another
    session holds it instead (then always True)."""
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        # waiting is polling: a backend blocked in pg_advisory_lock does not notice its client died, and
        # would stay queued for the lock (refusing every shared taker) until the holder let go
        while not (held := _try_lock(conn, lock_class, key)) and wait:
            time.sleep(WAIT_POLL_SECONDS)
        if held and also is not None:
            _try_lock(conn, also, key)
        yield held
    finally:
        _close(conn)


@contextmanager
def shared_session_lock(engine: Engine, lock_class: int, key, unless=None) -> Iterator[bool]:
    """session_lock's shared form (several holders; an exclusive taker is refused while any holds it).
    `unless`: an SQL condition asked in the same statement; while it holds the lock counts as not taken
    (given back with the connection), so a waiting exclusive taker can announce itself and let the shared
    holders drain instead of being starved by new ones."""
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        row = conn.execute(select(func.pg_try_advisory_lock_shared(literal(lock_class), key).label("held"),
                                  (unless if unless is not None else literal(False)).label("refused"))).one()
        yield bool(row.held) and not row.refused
    finally:
        _close(conn)


def _close(conn: Connection) -> None:
    """Give a lock's connection back. Its backend may be gone (terminated, the server restarted): the lock
    went with it, and the failure of the check-in (resetting the isolation level) must not replace what the
    block raised, nor fail a block that ended well (its connection is discarded instead)."""
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - see above
        log.warning("discarding a lock's connection whose backend is gone")
        try:
            conn.invalidate()
        except Exception:  # noqa: BLE001 - already invalidated or closed: nothing left to release
            pass


WAIT_POLL_SECONDS = 0.2


def lock_taken(engine: Engine, lock_class: int, key) -> bool:
    """Whether another session holds the advisory lock (`lock_class`, `key`) now (the lock taken to find out
    goes with its connection)."""
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        return not _try_lock(conn, lock_class, key)
    finally:
        conn.close()


def _try_lock(conn: Connection, lock_class: int, key) -> bool:
    return bool(conn.execute(select(func.pg_try_advisory_lock(literal(lock_class), key))).scalar_one())
