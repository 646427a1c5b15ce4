"""A driver its executors cannot reach: the job fails after a bounded wait with the cause in
job_run, instead of the master relaunching executors until the task's timeout.

The driver binds 127.0.0.1 (spark.driver.bindAddress) but advertises 127.0.0.2, as a driver advertising an address of
the wrong interface does: the worker's executors launch, cannot connect back, and never register."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import cluster_dags_test  # noqa: F401 - the tier's fixtures
from tests.integration.helpers import entries, make_deps, produce
from tests.conftest import empty_world
from tiering.config import Settings
from tiering.jobs.executors import WAIT_CONF
from tiering.model import TopicPolicy

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_executors_that_cannot_reach_the_driver_fail_the_job_with_the_cause(cluster_airflow, engine, s3_client,
                                                                           run_bucket, database_url, s3_settings):
    empty_world(engine, s3_client, run_bucket)
    deps = make_deps(engine, s3_client, run_bucket, cluster_airflow.tier1_root)
    produce(deps, "unreach", [entries("u", 3, 100)], TopicPolicy(offload_after_seconds=0,
                                                                  rollover_entries=10**9, rollover_bytes=2**40))
    settings = Settings(database_url=database_url, bucket=run_bucket, tier1_root=cluster_airflow.tier1_root,
                        prefix="t/", s3_endpoint_url=s3_settings["endpoint_url"],
                        aws_access_key_id=s3_settings["aws_access_key_id"],
                        aws_secret_access_key=s3_settings["aws_secret_access_key"])
    bindir = Path(sys.executable).parent
    env = {**os.environ, **settings.to_env(), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
    cmd = [str(bindir / "spark-submit"), "--master", cluster_airflow.cluster.master_url,
           "--conf", "spark.ui.enabled=false", "--conf", "spark.driver.host=127.0.0.2",
           "--conf", "spark.driver.bindAddress=127.0.0.1",
           "--conf", f"{WAIT_CONF}=15", "--conf", "spark.executorEnv.PYTHONPATH=" + str(ROOT),
           str(ROOT / "tiering" / "jobs" / "offload.py"), "--by=age", "--topic=unreach"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stderr[-2000:]
    from sqlalchemy import text

    with engine.connect() as conn:
        status, error = conn.execute(text("SELECT status, error FROM tiering.job_run WHERE kind = 'offload_by_age' "
                                          "ORDER BY run_id DESC LIMIT 1")).one()
    assert status == "FAILED" and "no executor registered" in error and "127.0.0.2" in error, error
    assert [led.state.value for led in deps.meta.list_ledgers("unreach")] == ["SEALED"]  # nothing touched
