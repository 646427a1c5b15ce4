"""Parquet snapshot of the metadata tables, and its restore (DESIGN §4, §5 `tiering_metadata_export`).

Layout under a base path (local directory or `s3://bucket/prefix`):

    {base}/topic/part-{id}-00000.parquet  one dataset per table, more parts when large; {id} the export's
    {base}/ledger/part-{id}-00000.parquet id, also in each part's Parquet metadata (export_location.py)
    {base}/chunk/...  {base}/gc_task/...  {base}/attribute/...  {base}/job_run/...
    {base}/manifest.json                  written LAST: without it the export is incomplete

Types keep exact values: timestamps are `timestamp[us, tz=UTC]` (PostgreSQL's precision), bigints int64,
`gc_task.attempts` int32, uuids and the ledger state as strings, `job_run.details` (jsonb) as its JSON text.
The manifest names the schema migrations applied, each table's files and row counts, the sequences' last
values, the export time (the snapshot's transaction time) and the format version.

`export_metadata` reads every table in one REPEATABLE READ, read-only transaction, so the files are one
consistent snapshot (no chunk without its ledger), streaming each table through a server-side cursor in
batches: memory is bounded by the batch size whatever the tables' sizes.

`tiering/ops/import_metadata.py` restores an export into an empty schema.

For the Spark job (`tiering/jobs/export_metadata.py`): `table_names()`, `arrow_schema(table)`,
`jdbc_query(table)` (the SELECT to give Spark's JDBC reader, with the casts that make every column a plain
type), `rows_to_table(table, rows)` (row dicts as JDBC/Spark give them -> a pyarrow Table of exactly that
schema), `write_part` on executors, then `build_manifest` + `write_manifest` on the driver, last.
"""
from __future__ import annotations

import datetime as _dt
import enum
import hashlib
import json
import uuid as _uuid
from dataclasses import asdict, dataclass, field
from typing import Iterable, Mapping, Sequence
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tiering.tier2.arrowfs import s3_filesystem
from tiering.errors import BadInput, TieringError
from tiering.model import BUCKET_NAME, INT64_MAX, check_export_location
from tiering.metadata import export_rows as R
from tiering.metadata.export_rows import jdbc_query, schemas, table_names  # re-exported: the Spark job uses them
from tiering.ops.export_location import (EXPORT_ID_KEY, MANIFEST, TABLE_KEY, LocationTaken, another_export,
                                         check_claimable, claim, create_manifest, discard, exists as _exists,
                                         is_local as _is_local, join as _join, new_export_id, only_writer, part_name,
                                         read_footer, release)

FORMAT = "tiering-metadata-export"
FORMAT_VERSION = 1
DEFAULT_BATCH_ROWS = 10_000
DEFAULT_ROWS_PER_PART = 1_000_000

_UTC = _dt.timezone.utc


# ----------------------------------------------------------------------------------------------- schema
def arrow_schema(table: str, export_id: str | None = None) -> pa.Schema:
    """The Arrow schema of one table's files: column order and nullability as in PostgreSQL; the export's id
    in its metadata when given (a part's proof that it is this export's)."""
    fields = [pa.field(c.name, c.arrow_type, nullable=c.nullable,
                       metadata={"pg_type": c.pg_kind} if c.pg_kind else None) for c in R.columns(table)]
    meta = {TABLE_KEY: table, "tiering.format_version": str(FORMAT_VERSION)}
    if export_id is not None:
        meta[EXPORT_ID_KEY] = export_id
    return pa.schema(fields, metadata=meta)


# ----------------------------------------------------------------------------------------------- rows
def _to_utc(v, naive_tz: _dt.tzinfo, where: str) -> _dt.datetime:
    if isinstance(v, str):
        v = _dt.datetime.fromisoformat(v)
    if not isinstance(v, _dt.datetime):
        raise BadInput(f"{where}: expected a timestamp, got {type(v).__name__}")
    if v.tzinfo is None or v.tzinfo.utcoffset(v) is None:
        v = v.replace(tzinfo=naive_tz)
    return v.astimezone(_UTC)


def _to_text(v, kind: str, where: str) -> str:
    if isinstance(v, str):
        return v
    if kind == "jsonb":
        return json.dumps(v, ensure_ascii=False, allow_nan=False)
    if isinstance(v, _uuid.UUID):
        return str(v)
    if isinstance(v, enum.Enum):
        return str(v.value)
    raise BadInput(f"{where}: expected text, got {type(v).__name__}")


