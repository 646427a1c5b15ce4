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

from tiering.jobs.spec import JOBS, POSITION_PATTERN, TOPIC_MAX, JobSpec, spark_submit_args

REPO = Path(__file__).resolve().parents[2]
PY_FILES = REPO / "build" / "tiering.zip"  # built by `make dist`; ships the package to cluster executors
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
        venv_bin = str(Path(sys.executable).parent)
        self.env_vars = {**settings.to_env(), "PYSPARK_PYTHON": sys.executable,
                         "PATH": f"{venv_bin}:{_env('PATH')}", "SPARK_LOCAL_IP": _env("SPARK_LOCAL_IP", "127.0.0.1")}
        if PY_FILES.exists():
            self.py_files = str(PY_FILES)
        return super().execute(context)


def _env(name: str, default: str = "") -> str:
    import os

    return os.environ.get(name, default)


def params_for(spec: JobSpec) -> dict:
    topic_schema = {"minLength": 1, "maxLength": TOPIC_MAX}
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
        default_args={"owner": OWNER, "retries": 1, "retry_delay": timedelta(minutes=2)},
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
