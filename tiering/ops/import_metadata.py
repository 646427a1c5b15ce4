"""Restore a metadata export (tiering/ops/export_metadata.py) into an EMPTY, migrated schema, in one
transaction (all or nothing): tables locked, FK order, ids preserved, the bigserial sequences moved past the
imported ids, the deferred ledger/chunk constraint triggers checked before the commit. It refuses (BadInput,
nothing changed) when a table holds rows, the manifest is missing or malformed, or the migrations differ.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from sqlalchemy import Text, bindparam, cast, insert, select, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DataError, IntegrityError, OperationalError

from tiering.errors import BadInput, TieringError
from tiering.ops.export_metadata import (_SERIALS, _TABLES, DEFAULT_BATCH_ROWS, Manifest, TableManifest, _exists,
                                         _join, _migrations, arrow_schema, read_manifest, table_names)


@dataclass
class ImportReport:
    rows: dict[str, int]
    exported_at: str
    sequences: dict[str, int]


def _insert_statement(tbl):
    values = {}
    for c in tbl.columns:
        p = bindparam(f"p_{c.name}", type_=Text if isinstance(c.type, JSONB) else c.type)
        values[c.name] = cast(p, JSONB) if isinstance(c.type, JSONB) else p
    return insert(tbl).values(values)


def _first_line(exc: Exception) -> str:
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__


def import_metadata(engine: Engine, fs: pafs.FileSystem, base_path: str, batch_rows: int = DEFAULT_BATCH_ROWS,
                    lock_timeout_seconds: int = 30) -> ImportReport:
    """Restore an export into an empty, migrated schema: one transaction, all or nothing."""
    manifest = read_manifest(fs, base_path)
    if set(manifest.tables) != set(table_names()):
        raise BadInput(f"export at {base_path!r} has tables {sorted(manifest.tables)}, expected {table_names()}")
    for t in table_names():
        for p in manifest.tables[t].files:
            if not _exists(fs, _join(base_path, p.path)):
                raise BadInput(f"export at {base_path!r} is incomplete: {p.path} is missing")
    rows: dict[str, int] = {}
    try:
        with engine.begin() as conn:
            conn.execute(text(f"SET LOCAL lock_timeout = '{int(lock_timeout_seconds)}s'"))
            have = _migrations(conn)
            if have != manifest.migrations:
                raise BadInput(
                    f"export was taken at migrations {[m['name'] for m in manifest.migrations]}, this database has "
                    f"{[m['name'] for m in have]}" + (" (same names, different checksums)" if
                                                      [m['name'] for m in have] ==
                                                      [m['name'] for m in manifest.migrations] else "")
                    + "; import into a database migrated to the same version")
            conn.execute(text("LOCK TABLE " + ", ".join(f"tiering.{t}" for t in table_names())
                              + " IN ACCESS EXCLUSIVE MODE"))
            busy = [t.name for t in _TABLES if conn.execute(select(text("1")).select_from(t).limit(1)).first()]
            if busy:
                raise BadInput(f"refusing to import: tables {', '.join(busy)} hold rows (import restores into a "
                               "freshly migrated, empty database)")
            for tbl in _TABLES:
                rows[tbl.name] = _import_table(conn, fs, base_path, tbl, manifest.tables[tbl.name], batch_rows)
            sequences = _reset_sequences(conn, manifest)
            # the deferred ledger<->chunk triggers run now, so a violation is reported like the others
            conn.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))
    except (IntegrityError, DataError) as exc:
        raise BadInput(f"import of {base_path!r} failed, nothing was imported: {_first_line(exc)}") from None
    except OperationalError as exc:
        if "lock timeout" in str(exc.orig):
            raise TieringError("import failed, nothing was imported: the metadata tables are in use "
                               f"(lock not granted within {lock_timeout_seconds}s)") from None
        raise
    return ImportReport(rows, manifest.exported_at, sequences)


def _import_table(conn: Connection, fs: pafs.FileSystem, base_path: str, tbl, tm: TableManifest,
                  batch_rows: int) -> int:
    schema = arrow_schema(tbl.name)
    stmt = _insert_statement(tbl)
    total = 0
    for part in tm.files:
        path = _join(base_path, part.path)
        with fs.open_input_file(path) as f:
            pf = pq.ParquetFile(f)
            got = pf.schema_arrow
            if got.names != schema.names or not all(a.type.equals(b.type) for a, b in zip(got, schema)):
                raise BadInput(f"{part.path}: columns {got} do not match table {tbl.name} ({schema})")
            n = 0
            for batch in pf.iter_batches(batch_size=batch_rows):
                records = [{f"p_{k}": v for k, v in r.items()} for r in batch.to_pylist()]
                if records:
                    conn.execute(stmt, records)
                n += len(records)
        if n != part.rows:
            raise BadInput(f"{part.path} holds {n} rows, the manifest says {part.rows}")
        total += n
    if total != tm.rows:
        raise BadInput(f"table {tbl.name}: {total} rows imported, the manifest says {tm.rows}")
    return total


def _reset_sequences(conn: Connection, manifest: Manifest) -> dict[str, int]:
    out = {}
    for table, col in _SERIALS.items():
        seq = conn.execute(text("SELECT pg_get_serial_sequence(:t, :c)"),
                           {"t": f"tiering.{table}", "c": col}).scalar()
        top = conn.execute(text(f"SELECT max({col}) FROM tiering.{table}")).scalar()
        last = max(v for v in (top, manifest.sequences.get(f"{table}.{col}"), 0) if v is not None)
        if last > 0:
            conn.execute(text("SELECT setval(:s, :v, true)"), {"s": seq, "v": last})
        else:
            conn.execute(text("SELECT setval(:s, 1, false)"), {"s": seq})
        out[f"{table}.{col}"] = last
    return out

