"""A job_run row left RUNNING by a driver that was killed is closed (FAILED, "abandoned") by the next run
of that job; a row whose driver is alive is not. The driver is a real process killed with
SIGKILL; the ownership is PostgreSQL's (advisory locks), nothing is faked."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from sqlalchemy import text

from tiering.metadata.job_runs import JobOutcome, JobRuns

DRIVER = """
import sys, time
from tiering.metadata import make_engine
from tiering.metadata.job_runs import JobRuns
print(JobRuns(make_engine(sys.argv[1], pool_size=1)).start(sys.argv[2]), flush=True)
time.sleep(600)
"""


def _driver(database_url, job):
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, database_url, job], stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def _row(db, run_id):
    with db.connect() as conn:
        return conn.execute(text("SELECT status, ended_at IS NOT NULL AS ended, error FROM tiering.job_run "
                                 "WHERE run_id = :r"), {"r": run_id}).one()


def test_the_next_run_closes_the_row_of_a_killed_driver_and_not_a_live_one(db, database_url):
    killed, killed_id = _driver(database_url, "offload")
    alive, alive_id = _driver(database_url, "offload")
    other, other_id = _driver(database_url, "gc")
    try:
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(10)
        os.kill(other.pid, signal.SIGKILL)  # another job's row: not this job's run to close
        other.wait(10)
        runs = JobRuns(db)
        run_id = runs.start("offload")
        status, ended, error = _row(db, killed_id)
        assert (status, ended) == ("FAILED", True) and "abandoned" in error and f"run {run_id}" in error
        assert _row(db, alive_id)[:2] == ("RUNNING", False)
        assert _row(db, other_id)[:2] == ("RUNNING", False)
        runs.finish(run_id, JobOutcome(items_done=1))
        assert _row(db, run_id)[:2] == ("SUCCEEDED", True)
        # finish released the lock: a later run does not take the finished row for anything
        later = JobRuns(db)
        later.finish(later.start("offload"), JobOutcome())
        assert _row(db, alive_id)[:2] == ("RUNNING", False)
    finally:
        for p in (killed, alive, other):
            p.kill()
            p.wait(10)
