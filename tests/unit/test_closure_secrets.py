"""What Spark ships to executors carries no secret: every task closure the jobs build (the
runner's, the metadata export's), and the `tiering` data source's class, pickled the way PySpark pickles them
(its cloudpickle). The database password, the AWS secret key, access key and session token, and the SSE-C
key are absent from the bytes; where unpickled, the settings take them from that machine's environment."""
from __future__ import annotations

import pickle

import pytest
from pyspark import cloudpickle

from tiering.config import Settings
from tiering.database_url import without_password

PASSWORD, ACCESS, SECRET, TOKEN = "pg-Pa55w0rd-xyz", "AKIAEXAMPLEACCESS", "s3cr3t/Key+Value", "sess-token-123"


@pytest.fixture
def settings(tmp_path, monkeypatch):
    key = bytes(range(100, 132))
    (tmp_path / "sse-c.key").write_bytes(key)
    monkeypatch.delenv("TIERING_DATABASE_URL", raising=False)
    return Settings(database_url=f"postgresql://tiering:{PASSWORD}@db.internal:5433/meta?sslmode=require",
                    bucket="b-1", tier1_root=tmp_path, aws_access_key_id=ACCESS, aws_secret_access_key=SECRET,
                    aws_session_token=TOKEN, s3_sse_c_key_file=tmp_path / "sse-c.key"), key


def _shipped(settings):
    from tiering.jobs import export_metadata, offload, runner
    from tiering.spark.source import TieringDataSource

    source_cls = type("TieringDataSource", (TieringDataSource,), {"_settings": settings})  # as spark.register
    return {"runner": cloudpickle.dumps(runner.executor_task(settings, offload.work, "token")),
            "export": cloudpickle.dumps(export_metadata._write_partitions(settings, "s3://b-1/x", "topic", "e1")),
            "source": cloudpickle.dumps(source_cls)}


def test_no_secret_in_any_closure_spark_ships(settings):
    s, key = settings
    for name, blob in _shipped(s).items():
        for secret in (PASSWORD.encode(), ACCESS.encode(), SECRET.encode(), TOKEN.encode(), key):
            assert secret not in blob, f"{name}: a secret travels to executors"
        assert b"db.internal" in blob and b"sse-c.key" in blob  # the rest of the settings does travel


def test_unpickled_settings_resolve_secrets_where_they_run(settings, monkeypatch):
    s, key = settings
    there = pickle.loads(pickle.dumps(s))
    assert there.database_url == "postgresql://tiering@db.internal:5433/meta?sslmode=require"  # libpq: PGPASSFILE
    assert there.aws_access_key_id is None and there.aws_secret_access_key is None  # boto3's chain
    assert there.s3_sse_c_key == key  # read from the key file where unpickled
    # a local master's executors share the driver's environment: the same database's URL gives the password
    monkeypatch.setenv("TIERING_DATABASE_URL", f"postgresql://tiering:{PASSWORD}@db.internal:5433/meta")
    assert pickle.loads(pickle.dumps(s)).database_url == s.database_url
    # another database's password is never borrowed
    monkeypatch.setenv("TIERING_DATABASE_URL", f"postgresql://tiering:{PASSWORD}@elsewhere:5433/meta")
    assert PASSWORD not in pickle.loads(pickle.dumps(s)).database_url


@pytest.mark.parametrize("url,bare", [
    ("postgresql://u:p%40ss@h/db", "postgresql://u@h/db"),
    ("postgresql://u@h:1/db", "postgresql://u@h:1/db"),
    ("postgresql://h/db", "postgresql://h/db"),
    ("postgresql://:pw@h/db", "postgresql://@h/db"),
    # libpq's password, and the client key's passphrase, in the query
    ("postgresql://u@h/db?password=pw&sslmode=require", "postgresql://u@h/db?sslmode=require"),
    ("postgresql://u:pw@h/db?sslmode=require&sslpassword=kp", "postgresql://u@h/db?sslmode=require"),
])
def test_without_password(url, bare):
    assert without_password(url) == bare


def test_a_password_in_the_query_stays_home_and_is_found_where_unpickled(monkeypatch):
    monkeypatch.delenv("TIERING_DATABASE_URL", raising=False)
    url = f"postgresql://tiering@db.internal:5433/meta?sslmode=require&password={PASSWORD}"
    s = Settings(database_url=url, bucket="b-1", tier1_root="/tmp")
    assert PASSWORD.encode() not in cloudpickle.dumps(s)
    assert pickle.loads(pickle.dumps(s)).database_url == "postgresql://tiering@db.internal:5433/meta?sslmode=require"
    monkeypatch.setenv("TIERING_DATABASE_URL", url)  # a local master's executors: the same database's URL
    assert pickle.loads(pickle.dumps(s)).database_url == url
