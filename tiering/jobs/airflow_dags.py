"""Builds the pipeline's Airflow DAGs from `tiering.jobs.spec.JOBS` (the DAG files in dags/ are one call
each). Settings and secrets reach spark-submit through its environment, resolved from the connections
`tiering_metadata` and `tiering_s3` when the task runs: never in `application_args`, never at parse time.
"""
from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param
from airflow.sdk.exceptions import AirflowFailException

from tiering.jobs.spec import JOBS, POSITION_PATTERN, TOPIC_MAX, TOPIC_PATTERN, JobSpec, spark_submit_args

JDBC_JAR = "/usr/share/java/postgresql.jar"
POOL = "tiering_spark"
OWNER = "tiering"


class TieringSparkSubmitOperator(SparkSubmitOperator):
    """spark-submit of one tiering job; settings from the Airflow connections, passed as environment."""

    def __init__(self, *, job: str, **kwargs):
        super().__init__(**kwargs)
        self.job = job

    def execute(self, context):
        from tiering.config import Settings

        params = context["params"]
        self.application_args = spark_submit_args(self.job, topic=params.get("topic") or None,
                                                  position=params.get("position") or None,
                                                  dest=params.get("dest") or None)
        settings = Settings.from_airflow()
        self.prepare_submit(settings.to_env())
        return super().execute(context)

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


def task_timeout(environ=None) -> timedelta:
    """execution_timeout of every task: TIERING_TASK_TIMEOUT_MINUTES (default 120). When it passes,
    Airflow kills spark-submit (client mode: the driver) and fails the task; the job_run row it leaves
    RUNNING is closed by the job's next run."""
    import os

    raw = (os.environ if environ is None else environ).get("TIERING_TASK_TIMEOUT_MINUTES", "") or "120"
    if not raw.isascii() or not raw.isdigit() or not 0 < int(raw) <= 10080:
        raise ValueError("TIERING_TASK_TIMEOUT_MINUTES must be a whole number of minutes, 1 to 10080")
    return timedelta(minutes=int(raw))


def _env(name: str, default: str = "") -> str:
    import os

    return os.environ.get(name, default)


def params_for(spec: JobSpec) -> dict:
    topic_schema = {"minLength": 1, "maxLength": TOPIC_MAX, "pattern": TOPIC_PATTERN}
    if spec.dag_id == "tiering_offload_prefix":
        return {
            "topic": Param(type="string", title="Topic", description="The topic to offload.", **topic_schema),
            "position": Param(type="string", title="Position (L:E)", pattern=POSITION_PATTERN,
                              description="Offload every sealed ledger before this ledger:entry position, "
                                          "e.g. 12:0."),
        }
    params = {"topic": Param(None, type=["null", "string"], title="Topic (optional)",
                             description="Limit this run to one topic; empty for all.", **topic_schema)}
    if spec.dag_id == "tiering_metadata_export":
        params["dest"] = Param(None, type=["null", "string"], title="Destination",
                               description="s3://bucket/path or a local path; default: "
                                           "s3://<bucket>/<prefix>-metadata/<run time>.")
    return params


def build_dag(dag_id: str, doc_md: str | None = None) -> DAG:
    spec = JOBS[dag_id]
    with DAG(
        dag_id=dag_id,
        description=spec.summary,
        doc_md=doc_md or spec.summary,
        schedule=spec.schedule,
        start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        tags=["tiering", *spec.tags],
        params=params_for(spec),
        default_args={"owner": OWNER, "retries": 1, "retry_delay": timedelta(minutes=2),
                      "execution_timeout": task_timeout()},
    ) as dag:
        TieringSparkSubmitOperator(
            task_id=spec.application.removesuffix(".py"),
            job=dag_id,
            application=spec.application_path,
            conn_id="spark_default",
            name=f"tiering-{dag_id}",
            pool=POOL,
            conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4",
                  **({"spark.driver.extraClassPath": JDBC_JAR} if spec.needs_jdbc else {})},
            jars=JDBC_JAR if spec.needs_jdbc else None,
        )
    return dag
