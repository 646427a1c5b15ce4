"""An Airflow home of the test run's own (its metastore a PostgreSQL database of its own, created here and
dropped at the end: `airflow_metastore`), connections pointing at the run's database and bucket,
with a database password and the S3 secret (the endpoint's real one: RGW checks keys) that must never
appear in any output."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[2]
DB_PASSWORD = f"pw-{secrets.token_hex(6)}"


def _load_airflow_env():
    spec = importlib.util.spec_from_file_location("airflow_env", REPO / ".ci" / "airflow_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.airflow_env


@contextlib.contextmanager
def airflow_metastore(database_url: str):
    """A PostgreSQL database for Airflow's metastore on the run's server, dropped on exit: never the
    database of the `tiering` schema."""
    from sqlalchemy import create_engine, text

    server = make_url(database_url)
    name = f"airflow_test_{secrets.token_hex(5)}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def airflow_runner(home: Path, tier1: Path, database_url: str, run_bucket: str, s3_settings: dict,
                   extra_env: dict | None = None, metastore: str | None = None, **airflow_env):
    """A callable running `airflow ...` in its own home (metastore: a PostgreSQL URL, e.g. from
    `airflow_metastore`; None: SQLite, for `airflow dags test` alone, which runs no scheduler), connections pointing at the run's database
    and bucket; `airflow_env` goes to .ci/airflow_env.py (e.g. `spark_master`), `extra_env` to every command. Settings reach tasks only
    through the connections, and the secrets to look for in any output are attached."""
    # PostgreSQL here trusts local connections, so a password is accepted and ignored: it lets the test
    # prove the password never leaks without needing a role that has one.
    url = make_url(database_url).set(password=DB_PASSWORD).render_as_string(hide_password=False)
    settings_env = {"TIERING_DATABASE_URL": url, "TIERING_BUCKET": run_bucket, "TIERING_PREFIX": "t/",
                    "TIERING_TIER1_ROOT": str(tier1), "TIERING_S3_ENDPOINT_URL": s3_settings["endpoint_url"],
                    "AWS_ACCESS_KEY_ID": s3_settings["aws_access_key_id"],
                    "AWS_SECRET_ACCESS_KEY": s3_settings["aws_secret_access_key"],
                    "AWS_DEFAULT_REGION": s3_settings["region_name"], "PATH": os.environ["PATH"]}
    env = {**os.environ, **_load_airflow_env()(settings_env, home, metastore=metastore, **airflow_env),
           # one object pair per ledger, the layout these tests reason about (as tests/conftest.py's
           # settings); batched offload is tested in test_offload_batch.py and by the e2e test's defaults
           "TIERING_OFFLOAD_BATCH_BYTES": "0",
           # a failing task's retries still run (and are tested), without a minute's wait before each
           "TIERING_TASK_RETRY_DELAY_SECONDS": "3", **(extra_env or {})}
    # The task must get settings from the connections, not from variables it inherits by accident.
    for name in ("TIERING_DATABASE_URL", "TIERING_BUCKET", "TIERING_S3_ENDPOINT_URL", "AWS_SECRET_ACCESS_KEY",
                 "AWS_ACCESS_KEY_ID", "TIERING_PREFIX"):
        env.pop(name, None)
    airflow_bin = str(Path(sys.executable).parent / "airflow")

    def run(*args, timeout=600):
        return subprocess.run([airflow_bin, *args], env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=home)

    _prepare_metastore(run, home, metastore)
    run.home = home
    run.tier1_root = tier1
    run.settings_env = settings_env
    run.secrets = (s3_settings["aws_secret_access_key"], DB_PASSWORD)
    return run


# A SQLite metastore migrated and given the pool once per test process, then copied into every other home
# that keeps its metastore in SQLite: the copy is what those two commands would write again (the file holds
# no path of its home), and each costs an Airflow start (about 20 and 15 s on 2 loaded cores).
_SQLITE_MIGRATED: list[Path] = []


def _prepare_metastore(run, home: Path, metastore: str | None) -> None:
    db = home / "airflow.db"
    if metastore is None and _SQLITE_MIGRATED and _SQLITE_MIGRATED[0].is_file():
        shutil.copyfile(_SQLITE_MIGRATED[0], db)
        return
    for cmd in (["db", "migrate"], ["pools", "set", "tiering_spark", "2", "tiering Spark jobs"]):
        done = run(*cmd)
        assert done.returncode == 0, done.stderr[-2000:]
    if metastore is None:
        template = home.parent / "airflow-sqlite-migrated.db"
        shutil.copyfile(db, template)
        _SQLITE_MIGRATED[:] = [template]


@pytest.fixture(scope="session")
def airflow(tmp_path_factory, database_url, run_bucket, s3_settings):
    """Run `airflow ...` with this environment; returns a callable giving CompletedProcess."""
    with airflow_metastore(database_url) as metastore:
        yield airflow_runner(tmp_path_factory.mktemp("airflow-home"), tmp_path_factory.mktemp("airflow-tier1"),
                             database_url, run_bucket, s3_settings, metastore=metastore)


def dags_test(airflow, dag_id: str, conf: dict | None = None):
    args = ["dags", "test", dag_id]
    if conf is not None:
        args += ["-c", json.dumps(conf)]
    done = airflow(*args)
    output = done.stdout + done.stderr
    assert not any(s in output for s in airflow.secrets), "a secret leaked into Airflow's output"
    return done, output
