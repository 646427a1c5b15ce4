"""Restore a metadata export (tiering/ops/export_metadata.py) into an EMPTY, migrated schema, in one
transaction (all or nothing): tables locked, FK order, ids preserved, the bigserial sequences moved past the
imported ids, the deferred ledger/chunk constraint triggers checked before the commit. It refuses (BadInput,
nothing changed) when a table holds rows, the manifest is missing or malformed, or the migrations differ.
The rows are written by `tiering.metadata.import_rows.restore`; this module reads and checks the files.
"""
from __future__ import annotations

import hashlib
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Iterator

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tiering.errors import BadInput, TieringError
from tiering.metadata import import_rows
from tiering.ops.export_location import read_footer
from tiering.tier2.objects import Bucket, check_bucket
from tiering.ops.export_metadata import (DEFAULT_BATCH_ROWS, TableManifest, _join, arrow_schema,
                                         check_bucket_exists, read_manifest, table_names)


@dataclass
class ImportReport:
    rows: dict[str, int]
    exported_at: str
    sequences: dict[str, int]


def import_metadata(engine, fs: pafs.FileSystem, base_path: str, batch_rows: int = DEFAULT_BATCH_ROWS,
                    lock_timeout_seconds: int = 30, bucket: str | None = None,
                    other_bucket: bool = False, store_bucket: Bucket | None = None) -> ImportReport:
    """Restore an export into an empty, migrated schema: one transaction, all or nothing. `bucket`: the
    tier-2 bucket of the store imported into; an export that names another is refused unless `other_bucket`
    (its objects were copied to this one, under the same keys). `store_bucket`: that bucket's client, checked
    to exist before anything is written: the rows imported name its objects, and into a bucket that is not
    there the import would make a store whose every tier-2 read fails."""
    check_bucket_exists(fs, base_path)
    manifest = read_manifest(fs, base_path)
    if bucket is not None and manifest.bucket is not None and manifest.bucket != bucket and not other_bucket:
        raise BadInput(f"export at {base_path!r} is of a store whose tier 2 is bucket {manifest.bucket!r}, not "
                       f"{bucket!r}: its chunks name objects this bucket does not hold (set TIERING_BUCKET to "
                       "that bucket, or, with its objects copied here under the same keys, import with "
                       "--other-bucket)")
    if set(manifest.tables) != set(table_names()):
        last = manifest.migrations[-1]["name"][:80] if manifest.migrations else "none"
        raise BadInput(f"export at {base_path!r} has tables {sorted(manifest.tables)}, expected {table_names()} "
                       f"(taken at migrations up to {last!r}: import it into a database migrated to that version)")
    if store_bucket is not None:
        check_bucket(store_bucket)
    for t in table_names():  # before anything is locked: a refusal here takes no lock and writes nothing
        for p in manifest.tables[t].files:
            _check_part(fs, base_path, t, p.path, manifest.export_id, p.sha256)

    def load(table: str, insert) -> int:
        return _load_table(fs, base_path, table, manifest.tables[table], batch_rows, insert)

    rows, sequences = import_rows.restore(engine, base_path, manifest.migrations, manifest.sequences, load,
                                          lock_timeout_seconds)
    return ImportReport(rows, manifest.exported_at, sequences)


