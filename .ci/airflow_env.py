"""Environment for running this repo's DAGs locally: AIRFLOW_HOME, this airflow.cfg, the address of the API
server, the secrets every Airflow process must share, and the connections `tiering_metadata`, `tiering_s3`
and `spark_default` built from the tiering settings.

    eval "$(python .ci/airflow_env.py HOME_DIR LOCAL_DIR)"   # export lines (make up / make demo)
    python .ci/airflow_env.py --connections FILE             # the connections as `airflow connections import` JSON
    python .ci/airflow_env.py --metastore-url                # airflow.cfg's sql_alchemy_conn_cmd
    python .ci/airflow_env.py --create-metastore LOCAL_DIR   # CREATE DATABASE when missing (make up)
    python .ci/airflow_env.py --check-fernet-key             # one line and exit 1 if the key cannot read it
    python .ci/airflow_env.py --drop-metastore LOCAL_DIR     # DROP the metastores LOCAL_DIR made (make clean)
    python .ci/airflow_env.py --end-dead-schedulers          # before a scheduler starts (make up), see below

Airflow's metastore is a PostgreSQL database of its own on the server of TIERING_DATABASE_URL: by default
`airflow_<hash>`, the hash of the local directory's absolute path (TIERING_LOCAL, default .local), so two
checkouts or two local directories never share one (TIERING_AIRFLOW_DATABASE names another;
TIERING_AIRFLOW_DATABASE_URL is a whole URL). Never the database of the `tiering` schema. The connections in
it are encrypted with the Fernet key under the local directory: a metastore outliving that directory would
hold rows no new key can read, so the metastores a local directory made are recorded in it
(`airflow-metastore`) and `make clean` drops exactly those. SQLite is left only to callers that pass no
metastore (an API server alone or `airflow dags test`: no scheduler, so no concurrent writers).

`make up` puts the connections in Airflow's metastore (Admin > Connections, editable, secrets masked);
`airflow_env()` can also give them as AIRFLOW_CONN_* (the `airflow dags test` fixtures use that).
Tests import `airflow_env()` directly.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import shlex
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parents[1]
# The one variable that places the API server (UI, REST, execution API): host:port. `[api] base_url` is
# derived from it, or tasks would call the default address and fail.
ADDRESS_VAR = "TIERING_AIRFLOW_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1:8080"
# Secrets the API server, scheduler, DAG processor and workers must agree on. When unset each process makes
# its own JWT secret and every task is refused with 403 "Signature verification failed".
SHARED_SECRETS = {  # file name -> the Airflow option that reads it (through its _CMD form: never in env)
    "jwt_secret": "AIRFLOW__API_AUTH__JWT_SECRET_CMD",
    "api_secret_key": "AIRFLOW__API__SECRET_KEY_CMD",
    "fernet_key": "AIRFLOW__CORE__FERNET_KEY_CMD",  # encrypts connection passwords in the metastore
}


AIRFLOW_DB_VAR = "TIERING_AIRFLOW_DATABASE"
CREATED_RECORD = "airflow-metastore"  # under the local directory: the metastores it created, one URL a line


def local_dir(env: dict[str, str]) -> Path:
    """The local directory (.local, or TIERING_LOCAL), as .ci/airflow_env.sh and the Makefile place it."""
    return Path(env.get("TIERING_LOCAL") or REPO / ".local")


def default_metastore_name(local: Path) -> str:
    """`airflow_` and 12 hex digits of the SHA-256 of the local directory's absolute path: stable for one
    checkout, distinct between checkouts and local directories on one server."""
    return "airflow_" + hashlib.sha256(str(Path(local).resolve()).encode()).hexdigest()[:12]


def metastore_url(env: dict[str, str], local: Path | None = None) -> str:
    """Airflow's metastore: TIERING_AIRFLOW_DATABASE_URL, else database TIERING_AIRFLOW_DATABASE (default
    `default_metastore_name(local)`) on the server of TIERING_DATABASE_URL, with psycopg2 (Airflow derives
    asyncpg from it)."""
    from sqlalchemy.engine import make_url

    raw = env.get("TIERING_AIRFLOW_DATABASE_URL") or env["TIERING_DATABASE_URL"]
    url = make_url(raw.replace("postgresql://", "postgresql+psycopg2://", 1))
    if not env.get("TIERING_AIRFLOW_DATABASE_URL"):
        tiering_db = url.database
        url = url.set(database=env.get(AIRFLOW_DB_VAR) or default_metastore_name(local or local_dir(env)))
        if url.database == tiering_db:
            raise SystemExit(f"{AIRFLOW_DB_VAR}={url.database!r} is the tiering metadata's database: "
                             "Airflow's metastore needs a database of its own")
    if not url.drivername.startswith("postgresql"):
        raise SystemExit(f"Airflow's metastore must be PostgreSQL, got {url.drivername}")
    return url.render_as_string(hide_password=False)


def create_metastore(url: str, local: Path | None = None) -> bool:
    """CREATE DATABASE of the metastore when missing (on the server's `postgres` database); True if made.
    With `local`, the metastore is recorded there for `make clean` when this call made it or when its name
    is the one derived from `local` (by construction no other directory's); one that existed under another
    name (an operator's own) is never recorded, so never dropped."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    target = make_url(url)
    admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            created = not conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"),
                                       {"d": target.database}).first()
            if created:
                conn.execute(text(f'CREATE DATABASE "{target.database}"'))
    finally:
        admin.dispose()
    if local is not None and (created or target.database == default_metastore_name(local)):
        _record_metastore(Path(local) / CREATED_RECORD, url)
    return created


def _record_metastore(record: Path, url: str) -> None:
    known = record.read_text().split() if record.exists() else []
    if url not in known:
        record.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # the URL may hold a password
        with os.fdopen(fd, "a") as f:
            f.write(url + "\n")


def drop_metastores(local: Path) -> list[str]:
    """DROP every metastore recorded in `local` (`make clean`, before `local` goes with its Fernet key).
    Returns one line per database: dropped, or why not (a server that does not answer is reported, not
    fatal: `make clean` still removes the directory)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    record = Path(local) / CREATED_RECORD
    lines = []
    for url in (record.read_text().split() if record.exists() else []):
        target = make_url(url)
        where = f'"{target.database}" on {target.host}:{target.port or 5432}'
        admin = create_engine(target.set(database="postgres"), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{target.database}" WITH (FORCE)'))
            lines.append(f"dropped Airflow's metastore {where}")
        except SQLAlchemyError as err:
            reason = str(getattr(err, "orig", err)).strip().splitlines()[0]
            lines.append(f"Airflow's metastore {where} not dropped ({reason}): drop it by hand, or its "
                         "connections stay encrypted with a key that is now gone")
        finally:
            admin.dispose()
    record.unlink(missing_ok=True)
    return lines


def _fernet_key(env: dict[str, str]) -> str:
    """The key Airflow will use: [core] fernet_key from the environment, or its _CMD form (how
    .ci/airflow_env.sh gives it)."""
    import subprocess

    if env.get("AIRFLOW__CORE__FERNET_KEY"):
        return env["AIRFLOW__CORE__FERNET_KEY"]
    cmd = env.get("AIRFLOW__CORE__FERNET_KEY_CMD")
    if cmd:
        return subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True).stdout.strip()
    return ""


def fernet_mismatch(url: str, key: str, key_source: str) -> str | None:
    """None when `key` decrypts every encrypted connection and variable in the metastore at `url` (or it has
    none yet); else one line naming the cause and the fix. Airflow itself would fail at the first such row
    with a bare `cryptography.fernet.InvalidToken` deep in a log."""
    from cryptography.fernet import Fernet, InvalidToken, MultiFernet
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    target = make_url(url)
    engine = create_engine(target)
    try:
        with engine.connect() as conn:
            if conn.execute(text("SELECT to_regclass('connection') IS NULL")).scalar():
                return None  # not migrated yet: nothing encrypted
            values = [(f"connection {cid!r}", v) for cid, v in conn.execute(text(
                "SELECT conn_id, password FROM connection WHERE is_encrypted AND password <> '' UNION ALL "
                "SELECT conn_id, extra FROM connection WHERE is_extra_encrypted AND extra <> ''"))]
            if conn.execute(text("SELECT to_regclass('variable') IS NOT NULL")).scalar():
                values += [(f"variable {k!r}", v) for k, v in conn.execute(text(
                    "SELECT key, val FROM variable WHERE is_encrypted AND val <> ''"))]
    finally:
        engine.dispose()
    if not values:
        return None
    where = f'"{target.database}" on {target.host}:{target.port or 5432}'
    try:
        fernet = MultiFernet([Fernet(part.strip().encode()) for part in key.split(",") if part.strip()])
    except (ValueError, TypeError):
        fernet = None
    for what, value in values:
        try:
            if fernet is None:
                raise InvalidToken
            fernet.decrypt(value.encode())
        except InvalidToken:
            return (f"Airflow's metastore {where} was set up with another Fernet key than {key_source} "
                    f"({what} cannot be decrypted): give Airflow the key that wrote it (AIRFLOW__CORE__FERNET_KEY"
                    f"_CMD), or re-encrypt with AIRFLOW__CORE__FERNET_KEY=<this key>,<old key> airflow "
                    f"rotate-fernet-key, or, with the old key lost, use another metastore "
                    f"(TIERING_AIRFLOW_DATABASE) or DROP DATABASE \"{target.database}\" to start afresh")
    return None


def address(env: dict[str, str]) -> tuple[str, int]:
    value = env.get(ADDRESS_VAR) or DEFAULT_ADDRESS
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise SystemExit(f"{ADDRESS_VAR}={value!r}: expected host:port, e.g. 127.0.0.1:8080")
    return host, int(port)


def shared_secrets(secrets_dir: Path) -> dict[str, Path]:
    """The shared secrets' files, generated once per checkout (mode 0600) and kept across restarts."""
    secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths = {}
    for name in SHARED_SECRETS:
        path = secrets_dir / name
        if not path.exists():
            value = (base64.urlsafe_b64encode(os.urandom(32)).decode() if name == "fernet_key"
                     else secrets.token_urlsafe(48))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(value)
        paths[name] = path
    return paths


def connections(env: dict[str, str], spark_master: str = "local[2]") -> dict[str, dict]:
    db = urlsplit(env["TIERING_DATABASE_URL"].replace("postgresql+psycopg2://", "postgresql://"))
    pg = {"conn_type": "postgres", "host": db.hostname, "port": db.port or 5432,
          "login": unquote(db.username or ""), "password": unquote(db.password or ""),
          "schema": db.path.lstrip("/"), "description": "tiering metadata (PostgreSQL, schema tiering)"}
    # libpq's TLS settings and server options, which the URL's query carries, go into the extra (the
    # Postgres provider's names), where TieringHook.database_url takes them from
    from tiering.database_url import database_libpq_params

    libpq = database_libpq_params(env["TIERING_DATABASE_URL"])
    if libpq:
        pg["extra"] = libpq
    extra = {"region_name": env.get("AWS_DEFAULT_REGION", "us-east-1"), "bucket": env["TIERING_BUCKET"],
             "prefix": env.get("TIERING_PREFIX", "tiering/")}
    if env.get("TIERING_S3_ENDPOINT_URL"):
        extra["endpoint_url"] = env["TIERING_S3_ENDPOINT_URL"]
    aws = {"conn_type": "aws", "login": env.get("AWS_ACCESS_KEY_ID", ""),
           "password": env.get("AWS_SECRET_ACCESS_KEY", ""), "extra": extra,
           "description": "tiering tier 2 (S3): bucket and prefix in extra"}
    spark = {"conn_type": "spark", "host": spark_master, "description": "where the tiering Spark jobs run"}
    return {"tiering_metadata": pg, "tiering_s3": aws, "spark_default": spark}


def airflow_env(env: dict[str, str], home: Path, spark_master: str = "local[2]", *,
                conns_in_env: bool = True, secrets_dir: Path | None = None,
                metastore: str | None = None) -> dict[str, str]:
    """The environment of Airflow's processes. `metastore`: its database URL (PostgreSQL, for anything with a
    scheduler); None keeps a SQLite file in `home` (an API server alone, `airflow dags test`)."""
    host, port = address(env)
    venv_bin = str(Path(sys.executable).parent)
    out = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW_CONFIG": str(REPO / "airflow.cfg"),
        "TIERING_REPO": str(REPO),
        "AIRFLOW__API__HOST": host,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://{host}:{port}/",
        "PATH": f"{venv_bin}:{env.get('PATH', os.environ.get('PATH', ''))}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "TIERING_TIER1_ROOT": env["TIERING_TIER1_ROOT"],
        "PYSPARK_PYTHON": sys.executable,
        # in the environment, not in airflow.cfg: the URL may hold a password
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metastore or f"sqlite:///{home}/airflow.db",
    }
    if conns_in_env:
        for conn_id, conn in connections(env, spark_master).items():
            out[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(conn)
    if secrets_dir is not None:
        for name, path in shared_secrets(secrets_dir).items():
            out[SHARED_SECRETS[name]] = f"cat {shlex.quote(str(path))}"
    return out


def end_dead_schedulers() -> int:
    """Mark this host's scheduler jobs that have stopped heartbeating failed; the number marked.

    Called by `make up` just before it starts the scheduler. A scheduler killed with tasks in flight (`make
    stop` past its bound, a crash, an OOM kill) leaves them `running` or `queued` under its job, and the new
    scheduler resets them at once only when that job no longer counts as running. Airflow decides that from
    the job's heartbeat: dead after [scheduler] scheduler_health_check_threshold (30 s) when the new one
    starts, otherwise only at its next orphan check, [scheduler] orphaned_tasks_check_interval (300 s) later.

    A live scheduler heartbeats every [scheduler] scheduler_heartbeat_sec (5 s). A job whose heartbeat is
    older than three of those is dead; a younger one is watched until it is that old and ended only if its
    heartbeat did not move meanwhile (at most ~15 s of waiting). Each job is ended by a compare-and-set on the
    heartbeat read, so a scheduler that is alive after all (another `make up` sharing the metastore, one
    started by hand) is never failed: its next heartbeat would have moved it."""
    import time
    from datetime import datetime, timedelta, timezone

    from airflow.configuration import conf
    from airflow.jobs.job import Job, JobState
    from airflow.utils.net import get_hostname
    from airflow.utils.session import create_session
    from sqlalchemy import select, update

    silent = timedelta(seconds=3 * conf.getfloat("scheduler", "scheduler_heartbeat_sec", fallback=5.0))
    running = (Job.job_type == "SchedulerJob", Job.state == JobState.RUNNING, Job.hostname == get_hostname())

    def beats() -> dict[int, datetime | None]:
        with create_session() as session:
            return dict(session.execute(select(Job.id, Job.latest_heartbeat).where(*running)).all())

    seen = beats()
    newest = max((b for b in seen.values() if b is not None), default=None)
    if newest is not None and datetime.now(timezone.utc) - newest < silent:
        time.sleep((silent - (datetime.now(timezone.utc) - newest)).total_seconds() + 0.5)
        now = beats()
        seen = {job: beat for job, beat in seen.items() if job in now and now[job] == beat}
    ended = 0
    with create_session() as session:
        for job, beat in seen.items():
            if beat is not None and datetime.now(timezone.utc) - beat < silent:
                continue  # (a clock step): not proven dead
            result = session.execute(update(Job).where(Job.id == job, *running, Job.latest_heartbeat == beat
                                                       if beat is not None else Job.latest_heartbeat.is_(None))
                                     .values(state=JobState.FAILED, end_date=datetime.now(timezone.utc)))
            ended += result.rowcount or 0
    return ended


def main(argv: list[str]) -> int:
    if argv[:1] == ["--end-dead-schedulers"]:
        ended = end_dead_schedulers()
        if ended:
            print(f"ended {ended} scheduler job(s) a killed scheduler left running: their tasks run again",
                  flush=True)
        return 0
    if argv[:1] == ["--connections"]:
        path = Path(argv[1])
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # holds passwords
        with os.fdopen(fd, "w") as f:
            json.dump(connections(dict(os.environ)), f, indent=1, sort_keys=True)
        return 0
    if argv[:1] == ["--metastore-url"]:
        sys.stdout.write(metastore_url(dict(os.environ)))  # no newline: Airflow takes the output as it is
        return 0
    if argv[:1] == ["--create-metastore"]:
        env = dict(os.environ)
        local = Path(argv[1]) if len(argv) > 1 else local_dir(env)
        if create_metastore(metastore_url(env, local), local):
            print("created")
        return 0
    if argv[:1] == ["--drop-metastore"]:
        for line in drop_metastores(Path(argv[1]) if len(argv) > 1 else local_dir(dict(os.environ))):
            print(line)
        return 0
    if argv[:1] == ["--check-fernet-key"]:
        env = dict(os.environ)
        cmd = shlex.split(env.get("AIRFLOW__CORE__FERNET_KEY_CMD", ""))
        source = ("AIRFLOW__CORE__FERNET_KEY" if env.get("AIRFLOW__CORE__FERNET_KEY")
                  else cmd[1] if len(cmd) == 2 and cmd[0] == "cat" else "AIRFLOW__CORE__FERNET_KEY_CMD's key")
        problem = fernet_mismatch(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], _fernet_key(env), source)
        if problem:
            print(problem, file=sys.stderr)
            return 1
        return 0
    home = Path(argv[0] if argv else REPO / ".local" / "airflow")
    local = Path(argv[1]) if len(argv) > 1 else home.parent
    env = airflow_env(dict(os.environ), home, conns_in_env=False, secrets_dir=local / "airflow-secrets",
                      metastore=metastore_url(dict(os.environ), local))
    for key, value in env.items():
        print(f"export {key}={shlex.quote(value)}")
    # connections now live in the metastore: a stale AIRFLOW_CONN_* would shadow them
    for conn_id in connections(dict(os.environ)):
        print(f"unset AIRFLOW_CONN_{conn_id.upper()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
