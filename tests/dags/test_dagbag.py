"""The DAG files parse, and every DAG carries what an operator expects: docs, tags, owner, retries, no
overlapping runs, the pool, and Params that validate."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    os.environ.setdefault("AIRFLOW_HOME", str(tmp_path_factory.mktemp("airflow-parse")))
    os.environ["AIRFLOW_CONFIG"] = str(REPO / "airflow.cfg")
    os.environ["TIERING_REPO"] = str(REPO)
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_no_import_errors_and_every_designed_dag(dagbag):
    from tiering.jobs.spec import JOBS

    assert dagbag.import_errors == {}
    assert sorted(dagbag.dags) == sorted(JOBS)


def test_every_dag_is_documented_tagged_owned_retried_and_serial(dagbag):
    from airflow.providers.standard.operators.python import ShortCircuitOperator

    from tiering.jobs.spec import JOBS

    for dag_id, dag in dagbag.dags.items():
        assert dag.doc_md and dag.doc_md.strip().startswith("###"), dag_id
        assert "tiering" in dag.tags and len(dag.tags) >= 2
        assert dag.max_active_runs == 1 and dag.catchup is False
        # plan on the worker first; the Spark task runs only when the plan says there is work
        plan, task = dag.get_task("plan"), dag.tasks[-1] if dag.tasks[-1].task_id != "plan" else dag.tasks[0]
        assert isinstance(plan, ShortCircuitOperator) and plan.downstream_task_ids == {task.task_id}
        assert task.owner == "tiering" and task.retries >= 1 and task.pool == "tiering_spark"
        assert task.application.endswith(f"tiering/jobs/{JOBS[dag_id].application}")
        assert task._conn_id == "spark_default"
        assert task.application_args is None  # built at run time from the run's params


def _with(params, values):
    import copy

    merged = copy.deepcopy(params)
    merged.update(values)  # ParamsDict.update keeps each Param's schema, as a triggered run does
    return merged


def test_offload_prefix_form_validates_the_position(dagbag):
    from airflow.sdk.exceptions import ParamValidationError

    params = dagbag.dags["tiering_offload_prefix"].params
    assert set(params.keys()) == {"topic", "position", "max_bytes_per_second"}
    params_ok = _with(params, {"topic": "orders", "position": "12:0"})
    assert params_ok.validate() == {"topic": "orders", "position": "12:0", "max_bytes_per_second": None}
    assert _with(params, {"topic": "orders", "position": "all"}).validate()["position"] == "all"
    for bad in ({"topic": "orders", "position": "12"}, {"topic": "", "position": "1:0"},
                {"topic": "orders", "position": "1:0; drop"}, {"topic": "orders", "position": "All"},
                {"topic": "orders", "position": "all\n"},
                # what int() and re take but a position is not: Unicode digits, a trailing newline (`$` matches
                # before it), control chars
                {"topic": "orders", "position": "\u0661:\u0660"}, {"topic": "orders", "position": "\uff11:\uff10"},
                {"topic": "orders", "position": "1:0\n"}, {"topic": "orders", "position": "1:0\v"},
                {"topic": "a\nb", "position": "1:0"}, {"topic": "orders\n", "position": "1:0"}):
        with pytest.raises(ParamValidationError):
            _with(params, bad).validate()


def test_offload_dags_take_an_optional_upload_limit_and_only_they(dagbag):
    from airflow.sdk.exceptions import ParamValidationError

    for dag_id, dag in dagbag.dags.items():
        if not dag_id.startswith("tiering_offload_"):
            assert "max_bytes_per_second" not in dag.params.keys(), dag_id
            continue
        base = {"topic": "orders", "position": "1:0"} if dag_id == "tiering_offload_prefix" else {}
        assert _with(dag.params, {**base, "max_bytes_per_second": 8388608}).validate()["max_bytes_per_second"] == 8388608
        assert _with(dag.params, {**base, "max_bytes_per_second": "8MiB"}).validate()["max_bytes_per_second"] == "8MiB"
        # past int64 (the job refuses it only once the run exists): refused by the form, as a negative one is
        for bad in (-1, "8Q", "-8M", "8M\n", 1.5, 2**63, 10**30):
            with pytest.raises(ParamValidationError):
                _with(dag.params, {**base, "max_bytes_per_second": bad}).validate()


def test_scheduled_dags_take_an_optional_topic_only_where_the_job_uses_it(dagbag):
    for dag_id, dag in dagbag.dags.items():
        # their jobs ignore a topic: no field
        if dag_id in ("tiering_gc", "tiering_gc_sweep", "tiering_metadata_export"):
            assert "topic" not in dag.params.keys(), dag_id
        elif dag_id != "tiering_offload_prefix":
            assert dag.params.validate()["topic"] is None
            assert _with(dag.params, {"topic": "orders"}).validate()["topic"] == "orders"
        assert "position" not in dag.params.keys() or dag_id == "tiering_offload_prefix"


def test_every_param_explains_itself_with_an_example(dagbag):
    for dag_id, dag in dagbag.dags.items():
        for name in dag.params.keys():
            param = dag.params.get_param(name)
            assert "e.g." in param.description and param.schema.get("title"), (dag_id, name)


def test_recover_is_manual_and_its_page_check_a_boolean_off_by_default(dagbag):
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.dags["tiering_recover"]
    assert dag.schedule is None  # after losing the database, by hand only
    assert set(dag.params.keys()) == {"topic", "check_pages", "dry_run"}
    assert dag.params.validate() == {"topic": None, "check_pages": False, "dry_run": False}  # a run, unless asked
    assert _with(dag.params, {"check_pages": True}).validate()["check_pages"] is True
    assert _with(dag.params, {"dry_run": True}).validate()["dry_run"] is True
    for bad in ({"check_pages": "yes"}, {"check_pages": 1}, {"dry_run": "true"}, {"dry_run": 0}):
        with pytest.raises(ParamValidationError):
            _with(dag.params, bad).validate()


def test_gc_retries_failed_keys_only_when_asked_and_its_form_says_what_that_does(dagbag):
    from airflow.sdk.exceptions import ParamValidationError

    from tiering.jobs.preflight import job_args

    params = dagbag.dags["tiering_gc"].params
    assert set(params.keys()) == {"retry_failed"}
    assert params.validate() == {"retry_failed": False}  # the hourly run leaves FAILED keys as they are
    param = params.get_param("retry_failed")
    assert param.schema["type"] == "boolean" and param.schema["title"] == "Retry FAILED keys"
    assert "FAILED keys due again" in param.description and "tiering gc --retry-failed" in param.description
    assert _with(params, {"retry_failed": True}).validate()["retry_failed"] is True
    for bad in ("yes", 1):
        with pytest.raises(ParamValidationError):
            _with(params, {"retry_failed": bad}).validate()
    # the run's params become the job's arguments as the plan and Spark tasks build them
    assert job_args("tiering_gc", {"retry_failed": True}) == ["--retry-failed"]
    assert job_args("tiering_gc", params.validate()) == []


def test_only_the_scrub_is_created_paused(dagbag):
    # it downloads the whole bucket: an operator turns it on
    assert dagbag.dags["tiering_scrub"].is_paused_upon_creation is True
    assert not any(d.is_paused_upon_creation for i, d in dagbag.dags.items() if i != "tiering_scrub")


def test_the_scrub_repairs_when_triggered_by_hand_or_asked(dagbag):
    params = dagbag.dags["tiering_scrub"].params
    assert set(params.keys()) == {"topic", "repair"}
    assert params["repair"] is None  # empty: decided by how the run started (run_params)
    assert params.get_param("repair").schema["type"] == ["null", "boolean"]
    from types import SimpleNamespace

    from airflow.utils.types import DagRunType

    from tiering.jobs.airflow_dags import run_params

    def resolved(run_type, repair=None):
        return run_params({"params": {"topic": None, "repair": repair},
                           "dag_run": SimpleNamespace(run_type=run_type)})["repair"]

    # the weekly run reports; a run triggered by hand repairs unless told not to; a ticked box always repairs
    assert resolved(DagRunType.SCHEDULED) is False and resolved(DagRunType.MANUAL) is True
    assert resolved(DagRunType.MANUAL, False) is False and resolved(DagRunType.SCHEDULED, True) is True
    assert resolved(DagRunType.ASSET_TRIGGERED) is False


def test_the_plan_tasks_log_says_what_a_run_covers_as_the_form_names_it():
    from tiering.jobs.airflow_dags import _describe

    assert _describe("tiering_recover", {"dry_run": True}) == "every topic, dry run, nothing changed"
    assert _describe("tiering_recover", {"topic": "a", "check_pages": True}) == "Topic 'a', check every page"
    assert _describe("tiering_offload_prefix", {"topic": "q", "position": "0:0"}) == "Topic 'q', Position '0:0'"
    assert _describe("tiering_offload_by_age", {}) == "every topic"
    assert _describe("tiering_gc", {"retry_failed": True}) == "retry FAILED keys"  # GC takes no topic
