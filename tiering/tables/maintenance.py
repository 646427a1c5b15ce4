"""Table maintenance: compact a partition's small data files into one, and expire old snapshots.

Compaction reads the rows of a partition's small files and writes them back as one file in one overwrite
snapshot that removes exactly those files and adds the new one. The commit asserts the table's current
snapshot (pyiceberg adds that requirement), so a sync or a retention delete committed meanwhile makes it fail
and nothing changes; the sync's own commits are retried over a maintenance commit (sync.py). Snapshot expiry
removes old snapshots from the metadata (never the current one). Orphan removal then deletes the files under
the table's location that no remaining snapshot or metadata file references and that are older than a grace
(files of expired snapshots, of compacted-away files, of runs killed before their commit), as GC's sweep does
for tier 2: the grace keeps a running sync's files, written before its commit, out of reach."""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from tiering.errors import BadInput, TableUnreadable, TieringError
from tiering.model import MIB
from tiering.tables.naming import DLQ_SUFFIX, PROP_TOPIC, encode_ledgers, rebuild_hint

SUMMARY_COMPACTED = "tiering.compacted-ledgers"


@dataclass
class MaintenanceReport:
    table: str
    partitions_compacted: int = 0
    files_before: int = 0
    files_after: int = 0
    snapshots_expired: int = 0
    orphans_deleted: int = 0
    errors: list[str] = field(default_factory=list)
    skipped: str | None = None  # why nothing was done, when another worker does it


def small_file_groups(table, small_bytes: int, min_files: int, max_bytes: int) -> list[list]:
    """Per partition, its files smaller than `small_bytes`, in groups of at least `min_files` and at most
    `max_bytes` together."""
    by_partition: dict = {}
    for task in table.scan().plan_files():  # the scan tasks: a file with the delete files that apply to it
        if task.file.file_size_in_bytes < small_bytes:
            by_partition.setdefault(repr(task.file.partition), []).append(task)
    groups = []
    for tasks in by_partition.values():
        tasks.sort(key=lambda t: t.file.file_path)
        cur, size = [], 0
        for t in tasks:
            if cur and size + t.file.file_size_in_bytes > max_bytes:
                groups.append(cur)
                cur, size = [], 0
            cur.append(t)
            size += t.file.file_size_in_bytes
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
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files

    report = report or MaintenanceReport(".".join(table.name()))
    for tasks in small_file_groups(table, small_bytes, min_files, max_bytes):
        files = [t.file for t in tasks]
        ids = _ledger_ids(table, files)
        # exactly the rows of the group's files, replaced by one file in ONE snapshot: pyiceberg's
        # overwrite commits a delete snapshot and then an append one, so a reader of the first saw the table
        # without these rows, and an incremental reader took the second as new rows
        rows = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue()).to_table(tasks).sort_by(
            [("ledger_id", "ascending"), ("entry_id", "ascending")])
        tx = table.transaction()
        with tx.update_snapshot(snapshot_properties={SUMMARY_COMPACTED: encode_ledgers(ids)}).overwrite() as rewrite:
            for f in files:
                rewrite.delete_data_file(f)
            for f in _dataframe_to_data_files(tx.table_metadata, rows, table.io, write_uuid=rewrite.commit_uuid):
                rewrite.append_data_file(f)
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


def referenced_files(table) -> set[str]:
    """Every file the table's metadata reaches: metadata files (current and logged), and per snapshot its
    manifest list, manifests and their data and delete files (deleted entries too: an older snapshot
    still reads them)."""
    refs = {table.metadata_location, *(m.metadata_file for m in table.metadata.metadata_log)}
    for snap in table.snapshots():
        refs.add(snap.manifest_list)
        for manifest in snap.manifests(table.io):
            refs.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                refs.add(entry.data_file.file_path)
    for stats in table.metadata.statistics:
        refs.add(stats.statistics_path)
    return refs


def listed_files(table, settings) -> list[tuple[str, datetime | None]]:
    """Every file under the table's location, as (URI as the manifests spell it, modification time): one
    listing (a request per 1,000 files) that the data-file check, the orphan removal and their preview share."""
    import pyarrow.fs as pafs

    from tiering.tables.files import s3_filesystem_for

    location = table.location().rstrip("/")
    fs, base = s3_filesystem_for(settings)(location)
    scheme = location.split("://", 1)[0]
    return [(f"{scheme}://{info.path}", info.mtime)
            for info in fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
            if info.type == pafs.FileType.File]


def check_data_files(table, listing: list[tuple[str, datetime | None]]) -> None:
    """TableUnreadable when a data file the current snapshot reads is not in `listing` (the table's location,
    from `listed_files`) any more: deleted by hand, or by a tool sharing the location; a scan of the table
    would fail on it. Compared with the manifests' live entries."""
    if table.current_snapshot() is None:
        return
    gone = sorted({task.file.file_path for task in table.scan().plan_files()} - {uri for uri, _ in listing})
    if gone:
        topic = table.properties.get(PROP_TOPIC, "TOPIC")
        raise TableUnreadable(f"table {'.'.join(table.name())!r} cannot be read: {len(gone)} data file(s) of its "
                              f"current snapshot are gone (the first: {gone[0]}); {rebuild_hint(topic)}")


def _orphans(table, listing, grace: timedelta, also_referenced: set[str] = frozenset()) -> list[str]:
    """The listed files nothing references and that are older than `grace` (a file a writer is making is
    not referenced yet)."""
    refs = referenced_files(table) | set(also_referenced)
    cutoff = datetime.now(timezone.utc) - grace
    return [uri for uri, mtime in listing if mtime is not None and mtime < cutoff and uri not in refs]


