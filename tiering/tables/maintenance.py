"""Table maintenance: compact a partition's small data files into one, and expire old snapshots.

Compaction reads the rows of a partition's small files and writes them back as one file in one overwrite
commit whose filter is the files' ledger ids: a ledger's rows are all in one file (files.py), so exactly the
rows read are replaced. The commit asserts the table's current snapshot (pyiceberg adds that requirement),
so a sync or a retention delete committed meanwhile makes it fail and nothing changes; the sync's own
commits are retried over a maintenance commit (sync.py). Snapshot expiry removes old snapshots from the
metadata (never the current one); it does not delete their files (pyiceberg 0.12 has no orphan-file
removal; the files stay until one is added)."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from tiering.model import MIB
from tiering.tables.naming import encode_ledgers

SUMMARY_COMPACTED = "tiering.compacted-ledgers"


@dataclass
class MaintenanceReport:
    table: str
    partitions_compacted: int = 0
    files_before: int = 0
    files_after: int = 0
    snapshots_expired: int = 0
    errors: list[str] = field(default_factory=list)


def small_file_groups(table, small_bytes: int, min_files: int, max_bytes: int) -> list[list]:
    """Per partition, its files smaller than `small_bytes`, in groups of at least `min_files` and at most
    `max_bytes` together."""
    by_partition: dict = {}
    for task in table.scan().plan_files():
        f = task.file
        if f.file_size_in_bytes < small_bytes:
            by_partition.setdefault(repr(f.partition), []).append(f)
    groups = []
    for files in by_partition.values():
        files.sort(key=lambda f: f.file_path)
        cur, size = [], 0
        for f in files:
            if cur and size + f.file_size_in_bytes > max_bytes:
                groups.append(cur)
                cur, size = [], 0
            cur.append(f)
            size += f.file_size_in_bytes
        groups.append(cur)
    return [g for g in groups if len(g) >= min_files]


def _ledger_ids(table, files) -> list[int]:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    ids: set[int] = set()
    for f in files:
        with table.io.new_input(f.file_path).open() as stream:
            col = pq.read_table(stream, columns=["ledger_id"])["ledger_id"]
            ids.update(pc.unique(col).to_pylist())
    return sorted(ids)


def compact(table, small_bytes: int = 32 * MIB, min_files: int = 4, max_bytes: int = 256 * MIB,
            report: MaintenanceReport | None = None) -> MaintenanceReport:
    from pyiceberg.expressions import In

    report = report or MaintenanceReport(".".join(table.name()))
    for files in small_file_groups(table, small_bytes, min_files, max_bytes):
        ids = _ledger_ids(table, files)
        rows = table.scan(row_filter=In("ledger_id", ids)).to_arrow().sort_by([("ledger_id", "ascending"),
                                                                              ("entry_id", "ascending")])
        tx = table.transaction()
        tx.overwrite(rows, overwrite_filter=In("ledger_id", ids),
                     snapshot_properties={SUMMARY_COMPACTED: encode_ledgers(ids)})
        tx.commit_transaction()
        table = table.refresh()
        report.partitions_compacted += 1
        report.files_before += len(files)
        report.files_after += 1
    return report


def expire_snapshots(table, older_than: timedelta, report: MaintenanceReport | None = None) -> MaintenanceReport:
    report = report or MaintenanceReport(".".join(table.name()))
    cutoff = datetime.now(timezone.utc) - older_than
    before = len(table.snapshots())
    table.maintenance.expire_snapshots().older_than(cutoff).commit()
    report.snapshots_expired += before - len(table.refresh().snapshots())
    return report


def maintain_topic(sync, state, expire_after: timedelta, small_bytes: int = 32 * MIB,
                   min_files: int = 4) -> MaintenanceReport:
    """Compact and expire a topic's table under the topic's sync lock (a sync waits for the next run), then
    bring the row's metadata location up to date. A topic whose table does not exist yet is left alone."""
    from tiering.metadata.table_sync import exclusive

    report = MaintenanceReport(state.identifier)
    with exclusive(sync.engine, state.topic_id) as held:
        if not held:
            report.errors.append("a sync of this topic is running; maintenance waits for the next run")
            return report
        if not sync.catalog.table_exists(state.identifier):
            return report
        try:
            table = sync.catalog.load_table(state.identifier)
            compact(table, small_bytes, min_files, report=report)
            expire_snapshots(table.refresh(), expire_after, report=report)
            sync.reconcile(sync.rows.get(state.topic), sync.catalog.load_table(state.identifier))
        except Exception as exc:  # noqa: BLE001 - this table failed; the others go on
            report.errors.append(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
    return report
