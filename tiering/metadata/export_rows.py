"""The rows a metadata export reads (tiering/ops/export_metadata.py writes them as Parquet): the exported
tables (the `tiering` schema's, and the product's rows of the Iceberg catalog's tables) and their columns,
the SELECTs (ours and the one Spark's JDBC reader runs), a REPEATABLE READ, read-only snapshot streaming
each table through a server-side cursor, and the manifest's facts (snapshot time, applied migrations,
sequences' last values).
"""
from __future__ import annotations

import datetime as _dt
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping

import pyarrow as pa
from sqlalchemy import BigInteger, Boolean, DateTime, Integer, String, Text, cast, func, select, text
from sqlalchemy.dialects.postgresql import ENUM, JSONB, UUID
from sqlalchemy.engine import Connection, Engine

from tiering.errors import BadInput
from tiering.metadata import tables as T

# FK order: parents before children (import inserts in this order). A topic's Iceberg table goes with its
# policy and sync state (topic_table) and its catalog rows: the row that points engines at the table's
# current metadata file, and its namespace's (the table's data and metadata files stay in the bucket).
TABLES = (T.topic, T.ledger, T.chunk, T.gc_task, T.attribute, T.job_run, T.subscription, T.subscription_loss,
          T.topic_tombstone, T.topic_table, T.iceberg_namespace_properties, T.iceberg_tables)
_BY_NAME = {t.name: t for t in TABLES}
# bigserial columns whose sequences import moves past the imported ids
SERIALS = {"topic": "topic_id", "gc_task": "task_id", "job_run": "run_id", "subscription": "subscription_id",
           "subscription_loss": "loss_id"}


def table_names() -> list[str]:
    """The exported tables, in FK order (import order)."""
    return [t.name for t in TABLES]


def qualified(tbl) -> str:
    """The table's name in SQL: `tiering.<name>`, or the catalog's table name alone (the search_path's)."""
    return tbl.fullname


def scope(tbl):
    """The rows of `tbl` that are the product's (a WHERE clause), or None for all of them: of the catalog's
    tables, those of catalog ICEBERG_CATALOG only (another catalog may share them)."""
    return tbl.c.catalog_name == T.ICEBERG_CATALOG if "catalog_name" in tbl.c else None


def scoped(stmt, tbl):
    """`stmt` (a SELECT of `tbl`) limited to the product's rows of it (`scope`)."""
    return stmt if scope(tbl) is None else stmt.where(scope(tbl))


def schemas(conn: Connection) -> dict[str, str]:
    """Each exported table's schema, as this connection's search_path finds it (the catalog's tables: where
    the role's search_path puts them; lineage names them with it)."""
    return dict(conn.execute(text(
        "SELECT t.name, n.nspname FROM unnest(CAST(:names AS text[]), CAST(:qualified AS text[])) AS t(name, q) "
        "JOIN pg_class c ON c.oid = to_regclass(t.q) JOIN pg_namespace n ON n.oid = c.relnamespace"),
        {"names": [t.name for t in TABLES], "qualified": [qualified(t) for t in TABLES]}).all())


def table(name: str):
    try:
        return _BY_NAME[name]
    except KeyError:
        raise BadInput(f"unknown metadata table {name!r}; expected one of {', '.join(table_names())}") from None


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    arrow_type: pa.DataType
    pg_kind: str  # "jsonb", "uuid", "enum": exported as their text; "" otherwise
    nullable: bool


def _arrow_type(col) -> pa.DataType:
    t = col.type
    if isinstance(t, (JSONB, UUID, String)):  # String: text, varchar and ENUM (a subclass)
        return pa.string()
    if isinstance(t, BigInteger):
        return pa.int64()
    if isinstance(t, Integer):
        return pa.int32()
    if isinstance(t, Boolean):
        return pa.bool_()
    if isinstance(t, DateTime):
        return pa.timestamp("us", tz="UTC")
    raise TypeError(f"no Arrow type for {col.table.name}.{col.name} ({t!r})")  # a new column type: add it here


