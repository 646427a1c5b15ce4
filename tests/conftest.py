"""Shared fixtures: the services `make services` started (read from .local/env), a fresh database and a
fresh bucket per test run (random names), a tier-1 root per test."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_local_env() -> None:
    env_file = ROOT / ".local" / "env"
    if not env_file.exists():
        return
    for line in env_file.read_text().splitlines():
        if line.strip() and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            os.environ.setdefault(key, value)


_load_local_env()
RUN_ID = secrets.token_hex(4)
# The TLS gateway a test started (tests/integration/test_encryption.py): stopped when the whole run ends
TLS_STARTED_BY_TESTS = ROOT / ".local" / "ceph" / "rgw-tls.by-tests"


def pytest_sessionfinish(session):
    """At the end of the run (not of one of its workers, which share the gateway): stop the TLS gateway if a
    test of this run started it."""
    if hasattr(session.config, "workerinput") or not TLS_STARTED_BY_TESTS.exists():
        return
    subprocess.run(["bash", str(ROOT / ".ci" / "ceph.sh"), "tls-rgw-stop"], capture_output=True, text=True,
                   timeout=120, env={**os.environ, "PY": sys.executable})
    TLS_STARTED_BY_TESTS.unlink(missing_ok=True)


# Tests run on two workers (pytest-xdist, `make test`, --dist loadfile: a module's tests stay together on one
# worker, in order, as many build one world per module); each worker has its own database and bucket
# (RUN_ID is drawn per process).

# Modules that share a session fixture costing a minute or more to build go to one worker as one unit, so
# that only that worker builds it: the Spark standalone cluster with its Airflow home, and the Airflow home
# with a PostgreSQL metastore (`airflow db migrate` of an empty database). Split over both workers, each
# built its own.
SHARED_SESSION_FIXTURES = {
    "tests/cluster/test_pipeline_on_cluster.py": "tests/cluster: spark_cluster",
    "tests/cluster/test_scrub_on_cluster.py": "tests/cluster: spark_cluster",
    "tests/cluster/test_unreachable_driver.py": "tests/cluster: spark_cluster",
    "tests/dags/test_dag_runs.py": "tests/dags: airflow",
    "tests/dags/test_lineage.py": "tests/dags: airflow",
    "tests/dags/test_recover_dag.py": "tests/dags: airflow",
    "tests/dags/test_table_sync_dag.py": "tests/dags: airflow",
}


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, with the modules of SHARED_SESSION_FIXTURES grouped (each group sent in collection
    order, where its first module stands); other modes are xdist's own."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return SHARED_SESSION_FIXTURES.get(module, module)

    return SharedFixtureScheduling(config, log)


def _require(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: run `make services` (or `make test`) first", pytrace=False)
    return value


@pytest.fixture(scope="session")
def database_url():
    """A database of its own for this test run, migrated; dropped at the end."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from tiering.metadata import make_engine, upgrade

    server = make_url(_require("TIERING_DATABASE_URL").replace("postgresql://", "postgresql+psycopg2://", 1))
    name = f"tiering_test_{RUN_ID}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def engine(database_url):
    from tiering.metadata import make_engine

    eng = make_engine(database_url)
    yield eng
    eng.dispose()


def empty_tables(engine) -> None:
    """Every table of the schema emptied, ids restarted."""
    from sqlalchemy import text

    with engine.begin() as conn:
        conn.execute(text("TRUNCATE tiering.topic, tiering.ledger, tiering.chunk, tiering.gc_task, "
                          "tiering.attribute, tiering.job_run, tiering.gc_sweep, tiering.subscription, "
                          "tiering.subscription_loss, tiering.topic_tombstone RESTART IDENTITY CASCADE"))
        # the Iceberg catalog's rows (migration 0014) go with the topics whose tables they name
        conn.execute(text("TRUNCATE iceberg_tables, iceberg_namespace_properties"))


def empty_world(engine, s3, bucket: str) -> None:
    """Tables and bucket both emptied: a module that builds one world for all its tests starts from nothing.
    Emptying only the tables would leave an earlier module's objects in the bucket, unreferenced: orphans
    to every check of the bucket against the metadata."""
    empty_tables(engine)
    _empty_bucket(s3, bucket)


@pytest.fixture
def db(engine):
    """The run's database, emptied before the test."""
    empty_tables(engine)
    return engine


@pytest.fixture(scope="session")
def s3_settings():
    return {
        "endpoint_url": _require("TIERING_S3_ENDPOINT_URL"),
        # the endpoint's real keys (RGW checks them; .local/env has the generated user's)
        "aws_access_key_id": _require("AWS_ACCESS_KEY_ID"),
        "aws_secret_access_key": _require("AWS_SECRET_ACCESS_KEY"),
        "region_name": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    }


@pytest.fixture(scope="session")
def s3_client(s3_settings):
    import boto3
    from botocore.config import Config

    return boto3.client("s3", **s3_settings, config=Config(max_pool_connections=32))


@pytest.fixture(scope="session")
def run_bucket(s3_client):
    name = f"tiering-test-{RUN_ID}"
    s3_client.create_bucket(Bucket=name)
    yield name
    _empty_bucket(s3_client, name)
    s3_client.delete_bucket(Bucket=name)


def _empty_bucket(s3, bucket: str) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys})
    for up in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
        s3.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])


@pytest.fixture
def bucket(s3_client, run_bucket):
    """The run's bucket, emptied (objects and multipart uploads) before the test."""
    _empty_bucket(s3_client, run_bucket)
    return run_bucket


@pytest.fixture
def tier1_root(tmp_path):
    root = tmp_path / "tier1"
    root.mkdir()
    return root


@pytest.fixture
def settings(database_url, s3_settings, run_bucket, tier1_root):
    from tiering.config import Settings

    return Settings(database_url=database_url, bucket=run_bucket, tier1_root=tier1_root, prefix="t/",
                    s3_endpoint_url=s3_settings["endpoint_url"],
                    aws_access_key_id=s3_settings["aws_access_key_id"],
                    aws_secret_access_key=s3_settings["aws_secret_access_key"],
                    aws_region=s3_settings["region_name"],
                    offload_batch_bytes=0)  # one object pair per ledger unless a test asks for batches

