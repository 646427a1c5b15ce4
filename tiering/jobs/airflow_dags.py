"""Builds the pipeline's Airflow DAGs from `tiering.jobs.spec.JOBS` (the DAG files in dags/ are one call
each). Settings and secrets reach spark-submit through its environment, resolved from the connections
`tiering_metadata` and `tiering_s3` by `tiering.jobs.hook.TieringHook` when the task runs: never in `application_args`, never at parse time.
"""
from __future__ import annotations

import logging
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import (DAG, Asset, AssetOrTimeSchedule, ExceptionRetryPolicy, Param, RetryAction,
                         RetryRule)
from airflow.sdk.exceptions import AirflowFailException
from airflow.timetables.trigger import CronTriggerTimetable

from tiering.jobs.lineage import LineageMixin
from tiering.jobs.spec import JOBS, PREFIX_POSITION_PATTERN, SIZE_PATTERN, TOPIC_MAX, TOPIC_PATTERN, JobSpec, RunParam
from tiering.model import INT64_MAX

JDBC_JAR = "/usr/share/java/postgresql.jar"
LOG4J = Path(__file__).resolve().parent / "log4j2.properties"  # Spark at WARN (TIERING_SPARK_LOG_LEVEL)
POOL = "tiering_spark"
OWNER = "tiering"
log = logging.getLogger(__name__)
# Data-aware scheduling: the Spark task of every DAG updates the Asset of its kind of work when it succeeds
# (a run with nothing to do skips that task, so it updates nothing). A DAG in RUNS_ON also runs when that
# Asset is updated, besides its own schedule (AssetOrTimeSchedule): deleting lagged tier-1 copies follows
# every offload instead of waiting up to an hour (an early run whose copies are not due yet plans nothing
# and skips Spark).
WORK = {"tiering_offload_by_age": "offload", "tiering_offload_by_size": "offload",
        "tiering_offload_prefix": "offload"}
RUNS_ON = {"tiering_delete_lagged": "offload", "tiering_table_sync": "offload"}


def work_asset(dag_id: str) -> Asset:
    kind = WORK.get(dag_id) or JOBS[dag_id].kind
    return Asset(name=f"tiering_{kind}", uri=f"tiering://work/{kind}", group="tiering")


class RefusedInput(SystemExit):
    """Bad input found by `plan`: the task fails once (RETRY_POLICY), its log ending at the sentence. A
    SystemExit, because Airflow logs it as "Task exited" without a traceback (AirflowFailException is logged
    with a dozen frames of Airflow's own)."""


# bad input fails at once; anything else (the metastore or the API server away a moment) keeps its retries
RETRY_POLICY = ExceptionRetryPolicy(rules=[RetryRule(exception=f"{__name__}.RefusedInput",
                                                     action=RetryAction.FAIL, reason="bad input: not retried")])


_SWITCH_WORDS = {"check_pages": "check every page", "repair": "repair what it finds",
                 "retry_failed": "retry FAILED keys", "dry_run": "dry run, nothing changed"}


def _describe(dag_id: str, params: dict) -> str:
    """The run's parameters as the trigger form names them (Topic 'orders', Position 12:0)."""
    parts = []
    for p in JOBS[dag_id].params:
        value = params.get(p.name)
        if value not in (None, "", False):
            parts.append(f"{_form_field(p).schema.get('title', p.name).split(' (')[0]} {value!r}"
                         if p.name not in _SWITCH_WORDS else _SWITCH_WORDS[p.name])
    if not params.get("topic") and "topic" in JOBS[dag_id].param_names():
        parts.insert(0, "every topic")  # a switch alone ("dry run") still says what it runs over
    return ", ".join(parts)


def _planned(result) -> str:
    if result.ledgers is None or result.ledgers == result.planned:
        return f"{result.planned} item(s)"
    return f"{result.ledgers} ledger(s) in {result.planned} batch(es)"


def _run_ref(dag_id: str, context):
    from tiering.metadata.job_runs import RunRef

    return RunRef(kind=JOBS[dag_id].kind, dag_id=dag_id, dag_run_id=context["run_id"],
                  try_number=context["ti"].try_number)