def _to_int(v, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise BadInput(f"{where}: expected an integer, got {v!r}")
    return v


def rows_to_table(table: str, rows: Iterable[Mapping], naive_tz: str | _dt.tzinfo = "UTC") -> pa.Table:
    """Row dicts (psycopg2 rows, JDBC/Spark `Row.asDict()`, ...) -> a pyarrow Table of `arrow_schema(table)`.

    Accepts per column: timestamps as aware datetimes (converted to UTC), naive datetimes (taken to be in
    `naive_tz`: PySpark hands TimestampType out as naive local time, so pass the executor's zone then) or
    ISO strings; uuids as UUID or str; the state as str or enum; jsonb as JSON text or a dict/list (dumped).
    A missing or NULL value in a NOT NULL column, or a value of the wrong kind, raises BadInput."""
    schema = arrow_schema(table)
    tz = ZoneInfo(naive_tz) if isinstance(naive_tz, str) else naive_tz
    cols: dict[str, list] = {f.name: [] for f in schema}
    converters = []
    for c, f in zip(R.columns(table), schema):
        if pa.types.is_timestamp(f.type):
            conv = lambda v, w: _to_utc(v, tz, w)  # noqa: E731
        elif pa.types.is_string(f.type):
            conv = (lambda k: lambda v, w: _to_text(v, k, w))(c.pg_kind)
        elif pa.types.is_boolean(f.type):
            conv = lambda v, w: v if isinstance(v, bool) else _bad_bool(v, w)  # noqa: E731
        else:
            conv = lambda v, w: _to_int(v, w)  # noqa: E731
        converters.append((c.name, f.nullable, conv, cols[c.name]))
    for n, row in enumerate(rows):
        for name, nullable, conv, out in converters:
            v = row.get(name) if hasattr(row, "get") else row[name]
            if v is None:
                if not nullable:
                    raise BadInput(f"{table} row {n}: column {name} is NOT NULL but the value is missing")
                out.append(None)
            else:
                out.append(conv(v, f"{table} row {n} column {name}"))
    return pa.Table.from_pydict(cols, schema=schema)


def _bad_bool(v, where: str):
    raise BadInput(f"{where}: expected a boolean, got {v!r}")


# ----------------------------------------------------------------------------------------------- filesystem
def default_export_prefix(prefix: str) -> str:
    """The key prefix of default export locations in the tier-2 bucket: beside the tier-2 prefix, not under
    it (GC's orphan sweep owns that); GC aborts multipart uploads that failed exports leave here."""
    return f"{prefix.rstrip('/')}-metadata/"


def filesystem_for(url: str, settings=None, *, endpoint_url: str | None = None, access_key: str | None = None,
                   secret_key: str | None = None, region: str | None = None) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, base path) for `s3://bucket/path` or a local path (or `file://` URL).

    S3 settings come from the keywords, else from a settings-like object (`s3_endpoint_url`,
    `aws_access_key_id`, `aws_secret_access_key`, `aws_region`, as `tiering.config.Settings`), else from
    pyarrow's default chain. An endpoint like `http://host:port` selects that host and scheme."""
    url = check_export_location(url)
    parts = urlsplit(url)
    if parts.scheme in ("s3", "s3a"):
        endpoint = endpoint_url or getattr(settings, "s3_endpoint_url", None)
        kwargs = {"region": region or getattr(settings, "aws_region", None) or "us-east-1"}
        ak = access_key or getattr(settings, "aws_access_key_id", None)
        sk = secret_key or getattr(settings, "aws_secret_access_key", None)
        if ak and sk:
            kwargs.update(access_key=ak, secret_key=sk)
        if endpoint:
            ep = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            kwargs.update(endpoint_override=ep.netloc, scheme=ep.scheme or "https")
        base = f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/")
        return s3_filesystem(settings, **kwargs), base
    return pafs.LocalFileSystem(), check_local_location(url)


