"""Airflow the way `make up` runs it: `.ci/airflow_up.sh` (API server, then scheduler and DAG processor,
LocalExecutor; metastore in PostgreSQL) with a home, a metastore database and a free port of its own. A run triggered over REST and a scheduled
run both SUCCEED through the scheduler, the executor and the execution API (`airflow dags test` bypasses all
three, which is how every run of `make up` could fail unseen), each with its job_run row pointing back at
it; a bad trigger is refused with HTTP 400; a conf key the DAG does not take fails the run once, without a
retry and without Spark, with a FAILED job_run row. A second `make up` reuses the running Airflow and
`make stop` ends its whole session.

DAGs are created paused here (on 2 shared cores, seven start-up runs would be five more Spark launches);
the test unpauses the two it drives, so what it shows of scheduling is the same as `make up`'s.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.conftest import empty_world
from tests.dags.conftest import airflow_metastore
from tests.e2e.support.airflow_server import admin_token, request_json as _http
from tests.support.processes import free_port as _free_port, group_alive as _group_alive
from tests.integration.helpers import entries, make_deps, produce
from tiering.model import LedgerState as S, TopicPolicy

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
DB_PASSWORD = f"pw-{secrets.token_hex(6)}"  # trusted local PostgreSQL ignores it: it is there to not leak


@pytest.fixture(scope="module")
def up(request, tmp_path_factory, database_url, run_bucket, s3_settings):
    local = tmp_path_factory.mktemp("local")
    port = _free_port()
    url = make_url(database_url).set(password=DB_PASSWORD).render_as_string(hide_password=False)
    env = {**os.environ, "TIERING_LOCAL": str(local), "TIERING_AIRFLOW_ADDRESS": f"127.0.0.1:{port}",
           "TIERING_DATABASE_URL": url, "TIERING_BUCKET": run_bucket, "TIERING_PREFIX": "t/",
           "TIERING_TIER1_ROOT": str(local / "tier1"), "TIERING_S3_ENDPOINT_URL": s3_settings["endpoint_url"],
           "AWS_ACCESS_KEY_ID": s3_settings["aws_access_key_id"],
           "AWS_SECRET_ACCESS_KEY": s3_settings["aws_secret_access_key"],
           "AWS_DEFAULT_REGION": s3_settings["region_name"],
           "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True", "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5"}
    metastore_cm = airflow_metastore(database_url)  # dropped after the stop below
    env["TIERING_AIRFLOW_DATABASE_URL"] = metastore_cm.__enter__()
    for name in list(env):  # nothing of the developer's own Airflow: this one is configured by the script
        if name.startswith(("AIRFLOW_CONN_", "AIRFLOW__API", "AIRFLOW_HOME")):
            env.pop(name)
    (local / "tier1").mkdir()
    # this module's runs also report lineage, through the scheduler path, to a file; the team tests (which
    # load the machine on purpose) run with lineage off, as `make up` does by default
    events = local / "lineage.jsonl"
    if request.module.__name__ == __name__:
        env["AIRFLOW__OPENLINEAGE__TRANSPORT"] = json.dumps({"type": "file", "log_file_path": str(events),
                                                            "append": True})

    def script(name, timeout=300):
        return subprocess.run(["bash", str(REPO / ".ci" / name)], env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)

    class Up:
        pass

    u = Up()
    u.local, u.home, u.url, u.env, u.script = local, local / "airflow", f"http://127.0.0.1:{port}", env, script
    u.events = events
    u.first = script("airflow_up.sh")
    try:
        yield u
    finally:
        script("stop.sh", timeout=400)
        metastore_cm.__exit__(None, None, None)


def _token(u) -> str:
    return admin_token(u.url, u.home)


def _wait_run(u, token, dag_id, run_id, timeout=420) -> dict:
    # a run is a Spark application started by the scheduler's worker: at load 7 on 2 cores (the suite's
    # other workers starting JVMs) one took more than 4 minutes from queued to done
    deadline = time.monotonic() + timeout
    run = None
    while time.monotonic() < deadline:
        try:
            status, run = _http(f"{u.url}/api/v2/dags/{dag_id}/dagRuns/{run_id}", token=token)
        except OSError:  # a slow answer on a loaded machine: ask again
            continue
        assert status == 200, run
        if run["state"] in ("success", "failed"):
            return run
        time.sleep(2)
    pytest.fail(f"{dag_id} {run_id} did not finish: {run}", pytrace=False)


def _wait_dags(u, token, dag_ids, timeout=120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_http(f"{u.url}/api/v2/dags/{d}", token=token)[0] == 200 for d in dag_ids):
            return
        time.sleep(1)
    pytest.fail(f"DAGs not parsed: {dag_ids}", pytrace=False)


def _job_run(engine, dag_id, run_id) -> dict:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT * FROM tiering.job_run WHERE dag_id = :d AND dag_run_id = :r "
                                      "ORDER BY run_id DESC LIMIT 1"), {"d": dag_id, "r": run_id}).one()._mapping)


def test_make_up_runs_scheduled_and_triggered_dags_to_success(up, engine, s3_client, run_bucket):
    assert up.first.returncode == 0, up.first.stdout[-2000:] + up.first.stderr[-3000:]
    secrets_dir = up.local / "airflow-secrets"
    assert sorted(p.name for p in secrets_dir.iterdir()) == ["api_secret_key", "fernet_key", "jwt_secret"]
    assert all(p.stat().st_mode & 0o077 == 0 for p in secrets_dir.iterdir())
    pgid = int((up.local / "airflow.pid").read_text())
    assert up.url in up.first.stdout
    conn = subprocess.run([str(REPO / ".venv/bin/airflow"), "config", "get-value", "database", "sql_alchemy_conn"],
                          env={**up.env, "AIRFLOW_HOME": str(up.home), "AIRFLOW_CONFIG": str(REPO / "airflow.cfg"),
                               "TIERING_REPO": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert conn.stdout.startswith("postgresql") and conn.stdout.rstrip().endswith(
        make_url(up.env["TIERING_AIRFLOW_DATABASE_URL"]).database), conn.stdout + conn.stderr

    again = up.script("airflow_up.sh")  # idempotent: finds the running one, starts no second standalone
    assert again.returncode == 0 and "already up" in again.stdout, again.stdout + again.stderr
    assert int((up.local / "airflow.pid").read_text()) == pgid

    token = _token(up)
    status, conns = _http(f"{up.url}/api/v2/connections", token=token)
    assert status == 200
    by_id = {c["connection_id"]: c for c in conns["connections"]}
    assert {"tiering_metadata", "tiering_s3", "spark_default"} <= set(by_id)  # in the metastore, for the UI
    assert by_id["tiering_metadata"]["password"] in (None, "***")  # never shown
    assert json.loads(by_id["tiering_s3"]["extra"])["bucket"] == run_bucket

    deps = make_deps(engine, s3_client, run_bucket, up.local / "tier1")
    empty_world(engine, s3_client, run_bucket)
    produce(deps, "due", [entries("d0", 5, 200), entries("d1", 5, 200)],
            TopicPolicy(offload_after_seconds=0, **BIG), open_tail=[b"open"])
    produce(deps, "manual", [[b"a"], [b"b"], [b"c"]], TopicPolicy(**BIG), open_tail=[b"d"])

    dags = ["tiering_offload_by_age", "tiering_offload_prefix", "tiering_delete_lagged"]
    _wait_dags(up, token, dags)

    # a bad trigger is refused before any run exists
    status, body = _http(f"{up.url}/api/v2/dags/tiering_offload_prefix/dagRuns", token=token,
                         data={"logical_date": None, "conf": {"topic": "manual", "position": "two"}})
    assert status == 400, body

    for dag_id in dags:
        status, body = _http(f"{up.url}/api/v2/dags/{dag_id}", token=token, data={"is_paused": False},
                             method="PATCH")
        assert status == 200, body
    status, triggered = _http(f"{up.url}/api/v2/dags/tiering_offload_prefix/dagRuns", token=token,
                              data={"logical_date": None, "conf": {"topic": "manual", "position": "2:0"}})
    assert status == 200, triggered
    status, typo = _http(f"{up.url}/api/v2/dags/tiering_delete_lagged/dagRuns", token=token,
                         data={"logical_date": None, "conf": {"typo_param": "x"}})
    assert status == 200, typo

    # unpaused, the 15-minute DAG gets its scheduled run for the last interval
    deadline = time.monotonic() + 120
    scheduled = []
    while not scheduled and time.monotonic() < deadline:
        try:
            _, runs = _http(f"{up.url}/api/v2/dags/tiering_offload_by_age/dagRuns", token=token)
        except OSError:  # a slow answer on a loaded machine: ask again (as _wait_run does)
            continue
        scheduled = [r for r in runs["dag_runs"] if r["run_type"] == "scheduled"]
        time.sleep(2)
    assert scheduled, "the scheduler created no scheduled run"

    for dag_id, run in (("tiering_offload_by_age", scheduled[0]), ("tiering_offload_prefix", triggered)):
        done = _wait_run(up, token, dag_id, run["dag_run_id"])
        assert done["state"] == "success", (dag_id, done, _task_log_tail(up))
        row = _job_run(engine, dag_id, run["dag_run_id"])
        assert row["status"] == "SUCCEEDED" and row["try_number"] == 1, row
        # items: a ledger, or a batch of a topic's small ledgers (the default): at least one
        assert row["kind"] == dag_id.removeprefix("tiering_") and row["items_done"] >= 1, row
    assert [led.state for led in deps.meta.list_ledgers("due")] == [S.OFFLOADED, S.OFFLOADED, S.OPEN]
    assert [led.state for led in deps.meta.list_ledgers("manual")] == [S.OFFLOADED, S.OFFLOADED, S.SEALED, S.OPEN]

    # nothing left to do: the next run plans on the worker, skips the Spark task and still succeeds
    status, idle = _http(f"{up.url}/api/v2/dags/tiering_offload_by_age/dagRuns", token=token,
                         data={"logical_date": None, "conf": {}})
    assert status == 200, idle
    assert _wait_run(up, token, "tiering_offload_by_age", idle["dag_run_id"])["state"] == "success"
    _, tis = _http(f"{up.url}/api/v2/dags/tiering_offload_by_age/dagRuns/{idle['dag_run_id']}/taskInstances",
                   token=token)
    assert {t["task_id"]: t["state"] for t in tis["task_instances"]} == {"plan": "success", "offload": "skipped"}
    row = _job_run(engine, "tiering_offload_by_age", idle["dag_run_id"])
    assert row["status"] == "SUCCEEDED" and row["details"] == {"planned": 0, "spark": "skipped"}, row

    # the typo: failed once, in `plan`, no retry, no Spark task run, a FAILED row saying why
    done = _wait_run(up, token, "tiering_delete_lagged", typo["dag_run_id"])
    assert done["state"] == "failed"
    _, tis = _http(f"{up.url}/api/v2/dags/tiering_delete_lagged/dagRuns/{typo['dag_run_id']}/taskInstances",
                   token=token)
    states = {t["task_id"]: (t["state"], t["try_number"]) for t in tis["task_instances"]}
    assert states["plan"] == ("failed", 1) and states["delete_lagged"][0] == "upstream_failed", states
    row = _job_run(engine, "tiering_delete_lagged", typo["dag_run_id"])
    assert row["status"] == "FAILED" and "does not take 'typo_param'" in row["error"], row

    # the run view: the refusal ends at the sentence (no traceback), the plan log counts ledgers and batches
    # in the form's words, the offload log has its outcome line once
    plan_log = _task_log(up, "tiering_delete_lagged", typo["dag_run_id"], "plan")
    assert "does not take 'typo_param'" in plan_log and "Traceback" not in plan_log
    assert "error_detail" not in plan_log, plan_log[-2000:]
    plan_log = _task_log(up, "tiering_offload_prefix", triggered["dag_run_id"], "plan")
    assert "Topic 'manual', Position '2:0': 2 ledger(s) in 1 batch(es) to do" in plan_log, plan_log[-3000:]
    assert "--prefix" not in plan_log
    offload_log = _task_log(up, "tiering_offload_prefix", triggered["dag_run_id"], "offload")
    assert offload_log.count("offload_prefix: SUCCEEDED: planned 1 (2 ledger(s) in 1 batch(es))") == 1, \
        offload_log[-3000:]

    logs = "".join(p.read_text(errors="replace") for p in up.home.rglob("*.log"))
    assert DB_PASSWORD not in logs
    _check_lineage(up, run_bucket, triggered["dag_run_id"], typo["dag_run_id"])

    stop = up.script("stop.sh", timeout=400)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    deadline = time.monotonic() + 15  # killed processes are reaped by init, not by us
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _group_alive(pgid), subprocess.run(["ps", "-o", "pid,stat,cmd", "-g", str(pgid)],
                                                  capture_output=True, text=True).stdout


def _check_lineage(u, bucket, triggered, typo) -> None:
    """OpenLineage through the scheduler: the DAG run and its tasks START and COMPLETE with the datasets
    and what moved; the refused run FAILs in `plan` with the sentence; no secret in any event."""
    raw = u.events.read_text()
    assert DB_PASSWORD not in raw and u.env["AWS_SECRET_ACCESS_KEY"] not in raw
    events = [json.loads(line) for line in raw.splitlines()]

    def types(job, run_id):
        return [e["eventType"] for e in events if e["job"]["name"] == job and _airflow_run(e) == run_id]

    assert types("tiering_offload_prefix", triggered) == ["START", "COMPLETE"]
    assert types("tiering_offload_prefix.offload", triggered) == ["START", "COMPLETE"]
    [done] = [e for e in events if e["job"]["name"] == "tiering_offload_prefix.offload"
              and e["eventType"] == "COMPLETE" and _airflow_run(e) == triggered]
    assert {(d["namespace"], d["name"]) for d in done["outputs"]} == {(f"s3://{bucket}", "t/manual")}
    assert done["run"]["facets"]["tiering"]["ledgers"] == 2
    assert types("tiering_delete_lagged.plan", typo) == ["START", "FAIL"]
    [fail] = [e for e in events if e["job"]["name"] == "tiering_delete_lagged.plan" and e["eventType"] == "FAIL"
              and _airflow_run(e) == typo]
    assert "typo_param" in fail["run"]["facets"]["errorMessage"]["message"]
    assert "FAIL" in types("tiering_delete_lagged", typo)


def _airflow_run(event) -> str | None:
    facets = event["run"]["facets"]
    return ((facets.get("airflow") or facets.get("airflowDagRun") or {}).get("dagRun") or {}).get("run_id")


def _task_log(u, dag_id, run_id, task_id) -> str:
    paths = list(u.home.joinpath("logs").glob(f"dag_id={dag_id}/run_id={run_id}/task_id={task_id}/*.log"))
    assert paths, (dag_id, run_id, task_id)
    return "".join(p.read_text(errors="replace") for p in sorted(paths))


def _task_log_tail(u) -> str:
    logs = sorted(u.home.joinpath("logs").rglob("*.log"), key=lambda p: p.stat().st_mtime)
    return "".join(p.read_text(errors="replace")[-1500:] for p in logs[-3:])
