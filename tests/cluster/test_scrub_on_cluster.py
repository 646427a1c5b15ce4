"""The `tiering` Spark source on the standalone cluster: the tiering_scrub DAG reads a topic across
both tiers through the source, every task on an executor of the cluster (the driver's tier-1 token checked
there), and records the entries it read in job_run; a flipped byte in tier 2 then fails the run, named by a row of its
one query."""
from __future__ import annotations

import pytest

from tests.cluster.test_pipeline_on_cluster import run_on_cluster
from tests.conftest import empty_world
from tests.cluster.conftest import cluster_dags_test
from tests.integration.helpers import entries, make_deps, produce
from tiering.model import LedgerState as S
from tiering.ops.offload import offload_ledger

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def deps(cluster_airflow, engine, s3_client, run_bucket):
    empty_world(engine, s3_client, run_bucket)
    return make_deps(engine, s3_client, run_bucket, cluster_airflow.tier1_root)


def _scrub_row(deps):
    from sqlalchemy import text

    with deps.meta.engine.connect() as conn:
        return dict(conn.execute(text("SELECT * FROM tiering.job_run WHERE kind = 'scrub' "
                                      "ORDER BY run_id DESC LIMIT 1")).one()._mapping)


def test_scrub_through_the_source_on_the_cluster(cluster_airflow, deps):
    expected = produce(deps, "scrub", [entries(f"s{i}", 12, 900) for i in range(3)], open_tail=[b"tail"])
    first, second, _third = deps.meta.list_ledgers("scrub", [S.SEALED])
    offload_ledger(deps, first)
    deps.tier1.delete("scrub", 0)
    deps.meta.mark_tier1_deleted(deps.meta.get_ledger("scrub", 0))  # L0 tier 2 only, L1 both, L2 and L3 tier 1
    offload_ledger(deps, second)
    run_on_cluster(cluster_airflow, "tiering_scrub", {"topic": "scrub"}, tasks_at_least=4)
    row = _scrub_row(deps)
    assert row["status"] == "SUCCEEDED" and row["details"]["entries"] == len(expected)
    assert row["bytes"] == sum(len(v) for v in expected.values())
    ch = deps.meta.get_chunk(deps.meta.get_ledger("scrub", 0))
    b = deps.bucket
    original = b.s3.get_object(Bucket=b.name, Key=ch.data_key)["Body"].read()
    spot = ch.data_offset + 200
    b.s3.put_object(Bucket=b.name, Key=ch.data_key,
                    Body=original[:spot] + bytes([original[spot] ^ 1]) + original[spot + 1:])
    try:
        # report only: a run triggered by hand would otherwise mark the tier-2-only ledger lost
        done, out, _apps = cluster_dags_test(cluster_airflow, "tiering_scrub", {"topic": "scrub", "repair": False})
    finally:
        b.s3.put_object(Bucket=b.name, Key=ch.data_key, Body=original)
    assert done.returncode != 0
    row = _scrub_row(deps)
    assert row["status"] == "FAILED" and row["details"]["failed_topics"] == ["scrub"] and ch.data_key in row["error"]
    # the finding came back as a row of the one query (mode PERMISSIVE), not as a task failure Spark retried
    assert (row["details"]["queries"], row["details"]["findings"]) == (1, 1)
    assert "scrub: ledger 0 from entry 0: CorruptObjectError" in row["error"]