def check_export_target(url: str, settings=None) -> None:
    """What an export to `url` (not overwriting) would refuse once started, found without writing: a location
    it cannot use (check_local_location), an S3 bucket that does not exist, a complete export there, files
    that are not parts of an export in its table directories (export_location.check_claimable). For a
    pipeline's plan, so that bad input is refused before Spark starts, and never retried."""
    fs, base = filesystem_for(url, settings)
    check_bucket_exists(fs, base)
    check_claimable(fs, base, overwrite=False)


def check_bucket_exists(fs: pafs.FileSystem, base_path: str) -> None:
    """BadInput when an S3 location's bucket does not exist (one HEAD): an export would fail on its first
    request with the server's code, an import would find no manifest; neither is what to fix."""
    if not _is_local(fs):
        bucket = base_path.split("/", 1)[0]
        if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise BadInput(f"export location s3://{base_path[:200]}: bucket {bucket!r} does not exist")


_NAMES_UNDER_BASE = 128  # what an export adds under its base: "/<table>/part-<export id>-<n>.parquet", markers


def check_local_location(url: str) -> str | None:
    """A local location's path (a plain path or a file:// URL; None for s3://) if it is a directory or could be
    made one; else BadInput (a file, a fifo or a file's child, a name too long), which pyarrow would raise as
    an OSError midway, after the location's lock was taken (in a DAG run: after Spark started, then retried)."""
    import errno
    import os
    import stat
    import tempfile

    url = check_export_location(url)
    parts = urlsplit(url)
    if parts.scheme in ("s3", "s3a"):
        return None
    if parts.scheme == "file":
        # normalised as a plain path is (abspath): the export lock is named after the base, and one directory
        # spelt two ways ('//', '..') must be one location
        path = os.path.normpath(parts.path or "/")
    else:
        path = os.path.abspath(os.path.expanduser(url))
    probe = path
    while True:
        try:
            mode = os.stat(probe).st_mode
        except (FileNotFoundError, NotADirectoryError):  # not there (yet): its parent decides
            if probe == os.path.dirname(probe):
                return path
            probe = os.path.dirname(probe)
            continue
        except OSError as exc:  # too long, a symlink loop, no permission: nothing could be written there
            reason = exc.strerror or errno.errorcode.get(exc.errno, "an error")
            raise BadInput(f"export location {path[:200]!r} cannot be used: {reason}") from None
        if not stat.S_ISDIR(mode):
            where = "" if probe == path else " (a part of it)"
            raise BadInput(f"export location {path[:200]!r}{where} is not a directory")
        if len(os.fsencode(path)) + _NAMES_UNDER_BASE > os.pathconf(probe, "PC_PATH_MAX") - 1:
            raise BadInput(f"export location {path[:200]!r} cannot be used: the paths of its parts would be "
                           "longer than the system allows")
        try:  # the export makes directories there: a read-only or pseudo file system (/proc) takes none
            os.rmdir(tempfile.mkdtemp(prefix=".tiering-probe-", dir=probe))
        except OSError as exc:
            raise BadInput(f"export location {path[:200]!r} cannot be used: no directory can be made in "
                           f"{probe[:200]!r} ({exc.strerror or type(exc).__name__})") from None
        return path


# ----------------------------------------------------------------------------------------------- manifest
@dataclass(frozen=True)
class PartFile:
    path: str  # relative to the base path
    rows: int
    # SHA-256 of the file's bytes as its writer wrote them (None: an export written before parts had digests):
    # an import checks it, so a part damaged or edited since, still Parquet with its row count, is refused
    sha256: str | None = None


@dataclass
class TableManifest:
    rows: int
    files: list[PartFile]


