"""The Iceberg catalog and a topic's table: pyiceberg's SQL catalog in the metadata database (the tables
Iceberg's JDBC catalog uses, `iceberg_tables` and `iceberg_namespace_properties`, so an engine with a JDBC
catalog named `tiering` finds the same tables; DuckDB reads one from its metadata file: docs/tables.md) and
PyArrowFileIO on the tier-2 store, under `s3://<bucket>/<prefix>-tables/`, never under tier 2's own prefix (GC's
orphan sweep lists that).

Secrets (the database URL, the S3 keys) go into the catalog's properties only: never logged, never in an
exception this module raises."""
from __future__ import annotations

import zlib
from functools import cache
from gzip import BadGzipFile

from tiering.config import Settings, aws_sdk_checksums_when_required
from tiering.errors import BadInput, TableUnreadable
from tiering.metadata.tables import ICEBERG_CATALOG
from tiering.model import tables_prefix
from tiering.tables.naming import DLQ_SUFFIX, PARTITION_FIELD, PROP_TOPIC, PROP_TOPIC_ID, parse_identifier

CATALOG_NAME = ICEBERG_CATALOG  # its rows in the catalog tables (migration 0014), which a metadata export carries


def warehouse(settings: Settings) -> str:
    """`s3://<bucket>/<prefix>-tables`: beside tier 2's prefix, not inside it (model.tables_prefix)."""
    return f"s3://{settings.bucket}/{tables_prefix(settings.prefix).rstrip('/')}"


def table_dataset(settings: Settings, identifier: str) -> dict[str, str]:
    """A table as an OpenLineage dataset, named as Iceberg tables are (the bucket, the table's location)."""
    location = f"{warehouse(settings)}/{identifier.replace('.', '/')}"
    return {"namespace": f"s3://{settings.bucket}", "name": location.removeprefix(f"s3://{settings.bucket}/")}


def io_properties(settings: Settings) -> dict[str, str]:
    """The FileIO's S3 settings: tier 2's filesystem (encryption, CA bundle: tiering/tables/fileio.py); the
    executors' writers build theirs from the same Settings."""
    from tiering.tables.fileio import properties

    props = {**properties(settings), "s3.region": settings.aws_region}
    if settings.s3_endpoint_url:
        props["s3.endpoint"] = settings.s3_endpoint_url
    if settings.aws_access_key_id and settings.aws_secret_access_key:
        props["s3.access-key-id"] = settings.aws_access_key_id
        props["s3.secret-access-key"] = settings.aws_secret_access_key
    if settings.aws_session_token:
        props["s3.session-token"] = settings.aws_session_token
    return props


def catalog(settings: Settings):
    """The SQL catalog (creates its two tables on first use, as the JDBC catalog does)."""
    aws_sdk_checksums_when_required()  # RGW 16 refuses aws-chunked uploads (config.py)
    url = settings.database_url
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg2://" + url[len("postgresql://"):]
    return _catalog_class()(CATALOG_NAME, uri=url, warehouse=warehouse(settings), **io_properties(settings))


@cache
def _catalog_class():
    """pyiceberg's SQL catalog, whose `load_table` raises TableUnreadable when the table's current metadata
    file is gone or is not Iceberg metadata (pyiceberg raises the filesystem's FileNotFoundError or a
    pydantic error): every command then says what happened and what to do, whichever path loads it."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import ValidationError

    class Catalog(SqlCatalog):
        def _convert_orm_to_iceberg(self, orm_table):
            # The product makes its tables under its warehouse only. A row of this catalog naming metadata
            # elsewhere (another tool's table in the shared catalog tables, on another store or host) is not
            # the product's: refused before any read, which on another scheme (gs://, a file of another host)
            # could wait for ever or fail as if the product's own table had lost its metadata file.
            location = orm_table.metadata_location or ""
            own = self.properties["warehouse"].rstrip("/") + "/"
            if not location.startswith(own):
                name = f"{orm_table.table_namespace}.{orm_table.table_name}"
                raise BadInput(f"table {name!r} has its metadata at {location[:200]!r}, outside this store's "
                               f"warehouse {own!r}: not a table tiering made (drop it, or give the topic "
                               "another table)")
            return super()._convert_orm_to_iceberg(orm_table)

        def table_exists(self, identifier) -> bool:
            try:  # (pyiceberg's loads the table to find out)
                return super().table_exists(identifier)
            except TableUnreadable:  # its catalog row is there: it exists, and loading it says what is wrong
                return True

        def load_table(self, identifier):
            try:
                return super().load_table(identifier)
            except (FileNotFoundError, ValidationError, UnicodeDecodeError, EOFError, BadGzipFile,
                    zlib.error) as exc:  # missing; not JSON, not UTF-8, a cut or false gzip (.gz.metadata.json)
                name = identifier if isinstance(identifier, str) else ".".join(identifier)
                detail = (str(exc).splitlines() or [""])[0] or type(exc).__name__
                raise TableUnreadable(f"table {name!r} cannot be read: its current metadata file is "
                                      f"{'gone' if isinstance(exc, FileNotFoundError) else 'not Iceberg metadata'}"
                                      f" ({detail[:300]}); `tiering table rebuild` of its topic makes it again "
                                      "from the retained log") from None

    return Catalog


def _iceberg_type(kind: str):
    from pyiceberg.types import (BinaryType, BooleanType, DoubleType, LongType, StringType, TimestamptzType)

    return {"string": StringType(), "int64": LongType(), "double": DoubleType(), "boolean": BooleanType(),
            "timestamp": TimestamptzType(), "binary": BinaryType()}[kind]


def _arrow_type(kind: str):
    import pyarrow as pa

    return {"string": pa.string(), "int64": pa.int64(), "double": pa.float64(), "boolean": pa.bool_(),
            "timestamp": pa.timestamp("us", tz="UTC"), "binary": pa.binary()}[kind]


# The `tiering` Spark source's columns (without `tier`, which changes as ledgers move), then the decoder's.
BASE = (("topic", "string"), ("ledger_id", "int64"), ("entry_id", "int64"), ("payload", "binary"),
        ("sealed_at", "timestamp"), ("offloaded_at", "timestamp"))
DLQ = BASE[:5] + (("reason", "string"),)


def columns(decoder: dict | None, dlq: bool = False) -> list[tuple[str, str]]:
    if dlq:
        return list(DLQ)
    return list(BASE) + [(f["name"], f["type"]) for f in (decoder or {}).get("fields", [])]


def table_schema(decoder: dict | None = None, dlq: bool = False):
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    return Schema(*(NestedField(i, name, _iceberg_type(kind), required=False)
                    for i, (name, kind) in enumerate(columns(decoder, dlq), start=1)))


def arrow_schema(decoder: dict | None = None, dlq: bool = False):
    """The Parquet data files' schema (no field ids: add_files maps columns by name)."""
    import pyarrow as pa

    return pa.schema([(name, _arrow_type(kind)) for name, kind in columns(decoder, dlq)])


