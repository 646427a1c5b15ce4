"""The pipeline on a real Spark standalone cluster: offload by age, delete-lagged, retention and
the metadata export, each through `airflow dags test` with spark_default = the cluster's master. Each run's
effect is checked in metadata, tier 1 and the bucket, and Spark's own event log must show that every task
ran on an executor of the cluster, never in the driver."""
from __future__ import annotations

import pytest

from tests.conftest import empty_world
from tests.cluster.conftest import cluster_dags_test
from tests.cluster.sparkcluster import executor_tasks
from tests.dags.test_dag_runs import last_job_run
from tests.integration.helpers import entries, make_deps, produce
from tiering.model import LedgerState as S, TopicPolicy
from tiering.tier1.marker import MARKER

pytestmark = pytest.mark.slow
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)


@pytest.fixture(scope="module")
def deps(cluster_airflow, engine, s3_client, run_bucket):
    empty_world(engine, s3_client, run_bucket)
    return make_deps(engine, s3_client, run_bucket, cluster_airflow.tier1_root)


def run_on_cluster(airflow, dag_id, conf=None, tasks_at_least=1):
    done, out, apps = cluster_dags_test(airflow, dag_id, conf)
    assert done.returncode == 0, out[-3000:]
    assert len(apps) == 1, f"expected one Spark application, event logs: {apps}"
    executors = executor_tasks(apps[0])
    assert len(executors) >= tasks_at_least and "driver" not in executors, executors
    return executors


def states(deps, topic):
    return [led.state for led in deps.meta.list_ledgers(topic)]


def test_cluster_is_up_with_its_worker(cluster_airflow):
    status = cluster_airflow.cluster.status()
    assert status["status"] == "ALIVE" and [w["state"] for w in status["workers"]] == ["ALIVE"]


def test_offload_by_age(cluster_airflow, deps):
    produce(deps, "age", [entries(f"a{i}", 10, 400) for i in range(3)],
            TopicPolicy(offload_after_seconds=0, deletion_lag_seconds=0, **BIG), open_tail=[b"open"])
    run_on_cluster(cluster_airflow, "tiering_offload_by_age", tasks_at_least=1)
    assert states(deps, "age") == [S.OFFLOADED, S.OFFLOADED, S.OFFLOADED, S.OPEN]
    assert last_job_run(deps, "offload") == ("SUCCEEDED", 3, 0)
    assert (cluster_airflow.tier1_root / MARKER).is_file()  # the driver's token, checked by the executor


def test_delete_lagged(cluster_airflow, deps):
    run_on_cluster(cluster_airflow, "tiering_delete_lagged", {"topic": "age"})
    assert [led.tier1_present for led in deps.meta.list_ledgers("age")] == [False, False, False, True]
    assert not any(deps.tier1.exists("age", i) for i in range(3)) and deps.tier1.retired_ids("age") == []
    assert last_job_run(deps, "delete_lagged") == ("SUCCEEDED", 3, 0)


def test_retention(cluster_airflow, deps):
    produce(deps, "ret", [entries(f"r{i}", 4, 250) for i in range(3)], TopicPolicy(retention_bytes=1000, **BIG),
            open_tail=[b"o"])
    run_on_cluster(cluster_airflow, "tiering_retention", {"topic": "ret"})
    assert states(deps, "ret") == [S.DELETED, S.DELETED, S.SEALED, S.OPEN]
    assert not deps.tier1.exists("ret", 0) and not deps.tier1.exists("ret", 1)


def test_metadata_export(cluster_airflow, deps, tmp_path):
    from tiering.ops.export_metadata import filesystem_for, read_manifest

    dest = tmp_path / "export"
    # one JDBC read per table, each a job of one task at least
    run_on_cluster(cluster_airflow, "tiering_metadata_export", {"dest": str(dest)}, tasks_at_least=6)
    manifest = read_manifest(*filesystem_for(str(dest)))
    assert manifest.row_counts["ledger"] == 8 and manifest.row_counts["topic"] == 2
    assert last_job_run(deps, "export_metadata")[0] == "SUCCEEDED"