@dataclass
class Manifest:
    format_version: int
    exported_at: str  # ISO 8601, UTC: the snapshot's transaction time
    migrations: list[dict]  # [{"name": ..., "checksum": ...}] in order
    tables: dict[str, TableManifest]
    sequences: dict[str, int | None] = field(default_factory=dict)  # "table.column" -> last value
    format: str = FORMAT
    export_id: str | None = None  # every part's Parquet metadata names it (None: an export written before exports had ids)
    # the tier-2 bucket the chunk rows' keys are in (None: an export written before manifests named it, or
    # by a caller that did not say): an import under another bucket would name objects that are not there
    bucket: str | None = None

    @property
    def row_counts(self) -> dict[str, int]:
        return {name: t.rows for name, t in self.tables.items()}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, data: str, where: str) -> "Manifest":
        try:
            d = json.loads(data)
            if d.get("format") != FORMAT:
                raise BadInput(f"{where} is not a tiering metadata export manifest")
            version = d.get("format_version")
            if type(version) is not int or version != FORMAT_VERSION:  # JSON's true is Python's 1
                raise BadInput(f"{where}: export format version {version!r}, this version reads {FORMAT_VERSION}")
            tables = {name: TableManifest(_count(t["rows"], f"{name}'s rows", where), [
                PartFile(_part_path(name, f["path"], where), _count(f["rows"], f"{name}'s part rows", where),
                         _digest(f.get("sha256"), where))
                for f in t["files"]]) for name, t in d["tables"].items()}
            return cls(FORMAT_VERSION, _timestamp(d["exported_at"], where),
                       [{"name": str(m["name"]), "checksum": str(m["checksum"])} for m in d["migrations"]],
                       tables, {str(k): (None if v is None else _count(v, f"sequence {k}", where))
                                for k, v in d.get("sequences", {}).items()},
                       export_id=None if d.get("export_id") is None else str(d["export_id"]),
                       bucket=_bucket(d.get("bucket"), where))
        except BadInput:
            raise
        # RecursionError: JSON nested too deep; OverflowError: a count of 1e400 (float infinity)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError) as exc:
            raise BadInput(f"{where} is malformed: {type(exc).__name__}: {exc}") from None


def _count(value: object, what: str, where: str) -> int:
    """A count or a sequence's value as the manifest gives it: a JSON integer that fits a bigint (not true,
    not 2.5, not 2**63, which PostgreSQL would refuse mid-import as if the schema were wrong)."""
    if type(value) is not int or not 0 <= value <= INT64_MAX:
        shown = repr(value)
        raise BadInput(f"{where} is malformed: {what} must be a whole number from 0 to {INT64_MAX}, got "
                       f"{shown[:40]}{'...' if len(shown) > 40 else ''}")
    return value


