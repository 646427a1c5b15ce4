"""The cluster tier: one Spark standalone cluster (master + worker JVMs from the venv's pyspark, loopback,
free ports) for the whole session, and an Airflow home whose `spark_default` points at it. Stopped at the
end of the session, whatever happened."""
from __future__ import annotations

import json

import pytest

from tests.cluster import sparkcluster
from tests.dags.conftest import airflow_runner


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
    run = airflow_runner(tmp_path_factory.mktemp("airflow-cluster-home"), tmp_path_factory.mktemp("cluster-tier1"),
                         database_url, run_bucket, s3_settings, spark_master=spark_cluster.master_url,
                         # spark-defaults.conf: the event log. No retries: a failing run here is about the
                         # cluster (retries are the DAG tests'), and each retry is another Spark application
                         extra_env={"SPARK_CONF_DIR": str(spark_cluster.conf_dir), "TIERING_TASK_RETRIES": "0"})
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
