"""No secret in spark-submit's argv or its logged command, for every kind of master: the command
is built by the Spark provider itself (`SparkSubmitHook._build_spark_submit_command`) from the operator as
the task prepares it, and checked as a list; the line the hook logs is checked too. A master that would
need a secret in argv is refused with a sentence. No Spark is started."""
from __future__ import annotations

import json
import sys
import zipfile

import pytest
from airflow.sdk.exceptions import AirflowFailException

from tiering.jobs.airflow_dags import TieringSparkSubmitOperator, task_retries, task_retry_delay, task_timeout
from tiering.jobs.submit import py_files_archive

DB_PASSWORD = "pw-Zq81secret"
AWS_SECRET = "aws-Kx93secret"
AWS_KEY = "AKIAEXAMPLEKEY"
SETTINGS = {"TIERING_DATABASE_URL": f"postgresql+psycopg2://tiering:{DB_PASSWORD}@db.example:5432/tiering",
            "TIERING_BUCKET": "bucket", "TIERING_PREFIX": "t/", "TIERING_TIER1_ROOT": "/mnt/tier1",
            "AWS_ACCESS_KEY_ID": AWS_KEY, "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "AWS_DEFAULT_REGION": "us-east-1"}
NO_SECRETS = {**{k: v for k, v in SETTINGS.items() if not k.startswith("AWS_") or k == "AWS_DEFAULT_REGION"},
              "TIERING_DATABASE_URL": "postgresql+psycopg2://tiering@db.example:5432/tiering"}
MASTERS = {
    "local": {"conn_type": "spark", "host": "local[2]"},
    "standalone": {"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077},
    "yarn": {"conn_type": "spark", "host": "yarn", "extra": {"queue": "etl"}},
    "yarn-cluster": {"conn_type": "spark", "host": "yarn", "extra": {"deploy-mode": "cluster"}},
    "k8s": {"conn_type": "spark", "host": "k8s://https://kube.example:6443"},
}


def _operator(monkeypatch, master: str) -> TieringSparkSubmitOperator:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(MASTERS[master]))
    return TieringSparkSubmitOperator(task_id="gc", job="tiering_gc", application="/opt/tiering/jobs/gc.py",
                                      conn_id="spark_default", name="tiering-gc")


def _command(op, capsys) -> tuple[list[str], str]:
    """The command as the hook builds it, and the line it logs (Airflow's structlog writes to stdout)."""
    op.application_args = ["--workers=2"]
    capsys.readouterr()
    cmd = op._get_hook()._build_spark_submit_command(op.application)
    out = capsys.readouterr()
    logged = "\n".join(line for line in (out.out + out.err).splitlines() if "Spark-Submit cmd" in line)
    assert "--workers=2" in logged, "the hook logged no command line"
    return cmd, logged


def _no_secret(text: str) -> None:
    for secret in (DB_PASSWORD, AWS_SECRET, AWS_KEY):
        assert secret not in text


@pytest.mark.parametrize("master", ["local", "standalone"])
def test_local_and_standalone_get_settings_in_the_environment_only(monkeypatch, capsys, master):
    op = _operator(monkeypatch, master)
    op.prepare_submit(dict(SETTINGS))
    cmd, logged = _command(op, capsys)
    _no_secret(" ".join(cmd))
    _no_secret(logged)
    assert "--py-files" in cmd and not any("appMasterEnv" in a or "driverEnv" in a for a in cmd)
    # the driver (this process's child) gets them, and nothing forces an address on it
    assert op.env_vars["AWS_SECRET_ACCESS_KEY"] == AWS_SECRET and "SPARK_LOCAL_IP" not in op.env_vars
    assert op.env_vars["PYSPARK_PYTHON"] == sys.executable


@pytest.mark.parametrize("master", ["yarn", "yarn-cluster"])
def test_yarn_with_a_secret_is_refused_with_the_reason(monkeypatch, master):
    op = _operator(monkeypatch, master)
    with pytest.raises(AirflowFailException) as err:
        op.prepare_submit(dict(SETTINGS))
    msg = str(err.value)
    _no_secret(msg)
    assert "YARN" in msg and "tiering_metadata password" in msg and "AWS_SECRET_ACCESS_KEY" in msg
    assert "PGPASSFILE" in msg and "instance role" in msg


@pytest.mark.parametrize("query", [f"password={DB_PASSWORD}", f"sslmode=require&sslpassword={DB_PASSWORD}"])
def test_yarn_with_a_password_in_the_database_urls_query_is_refused(monkeypatch, query):
    # libpq takes the password (and the client key's passphrase) in the URL's query as well
    op = _operator(monkeypatch, "yarn")
    with pytest.raises(AirflowFailException, match="tiering_metadata password") as err:
        op.prepare_submit({**NO_SECRETS, "TIERING_DATABASE_URL": f"{NO_SECRETS['TIERING_DATABASE_URL']}?{query}"})
    _no_secret(str(err.value))


@pytest.mark.parametrize("master", ["yarn", "yarn-cluster"])
def test_yarn_without_secrets_passes_only_plain_settings_in_argv(monkeypatch, capsys, master):
    op = _operator(monkeypatch, master)
    op.prepare_submit(dict(NO_SECRETS))
    cmd, logged = _command(op, capsys)
    _no_secret(" ".join(cmd) + logged)
    confs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--conf"]
    assert "spark.yarn.appMasterEnv.TIERING_BUCKET=bucket" in confs
    assert "spark.yarn.appMasterEnv.TIERING_DATABASE_URL=postgresql+psycopg2://tiering@db.example:5432/tiering" \
        in confs


def test_kubernetes_is_refused_before_anything_is_built(monkeypatch):
    op = _operator(monkeypatch, "k8s")
    with pytest.raises(AirflowFailException, match="Kubernetes is not supported"):
        op.prepare_submit(dict(NO_SECRETS))


def test_standalone_cluster_deploy_mode_is_refused(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077, "extra": {"deploy-mode": "cluster"}}))
    op = TieringSparkSubmitOperator(task_id="gc", job="tiering_gc", application="/x.py", conn_id="spark_default")
    with pytest.raises(AirflowFailException, match="client mode only"):
        op.prepare_submit(dict(NO_SECRETS))