def _bucket(value: object, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not BUCKET_NAME.fullmatch(value):
        raise BadInput(f"{where} is malformed: bucket must be a bucket name")
    return value


def _digest(value: object, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 64 or value.strip("0123456789abcdef"):
        shown = repr(value)
        raise BadInput(f"{where} is malformed: a part's sha256 must be 64 lower-case hex digits, got "
                       f"{shown[:40]}{'...' if len(shown) > 40 else ''}")
    return value


def _timestamp(value: object, where: str) -> str:
    """The export's time as the manifest gives it: ISO 8601 with its zone (as build_manifest writes it), kept
    as written; anything else (a number, a text with escapes or newlines) is not this format's manifest."""
    try:
        if not isinstance(value, str) or _dt.datetime.fromisoformat(value).tzinfo is None:
            raise ValueError
    except ValueError:
        shown = repr(value)
        raise BadInput(f"{where} is malformed: exported_at must be an ISO 8601 time with its zone, got "
                       f"{shown[:40]}{'...' if len(shown) > 40 else ''}") from None
    return value


def _part_path(table: str, path: object, where: str) -> str:
    """A part's path as the manifest gives it: inside its table's directory of the export (export_location.
    part_name writes them so), never a path that leads elsewhere ("../", absolute) for the import to read."""
    path = str(path)
    if not path.startswith(f"{table}/") or any(seg in ("", ".", "..") for seg in path.split("/")):
        raise BadInput(f"{where} names part {path!r} outside its table's directory {table}/")
    return path


def build_manifest(source, parts: Mapping[str, Sequence[PartFile]],
                   exported_at: _dt.datetime | None = None, export_id: str | None = None,
                   bucket: str | None = None) -> Manifest:
    """The manifest of an export whose parts were written (e.g. by Spark executors): migrations and
    sequences are read from the database now; `bucket`: the store's tier-2 bucket. Every table must have
    at least one part."""
    missing = [t for t in table_names() if not parts.get(t)]
    if missing:
        raise BadInput(f"no parts for tables {', '.join(missing)} (an empty table still gets one empty part)")

    facts = R.manifest_facts(source, exported_at)  # an engine, a connection or an export_rows.Snapshot
    return Manifest(FORMAT_VERSION, facts.exported_at.astimezone(_UTC).isoformat(), facts.migrations,
                    {t: TableManifest(sum(p.rows for p in parts[t]), list(parts[t])) for t in table_names()},
                    facts.sequences, export_id=export_id, bucket=bucket)


def check_parts(fs: pafs.FileSystem, base_path: str, manifest: Manifest) -> None:
    """Every part the manifest names is at the base path, as this process sees it, with the rows it claims
    (read from the Parquet footer) and, when the manifest has an export id, that id in its metadata.
    Executors on other machines write a local path on *their* disks: a manifest over parts the driver
    cannot see would be an export that looks complete and is not; a stale part of an earlier export at the
    same path, with the same row count, would pass for this export's rows."""
    for table, tm in manifest.tables.items():
        for part in tm.files:
            path = _join(base_path, part.path)
            owner = None
            try:
                footer = read_footer(fs, path)
                rows, owner = footer.rows, footer.export_id
            except FileNotFoundError:
                rows = None
            except OSError as exc:
                if _exists(fs, path):
                    raise TieringError(f"export part {path} cannot be read: {str(exc).splitlines()[0]}") from None
                rows = None
            if rows is None and another_export(fs, base_path, table, manifest.export_id):
                raise LocationTaken(f"another export took {base_path!r} (it removed part {part.path} of this "
                                    f"one); no manifest written")
            if rows is None:
                raise TieringError(f"export part {path} of table {table} is missing where the manifest goes "
                                   f"(written on another machine? export to s3:// or to a path every Spark "
                                   f"worker shares); no manifest written")
            if rows != part.rows:
                raise TieringError(f"export part {path} has {rows} rows, its writer reported {part.rows}; "
                                   f"no manifest written")
            if manifest.export_id is not None and owner != manifest.export_id:
                raise TieringError(f"export part {path} belongs to export {owner or 'unknown'}, not to this one "
                                   f"({manifest.export_id}); no manifest written")


def write_manifest(fs: pafs.FileSystem, base_path: str, manifest: Manifest) -> str:
    """Write the manifest (last step of an export), after checking every part it names (`check_parts`).
    Created only if there is none, atomically (export_location.create_manifest): of two exports into one
    location at once, the one that does not write it gets LocationTaken. Every part is looked for again after:
    a `claim` of the location that started before the manifest was there may have removed some; then the
    manifest goes again and the export fails."""
    check_parts(fs, base_path, manifest)
    path = create_manifest(fs, base_path, manifest.to_json().encode(), manifest.export_id or new_export_id())
    gone = [p.path for t in manifest.tables.values() for p in t.files if not _exists(fs, _join(base_path, p.path))]
    if gone:
        try:
            if read_manifest(fs, base_path).export_id == manifest.export_id:
                fs.delete_file(path)
        except (OSError, TieringError):
            pass  # best effort: the error below says what happened
        raise LocationTaken(f"another export took {base_path!r} and removed part {gone[0]} of this one; "
                            f"no manifest of this export stays")
    return path


def read_manifest(fs: pafs.FileSystem, base_path: str) -> Manifest:
    path = _join(base_path, MANIFEST)
    try:
        kind = fs.get_file_info(path).type
        if kind not in (pafs.FileType.File, pafs.FileType.NotFound):
            # a fifo would block the open forever, a device never end, a directory fail as an I/O error
            raise BadInput(f"{path} is not a regular file: not a metadata export")
        with fs.open_input_stream(path) as f:
            data = f.read()
    except FileNotFoundError:
        raise BadInput(f"no {MANIFEST} at {base_path!r}: not a metadata export, or an incomplete one") from None
    except OSError as exc:
        if not _exists(fs, path):
            raise BadInput(f"no {MANIFEST} at {base_path!r}: not a metadata export, or an incomplete one") from None
        raise TieringError(f"cannot read {path}: {exc}") from None
    return Manifest.from_json(data.decode("utf-8", errors="replace"), path)


# ----------------------------------------------------------------------------------------------- export
def write_part(fs: pafs.FileSystem, base_path: str, table: str, part_no: int, data: pa.Table,
               export_id: str) -> PartFile:
    """Write one part file of a table (used by executors of the Spark job, and by export_metadata)."""
    schema = arrow_schema(table, export_id)
    if not data.schema.equals(schema, check_metadata=False):
        data = data.cast(schema)
    rel = part_name(table, part_no, export_id)
    with _PartWriter(fs, base_path, table, rel, schema) as w:
        w.write(data)
    return w.part


class _Digesting:
    """A write-only file for ParquetWriter: each write goes to `sink` and into a SHA-256 of the file."""

    def __init__(self, sink):
        self.sink, self.sha, self.at, self.closed = sink, hashlib.sha256(), 0, False

    def write(self, data) -> int:
        self.sha.update(data)
        self.sink.write(data)
        self.at += len(data)
        return len(data)

    def tell(self) -> int:
        return self.at

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True  # the sink is closed by its owner


class _PartWriter:
    def __init__(self, fs: pafs.FileSystem, base_path: str, table: str, rel: str, schema: pa.Schema):
        if _is_local(fs):
            fs.create_dir(_join(base_path, table), recursive=True)
        self.rel = rel
        self.sink = fs.open_output_stream(_join(base_path, rel))
        self.digest = _Digesting(self.sink)
        self.writer = pq.ParquetWriter(self.digest, schema, compression="zstd")
        self.rows = 0

    def write(self, data: pa.Table) -> None:
        self.writer.write_table(data)
        self.rows += data.num_rows

    @property
    def part(self) -> PartFile:
        """The part as written (after the writer closed: the digest covers the footer)."""
        return PartFile(self.rel, self.rows, self.digest.sha.hexdigest())

    def __enter__(self) -> "_PartWriter":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.writer.close()
        finally:
            self.sink.close()


def export_metadata(engine, fs: pafs.FileSystem, base_path: str, batch_rows: int = DEFAULT_BATCH_ROWS,
                    rows_per_part: int = DEFAULT_ROWS_PER_PART, overwrite: bool = False,
                    bucket: str | None = None) -> Manifest:
    """Write a consistent Parquet snapshot of the metadata tables under `base_path`; returns its manifest,
    which names `bucket` (the store's tier-2 bucket: an import checks it is the bucket it imports under).

    Refuses (BadInput) to write over a complete export unless `overwrite`; then the old manifest is deleted
    first, so a failure midway leaves a recognisably incomplete export, never a mixed one; a failure removes
    the parts this export wrote (export_location.py)."""
    if batch_rows < 1 or rows_per_part < 1:
        raise BadInput("batch_rows and rows_per_part must be positive")
    check_bucket_exists(fs, base_path)
    export_id = new_export_id()
    with only_writer(engine, fs, base_path):
        claim(fs, base_path, export_id, overwrite)
        try:
            with R.snapshot(engine) as snap:
                parts = {t: _export_table(snap, fs, base_path, t, batch_rows, rows_per_part, export_id)
                         for t in table_names()}
                manifest = build_manifest(snap, parts, snap.now, export_id, bucket)
            write_manifest(fs, base_path, manifest)
        except BaseException:
            discard(fs, base_path, export_id)
            raise
        release(fs, base_path, export_id)
    return manifest


def _export_table(snap: R.Snapshot, fs: pafs.FileSystem, base_path: str, table: str, batch_rows: int,
                  rows_per_part: int, export_id: str) -> list[PartFile]:
    schema = arrow_schema(table, export_id)
    parts: list[PartFile] = []
    writer: _PartWriter | None = None
    try:
        for rows in snap.stream(table, batch_rows):
            while rows:
                if writer is None:
                    writer = _PartWriter(fs, base_path, table, part_name(table, len(parts), export_id), schema)
                take = rows[:rows_per_part - writer.rows]
                rows = rows[len(take):]
                writer.write(rows_to_table(table, take))
                if writer.rows >= rows_per_part:
                    writer.__exit__(None, None, None)
                    parts.append(writer.part)
                    writer = None
        if writer is None and not parts:  # an empty table still has one (empty) part with its schema
            writer = _PartWriter(fs, base_path, table, part_name(table, 0, export_id), schema)
        if writer is not None:
            writer.__exit__(None, None, None)
            parts.append(writer.part)
            writer = None
    finally:
        if writer is not None:
            writer.__exit__(None, None, None)
    return parts


__all__ = ["FORMAT_VERSION", "MANIFEST", "Manifest", "PartFile", "TableManifest", "arrow_schema", "build_manifest",
           "export_metadata", "filesystem_for", "jdbc_query", "part_name", "read_manifest", "rows_to_table", "schemas",
           "table_names", "write_manifest", "write_part"]
