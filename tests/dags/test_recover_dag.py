"""`tiering_recover` for real: `airflow dags test` plans on the worker, then spark-submit runs
tiering/jobs/recover.py on local[2], each topic an item: index objects read on the executors (pages checked,
as the run asks), tier-1 ledgers adopted, one transaction per topic. Settings from the Airflow connections
only; no output holds a secret."""
from __future__ import annotations

import json
import shutil

import pytest
from sqlalchemy import text

from tests.conftest import empty_world
from tests.dags.conftest import dags_test
from tests.integration.helpers import entries, make_deps, produce
from tiering.model import LedgerState as S
from tiering.ops.offload import offload_many
from tiering.read import Entry, ReadHandle
from tiering.tier1.marker import MARKER
from tiering.tier2.reader import tier2_opener

pytestmark = pytest.mark.slow


def test_recover_dag_rebuilds_offloaded_and_tier1_ledgers_with_the_page_check(airflow, engine, s3_client, run_bucket):
    empty_world(engine, s3_client, run_bucket)
    # recovery reads tier 1 too: the DAG tier's shared root must hold only this test's topics
    for child in airflow.tier1_root.iterdir():
        if child.name != MARKER:
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    deps = make_deps(engine, s3_client, run_bucket, airflow.tier1_root)
    expected = {}
    for name in ("orders", "tenant/ns/β"):
        expected[name] = produce(deps, name, [entries(name[:1], 30, 700), entries(name[:1] + "2", 9, 300)],
                                 open_tail=[b"tail"])
        offload_many(deps, [deps.meta.get_ledger(name, 0)])
    expected["tier-1 only"] = produce(deps, "tier-1 only", [entries("t", 4, 10)])
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE tiering.topic, tiering.ledger, tiering.chunk, tiering.gc_task, "
                          "tiering.attribute, tiering.job_run CASCADE"))

    def tier1_files() -> dict:  # (the shared root's marker aside: the first job reading tier 1 writes it)
        return {p: p.read_bytes() for p in airflow.tier1_root.rglob("*") if p.is_file() and p.name != MARKER}

    tails = tier1_files()

    # the preview first: the run's counts, every topic's transaction rolled back, the open files left open
    done, out = dags_test(airflow, "tiering_recover", {"check_pages": True, "dry_run": True})
    assert done.returncode == 0, out[-3000:]
    assert "recover_dry_run: SUCCEEDED: planned 3, done 3, skipped 0, failed 0" in out, out[-3000:]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.topic")).scalar() == 0
        assert conn.execute(text("SELECT count(*) FROM tiering.ledger")).scalar() == 0
        preview = conn.execute(text("SELECT details FROM tiering.job_run WHERE job = 'recover_dry_run'")).scalar_one()
        assert conn.execute(text("SELECT count(*) FROM tiering.job_run WHERE job = 'recover'")).scalar() == 0
    preview = preview if isinstance(preview, dict) else json.loads(preview)
    assert preview["dry_run"] is True
    assert tier1_files() == tails  # nothing sealed

    done, out = dags_test(airflow, "tiering_recover", {"check_pages": True})
    assert done.returncode == 0, out[-3000:]
    assert "recover: SUCCEEDED: planned 3, done 3, skipped 0, failed 0" in out, out[-3000:]
    for name in ("orders", "tenant/ns/β"):
        assert [(led.state, led.tier1_present) for led in deps.meta.list_ledgers(name)] == [
            (S.OFFLOADED, True), (S.SEALED, True), (S.SEALED, True)]  # the open file was sealed
    assert [led.state for led in deps.meta.list_ledgers("tier-1 only")] == [S.SEALED]
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    for name, data in expected.items():
        assert {(e.ledger_id, e.entry_id): e.data for e in handle.read(name) if isinstance(e, Entry)} == data
    with engine.connect() as conn:
        row = conn.execute(text("SELECT status, items_done, items_failed, details FROM tiering.job_run "
                                "WHERE job = 'recover' ORDER BY run_id DESC LIMIT 1")).one()
    details = row.details if isinstance(row.details, dict) else json.loads(row.details)
    assert (row.status, row.items_done, row.items_failed) == ("SUCCEEDED", 3, 0)
    assert details["pages_checked"] is True and details["ledgers_recovered"] == 2
    assert details["tier1_adopted"] == 5 and details["tier1_sealed"] == 2 and details["tier1_copies_recorded"] == 2
    assert "dry_run" not in details
    counted = ("ledgers_recovered", "tier1_adopted", "tier1_sealed", "tier1_copies_recorded", "topics_created")
    assert {k: preview[k] for k in counted} == {k: details[k] for k in counted}  # the preview said what it did