def remove_orphans(table, settings, grace: timedelta, report: MaintenanceReport | None = None,
                   listing: list[tuple[str, datetime | None]] | None = None) -> MaintenanceReport:
    """Delete the files under the table's location that nothing references and that are older than
    `grace`. `listing` is the location's listing when the caller has one at hand."""
    from tiering.tables.files import s3_filesystem_for

    report = report or MaintenanceReport(".".join(table.name()))
    listing = listed_files(table, settings) if listing is None else listing
    fs, _ = s3_filesystem_for(settings)(table.location().rstrip("/"))
    for uri in _orphans(table, listing, grace):
        fs.delete_file(uri.split("://", 1)[1])
        report.orphans_deleted += 1
    return report


def preview(table, settings, expire_after: timedelta, small_bytes: int, min_files: int, orphan_grace: timedelta,
            report: MaintenanceReport, also_referenced: set[str] = frozenset(),
            listing: list[tuple[str, datetime | None]] | None = None) -> None:
    """What compact, expire_snapshots and remove_orphans would do to `table`, counted; nothing written.
    Orphans are counted against today's references (files an expiry would release are not counted)."""
    for files in small_file_groups(table, small_bytes, min_files, 256 * MIB):
        report.partitions_compacted += 1
        report.files_before += len(files)
        report.files_after += 1
    cutoff = datetime.now(timezone.utc) - expire_after
    kept = {ref.snapshot_id for ref in table.metadata.refs.values()}
    report.snapshots_expired += sum(1 for snap in table.snapshots() if snap.snapshot_id not in kept
                                    and snap.timestamp_ms < cutoff.timestamp() * 1000)
    listing = listed_files(table, settings) if listing is None else listing
    report.orphans_deleted += len(_orphans(table, listing, orphan_grace, also_referenced))


def maintain_topic(sync, state, expire_after: timedelta, small_bytes: int = 32 * MIB,
                   min_files: int = 4, orphan_grace: timedelta = timedelta(days=1),
                   dry_run: bool = False) -> MaintenanceReport:
    """Compact and expire a topic's table under the topic's sync lock (a sync running waits for it), then
    bring the row's metadata location up to date. A topic whose table does not exist yet is left alone."""
    from tiering.metadata.table_sync import turn
    from tiering.tables.catalog import owner_problem
    from tiering.tables.marks import check_marks, dropped, gone_file
    from tiering.tables.sync import SUMMARY_DLQ_FILES

    report = MaintenanceReport(state.identifier)
    # a preview writes nothing: it takes no turn, so no real maintenance meeting it reports "skipped"
    with nullcontext("held") if dry_run else \
            turn(sync.engine, state.topic_id, sync.limits.wait_seconds, maintenance=True) as got:
        if got == "taken":
            report.skipped = "another maintenance of this table is running: it does the work"
            return report
        if got == "busy":
            report.errors.append(f"a sync of this topic ran on past the {sync.limits.wait_seconds:g} s a "
                                 "maintenance waits for it: nothing done; rerun when it has ended")
            return report
        try:
            now = sync.rows.held(state.topic, state.topic_id, "nothing done")  # re-read under the lock
            if not sync.catalog.table_exists(state.identifier):
                if why := dropped(state):
                    report.errors.append(why)
                return report
            table = sync.catalog.load_table(state.identifier)
            # nothing is compacted, expired or deleted in a table that is not this topic's (made by another
            # tool under the name: its snapshots and unreferenced files are its own) or that holds less than
            # the row says (replaced behind the store's back)
            problem = owner_problem(table, state.topic, state.topic_id)
            if problem is not None:
                raise BadInput(f"table {state.identifier!r} {problem}")
            check_marks(now, table)
            listing = listed_files(table, sync.settings)  # the check and the orphan removal share it
            check_data_files(table, listing)  # a table with a hole is rebuilt, not maintained
            dlq = state.identifier + DLQ_SUFFIX
            if dry_run:  # the counts of what it would do; the dead letters a killed sync left count as kept
                preview(table, sync.settings, expire_after, small_bytes, min_files, orphan_grace, report,
                        listing=listing)
                if sync.catalog.table_exists(dlq):
                    pending = {f for s in table.snapshots() if s.summary
                               for f in s.summary.additional_properties.get(SUMMARY_DLQ_FILES, "").split(",") if f}
                    preview(sync.catalog.load_table(dlq), sync.settings, expire_after, 0, min_files, orphan_grace,
                            report, pending)
                return report
            if sync.catalog.table_exists(dlq):
                # dead letters a killed sync left uncommitted are referenced only by the table's summaries:
                # commit them before those can expire and before the orphan removal looks at their files
                sync.catch_up_dlq(table, sync.catalog.load_table(dlq))
            # the row counts a killed sync's commits from their snapshot summaries: catch it up before the
            # expiry can remove those snapshots
            sync.reconcile(sync.rows.get(state.topic), table)
            compact(table, small_bytes, min_files, report=report)
            expire_snapshots(table.refresh(), expire_after, report=report)
            # files written since the listing are newer than any grace: the listing leaves nothing out
            remove_orphans(table.refresh(), sync.settings, orphan_grace, report=report, listing=listing)
            if sync.catalog.table_exists(dlq):  # the dead letters: expiry and orphans (they are few)
                expire_snapshots(sync.catalog.load_table(dlq), expire_after, report=report)
                remove_orphans(sync.catalog.load_table(dlq), sync.settings, orphan_grace, report=report)
            sync.reconcile(sync.rows.get(state.topic), sync.catalog.load_table(state.identifier))
        except TieringError as exc:  # its own sentence (a table not the product's, one that cannot be read)
            report.errors.append(str(exc))
        except Exception as exc:  # noqa: BLE001 - this table failed; the others go on
            report.errors.append(gone_file(exc, state.topic) or
                                 f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}")
    return report