def _pg_kind(col) -> str:
    t = col.type
    if isinstance(t, JSONB):
        return "jsonb"
    if isinstance(t, UUID):
        return "uuid"
    if isinstance(t, ENUM):
        return "enum"
    return ""


def columns(name: str) -> list[ColumnSpec]:
    """One table's columns, in PostgreSQL's order, with their Arrow types."""
    return [ColumnSpec(c.name, _arrow_type(c), _pg_kind(c), c.nullable) for c in table(name).columns]


def jdbc_query(name: str) -> str:
    """The SELECT a Spark JDBC reader should run for `name` (option `query`): uuid, enum and jsonb come as
    text, so Spark sees strings, longs, ints, booleans and timestamps only. Set the Spark session time zone
    to UTC (spark.sql.session.timeZone=UTC) so timestamps are not shifted."""
    tbl = table(name)
    cols = []
    for c in tbl.columns:
        cols.append(f"{c.name}::text AS {c.name}" if _pg_kind(c) else c.name)
    where = "" if scope(tbl) is None else f" WHERE catalog_name = '{T.ICEBERG_CATALOG}'"
    return f"SELECT {', '.join(cols)} FROM {qualified(tbl)}{where}"


def _select(tbl):
    """SELECT with jsonb as its PostgreSQL text (what JDBC gives too), ordered by primary key."""
    cols = [cast(c, Text).label(c.name) if isinstance(c.type, JSONB) else c for c in tbl.columns]
    return scoped(select(*cols).order_by(*tbl.primary_key.columns), tbl)


def migrations(conn: Connection) -> list[dict]:
    """The applied schema migrations, [{"name", "checksum"}] in order ([] before the first migration)."""
    if not conn.execute(text("SELECT to_regclass('tiering.schema_migrations')")).scalar():
        return []
    return [{"name": n, "checksum": c} for n, c in conn.execute(
        text("SELECT name, checksum FROM tiering.schema_migrations ORDER BY name"))]


def serial_sequence(conn: Connection, name: str, col: str) -> str:
    return conn.execute(text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": f"tiering.{name}", "c": col}).scalar()


def sequences(conn: Connection) -> dict[str, int | None]:
    out = {}
    for name, col in SERIALS.items():
        row = conn.execute(text(f"SELECT last_value, is_called FROM {serial_sequence(conn, name, col)}")).one()
        out[f"{name}.{col}"] = row.last_value if row.is_called else None
    return out


@dataclass(frozen=True)
class ManifestFacts:
    exported_at: _dt.datetime
    migrations: list[dict]
    sequences: dict[str, int | None]


class Snapshot:
    """One REPEATABLE READ, read-only transaction: every table read through it is the same moment."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.now: _dt.datetime = conn.execute(select(func.now())).scalar_one()

    def stream(self, name: str, batch_rows: int) -> Iterator[list[Mapping]]:
        """The table's rows, in primary-key order, batch_rows at a time (a server-side, named cursor)."""
        result = self.conn.execute(_select(table(name)),
                                   execution_options={"stream_results": True, "yield_per": batch_rows})
        for batch in result.partitions():
            yield [r._mapping for r in batch]


@contextmanager
def snapshot(engine: Engine) -> Iterator[Snapshot]:
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        with conn.begin():
            yield Snapshot(conn)


def manifest_facts(source, exported_at: _dt.datetime | None = None) -> ManifestFacts:
    """Snapshot time (unless given), migrations and sequences, read through `source`: a Snapshot, a
    Connection (e.g. the Spark job's snapshot-holding one) or an Engine (a connection of its own)."""
    if isinstance(source, Snapshot):
        source = source.conn
    if isinstance(source, Connection):
        at = exported_at or source.execute(select(func.now())).scalar_one()
        return ManifestFacts(at, migrations(source), sequences(source))
    with source.connect() as conn:
        return manifest_facts(conn, exported_at)


__all__ = ["SERIALS", "TABLES", "ColumnSpec", "ManifestFacts", "Snapshot", "columns", "jdbc_query",
           "manifest_facts", "migrations", "qualified", "schemas", "scope", "scoped", "sequences", "serial_sequence",
           "snapshot", "table", "table_names"]
