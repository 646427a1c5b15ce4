"""OpenLineage on real DAG runs: `airflow dags test` with the provider's file transport (every event a JSON
line in one file). A working offload emits START and COMPLETE for its tasks with the topic and tier-2
datasets and what moved (the job_run row's counts and ledger range), the Spark application gets the task's
run as its parent, a refused input emits FAIL with the error, and no event holds a secret. Without a
transport the provider is off: no listener, nothing in spark-submit's command."""
from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.conftest import empty_world
from tests.dags.conftest import airflow_runner, dags_test
from tests.integration.helpers import entries, make_deps, produce
from tiering.model import LedgerState as S, TopicPolicy

pytestmark = pytest.mark.slow
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
NAMESPACE = "tiering-lineage-test"


@pytest.fixture(scope="module")
def lineage_airflow(tmp_path_factory, database_url, run_bucket, s3_settings):
    """An Airflow home (SQLite metastore: `dags test` alone) whose OpenLineage transport is a file; the
    full task info is on, so an operator attribute holding a secret would show in the events."""
    events = tmp_path_factory.mktemp("lineage") / "events.jsonl"
    run = airflow_runner(tmp_path_factory.mktemp("airflow-lineage-home"), tmp_path_factory.mktemp("lineage-tier1"),
                         database_url, run_bucket, s3_settings, extra_env={
                             "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                                 {"type": "file", "log_file_path": str(events), "append": True}),
                             "AIRFLOW__OPENLINEAGE__NAMESPACE": NAMESPACE,
                             "AIRFLOW__OPENLINEAGE__INCLUDE_FULL_TASK_INFO": "True"})
    run.events = events
    return run


@pytest.fixture(scope="module")
def deps(lineage_airflow, engine, s3_client, run_bucket):
    empty_world(engine, s3_client, run_bucket)
    return make_deps(engine, s3_client, run_bucket, lineage_airflow.tier1_root)


def events_of(airflow, job_name: str) -> list[dict]:
    raw = airflow.events.read_text() if airflow.events.exists() else ""
    assert not any(s in raw for s in airflow.secrets), "a secret leaked into a lineage event"
    return [e for e in map(json.loads, raw.splitlines()) if e["job"]["name"] == job_name]


def datasets(event: dict, side: str) -> set[tuple[str, str]]:
    return {(d["namespace"], d["name"]) for d in event.get(side, [])}


def test_offload_emits_start_and_complete_with_its_datasets_and_what_moved(lineage_airflow, deps, database_url,
                                                                            run_bucket):
    produce(deps, "lin", [entries("a", 7, 50), entries("b", 5, 50)], TopicPolicy(offload_after_seconds=0, **BIG),
            open_tail=[b"open"])
    done, out = dags_test(lineage_airflow, "tiering_offload_by_age", {"topic": "lin"})
    assert done.returncode == 0, out[-3000:]
    assert [led.state for led in deps.meta.list_ledgers("lin")] == [S.OFFLOADED, S.OFFLOADED, S.OPEN]
    url = make_url(database_url)
    topic = (f"tiering://{url.host}{f':{url.port}' if url.port and url.port != 5432 else ''}/{url.database}",
             "lin")
    tier2 = (f"s3://{run_bucket}", "t/lin")

    spark = events_of(lineage_airflow, "tiering_offload_by_age.offload")
    assert [e["eventType"] for e in spark] == ["START", "COMPLETE"], spark
    start, complete = spark
    assert all(e["job"]["namespace"] == NAMESPACE for e in spark)
    assert datasets(start, "inputs") == {topic} and datasets(start, "outputs") == {tier2}
    assert datasets(complete, "inputs") == {topic} and datasets(complete, "outputs") == {tier2}
    with deps.meta.engine.connect() as conn:
        run_id, nbytes = conn.execute(text("SELECT run_id, bytes FROM tiering.job_run WHERE job = 'offload' "
                                           "ORDER BY run_id DESC LIMIT 1")).one()
    facet = complete["run"]["facets"]["tiering"]
    assert facet["jobRunId"] == run_id and facet["status"] == "SUCCEEDED" and facet["bytes"] == nbytes > 0
    assert (facet["ledgers"], facet["entries"], facet["firstLedgerId"], facet["lastLedgerId"]) == (2, 12, 0, 1)
    assert complete["outputs"][0]["outputFacets"]["outputStatistics"] == {
        **complete["outputs"][0]["outputFacets"]["outputStatistics"], "rowCount": 12, "size": nbytes}
    # one run is one tree: the task's parent is the DAG run, and spark-submit carries the task's run id
    assert complete["run"]["facets"]["parent"]["job"]["name"] == "tiering_offload_by_age"
    task_run = complete["run"]["runId"]
    assert re.search(rf"spark\.openlineage\.parentRunId={task_run}\b", out), out[-3000:]
    assert f"spark.openlineage.parentJobName=tiering_offload_by_age.offload" in out
    assert "spark.openlineage.transport" not in out
    with deps.meta.engine.connect() as conn:  # the application itself got it
        assert conn.execute(text("SELECT details->>'lineage_parent_run' FROM tiering.job_run WHERE run_id = :r"),
                            {"r": run_id}).scalar() == task_run

    plan = events_of(lineage_airflow, "tiering_offload_by_age.plan")
    assert [e["eventType"] for e in plan] == ["START", "COMPLETE"]
    assert plan[1]["run"]["facets"]["tiering"]["planned"] == 2
    assert datasets(plan[1], "inputs") == {topic}


