"""A bounded wait for the first executor of a cluster job.

On a standalone (or YARN) master, executors that cannot reach the driver (it advertises 127.0.0.1, a
firewall drops its port) die right after launch; the master relaunches them until the task's
execution_timeout, and the job's row ends with whatever error the kill left ("ConnectionRefusedError").
The driver waits instead, at most `spark.tiering.executorWaitSeconds` (default 120 s; 0: no wait), for one
executor to register, and otherwise fails with the cause and what to set. A local master has its executor in
the driver: nothing to wait for.

Some executors missing (a second node that cannot reach the driver while the first one can) does not stop a
job that has executors to run on; it is reported: with `spark.tiering.expectedExecutors` = N the driver waits
(within the same bound) for N, and otherwise goes on with those it has, returning a sentence the job records
in `job_run.details.executors_missing` and prints; every job (through `tiering.jobs.runner`) records it, and
the jobs that fan items out record the executors' hosts.
"""
from __future__ import annotations

import math
import time
from typing import Callable

from tiering.errors import TieringError

WAIT_CONF = "spark.tiering.executorWaitSeconds"
EXPECTED_CONF = "spark.tiering.expectedExecutors"
DEFAULT_WAIT_SECONDS = 120


def wait_for_executor(executors: Callable[[], int], seconds: float, advertised: str, master: str, *,
                      expected: int = 1, clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep, poll: float = 0.5) -> str | None:
    """Return once `executors()` (registered executors, the driver not counted) is at least `expected`;
    after `seconds`: raise TieringError naming the advertised driver address when none registered, else
    return the sentence saying how many of the expected are missing."""
    deadline = clock() + seconds
    expected = max(1, expected)
    while (have := executors()) < expected:
        if clock() >= deadline and have >= 1:
            return (f"only {have} of {expected} expected executors registered within {seconds:g} s on {master}: "
                    f"the others probably cannot reach the driver at {advertised} (README, Running on a cluster)")
        if clock() >= deadline:
            raise TieringError(
                f"no executor registered with the driver within {seconds:g} s on {master}: executors probably "
                f"cannot reach the driver at {advertised}; set spark.driver.host (or SPARK_LOCAL_IP on the "
                f"Airflow worker) to an address the Spark workers reach and open spark.driver.port and "
                f"spark.blockManager.port (README, Running on a cluster); {WAIT_CONF} bounds this wait")
        sleep(poll)
    return None


def wait_on(sc) -> str | None:
    """wait_for_executor for a live SparkContext (nothing on a local master); the missing-executors
    sentence, if any, is also printed on stderr."""
    import sys

    conf = sc.getConf()
    master = conf.get("spark.master", "local")
    if master.startswith("local"):
        return None
    try:
        seconds = float(conf.get(WAIT_CONF, str(DEFAULT_WAIT_SECONDS)))
        expected = int(conf.get(EXPECTED_CONF, "1"))
        if not math.isfinite(seconds):  # float() takes nan and inf: a deadline that never comes
            raise ValueError(seconds)
    except ValueError:
        raise TieringError(f"{WAIT_CONF} must be a number of seconds and {EXPECTED_CONF} a whole number") from None
    if seconds <= 0:
        return None
    advertised = f"{conf.get('spark.driver.host', '?')}:{conf.get('spark.driver.port', '?')}"
    jsc = sc._jsc.sc()

    def executors() -> int:
        try:
            # getExecutorMemoryStatus has one entry per block manager, the driver's included
            return jsc.getExecutorMemoryStatus().size() - 1
        except Exception:
            if not jsc.isStopped():
                raise
        # Spark gave up on the application (the master unreachable, or it refused or killed it): asking the
        # stopped context failed with "Cannot call methods on a stopped SparkContext", which says nothing
        raise TieringError(f"Spark stopped the application before an executor registered: the master {master} "
                           "could not be reached, or it refused or removed the application (Spark's log above says "
                           "which)") from None

    missing = wait_for_executor(executors, seconds, advertised, master, expected=expected)
    if missing:
        print(f"warning: {missing}", file=sys.stderr)
    return missing


def executor_hosts(sc) -> list[str]:
    """The hosts of the executors registered now (the driver's own block manager left out), for job_run."""
    jsc = sc._jsc.sc()
    driver = jsc.env().blockManager().blockManagerId().hostPort()  # the driver's own entry
    keys = jsc.getExecutorMemoryStatus().keys().iterator()
    hosts = set()
    while keys.hasNext():
        key = keys.next()
        if key != driver:
            hosts.add(key.rsplit(":", 1)[0])
    return sorted(hosts)
