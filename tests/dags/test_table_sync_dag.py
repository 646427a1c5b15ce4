"""`tiering_table_sync` for real under `airflow dags test`: an idle run plans on the worker and starts no
Spark; a run with a topic's table due writes the data files on local[2] executors and commits them, the
table then equal to `tiering read`. Settings come from the Airflow connections only; no output holds a
secret (dags_test checks)."""
from __future__ import annotations

import shutil

import pytest
from sqlalchemy import text

from tests.conftest import empty_world
from tests.dags.conftest import dags_test
from tests.integration.helpers import entries, make_deps, produce
from tiering.metadata.table_sync import TableRows
from tiering.ops.offload import offload_many
from tiering.read import Entry, ReadHandle
from tiering.tables.catalog import catalog
from tiering.tier1.marker import MARKER
from tiering.tier2.reader import tier2_opener

pytestmark = pytest.mark.slow


def test_table_sync_dag_skips_spark_when_idle_then_syncs(airflow, engine, s3_client, run_bucket, settings):
    empty_world(engine, s3_client, run_bucket)
    for child in airflow.tier1_root.iterdir():  # the DAG tier's shared root: only this test's topics
        if child.name != MARKER:
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    cat = catalog(settings)  # same bucket and prefix as the connections'
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM iceberg_tables"))
    deps = make_deps(engine, s3_client, run_bucket, airflow.tier1_root)
    produce(deps, "orders", [entries("o", 40, 300), entries("p", 20, 100)], open_tail=[b"tail"])
    offload_many(deps, [deps.meta.get_ledger("orders", 0)])

    done, out = dags_test(airflow, "tiering_table_sync")  # no topic has a table yet
    assert done.returncode == 0, out[-3000:]
    assert "nothing to do, Spark not started" in out, out[-3000:]

    TableRows(engine).set_policy("orders", "ns.orders", "follow")
    done, out = dags_test(airflow, "tiering_table_sync")
    assert done.returncode == 0, out[-3000:]
    assert "table_sync: SUCCEEDED: planned 1, done 2, skipped 0, failed 0" in out, out[-3000:]
    t = cat.load_table("ns.orders").scan().to_arrow()
    got = dict(zip(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist()), t["payload"].to_pylist()))
    assert len(got) == t.num_rows == 60
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    assert got == {(e.ledger_id, e.entry_id): e.data for e in handle.read("orders")
                   if isinstance(e, Entry) and e.ledger_id < 2}
    assert TableRows(engine).get("orders").synced_through == 1