def plan_on_worker(dag_id: str, **context) -> bool:
    """The `plan` task: refuse bad input once (no retry, a FAILED job_run row) and skip the Spark task when
    there is nothing to do (tiering.jobs.preflight)."""
    from tiering.errors import BadInput
    from tiering.jobs.hook import TieringHook
    from tiering.jobs.preflight import preflight
    from tiering.jobs.runner import deps_from

    params = run_params(context)
    try:
        settings = TieringHook().get_settings()
        result = preflight(dag_id, context["dag_run"].conf, params, set(context["dag"].params.keys()),
                           lambda: deps_from(settings), _run_ref(dag_id, context), settings)
    except BadInput as exc:
        log.error("%s: refused: %s", dag_id, exc)
        raise RefusedInput(f"{dag_id}: {exc}") from None
    context["task"].lineage_extra = {"planned": result.planned, "sparkStarted": result.run_spark}
    what = _describe(dag_id, params) or "(no parameters)"
    if result.planned is None:
        log.info("%s: %s: planned by the Spark job", dag_id, what)
    elif result.planned == 0:
        log.info("%s: %s: nothing to do, Spark not started", dag_id, what)
    else:
        log.info("%s: %s: %s to do", dag_id, what, _planned(result))
    return result.run_spark


def run_params(context) -> dict:
    """The run's parameters as its job gets them. The scrub's `repair` left empty follows how the run
    started: an operator who triggers a scrub by hand wants what it finds repaired, the weekly run reports."""
    params = dict(context["params"])
    if "repair" in params and params["repair"] is None:
        run_type = context["dag_run"].run_type
        params["repair"] = getattr(run_type, "value", run_type) == "manual"
    return params


# rendered before the task starts, so the lineage START event names the run's topic (tiering.jobs.lineage)
LINEAGE_TOPIC = "{{ params.get('topic') or '' }}"  # a DAG without the param has none


class TieringPlanOperator(LineageMixin, ShortCircuitOperator):
    """The `plan` task (plan_on_worker), with the run's lineage: its datasets, and the refusal's error and
    job_run row when the input is refused."""

    template_fields = (*ShortCircuitOperator.template_fields, "lineage_topic")

    def __init__(self, *, job: str, **kwargs):
        super().__init__(python_callable=plan_on_worker, op_args=[job], **kwargs)
        self.lineage_job = job
        self.lineage_topic = LINEAGE_TOPIC

    def execute(self, context):
        try:
            return super().execute(context)
        finally:
            # PythonOperator.execute leaves the whole context in op_kwargs, which a listener describing the
            # task with full task info cannot serialise (the task instance refers back to the task)
            self.op_kwargs = {}


class TieringSparkSubmitOperator(LineageMixin, SparkSubmitOperator):
    """spark-submit of one tiering job; settings from the Airflow connections, passed as environment. With
    lineage on, the Spark application gets the provider's parent-job properties (never its transport, which
    may hold a key: it would be in spark-submit's argv)."""

    template_fields = (*SparkSubmitOperator.template_fields, "lineage_topic")

    def __init__(self, *, job: str, **kwargs):
        super().__init__(**kwargs)
        self.job = job
        self.lineage_job = job
        self.lineage_topic = LINEAGE_TOPIC
        self._openlineage_inject_transport_info = False

    def execute(self, context):
        from tiering.jobs.hook import TieringHook

        params = run_params(context)
        from tiering.jobs.preflight import job_args

        self.application_args = job_args(self.job, params)
        settings = TieringHook().get_settings()
        self.prepare_submit(settings.to_env())
        ref = _run_ref(self.job, context)  # the job's job_run row carries the Airflow run it belongs to
        self.env_vars.update(TIERING_AIRFLOW_DAG_ID=ref.dag_id, TIERING_AIRFLOW_DAG_RUN_ID=ref.dag_run_id,
                             TIERING_AIRFLOW_TRY_NUMBER=str(ref.try_number))
        from tiering.jobs import lineage

        self._openlineage_inject_parent_job_info = lineage.enabled()  # the Spark run is the task's child
        try:
            return super().execute(context)
        finally:
            self.env_vars = {}  # its secrets never outlive the submit (a listener may describe the task)
            self._log_outcome(settings, ref)

    def _log_outcome(self, settings, ref) -> None:
        """The job's outcome as a few lines at the end of the task log, its first errors at ERROR."""
        from tiering.jobs.runner import outcome_lines
        from tiering.metadata.job_runs import JobRuns

        from tiering import clients

        engine = clients.engine(settings, pool_size=1)
        try:
            row = JobRuns(engine).by_airflow_run(ref.dag_id, ref.dag_run_id, ref.try_number)
        except Exception as exc:  # noqa: BLE001 - the log summary must not hide the task's own outcome
            self.log.warning("outcome: job_run not readable: %s", type(exc).__name__)
            return
        finally:
            engine.dispose()
        if row is None:
            self.log.error("%s: the job recorded no job_run row (it did not start; see above)", ref.kind)
            return
        for line in outcome_lines(row.get("kind") or ref.kind, row):
            self.log.info("%s", line)
        if row.get("error"):  # the first error; the job printed the others above
            self.log.error("%s: error: %s", ref.kind, row["error"])

    def prepare_submit(self, settings_env: dict[str, str]) -> None:
        """env_vars and py_files for this spark_default (tiering.jobs.submit); a master that would get a
        secret in argv fails the task once, with the reason."""
        import os

        from tiering.errors import BadInput
        from tiering.jobs.submit import executor_python, job_environment, py_files_archive

        try:
            master, deploy_mode, extra = _spark_connection(self._conn_id)
            self.env_vars = job_environment(
                settings_env, master, deploy_mode, executor_python(extra, os.environ, sys.executable),
                sys.executable, f"{Path(sys.executable).parent}:{_env('PATH')}")
        except BadInput as exc:
            raise AirflowFailException(str(exc)) from None
        self.py_files = str(py_files_archive())


