"""`tiering_gc` with `retry_failed` for real: `airflow dags test` plans on the worker, then spark-submit runs
tiering/jobs/gc.py on local[2]. The hourly run (the Param off) leaves the queue's FAILED keys alone; a run
triggered with retry_failed=true makes them due again and deletes them, as `tiering gc --retry-failed`
does. Settings from the Airflow connections only; no output holds a secret."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from tests.conftest import empty_world
from tests.dags.conftest import dags_test
from tests.integration.helpers import bucket_keys, make_deps

pytestmark = pytest.mark.slow
KEYS = [f"t/gone/uuid-{i}-ledger-{i}" for i in range(3)]


def _failed_rows(engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT key, state FROM tiering.gc_task ORDER BY key"))]


def test_a_triggered_run_with_retry_failed_deletes_the_failed_keys(airflow, engine, s3_client, run_bucket):
    empty_world(engine, s3_client, run_bucket)
    deps = make_deps(engine, s3_client, run_bucket, airflow.tier1_root)
    for key in KEYS:  # objects whose deletes S3 refused five times (a bucket policy, since mended)
        s3_client.put_object(Bucket=run_bucket, Key=key, Body=b"x")
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tiering.gc_task (key, reason, attempts, state, last_error, not_before) "
                          "VALUES (:k, 'test', 5, 'FAILED', 'AccessDenied', now() - interval '1 hour')"),
                     [{"k": k} for k in KEYS])

    done, out = dags_test(airflow, "tiering_gc")  # the hourly run: FAILED keys are not its business
    assert done.returncode == 0, out[-3000:]
    assert _failed_rows(engine) == [(k, "FAILED") for k in KEYS] and set(KEYS) <= bucket_keys(deps)

    done, out = dags_test(airflow, "tiering_gc", {"retry_failed": True})
    assert done.returncode == 0, out[-3000:]
    assert "tiering_gc: retry FAILED keys: 1 item(s) to do" in out, out[-3000:]  # one worker drains 3 keys
    assert _failed_rows(engine) == [] and not set(KEYS) & bucket_keys(deps)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT status, details FROM tiering.job_run WHERE job = 'gc' "
                                "ORDER BY run_id DESC LIMIT 1")).one()
    details = row.details if isinstance(row.details, dict) else json.loads(row.details)
    assert row.status == "SUCCEEDED" and details["requeued"] == 3
