"""Airflow's metastore and the Fernet key that encrypts its connections, set up as `make demo` and `make up`
set it up (sourcing `.ci/airflow_env.sh`) and torn down as `make clean` does (`.ci/clean.sh`), against a
PostgreSQL server of the test's own (a private cluster: the machine's shared server keeps its databases,
and the test can assert which databases exist on it):

- clean, then set up again in the same local directory: it works, and the connections in the metastore are
  readable with the new key (a metastore outliving `.local` holds rows encrypted with the lost key:
  `cryptography.fernet.InvalidToken` at the next import);
- a second local directory against the same server gets a metastore of its own and leaves the first one's
  connections readable with the first one's key; `make clean` of one drops its own metastore only;
- a local directory pointed at a metastore another key wrote (TIERING_AIRFLOW_DATABASE, an operator's own)
  fails with one line naming the cause and the fix, writes nothing to it, and its `make clean` leaves it.

About 45 s on 2 cores: four set-ups (`airflow db migrate` of an empty database, the pool, the connections'
import: about 10 s each) and one refused.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.support.postgres import private_postgres

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
S3_SECRET = "secret-of-the-test-s3-user"


@pytest.fixture
def pg_server():
    """A private PostgreSQL cluster on a free port, one per test (under a second to start) so that each
    sequence starts from an empty server; yields its base URL (no database)."""
    with private_postgres("metastore") as base:
        yield base


def _env(server: str, local: Path, **extra) -> dict[str, str]:
    """The environment `make` gives the scripts (.local/env's settings, the venv first on PATH), with
    TIERING_LOCAL placing the local directory; nothing of the developer's own Airflow."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "TIERING_"))}
    env.update({"PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}", "TIERING_LOCAL": str(local),
                "TIERING_DATABASE_URL": f"{server}/tiering", "TIERING_BUCKET": "tiering-local",
                "TIERING_PREFIX": "tiering/", "TIERING_TIER1_ROOT": str(local / "tier1"),
                "TIERING_S3_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "test-user",
                "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_DEFAULT_REGION": "us-east-1", **extra})
    return env


def _set_up(server: str, local: Path, **extra) -> tuple[subprocess.CompletedProcess, str | None]:
    """`make demo`'s and `make up`'s Airflow set-up: source .ci/airflow_env.sh. Returns the process and the
    metastore's database name it exported."""
    done = subprocess.run(["bash", "-c", 'set -eu; source .ci/airflow_env.sh; echo "METASTORE=$AIRFLOW__DATABASE'
                                         '__SQL_ALCHEMY_CONN"'],
                          env=_env(server, local, **extra), cwd=REPO, capture_output=True, text=True, timeout=300)
    urls = [line.removeprefix("METASTORE=") for line in done.stdout.splitlines() if line.startswith("METASTORE=")]
    return done, (make_url(urls[0]).database if urls else None)


def _clean(server: str, local: Path, **extra) -> subprocess.CompletedProcess:
    """`make clean` for that local directory."""
    return subprocess.run(["bash", str(REPO / ".ci" / "clean.sh")], env=_env(server, local, **extra), cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def _databases(server: str) -> set[str]:
    engine = create_engine(f"{server}/postgres")
    try:
        with engine.connect() as conn:
            return set(conn.execute(text("SELECT datname FROM pg_database")).scalars())
    finally:
        engine.dispose()


def _s3_secret(server: str, database: str, local: Path) -> str:
    """tiering_s3's password as stored in the metastore, decrypted with the local directory's Fernet key."""
    from cryptography.fernet import Fernet

    engine = create_engine(f"{server}/{database}")
    try:
        with engine.connect() as conn:
            stored, encrypted = conn.execute(text(
                "SELECT password, is_encrypted FROM connection WHERE conn_id = 'tiering_s3'")).one()
    finally:
        engine.dispose()
    assert encrypted
    key = (local / "airflow-secrets" / "fernet_key").read_text().strip()
    return Fernet(key.encode()).decrypt(stored.encode()).decode()


def _ok(done: subprocess.CompletedProcess) -> str:
    return f"rc={done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def test_clean_then_set_up_again(pg_server, tmp_path):
    a = tmp_path / "a" / ".local"
    first, name_a = _set_up(pg_server, a)
    assert first.returncode == 0, _ok(first)
    assert _s3_secret(pg_server, name_a, a) == S3_SECRET

    # `make clean`, then `make demo` / `make up` in the same place: the old metastore went with the old key
    cleaned = _clean(pg_server, a)
    assert cleaned.returncode == 0 and not a.exists(), _ok(cleaned)
    again, name_a2 = _set_up(pg_server, a)
    assert again.returncode == 0, _ok(again)
    assert _s3_secret(pg_server, name_a2, a) == S3_SECRET
    assert name_a2 == name_a != "airflow"  # tied to the directory: the same checkout finds its own metastore


def test_two_local_directories_on_one_server(pg_server, tmp_path):
    a, b, c = (tmp_path / n / ".local" for n in "abc")
    first, name_a = _set_up(pg_server, a)
    assert first.returncode == 0, _ok(first)

    # a second checkout on the same machine: works, its own metastore, the first one's connections untouched
    second, name_b = _set_up(pg_server, b)
    assert second.returncode == 0, _ok(second)
    assert _s3_secret(pg_server, name_b, b) == S3_SECRET
    assert _s3_secret(pg_server, name_a, a) == S3_SECRET
    assert name_b != name_a and {name_a, name_b} <= _databases(pg_server)
    # `make clean` of one drops its own metastore, and only that one
    cleaned = _clean(pg_server, b)
    assert cleaned.returncode == 0, _ok(cleaned)
    assert name_b not in _databases(pg_server) and name_a in _databases(pg_server)

    # an operator points a third directory (so another key) at the first one's metastore: one line, the
    # cause and the fix, and nothing written over the first key's rows
    mismatch, _ = _set_up(pg_server, c, TIERING_AIRFLOW_DATABASE=name_a)
    assert mismatch.returncode != 0, _ok(mismatch)
    lines = mismatch.stderr.strip().splitlines()
    assert len(lines) == 1, mismatch.stderr
    assert f'"{name_a}"' in lines[0] and "another Fernet key" in lines[0], lines[0]
    assert "rotate-fernet-key" in lines[0] and "AIRFLOW__CORE__FERNET_KEY_CMD" in lines[0], lines[0]
    assert "Traceback" not in mismatch.stdout + mismatch.stderr
    assert _s3_secret(pg_server, name_a, a) == S3_SECRET
    # and its `make clean` leaves the metastore it did not create
    cleaned = _clean(pg_server, c, TIERING_AIRFLOW_DATABASE=name_a)
    assert cleaned.returncode == 0, _ok(cleaned)
    assert name_a in _databases(pg_server)