def _spark_connection(conn_id: str) -> tuple[str, str | None, dict]:
    """(master, deploy mode, extra) of the Spark connection, resolved by the provider itself."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    extra = conn.extra_dejson or {}
    if "k8s" in f"{conn.conn_type}://{conn.host or ''}":
        # refused by job_environment; the provider itself fails with NameError without the k8s provider
        return f"{conn.host}", None, extra
    resolved = SparkSubmitHook(conn_id=conn_id)._connection
    return resolved["master"], resolved["deploy_mode"], extra


def _whole_number(environ, name: str, default: str, lo: int, hi: int, unit: str = "") -> int:
    """A DAG-parse setting: ASCII digits within [lo, hi] (unset or empty: `default`), else ValueError naming it."""
    import os

    raw = (os.environ if environ is None else environ).get(name, "") or default
    if not raw.isascii() or not raw.isdigit() or not lo <= int(raw) <= hi:
        raise ValueError(f"{name} must be a whole number{f' of {unit}' if unit else ''}, {lo} to {hi}")
    return int(raw)


def task_timeout(environ=None) -> timedelta:
    """execution_timeout of every task: TIERING_TASK_TIMEOUT_MINUTES (default 120). When it passes,
    Airflow kills spark-submit (client mode: the driver) and fails the task; the job_run row it leaves
    RUNNING is closed by the job's next run."""
    return timedelta(minutes=_whole_number(environ, "TIERING_TASK_TIMEOUT_MINUTES", "120", 1, 10080, "minutes"))


def task_retries(environ=None) -> int:
    """retries of every task: TIERING_TASK_RETRIES (default 2, 0 to 10), for transient failures (Spark, the
    metastore, an Airflow restart). 0 suits a deployment whose runs are retried by the next schedule, or
    tests whose failing runs are not about retries."""
    return _whole_number(environ, "TIERING_TASK_RETRIES", "2", 0, 10)


def task_retry_delay(environ=None) -> timedelta:
    """retry_delay of every task: TIERING_TASK_RETRY_DELAY_SECONDS (default 60, 0 to 86400), the wait
    before each of its TIERING_TASK_RETRIES."""
    return timedelta(seconds=_whole_number(environ, "TIERING_TASK_RETRY_DELAY_SECONDS", "60", 0, 86400, "seconds"))


def _env(name: str, default: str = "") -> str:
    import os

    return os.environ.get(name, default)