def check_current_files(table) -> None:
    """TableUnreadable when the current snapshot's manifest list is gone (its snapshot expired and its files
    were deleted, as after an import of an export older than that): one GET. The table's metadata read,
    but no scan or append of it would."""
    snap = table.current_snapshot()
    if snap is None:
        return
    try:
        snap.manifests(table.io)
    except FileNotFoundError as exc:
        detail = (str(exc).splitlines() or [""])[0][:300]
        raise TableUnreadable(f"table {'.'.join(table.name())!r} cannot be read: its current snapshot's manifest "
                              f"list is gone ({detail}); `tiering table rebuild` of its topic makes it again "
                              "from the retained log") from None


def owner_problem(table, topic: str, topic_id: int | None) -> str | None:
    """Why `table` is not the table of this topic (another topic's, another tool's, or the table of an
    earlier topic of the same name, deleted: its rows are not this topic's), or None."""
    owner, owner_id = table.properties.get(PROP_TOPIC), table.properties.get(PROP_TOPIC_ID)
    if owner != topic:
        whose = f"topic {owner!r}" if owner else "no topic (it was not made by tiering)"
        return f"belongs to {whose}, not to topic {topic!r}"
    if topic_id is not None and owner_id is not None and owner_id != str(topic_id):
        return (f"belongs to an earlier topic {topic!r} (id {owner_id}), deleted since; this topic is id "
                f"{topic_id}: `tiering table rebuild {topic}` drops it and makes this topic's from the retained "
                "log, or give this topic another table")
    return None


def ensure_table(cat, settings: Settings, identifier: str, topic: str, decoder: dict | None = None,
                 dlq: bool = False, topic_id: int | None = None):
    """The topic's table (`dlq`: its dead-letter table `TABLE__dlq`), created (with its namespace) when
    missing: partitioned by day of sealed_at, sorted by ledger and entry; a decoder's new fields are added
    as nullable columns (old files read them as null). A table of that name that is not this topic's is
    refused."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import DayTransform, IdentityTransform

    namespace, _ = parse_identifier(identifier)
    if dlq:
        identifier += DLQ_SUFFIX
    cat.create_namespace_if_not_exists(namespace)
    spec = PartitionSpec(PartitionField(source_id=5, field_id=1000, transform=DayTransform(), name=PARTITION_FIELD))
    order = SortOrder(SortField(source_id=2, transform=IdentityTransform()),
                      SortField(source_id=3, transform=IdentityTransform()))
    location = f"{warehouse(settings)}/{identifier.replace('.', '/')}"  # as table_dataset names it
    table = cat.create_table_if_not_exists(identifier, table_schema(decoder, dlq), location=location,
                                           partition_spec=spec, sort_order=order,
                                           properties={PROP_TOPIC: topic, "format-version": "2",
                                                       **({PROP_TOPIC_ID: str(topic_id)} if topic_id is not None
                                                          else {})})
    problem = owner_problem(table, topic, topic_id)
    if problem is not None:
        raise BadInput(f"table {identifier!r} exists and {problem}")
    have = {f.name: f.field_type for f in table.schema().fields}
    missing = [(n, k) for n, k in columns(decoder, dlq) if n not in have]
    for n, k in columns(decoder, dlq):
        if n in have and have[n] != _iceberg_type(k):
            raise BadInput(f"table {identifier!r} has column {n!r} of type {have[n]}, the decoder says {k}")
    if missing:
        with table.update_schema() as update:
            for n, k in missing:
                update.add_column(n, _iceberg_type(k), required=False)
        table = cat.load_table(identifier)
    return table