def _check_part(fs: pafs.FileSystem, base_path: str, table: str, rel: str, export_id: str | None,
                sha256: str | None) -> None:
    """A part the manifest names is a regular file (a fifo would block the import forever, holding every
    table's lock), a Parquet file, of this table and of this export (its footer says so, as export's
    check_parts wrote it): a part of another export at the same path, even with the same row count, is not.
    With the manifest's digest, its bytes are those its writer wrote: a part damaged or edited since, still
    Parquet with its row count (a flipped bit in a value), would be imported as the store's metadata."""
    path = _join(base_path, rel)
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.NotFound:
        raise BadInput(f"export at {base_path!r} is incomplete: {rel} is missing")
    if kind != pafs.FileType.File:
        raise BadInput(f"export at {base_path!r}: {rel} is not a regular file")
    try:
        footer = read_footer(fs, path)
    except ValueError as exc:  # pyarrow's ArrowInvalid: not Parquet, or cut short
        raise BadInput(f"export at {base_path!r}: {rel} is not a readable Parquet file "
                       f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    except OSError as exc:  # the file or the link failed, not the export: a failure (exit 1), to try again
        raise TieringError(f"export at {base_path!r}: {rel} could not be read "
                           f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    if footer.table is not None and footer.table != table:
        raise BadInput(f"export at {base_path!r}: {rel} holds table {footer.table[:80]!r}, not {table}")
    if export_id is not None and footer.export_id != export_id:
        raise BadInput(f"export at {base_path!r}: {rel} belongs to export {(footer.export_id or 'unknown')[:40]!r}, "
                       f"not to this one ({export_id})")
    if sha256 is not None:  # hashed only: the load reads the part again into the copy it parses
        _read_checked(fs, base_path, rel, sha256, sink=None)


# a part up to this size is held in memory while it loads; a larger one is spooled to a temporary file
_SPOOL_BYTES = 64 << 20


@contextmanager
def _verified_copy(fs: pafs.FileSystem, base_path: str, rel: str, sha256: str | None) -> Iterator[IO[bytes]]:
    """The part's bytes, read once from the export and checked against the manifest's digest, as a seekable
    local copy: what is parsed is what was checked. Reading the export's file twice (a digest, then the load)
    would load a part replaced between the two reads."""
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as copy:
        _read_checked(fs, base_path, rel, sha256, sink=copy)
        copy.seek(0)
        yield copy


def _read_checked(fs: pafs.FileSystem, base_path: str, rel: str, sha256: str | None, sink: IO[bytes] | None) -> None:
    """Read the part whole (into `sink` when given) and check its SHA-256 against the manifest's."""
    digest = hashlib.sha256()
    path = _join(base_path, rel)
    # looked at again: replaced by a fifo since the checks, its open would block the import for good
    # (holding every table's lock); gone since, it is the export's fault, not an I/O error of ours
    if (kind := fs.get_file_info(path).type) != pafs.FileType.File:
        what = "is missing" if kind == pafs.FileType.NotFound else "is not a regular file"
        raise BadInput(f"export at {base_path!r}: {rel} {what} (changed since the import began; nothing "
                       "was imported)")
    try:
        with fs.open_input_stream(path) as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                if sink is not None:
                    sink.write(chunk)
    except FileNotFoundError:
        raise BadInput(f"export at {base_path!r}: {rel} is missing (deleted since the import began; "
                       "nothing was imported)") from None
    if sha256 is not None and digest.hexdigest() != sha256:
        raise BadInput(f"export at {base_path!r}: {rel} is not the file its export wrote (its SHA-256 "
                       "differs from the manifest's): damaged or changed since; nothing was imported")


def _load_table(fs: pafs.FileSystem, base_path: str, table: str, tm: TableManifest, batch_rows: int,
                insert) -> int:
    schema = arrow_schema(table)
    total = 0
    for part in tm.files:
        with _verified_copy(fs, base_path, part.path, part.sha256) as f:
            pf = pq.ParquetFile(f)
            got = pf.schema_arrow
            if got.names != schema.names or not all(a.type.equals(b.type) for a, b in zip(got, schema)):
                raise BadInput(f"{part.path}: columns {got} do not match table {table} ({schema})")
            n = 0
            for batch in pf.iter_batches(batch_size=batch_rows):
                records = batch.to_pylist()
                insert(records)
                n += len(records)
        if n != part.rows:
            raise BadInput(f"{part.path} holds {n} rows, the manifest says {part.rows}")
        total += n
    if total != tm.rows:
        raise BadInput(f"table {table}: {total} rows imported, the manifest says {tm.rows}")
    return total