def test_executor_python_from_the_connection_extra_or_the_environment(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077,
         "extra": {"executor-python": "/opt/venv/bin/python"}}))
    op = TieringSparkSubmitOperator(task_id="gc", job="tiering_gc", application="/x.py", conn_id="spark_default")
    op.prepare_submit(dict(NO_SECRETS))
    assert op.env_vars["PYSPARK_PYTHON"] == "/opt/venv/bin/python"
    assert op.env_vars["PYSPARK_DRIVER_PYTHON"] == sys.executable
    op = _operator(monkeypatch, "standalone")
    monkeypatch.setenv("TIERING_EXECUTOR_PYTHON", "/srv/py/bin/python3")
    op.prepare_submit(dict(NO_SECRETS))
    assert op.env_vars["PYSPARK_PYTHON"] == "/srv/py/bin/python3"


def test_py_files_archive_is_built_from_the_running_package(tmp_path):
    first = py_files_archive(tmp_path)
    assert py_files_archive(tmp_path) == first  # same code, same archive
    names = zipfile.ZipFile(first).namelist()
    assert "tiering/jobs/runner.py" in names and "tiering/__init__.py" in names
    assert not any("__pycache__" in n for n in names)


def test_task_timeout_is_configurable_and_checked():
    assert task_timeout({}).total_seconds() == 7200
    assert task_timeout({"TIERING_TASK_TIMEOUT_MINUTES": "5"}).total_seconds() == 300
    for bad in ("0", "-1", "1.5", "٣", "99999"):
        with pytest.raises(ValueError):
            task_timeout({"TIERING_TASK_TIMEOUT_MINUTES": bad})


def test_task_retries_are_configurable_and_checked():
    assert task_retries({}) == 2
    assert task_retries({"TIERING_TASK_RETRIES": "0"}) == 0 and task_retries({"TIERING_TASK_RETRIES": "10"}) == 10
    for bad in ("-1", "1.5", "x", "11", "٣", " 1"):
        with pytest.raises(ValueError, match="TIERING_TASK_RETRIES"):
            task_retries({"TIERING_TASK_RETRIES": bad})


def test_task_retry_delay_is_configurable_and_checked():
    assert task_retry_delay({}).total_seconds() == 60
    assert task_retry_delay({"TIERING_TASK_RETRY_DELAY_SECONDS": "0"}).total_seconds() == 0
    for bad in ("-1", "1.5", "x", "86401", "٣"):
        with pytest.raises(ValueError, match="TIERING_TASK_RETRY_DELAY_SECONDS"):
            task_retry_delay({"TIERING_TASK_RETRY_DELAY_SECONDS": bad})


def test_the_lineage_transport_never_reaches_spark_submit(monkeypatch):
    """Parent-run properties are names and ids; a transport may hold a key, and would be in argv."""
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__SPARK_INJECT_TRANSPORT_INFO", "True")
    op = _operator(monkeypatch, "local")
    assert op._openlineage_inject_transport_info is False
