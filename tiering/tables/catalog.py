"""The Iceberg catalog and a topic's table: pyiceberg's SQL catalog in the metadata database (the tables
Iceberg's JDBC catalog uses, `iceberg_tables` and `iceberg_namespace_properties`, so Spark, Trino, Flink or
DuckDB with a JDBC catalog named `tiering` read the same tables) and PyArrowFileIO on the tier-2 store,
under `s3://<bucket>/<prefix>-tables/`, never under tier 2's own prefix (GC's orphan sweep lists that).

Secrets (the database URL, the S3 keys) go into the catalog's properties only: never logged, never in an
exception this module raises."""
from __future__ import annotations

from tiering.config import Settings, aws_sdk_checksums_when_required
from tiering.errors import BadInput
from tiering.tables.naming import PROP_TOPIC, parse_identifier

CATALOG_NAME = "tiering"
PARTITION_FIELD = "sealed_at_day"


def warehouse(settings: Settings) -> str:
    """`s3://<bucket>/<prefix>-tables`: beside tier 2's prefix, not inside it."""
    return f"s3://{settings.bucket}/{settings.prefix.rstrip('/') or 'tiering'}-tables"


def table_location(settings: Settings, identifier: str) -> str:
    namespace, name = parse_identifier(identifier)
    return f"{warehouse(settings)}/{namespace}/{name}"


def io_properties(settings: Settings) -> dict[str, str]:
    """PyArrowFileIO's S3 settings (the executors' writers build theirs from the same Settings)."""
    props = {"py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO", "s3.region": settings.aws_region}
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
    from pyiceberg.catalog.sql import SqlCatalog

    if settings.s3_encryption.enabled:
        # pyarrow's S3 filesystem cannot send SSE headers (tiering/tier2/arrowfs.py): refuse rather than write
        # a table's files unencrypted in a bucket whose every other object is encrypted
        raise BadInput("Iceberg tables do not support TIERING_S3_SSE / SSE-C yet: the table's files would be "
                       "written unencrypted")
    aws_sdk_checksums_when_required()  # RGW 16 refuses aws-chunked uploads (config.py)
    url = settings.database_url
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg2://" + url[len("postgresql://"):]
    return SqlCatalog(CATALOG_NAME, uri=url, warehouse=warehouse(settings), **io_properties(settings))


def table_schema():
    """The `tiering` Spark source's columns (without `tier`, which changes as ledgers move)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import BinaryType, LongType, NestedField, StringType, TimestamptzType

    return Schema(
        NestedField(1, "topic", StringType(), required=False),
        NestedField(2, "ledger_id", LongType(), required=False),
        NestedField(3, "entry_id", LongType(), required=False),
        NestedField(4, "payload", BinaryType(), required=False),
        NestedField(5, "sealed_at", TimestamptzType(), required=False),
        NestedField(6, "offloaded_at", TimestamptzType(), required=False),
    )


def arrow_schema():
    """The Parquet data files' schema (no field ids: add_files maps columns by name)."""
    import pyarrow as pa

    return pa.schema([("topic", pa.string()), ("ledger_id", pa.int64()), ("entry_id", pa.int64()),
                      ("payload", pa.binary()), ("sealed_at", pa.timestamp("us", tz="UTC")),
                      ("offloaded_at", pa.timestamp("us", tz="UTC"))])


def ensure_table(cat, settings: Settings, identifier: str, topic: str):
    """The topic's table, created (with its namespace) when missing: partitioned by day of sealed_at, sorted
    by ledger and entry. A table of that name that is not this topic's is refused."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import DayTransform, IdentityTransform

    namespace, _ = parse_identifier(identifier)
    cat.create_namespace_if_not_exists(namespace)
    spec = PartitionSpec(PartitionField(source_id=5, field_id=1000, transform=DayTransform(), name=PARTITION_FIELD))
    order = SortOrder(SortField(source_id=2, transform=IdentityTransform()),
                      SortField(source_id=3, transform=IdentityTransform()))
    table = cat.create_table_if_not_exists(identifier, table_schema(), location=table_location(settings, identifier),
                                           partition_spec=spec, sort_order=order,
                                           properties={PROP_TOPIC: topic, "format-version": "2"})
    owner = table.properties.get(PROP_TOPIC)
    if owner != topic:
        whose = f"topic {owner!r}" if owner else "no topic (it was not made by tiering)"
        raise BadInput(f"table {identifier!r} exists and belongs to {whose}, not to topic {topic!r}")
    return table