def _form_field(param: RunParam) -> Param:
    """The trigger form's field of a run parameter; the schema's own constraints let the form refuse a bad
    value on the field. A required topic is offloadPrefix's (the only one the spec requires)."""
    topic_schema = {"minLength": 1, "maxLength": TOPIC_MAX, "pattern": TOPIC_PATTERN}
    if param.name == "topic" and param.required:
        return Param(type="string", title="Topic", **topic_schema,
                     description="The topic to offload, e.g. orders. It must exist.")
    if param.name == "topic":
        return Param(None, type=["null", "string"], title="Topic (optional)", **topic_schema,
                     description="Limit this run to one topic, e.g. orders; leave empty for every topic.")
    if param.name == "position":
        # The form does not check a pattern in the browser (Airflow 3.3 applies only min/maxLength to a
        # text field), and the server's 400 is jsonschema's text with the failing schema: under allOf that
        # schema is this small one, so the refusal quotes its sentence rather than the whole field.
        return Param(type="string", title="Position (ledger:entry, or all)", minLength=3, maxLength=37,
                     allOf=[{"pattern": PREFIX_POSITION_PATTERN,
                             "description": "A position is two whole numbers joined by a colon: ledger:entry, "
                                            "e.g. 12:0; or all."}],
                     description="Offload every sealed ledger before this position: two whole "
                                 "numbers, the ledger id and the entry id, joined by a colon, "
                                 "e.g. 12:0. all: every sealed ledger of the topic.")
    if param.name == "dest":
        return Param(None, type=["null", "string"], title="Destination", minLength=1,
                     description="Where to write the snapshot: s3://bucket/path or a local "
                                 "directory, e.g. s3://backups/tiering/2026-11-22. Empty: "
                                 "s3://<bucket>/<prefix>-metadata/<run time>.")
    if param.name == "check_pages":
        return Param(False, type="boolean", title="Check every page",
                     description="Also download every data object and check its page CRC32Cs, so a corrupt "
                                 "copy is not recovered; this reads the whole bucket. Off: objects' lengths "
                                 "and indexes are checked, pages when read, e.g. on for a suspect bucket.")
    if param.name == "repair":
        return Param(None, type=["null", "boolean"], title="Repair",
                     description="Then repair the topics the scrub found broken (tiering repair): a missing, "
                                 "short or corrupt tier-2 copy is re-made from its verified tier-1 copy, a ledger "
                                 "with no good copy left is marked lost. Empty: on for a run triggered by hand, "
                                 "off for the scheduled run (which reports only); false: report only, e.g. true in a "
                                 "scheduled run after a bucket restore.")
    if param.name == "retry_failed":
        return Param(False, type="boolean", title="Retry FAILED keys",
                     description="First make the GC queue's FAILED keys due again (S3 refused their delete 5 "
                                 "times; nothing retries them otherwise), then delete them with the due ones: "
                                 "tiering gc --retry-failed; e.g. on once a bucket policy or permission that "
                                 "refused the deletes is mended. Off: the hourly run, FAILED keys left as they are.")
    if param.name == "dry_run":
        return Param(False, type="boolean", title="Dry run",
                     description="Report what a recovery would do now and change nothing: each topic's rows are "
                                 "decided and rolled back, open tier-1 files are not sealed (tiering "
                                 "recover-from-bucket --dry-run); the counts are in the run's job_run row; "
                                 "e.g. on first, to see what a recovery would bring back before running it.")
    if param.name == "max_bytes_per_second":
        return Param(None, type=["null", "integer", "string"], title="Upload limit (per second, optional)",
                     minimum=0, maximum=INT64_MAX, pattern=SIZE_PATTERN,
                     description="Bound this run's upload rate, split across its Spark tasks: bytes per second or "
                                 "a size with a unit, e.g. 8MiB or 8388608 for 8 MiB/s; 0: unlimited; empty: "
                                 "TIERING_OFFLOAD_MAX_BYTES_PER_SECOND.")
    raise ValueError(f"no form field for the run parameter {param.name!r}")


def params_for(spec: JobSpec) -> dict:
    """Only the parameters the job takes (`JobSpec.params`); each says what it does, with an example."""
    return {p.name: _form_field(p) for p in spec.params}


def build_dag(dag_id: str, doc_md: str | None = None) -> DAG:
    spec = JOBS[dag_id]
    schedule = spec.schedule
    if dag_id in RUNS_ON:  # its cron, or an update of the Asset it follows, whichever comes first
        schedule = AssetOrTimeSchedule(timetable=CronTriggerTimetable(spec.schedule, timezone="UTC"),
                                       assets=work_asset(next(k for k, v in WORK.items() if v == RUNS_ON[dag_id])))
    with DAG(
        dag_id=dag_id,
        description=spec.summary,
        doc_md=doc_md or spec.summary,
        schedule=schedule,
        start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["tiering", *spec.tags],
        params=params_for(spec),
        # retries are for transient failures (Spark, the metastore, an Airflow restart: a task killed past
        # `make stop`'s bound is retried after its heartbeat times out); bad input fails in `plan`, once
        default_args={"owner": OWNER, "retries": task_retries(), "retry_delay": task_retry_delay(),
                      "execution_timeout": task_timeout()},
    ) as dag:
        plan = TieringPlanOperator(task_id="plan", job=dag_id, retry_policy=RETRY_POLICY)
        plan >> TieringSparkSubmitOperator(
            task_id=spec.application.removesuffix(".py"),
            job=dag_id,
            application=spec.application_path,
            conn_id="spark_default",
            name=f"tiering-{dag_id}",
            pool=POOL,
            conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
                  "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J.as_uri()}",
                  **({"spark.driver.extraClassPath": JDBC_JAR} if spec.needs_jdbc else {})},
            jars=JDBC_JAR if spec.needs_jdbc else None,
            outlets=[work_asset(dag_id)],
        )
    return dag
