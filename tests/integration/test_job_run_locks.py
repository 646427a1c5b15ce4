"""A job_run row's owner lock (a session advisory lock) never makes a later run wait: a connection going back
to the pool drops its session locks, and a run whose key is held elsewhere (reused run ids) goes on without
one. Before, `make test` hung forever in an INSERT waiting on an idle pooled connection."""
from __future__ import annotations

import logging

import pytest
from sqlalchemy import func, select, text

from tiering.metadata import db, make_engine
from tiering.metadata.job_runs import LOCK_BASE, JobOutcome, JobRuns

pytestmark = pytest.mark.usefixtures("db")


@pytest.fixture
def eng(database_url):
    # lock_timeout turns the old hang into an error this test can see
    engine = make_engine(database_url, connect_args={"options": "-c lock_timeout=3000"})
    yield engine
    engine.dispose()


def _restart_ids(engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE tiering.job_run RESTART IDENTITY"))


def _lock_holders(engine, key: int) -> int:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND ((classid::bigint << 32) | objid::bigint) = :key"), {"key": key}).scalar_one()


def test_a_connection_back_in_the_pool_holds_no_session_lock(eng):
    with eng.connect() as conn:
        conn.execute(select(func.pg_advisory_lock(LOCK_BASE + 1)))
    # that connection is idle in the pool now; hold it so the next run must use another one
    with eng.connect() as idle:
        assert _lock_holders(eng, LOCK_BASE + 1) == 0
        runs = JobRuns(eng)
        run_id = runs.start("gc")
        assert run_id == 1
        runs.finish(run_id, JobOutcome())
        idle.execute(text("SELECT 1"))


def test_a_run_dropped_without_finish_does_not_block_the_next_one(eng):
    runs = JobRuns(eng)
    first = runs.start("defrag")
    runs._held.pop(first).close()  # the process lost track of it: the pool gets the connection back
    _restart_ids(eng)
    with eng.connect():  # keep the returned connection busy: the next start takes another one
        again = JobRuns(eng)
        second = again.start("defrag")
    assert second == 1
    # finished, so its session lock goes: an engine's dispose does not close a connection still checked out,
    # and the next test's holder would wait on that lock for as long as the garbage collector let it live
    again.finish(second, JobOutcome())


def test_a_key_held_by_a_live_session_does_not_block_start(eng, database_url, caplog):
    other = make_engine(database_url, connect_args={"options": "-c lock_timeout=3000"})  # fail, never hang
    try:
        with other.connect() as holder:
            holder.execute(select(func.pg_advisory_lock(LOCK_BASE + 1)))
            _restart_ids(eng)
            with caplog.at_level(logging.WARNING, logger="tiering.metadata.job_runs"):
                runs = JobRuns(eng)
                run_id = runs.start("gc")
            assert run_id == 1
            assert "held by another session" in caplog.text
            runs.finish(run_id, JobOutcome(items_done=1))
            holder.execute(select(func.pg_advisory_unlock_all()))
        with eng.connect() as conn:
            assert conn.execute(text("SELECT status FROM tiering.job_run WHERE run_id = 1")).scalar_one() == "SUCCEEDED"
    finally:
        other.dispose()


@pytest.mark.parametrize("sql, key", [
    ("SELECT pg_advisory_lock(:k)", LOCK_BASE + 7), ("SELECT pg_try_advisory_lock(:k)", LOCK_BASE + 7),
    ("SELECT pg_advisory_lock_shared(:k)", LOCK_BASE + 7), ("select PG_TRY_ADVISORY_LOCK_SHARED (:k)", LOCK_BASE + 7),
    ("SELECT pg_try_advisory_lock(0, CAST(:k AS int))", 7)])
def test_every_kind_of_session_lock_is_released_at_check_in(eng, sql, key):
    with eng.connect() as conn:
        conn.execute(text(sql), {"k": key})
        assert _lock_holders(eng, key) == 1
    # back in the pool (the next checkout is likely the same connection: it must hold nothing either)
    assert _lock_holders(eng, key) == 0


def test_transaction_locks_leave_no_release_to_do(eng):
    """Only a connection that took a session lock pays for the release transaction at check-in."""
    with eng.begin() as conn:
        conn.execute(select(func.pg_advisory_xact_lock(LOCK_BASE + 8)))
        conn.execute(select(func.pg_try_advisory_xact_lock(LOCK_BASE + 9)))
        conn.execute(select(func.pg_advisory_unlock_all()))
        assert not conn.info.get(db._HOLDS_SESSION_LOCKS)
        conn.execute(select(func.pg_try_advisory_lock(LOCK_BASE + 10)))
        assert conn.info.get(db._HOLDS_SESSION_LOCKS)
    assert _lock_holders(eng, LOCK_BASE + 10) == 0
    with eng.connect() as conn:
        assert not conn.info.get(db._HOLDS_SESSION_LOCKS)  # the release cleared the mark


def test_a_waiter_killed_while_it_waits_for_a_session_lock_leaves_no_waiter_behind(eng, database_url):
    """A recovery waiting for GC's runs (session_lock(wait=True)) killed meanwhile: a backend blocked in
    pg_advisory_lock does not notice its client is gone, and stayed queued for the lock, so every GC run's
    shared try-lock failed until the GC run under way ended. Waiting is polling now: nothing is left queued."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from sqlalchemy import literal

    lock_class, key = 0x74657374, 4242
    waiting = ("import sys, time\n"
               "from sqlalchemy import literal\n"
               "from tiering.metadata import db, make_engine\n"
               f"with db.session_lock(make_engine(sys.argv[1]), {lock_class}, literal({key}), wait=True):\n"
               "    pass\n")

    def waiters() -> int:
        with eng.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                                     "AND classid::bigint = :c AND objid::bigint = :k AND database = (SELECT oid "
                                     "FROM pg_database WHERE datname = current_database())"),
                                {"c": lock_class, "k": key}).scalar_one()

    with db.session_lock(eng, lock_class, literal(key)) as held:
        assert held
        child = subprocess.Popen([sys.executable, "-c", waiting, database_url], cwd=os.getcwd())
        time.sleep(3)  # it is waiting (the lock is ours)
        assert child.poll() is None
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        time.sleep(0.5)
        assert waiters() == 0
    with eng.connect() as conn:  # and a shared taker gets it at once
        assert conn.execute(select(func.pg_try_advisory_lock_shared(literal(lock_class), literal(key)))).scalar_one()
