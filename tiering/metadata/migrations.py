"""Plain-SQL migrations: `sql/migrations/NNNN_name.sql` applied in order, recorded in
`tiering.schema_migrations`; then every `sql/views/*.sql` is recreated. Safe when several processes run it
at once: the whole upgrade runs under one transaction-scoped advisory lock."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Engine

from tiering.errors import TieringError

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
_LOCK_ID = 0x7469657269_6E67 & 0x7FFFFFFFFFFFFFFF  # "tiering"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
_VIEW = re.compile(r"CREATE\s+VIEW\s+([a-z_.]+)", re.IGNORECASE)


@dataclass(frozen=True)
class UpgradeResult:
    applied: list[str]
    already: list[str]
    views: list[str]


class MigrationError(TieringError):
    pass


def _migration_files(sql_dir: Path) -> list[Path]:
    files = sorted((sql_dir / "migrations").glob("*.sql"))
    for f in files:
        if not _NAME.match(f.name):
            raise MigrationError(f"migration file name {f.name!r} is not NNNN_name.sql")
    return files


def _run_script(conn, sql: str) -> None:
    """Run a multi-statement script as is: no parameters, so '%' in PL/pgSQL needs no escaping."""
    with conn.connection.cursor() as cur:
        cur.execute(sql)


def upgrade(engine: Engine, sql_dir: Path = SQL_DIR) -> UpgradeResult:
    files = _migration_files(sql_dir)
    views = sorted((sql_dir / "views").glob("*.sql"))
    applied, already = [], []
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
        conn.execute(text("CREATE SCHEMA IF NOT EXISTS tiering"))
        conn.execute(text(
            "CREATE TABLE IF NOT EXISTS tiering.schema_migrations ("
            " name text PRIMARY KEY, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"))
        done = dict(conn.execute(text("SELECT name, checksum FROM tiering.schema_migrations")).all())
        for f in files:
            body = f.read_text()
            checksum = hashlib.sha256(body.encode()).hexdigest()
            if f.name in done:
                if done[f.name] != checksum:
                    raise MigrationError(f"migration {f.name} was changed after it was applied; add a new one")
                already.append(f.name)
                continue
            _run_script(conn, body)
            conn.execute(text("INSERT INTO tiering.schema_migrations (name, checksum) VALUES (:n, :c)"),
                         {"n": f.name, "c": checksum})
            applied.append(f.name)
        names = []
        for v in views:  # views are derived: drop and recreate them all, in order
            body = v.read_text()
            for name in _VIEW.findall(body):
                _run_script(conn, f"DROP VIEW IF EXISTS {name} CASCADE")
                names.append(name)
            _run_script(conn, body)
    return UpgradeResult(applied, already, names)


def current_version(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT to_regclass('tiering.schema_migrations')")).scalar()
        if not exists:
            return []
        return list(conn.execute(text("SELECT name FROM tiering.schema_migrations ORDER BY name")).scalars())
