"""SQLAlchemy Core table objects mirroring every table of sql/migrations (the SQL files are the source of truth;
tests/integration/test_schema_mirror.py compares the two)."""
from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, DateTime, Integer, MetaData, String, Table, Text
from sqlalchemy.dialects.postgresql import ENUM, JSONB, UUID

metadata = MetaData(schema="tiering")

ledger_state = ENUM("OPEN", "SEALED", "OFFLOADING", "OFFLOADED", "DELETED", name="ledger_state",
                    schema="tiering", create_type=False)

topic = Table(
    "topic", metadata,
    Column("topic_id", BigInteger, primary_key=True),
    Column("name", Text, nullable=False),
    Column("offload_after_seconds", BigInteger, nullable=False),
    Column("offload_threshold_bytes", BigInteger, nullable=False),
    Column("deletion_lag_seconds", BigInteger, nullable=False),
    Column("retention_seconds", BigInteger, nullable=False),
    Column("retention_bytes", BigInteger, nullable=False),
    Column("rollover_entries", BigInteger, nullable=False),
    Column("rollover_bytes", BigInteger, nullable=False),
    Column("next_ledger_id", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("trim_marker_written", BigInteger, nullable=False),  # 0004: retention's marker last in tier 2
    Column("retain_unread", Boolean, nullable=False),  # 0006: subscriptions bound retention
    Column("max_retention_seconds", BigInteger, nullable=False),
    Column("max_retention_bytes", BigInteger, nullable=False),
    Column("subscription_expiry_seconds", BigInteger, nullable=False),
)

ledger = Table(
    "ledger", metadata,
    Column("topic_id", BigInteger, primary_key=True),
    Column("ledger_id", BigInteger, primary_key=True),
    Column("state", ledger_state, nullable=False),
    Column("entry_count", BigInteger, nullable=False),
    Column("size_bytes", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("sealed_at", DateTime(timezone=True)),
    Column("tier1_present", Boolean, nullable=False),
    Column("tier1_deleted_at", DateTime(timezone=True)),
    Column("offload_uuid", UUID(as_uuid=False)),
    Column("offload_started_at", DateTime(timezone=True)),
    Column("offloaded_at", DateTime(timezone=True)),
    Column("deleted_at", DateTime(timezone=True)),
    Column("version", BigInteger, nullable=False),
    # 0009: no tier holds a good copy (tiering repair marks it; recovery records the ids it found no copy of,
    # without a chunk row: 0013)
    Column("lost_at", DateTime(timezone=True)),
    Column("lost_reason", Text),
)

chunk = Table(
    "chunk", metadata,
    Column("topic_id", BigInteger, primary_key=True),
    Column("ledger_id", BigInteger, primary_key=True),
    Column("data_key", Text, nullable=False),
    Column("data_offset", BigInteger, nullable=False),
    Column("data_length", BigInteger, nullable=False),
    Column("index_key", Text, nullable=False),
    Column("index_offset", BigInteger, nullable=False),
    Column("index_length", BigInteger, nullable=False),
    Column("first_entry_id", BigInteger, nullable=False),
    Column("last_entry_id", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("data_alone", Boolean, nullable=False),  # 0004: the data object holds this ledger only (triggers)
    Column("data_etag", Text),  # 0012: the objects' ETags as written (NULL: not known)
    Column("index_etag", Text),
)

gc_task = Table(
    "gc_task", metadata,
    Column("task_id", BigInteger, primary_key=True),
    Column("key", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("owner_uuid", UUID(as_uuid=False)),
    Column("not_before", DateTime(timezone=True), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("last_error", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

topic_usage = Table(  # 0003: per-topic totals, maintained by triggers
    "topic_usage", metadata,
    Column("topic_id", BigInteger, primary_key=True),
    Column("open_ledgers", BigInteger, nullable=False),
    Column("sealed_ledgers", BigInteger, nullable=False),
    Column("offloading_ledgers", BigInteger, nullable=False),
    Column("offloaded_ledgers", BigInteger, nullable=False),
    Column("deleted_ledgers", BigInteger, nullable=False),
    Column("live_ledgers", BigInteger, nullable=False),
    Column("live_entries", BigInteger, nullable=False),
    Column("live_bytes", BigInteger, nullable=False),
    Column("tier1_ledgers", BigInteger, nullable=False),
    Column("tier1_bytes", BigInteger, nullable=False),
    Column("tier2_ledgers", BigInteger, nullable=False),
    Column("tier2_bytes", BigInteger, nullable=False),
    Column("tier2_stored_bytes", BigInteger, nullable=False),
)

ledger_hourly = Table(  # 0010: per topic and hour, offloads and the backlog's net change (dashboard series)
    "ledger_hourly", metadata,
    Column("hour", DateTime(timezone=True), primary_key=True),
    Column("topic_id", BigInteger, primary_key=True),
    Column("offloaded_ledgers", BigInteger, nullable=False),
    Column("offloaded_bytes", BigInteger, nullable=False),
    Column("backlog_ledgers", BigInteger, nullable=False),
    Column("backlog_bytes", BigInteger, nullable=False),
)

attribute = Table(
    "attribute", metadata,
    Column("topic_id", BigInteger, primary_key=True),
    Column("ledger_id", BigInteger, primary_key=True),
    Column("key", Text, primary_key=True),
    Column("value", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("version", BigInteger, nullable=False),
)

job_run = Table(
    "job_run", metadata,
    Column("run_id", BigInteger, primary_key=True),
    Column("job", Text, nullable=False),
    Column("topic", Text),
    Column("status", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True)),
    Column("items_done", BigInteger, nullable=False),
    Column("items_failed", BigInteger, nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("error", Text),
    Column("details", JSONB),
    Column("kind", Text),  # migration 0002: offload_by_age, offload_prefix, ... and the Airflow run
    Column("dag_id", Text),
    Column("dag_run_id", Text),
    Column("try_number", Integer),
)

gc_sweep = Table(  # 0005: the orphan sweep's listing cursor (metadata/gc_sweep.py)
    "gc_sweep", metadata,
    Column("bucket", Text, primary_key=True),
    Column("prefix", Text, primary_key=True),
    Column("cursor", Text, nullable=False),
    Column("pass_started_at", DateTime(timezone=True)),
    Column("last_pass_completed_at", DateTime(timezone=True)),
    Column("passes_completed", BigInteger, nullable=False),
    Column("pages_listed", BigInteger, nullable=False),
    Column("orphans_deleted", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("version", BigInteger, nullable=False),
)

subscription = Table(  # 0006
    "subscription", metadata,
    Column("subscription_id", BigInteger, primary_key=True),
    Column("topic_id", BigInteger, nullable=False),
    Column("name", Text, nullable=False),
    Column("ack_ledger_id", BigInteger),
    Column("ack_entry_id", BigInteger),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("last_ack_at", DateTime(timezone=True)),
    Column("entries_deleted_unread", BigInteger, nullable=False),
    Column("bytes_deleted_unread", BigInteger, nullable=False),
    Column("last_loss_at", DateTime(timezone=True)),
    Column("last_loss_reason", Text),
    Column("version", BigInteger, nullable=False),
)

subscription_loss = Table(  # 0006
    "subscription_loss", metadata,
    Column("loss_id", BigInteger, primary_key=True),
    Column("subscription_id", BigInteger, nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("reason", Text, nullable=False),
    Column("from_ledger_id", BigInteger, nullable=False),
    Column("from_entry_id", BigInteger, nullable=False),
    Column("to_ledger_id", BigInteger, nullable=False),
    Column("to_entry_id", BigInteger, nullable=False),
    Column("entries", BigInteger, nullable=False),
    Column("bytes", BigInteger, nullable=False),
)

topic_tombstone = Table(  # 0006
    "topic_tombstone", metadata,
    Column("name", Text, primary_key=True),
    Column("next_ledger_id", BigInteger, nullable=False),
    Column("trim_marker_written", BigInteger, nullable=False),
    Column("deleted_at", DateTime(timezone=True), nullable=False),
    Column("version", BigInteger, nullable=False),  # 0015: the deleted topic's last version (-1: not known)
)

topic_table = Table(  # 0008: a topic's Iceberg table policy and sync state (metadata/table_sync.py)
    "topic_table", metadata,
    Column("topic_id", BigInteger, primary_key=True),
    Column("identifier", Text, nullable=False),
    Column("retention", Text, nullable=False),
    Column("decoder", JSONB),
    Column("synced_through", BigInteger, nullable=False),
    Column("trimmed_through", BigInteger, nullable=False),
    Column("ledgers_committed", BigInteger, nullable=False),
    Column("entries_committed", BigInteger, nullable=False),
    Column("snapshot_id", BigInteger),
    Column("metadata_location", Text),
    Column("synced_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("version", BigInteger, nullable=False),
)

# The Iceberg SQL catalog's tables (0014; pyiceberg's and the JDBC catalog's layout), unqualified like
# pyiceberg's own: they are found through the search_path. Other catalogs may keep rows in them: the product's
# rows are those of catalog ICEBERG_CATALOG (a metadata export carries those only).
ICEBERG_CATALOG = "tiering"
catalog_metadata = MetaData()

iceberg_namespace_properties = Table(
    "iceberg_namespace_properties", catalog_metadata,
    Column("catalog_name", String(255), primary_key=True),
    Column("namespace", String(255), primary_key=True),
    Column("property_key", String(255), primary_key=True),
    Column("property_value", String(1000), nullable=False),
)

iceberg_tables = Table(
    "iceberg_tables", catalog_metadata,
    Column("catalog_name", String(255), primary_key=True),
    Column("table_namespace", String(255), primary_key=True),
    Column("table_name", String(255), primary_key=True),
    Column("metadata_location", String(1000)),
    Column("previous_metadata_location", String(1000)),
    Column("iceberg_type", String(5)),
)


def chunk_values(ch) -> dict:
    """A tiering.model.Chunk's values as a chunk row's columns (its key and version aside)."""
    return {"data_key": ch.data_key, "data_offset": ch.data_offset, "data_length": ch.data_length,
            "index_key": ch.index_key, "index_offset": ch.index_offset, "index_length": ch.index_length,
            "first_entry_id": ch.first_entry_id, "last_entry_id": ch.last_entry_id, "data_etag": ch.data_etag,
            "index_etag": ch.index_etag}
