"""The rows a metadata import writes (tiering/ops/import_metadata.py reads them from Parquet): one
transaction, all or nothing -- tables locked, refused unless every table is empty and the migrations are the
export's, rows inserted in FK order with their ids, the bigserial sequences moved past the imported ids, the
deferred ledger/chunk constraint triggers checked before the commit.
"""
from __future__ import annotations

from typing import Callable, Iterable, Mapping

from sqlalchemy import Text, bindparam, cast, insert, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DataError, IntegrityError, OperationalError

from tiering.errors import BadInput, TieringError
from tiering.metadata.export_rows import SERIALS, TABLES, migrations, qualified, scope, scoped, serial_sequence
from tiering.metadata.tables import ICEBERG_CATALOG

# load(table name, insert) -> rows loaded: feeds the table's rows through insert(list of row dicts)
Loader = Callable[[str, Callable[[list[Mapping]], None]], int]


def _insert_statement(tbl):
    values = {}
    for c in tbl.columns:
        p = bindparam(f"p_{c.name}", type_=Text if isinstance(c.type, JSONB) else c.type)
        values[c.name] = cast(p, JSONB) if isinstance(c.type, JSONB) else p
    return insert(tbl).values(values)


def _any_row(tbl):
    """A row of the table that an import would have to write over (of the catalog's: one of the product's)."""
    return scoped(select(text("1")).select_from(tbl).limit(1), tbl)


def _check_catalog(table: str, records: list[Mapping], where: str) -> None:
    """The catalog's rows an export holds are the product's catalog's (export writes no other): an import
    never writes rows of another catalog, whatever the files say."""
    other = next((r.get("catalog_name") for r in records if r.get("catalog_name") != ICEBERG_CATALOG), None)
    if other is not None or any("catalog_name" not in r for r in records):
        raise BadInput(f"import of {where!r} refused, nothing was imported: {table} holds a row of catalog "
                       f"{str(other)[:80]!r}, not {ICEBERG_CATALOG!r}")


def _first_line(exc: Exception) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__


def restore(engine: Engine, where: str, expected_migrations: list[dict], sequences: Mapping[str, int | None],
            load: Loader, lock_timeout_seconds: int = 30) -> tuple[dict[str, int], dict[str, int]]:
    """Insert every table's rows (through `load`, FK order) into the empty schema in one transaction;
    returns (rows per table, sequences' last values). `where` names the export in error messages; a
    BadInput raised by `load` rolls everything back too."""
    rows: dict[str, int] = {}
    try:
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL lock_timeout = '{int(lock_timeout_seconds)}s'"))
            have = migrations(conn)
            if have != expected_migrations:
                raise BadInput(
                    f"export was taken at migrations {[m['name'] for m in expected_migrations]}, this database has "
                    f"{[m['name'] for m in have]}" + (" (same names, different checksums)" if
                                                      [m['name'] for m in have] ==
                                                      [m['name'] for m in expected_migrations] else "")
                    + "; import into a database migrated to the same version")
            conn.execute(text("LOCK TABLE " + ", ".join(qualified(t) for t in TABLES) + " IN ACCESS EXCLUSIVE MODE"))
            busy = [t.name for t in TABLES if conn.execute(_any_row(t)).first()]
            if busy:
                raise BadInput(f"refusing to import: tables {', '.join(busy)} hold rows (import restores into a "
                               "freshly migrated, empty database)")
            for tbl in TABLES:
                stmt = _insert_statement(tbl)

                def insert_rows(records: Iterable[Mapping], stmt=stmt, tbl=tbl) -> None:
                    records = list(records)
                    if scope(tbl) is not None:
                        _check_catalog(tbl.name, records, where)
                    records = [{f"p_{k}": v for k, v in r.items()} for r in records]
                    if records:
                        conn.execute(stmt, records)

                rows[tbl.name] = load(tbl.name, insert_rows)
            last = _reset_sequences(conn, sequences)
            # the deferred ledger<->chunk triggers run now, so a violation is reported like the others
            conn.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))
    except (IntegrityError, DataError) as exc:
        raise BadInput(f"import of {where!r} failed, nothing was imported: {_first_line(exc)}") from None
    except OperationalError as exc:
        if "lock timeout" in str(exc.orig):
            raise TieringError("import failed, nothing was imported: the metadata tables are in use "
                               f"(lock not granted within {lock_timeout_seconds}s)") from None
        raise
    return rows, last


def _reset_sequences(conn: Connection, sequences: Mapping[str, int | None]) -> dict[str, int]:
    out = {}
    for table, col in SERIALS.items():
        seq = serial_sequence(conn, table, col)
        top = conn.execute(text(f"SELECT max({col}) FROM tiering.{table}")).scalar()
        last = max(v for v in (top, sequences.get(f"{table}.{col}"), 0) if v is not None)
        if last > 0:
            conn.execute(text("SELECT setval(:s, :v, true)"), {"s": seq, "v": last})
        else:
            conn.execute(text("SELECT setval(:s, 1, false)"), {"s": seq})
        out[f"{table}.{col}"] = last
    return out


__all__ = ["Loader", "restore"]
