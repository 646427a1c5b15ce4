"""The pipeline on a cluster whose second worker is another node: its own network namespace and
address, its own file system with the tier-1 root bind-mounted at the same path, PostgreSQL and RGW reached
over the network (tests/cluster/netns.py). Through `airflow dags test`: offload, delete-lagged and the
metadata export with tasks on both nodes; an export to a path only the driver has fails and leaves
nothing; the second node killed mid-offload never gives a green run with a ledger left behind, and the next
run finishes without waiting for the offload timeout. Skipped, saying why, where namespaces cannot be made."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cluster import netns
from tests.cluster.conftest import cluster_dags_test
from tests.conftest import empty_world
from tests.dags.conftest import airflow_runner
from tests.integration.helpers import entries, make_deps, produce
from tiering.config import Settings
from tiering.model import LedgerState as S, TopicPolicy

pytestmark = pytest.mark.slow
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, database_url, s3_settings):
    node_fs = tmp_path_factory.mktemp("node-fs")  # on the second node: a tmpfs holding only the tier-1 root
    root = node_fs / "tier1"
    root.mkdir()
    try:
        nodes = netns.start(tmp_path_factory.mktemp("two-nodes"), root, database_url, s3_settings["endpoint_url"])
    except netns.Unavailable as exc:
        pytest.skip(f"no second node: network namespaces cannot be made here ({exc})")
    try:
        yield nodes
    finally:
        netns.stop(nodes)


@pytest.fixture(scope="module")
def airflow2(tmp_path_factory, two_nodes, database_url, run_bucket, s3_settings):
    run = airflow_runner(tmp_path_factory.mktemp("airflow-two-nodes"), two_nodes.tier1_root, database_url, run_bucket,
                         s3_settings, spark_master=two_nodes.master_url,
                         extra_env={"SPARK_CONF_DIR": str(two_nodes.conf_dir)})
    run.cluster = two_nodes
    return run


@pytest.fixture(scope="module")
def deps(airflow2, engine, s3_client, run_bucket):
    empty_world(engine, s3_client, run_bucket)
    return make_deps(engine, s3_client, run_bucket, airflow2.tier1_root)


def _hosts(airflow, dag_id, conf=None, ok=True):
    done, out, apps = cluster_dags_test(airflow, dag_id, conf)
    if ok:
        assert done.returncode == 0, out[-3000:]
    hosts = set()
    for app in apps:
        hosts |= set(netns.executor_hosts(app).values())
    return done, out, hosts


def _submit(airflow, nodes, job: str, *args: str, conf: dict | None = None) -> subprocess.CompletedProcess:
    """spark-submit of one job to the two-node cluster by hand (one try, no Airflow retries), settings in
    its environment as the operator gives them."""
    settings = Settings.from_env({**os.environ, **airflow.settings_env})
    bindir = Path(sys.executable).parent
    env = {**os.environ, **settings.to_env(), "PYSPARK_PYTHON": sys.executable, "SPARK_CONF_DIR": str(nodes.conf_dir),
           "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
    confs = [x for k, v in {"spark.ui.enabled": "false", "spark.executorEnv.PYTHONPATH": str(ROOT),
                            **(conf or {})}.items() for x in ("--conf", f"{k}={v}")]
    cmd = [str(bindir / "spark-submit"), "--master", nodes.master_url, *confs, str(ROOT / "tiering" / "jobs" / job),
           *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _last_run(deps, job):
    from sqlalchemy import text

    with deps.meta.engine.connect() as conn:
        return dict(conn.execute(text("SELECT * FROM tiering.job_run WHERE job = :j ORDER BY run_id DESC LIMIT 1"),
                                 {"j": job}).one()._mapping)


def test_both_nodes_run_the_pipeline(airflow2, two_nodes, deps, run_bucket):
    nodes = {two_nodes.host_ip, two_nodes.node_ip}
    assert {w["host"] for w in two_nodes.status()["workers"] if w["state"] == "ALIVE"} == nodes
    for t in range(4):
        produce(deps, f"n{t}", [entries(f"n{t}{i}", 6, 2000) for i in range(3)],
                TopicPolicy(offload_after_seconds=0, deletion_lag_seconds=0, **BIG), open_tail=[b"open"])
    _, _, hosts = _hosts(airflow2, "tiering_offload_by_age")
    assert hosts == nodes, f"tasks ran on {hosts}, expected both nodes"
    assert all(led.state == S.OFFLOADED for t in range(4) for led in deps.meta.list_ledgers(f"n{t}")[:3])

    _, _, hosts = _hosts(airflow2, "tiering_delete_lagged")
    assert hosts <= nodes and hosts
    assert not any(deps.tier1.exists(f"n{t}", i) for t in range(4) for i in range(3))  # deleted on either node

    # (retention deletes tier-1 copies on the executors as delete-lagged does: its run on a cluster is
    # tests/cluster/test_pipeline_on_cluster.py's, not a fourth application here)
    from tiering.ops.export_metadata import filesystem_for, read_manifest

    dest = f"s3://{run_bucket}/two-nodes-export"
    _, _, hosts = _hosts(airflow2, "tiering_metadata_export", {"dest": dest})
    assert hosts and hosts <= nodes, hosts  # one task per table: either node
    settings = Settings.from_env({**os.environ, **airflow2.settings_env})
    manifest = read_manifest(*filesystem_for(dest, settings))
    assert manifest.row_counts["topic"] == 4 and manifest.export_id
    # a second export into it is refused and --overwrite replaces it: S3 logic of the driver, the same on any
    # master (tests/integration/test_export_location.py), not two more applications on this cluster
    # no secret in any event log, worker directory (executors' stdout/stderr, shipped files) or daemon log
    for path in two_nodes.state_dir.rglob("*"):
        if path.is_file() and path.stat().st_size < 64 * 1024 * 1024:
            data = path.read_bytes()
            assert not any(secret.encode() in data for secret in airflow2.secrets), f"a secret in {path}"


def test_an_export_to_a_path_only_the_driver_has_fails_and_leaves_nothing(airflow2, two_nodes, deps):
    """Item 3: the second node does not see the driver's directory (its file system holds only the tier-1
    root): its tasks write nothing there and say so; the driver removes what the first node wrote."""
    dest = two_nodes.tier1_root.parent / "export"  # the driver's disk: an empty tmpfs on the second node
    # executors of 1.5 GiB fit only the second node: every task runs there
    done = _submit(airflow2, two_nodes, "export_metadata.py", "--dest", str(dest),
                   conf={"spark.executor.memory": "1536m", "spark.scheduler.minRegisteredResourcesRatio": "0",
                         "spark.jars": "/usr/share/java/postgresql.jar"})
    assert done.returncode == 1, done.stderr[-3000:]
    row = _last_run(deps, "export_metadata")
    assert row["status"] == "FAILED" and "is not the driver's (its marker is missing)" in row["error"], row["error"]
    left = [p for p in dest.rglob("*") if p.is_file()] if dest.exists() else []
    assert left == [], left  # no manifest, no parts, no marker


def test_the_second_node_killed_mid_offload_is_never_a_green_run(airflow2, two_nodes, deps):
    """Item 5: 120 ledgers offloaded at 384 KiB/s (about 20 s); the second node's worker, executor and Python
    workers are killed once tasks run there. The run ends with every ledger OFFLOADED or FAILED naming the
    ledgers left; the next run (offload timeout: an hour) offloads the rest at once."""
    produce(deps, "kill", [entries(f"k{i}", 2, 32 * 1024) for i in range(120)],
            TopicPolicy(offload_after_seconds=0, **BIG), open_tail=[b"o"])
    killed = threading.Event()

    def kill_when_busy():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            with deps.meta.engine.connect() as conn:
                from sqlalchemy import text

                done = conn.execute(text("SELECT count(*) FROM tiering.ledger l JOIN tiering.topic t USING "
                                         "(topic_id) WHERE t.name = 'kill' AND l.state IN ('OFFLOADING', "
                                         "'OFFLOADED')")).scalar()
            if done >= 20:  # both executors are at work by now (the scheduler waited for both)
                two_nodes.kill_remote_worker()
                killed.set()
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    done, out, apps = cluster_dags_test(airflow2, "tiering_offload_by_age",
                                        {"topic": "kill", "max_bytes_per_second": 384 * 1024})
    killer.join(timeout=10)
    assert killed.is_set(), "the run ended before the second node could be killed"
    lost = [e for app in apps for e in map(json.loads, app.read_text().splitlines())
            if e.get("Event") == "SparkListenerTaskEnd" and e["Task Info"]["Host"] == two_nodes.node_ip
            and e.get("Task End Reason", {}).get("Reason") == "ExecutorLostFailure"]
    assert lost, "the kill hit no task running on the second node"
    left = [led.ledger_id for led in deps.meta.list_ledgers("kill") if led.state not in (S.OFFLOADED, S.OPEN)]
    row = _last_run(deps, "offload")
    print(f"second node killed: exit {done.returncode}, {row['status']}, done {row['items_done']}, "
          f"failed {row['items_failed']}, details {row['details']}, error {row['error']}")
    if done.returncode == 0:
        assert left == [] and row["status"] == "SUCCEEDED", (left, row)
    else:
        assert left and row["status"] == "FAILED", (left, row)
        assert any(f"kill/{i}" in (row["error"] or "") + out for i in left), (row["error"], out[-2000:])

    done, out, _apps = cluster_dags_test(airflow2, "tiering_offload_by_age", {"topic": "kill"})
    assert done.returncode == 0, out[-3000:]
    assert all(led.state == S.OFFLOADED for led in deps.meta.list_ledgers("kill")[:-1])


def test_executors_of_the_second_node_that_cannot_reach_the_driver_are_reported(airflow2, two_nodes, deps):
    """Item 6 (partial): the driver advertises 127.0.0.1, which the host's executor reaches and the second
    node's does not. The job runs on the executor it has and records how many were missing, and where it
    ran, in job_run.details (with spark.tiering.expectedExecutors = 2)."""
    produce(deps, "half", [entries("h", 3, 100)], TopicPolicy(offload_after_seconds=0, **BIG), open_tail=[b"o"])
    done = _submit(airflow2, two_nodes, "offload.py", "--by=age", "--topic=half",
                   conf={"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                         "spark.tiering.expectedExecutors": "2", "spark.tiering.executorWaitSeconds": "20"})
    assert done.returncode == 0, done.stderr[-3000:]
    details = _last_run(deps, "offload")["details"]
    assert details["executors_missing"].startswith("only 1 of 2 expected executors registered")
    assert details["executor_hosts"] == [two_nodes.host_ip], details  # the second node's never registered
    assert [led.state for led in deps.meta.list_ledgers("half")] == [S.OFFLOADED, S.OPEN]