def test_a_refused_input_emits_fail_with_the_error(lineage_airflow, deps):
    # valid in the form, refused by the plan task: the topic does not exist
    done, out = dags_test(lineage_airflow, "tiering_offload_prefix", {"topic": "nosuch", "position": "2:0"})
    assert done.returncode != 0 and "nosuch" in out, out[-3000:]
    plan = events_of(lineage_airflow, "tiering_offload_prefix.plan")
    assert [e["eventType"] for e in plan] == ["START", "FAIL"], plan
    fail = plan[1]
    assert "nosuch" in fail["run"]["facets"]["errorMessage"]["message"]
    facet = fail["run"]["facets"]["tiering"]
    assert facet["status"] == "FAILED" and "bad input" in facet["error"] and facet["jobRunId"] > 0
    assert "nosuch" in {d["name"] for d in fail["inputs"]}
    assert not events_of(lineage_airflow, "tiering_offload_prefix.offload")  # Spark never started


def _listeners(airflow) -> list:
    done = airflow("plugins", "--output", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    plugin = next(p for p in json.loads(done.stdout) if p["name"] == "OpenLineageProviderPlugin")
    return plugin.get("listeners") or []


def test_no_transport_means_no_listener(airflow, lineage_airflow):
    """The default home (tests/dags/conftest.py) configures no transport: the provider is disabled, so no
    listener runs (test_dag_runs.py checks spark-submit gets no parent either); with one, it listens."""
    assert _listeners(airflow) == []
    assert _listeners(lineage_airflow)


def test_export_and_an_idle_gc_report_their_datasets(lineage_airflow, deps, database_url, run_bucket):
    """The export reads the metadata tables and writes its location; an idle GC run ends in `plan` (no Spark)
    with its job_run row and the bucket's prefix."""
    done, out = dags_test(lineage_airflow, "tiering_metadata_export", {})
    assert done.returncode == 0, out[-3000:]
    [complete] = [e for e in events_of(lineage_airflow, "tiering_metadata_export.export_metadata")
                  if e["eventType"] == "COMPLETE"]
    url = make_url(database_url)
    names = {d["name"] for d in complete["inputs"]}
    assert {f"{url.database}.tiering.topic", f"{url.database}.tiering.ledger"} <= names
    with deps.meta.engine.connect() as conn:  # where this database's search_path has the catalog's tables
        schema = conn.execute(text("SELECT current_schema()")).scalar_one()
    assert {f"{url.database}.{schema}.iceberg_tables", f"{url.database}.{schema}.iceberg_namespace_properties"} <= names
    assert {d["namespace"] for d in complete["inputs"]} == {f"postgres://{url.host}:{url.port or 5432}"}
    [export] = datasets(complete, "outputs")
    assert export[0] == f"s3://{run_bucket}" and export[1].startswith("t-metadata/"), export

    done, out = dags_test(lineage_airflow, "tiering_gc")
    assert done.returncode == 0, out[-3000:]
    [gc_plan] = [e for e in events_of(lineage_airflow, "tiering_gc.plan") if e["eventType"] == "COMPLETE"]
    facet = gc_plan["run"]["facets"]["tiering"]
    assert facet["planned"] == 0 and facet["sparkStarted"] is False and facet["jobRunId"] > 0
    assert datasets(gc_plan, "outputs") == {(f"s3://{run_bucket}", "t/")}


def test_a_table_sync_reports_the_iceberg_table_it_wrote(lineage_airflow, deps, run_bucket):
    """The sync's COMPLETE names the topic it read and the Iceberg table it appended to (the bucket and the
    table's location, as Iceberg datasets are named), with what reached the table."""
    from tiering.metadata.table_sync import TableRows

    produce(deps, "tab", [entries("t", 6, 40), entries("u", 4, 40)], TopicPolicy(**BIG), open_tail=[b"open"])
    TableRows(deps.meta.engine).set_policy("tab", "lineage.tab", "follow")
    done, out = dags_test(lineage_airflow, "tiering_table_sync", {})
    assert done.returncode == 0, out[-3000:]
    [complete] = [e for e in events_of(lineage_airflow, "tiering_table_sync.table_sync")
                  if e["eventType"] == "COMPLETE"]
    assert (f"s3://{run_bucket}", "t-tables/lineage/tab") in datasets(complete, "outputs")
    assert {name for _, name in datasets(complete, "inputs")} == {"tab"}
    facet = complete["run"]["facets"]["tiering"]
    assert (facet["ledgers"], facet["entries"], facet["firstLedgerId"], facet["lastLedgerId"]) == (2, 10, 0, 1)
