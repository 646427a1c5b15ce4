"""A bounded wait for the first executor of a cluster job (issue 24).

On a standalone (or YARN) master, executors that cannot reach the driver (it advertises 127.0.0.1, a
firewall drops its port) die right after launch; the master relaunches them until the task's
execution_timeout, and the job's row ends with whatever error the kill left ("ConnectionRefusedError").
The driver waits instead, at most `spark.tiering.executorWaitSeconds` (default 120 s; 0: no wait), for one
executor to register, and otherwise fails with the cause and what to set. A local master has its executor in
the driver: nothing to wait for.
"""
from __future__ import annotations

import time
from typing import Callable

from tiering.errors import TieringError

WAIT_CONF = "spark.tiering.executorWaitSeconds"
DEFAULT_WAIT_SECONDS = 120


def wait_for_executor(executors: Callable[[], int], seconds: float, advertised: str, master: str, *,
                      clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                      poll: float = 0.5) -> None:
    """Return once `executors()` (registered executors, the driver not counted) is at least 1; raise
    TieringError naming the advertised driver address after `seconds`."""
    deadline = clock() + seconds
    while executors() < 1:
        if clock() >= deadline:
            raise TieringError(
                f"no executor registered with the driver within {seconds:g} s on {master}: executors probably "
                f"cannot reach the driver at {advertised}; set spark.driver.host (or SPARK_LOCAL_IP on the "
                f"Airflow worker) to an address the Spark workers reach and open spark.driver.port and "
                f"spark.blockManager.port (README, Running on a cluster); {WAIT_CONF} bounds this wait")
        sleep(poll)


def wait_on(sc) -> None:
    """wait_for_executor for a live SparkContext (nothing on a local master)."""
    conf = sc.getConf()
    master = conf.get("spark.master", "local")
    if master.startswith("local"):
        return
    try:
        seconds = float(conf.get(WAIT_CONF, str(DEFAULT_WAIT_SECONDS)))
    except ValueError:
        raise TieringError(f"{WAIT_CONF} must be a number of seconds") from None
    if seconds <= 0:
        return
    advertised = f"{conf.get('spark.driver.host', '?')}:{conf.get('spark.driver.port', '?')}"
    # getExecutorMemoryStatus has one entry per block manager, the driver's included
    wait_for_executor(lambda: sc._jsc.sc().getExecutorMemoryStatus().size() - 1, seconds, advertised, master)
