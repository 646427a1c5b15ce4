"""The cluster tier: one Spark standalone cluster (master + worker JVMs from the venv's pyspark, loopback,
free ports) for the whole session, and an Airflow home whose `spark_default` points at it. Stopped at the
end of the session, whatever happened."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.cluster import sparkcluster
from tests.dags.conftest import DB_PASSWORD, _load_airflow_env


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("spark-cluster")
    cluster = sparkcluster.start(state, workers=1, cores=1)
    try:
        yield cluster
    finally:
        sparkcluster.stop(state)


@pytest.fixture(scope="session")
def cluster_airflow(tmp_path_factory, spark_cluster, database_url, run_bucket, s3_settings):
    """`airflow ...` with spark_default = the cluster's master; returns a callable giving CompletedProcess."""
    home = tmp_path_factory.mktemp("airflow-cluster-home")
    tier1 = tmp_path_factory.mktemp("cluster-tier1")
    url = make_url(database_url).set(password=DB_PASSWORD).render_as_string(hide_password=False)
    settings_env = {"TIERING_DATABASE_URL": url, "TIERING_BUCKET": run_bucket, "TIERING_PREFIX": "t/",
                    "TIERING_TIER1_ROOT": str(tier1), "TIERING_S3_ENDPOINT_URL": s3_settings["endpoint_url"],
                    "AWS_ACCESS_KEY_ID": s3_settings["aws_access_key_id"],
                    "AWS_SECRET_ACCESS_KEY": s3_settings["aws_secret_access_key"],
                    "AWS_DEFAULT_REGION": s3_settings["region_name"], "PATH": os.environ["PATH"]}
    env = {**os.environ, **_load_airflow_env()(settings_env, home, spark_master=spark_cluster.master_url),
           "SPARK_CONF_DIR": str(spark_cluster.conf_dir),  # spark-defaults.conf: the event log
           # one item per ledger (as tests/dags): more than one task to place on executors
           "TIERING_OFFLOAD_BATCH_BYTES": "0"}
    for name in ("TIERING_DATABASE_URL", "TIERING_BUCKET", "TIERING_S3_ENDPOINT_URL", "AWS_SECRET_ACCESS_KEY",
                 "AWS_ACCESS_KEY_ID", "TIERING_PREFIX"):
        env.pop(name, None)
    airflow_bin = str(Path(sys.executable).parent / "airflow")

    def run(*args, timeout=600):
        return subprocess.run([airflow_bin, *args], env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=home)

    for cmd in (["db", "migrate"], ["pools", "set", "tiering_spark", "2", "tiering Spark jobs"]):
        done = run(*cmd)
        assert done.returncode == 0, done.stderr[-2000:]
    run.tier1_root = tier1
    run.secrets = (s3_settings["aws_secret_access_key"], DB_PASSWORD)
    run.cluster = spark_cluster
    return run


def cluster_dags_test(airflow, dag_id: str, conf: dict | None = None):
    """`airflow dags test` of one DAG; returns (CompletedProcess, output, the event logs of the Spark
    applications it started). No secret may appear in the output."""
    before = set(airflow.cluster.event_dir.iterdir())
    args = ["dags", "test", dag_id] + (["-c", json.dumps(conf)] if conf is not None else [])
    done = airflow(*args)
    output = done.stdout + done.stderr
    assert not any(s in output for s in airflow.secrets), "a secret leaked into Airflow's output"
    apps = sorted(p for p in set(airflow.cluster.event_dir.iterdir()) - before if not p.name.endswith(".inprogress"))
    return done, output, apps
