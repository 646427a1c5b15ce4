"""Spark job: Parquet snapshot of the `tiering` tables. Spark reads each table over JDBC (Debian's driver
locally, `--packages org.postgresql:postgresql` on a cluster) and executors write the parts with pyarrow
(locally or to S3 without s3a); the driver writes the manifest last.

Consistency: the driver opens a REPEATABLE READ transaction and exports its snapshot; every JDBC session
adopts it (`SET TRANSACTION SNAPSHOT` as the session's init statement), so all tables are read as of one
instant even while the pipeline runs.

The location (tiering/ops/export_location.py): a complete export there is refused unless `--overwrite`
(its manifest then goes first); parts carry this export's id in their names and Parquet metadata, which
the driver checks before the manifest; an executor that does not see a local destination writes nothing
and says so; a failed run removes its parts. Airflow's retry of a failed run finds no manifest and exports
again into the same location.
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

from tiering import clients
from tiering.config import Settings
from tiering.errors import TieringError
from tiering.metadata.job_runs import JobOutcome
from tiering.model import check_export_location
from tiering.ops import export_metadata as ex
from tiering.ops.export_location import claim, discard, new_export_id, only_writer, release


def default_dest(settings: Settings, now: datetime) -> str:
    # Not under the tier-2 prefix: GC's orphan sweep owns everything there.
    return f"s3://{settings.bucket}/{ex.default_export_prefix(settings.prefix)}{now:%Y%m%dT%H%M%SZ}"


def jdbc_options(settings: Settings) -> dict[str, str]:
    from tiering.spark.sql import jdbc_url

    url, user, password = jdbc_url(settings.database_url)
    return {"url": url, "user": user, "password": password, "driver": "org.postgresql.Driver", "fetchsize": "10000"}


def _write_partitions(settings: Settings, dest: str, table: str, export_id: str):
    def write(batches):
        import socket

        import pyarrow as pa
        from pyspark import TaskContext

        from tiering.ops.export_location import ExportNotShared, check_shared

        fs, base = ex.filesystem_for(dest, settings)
        try:
            check_shared(fs, base, export_id, socket.gethostname())
        except ExportNotShared as exc:  # reported to the driver, which fails the run with this sentence
            yield pa.RecordBatch.from_pylist([{"path": None, "rows": -1, "sha256": None, "error": str(exc)}],
                                             schema=_result_schema())
            return
        batches = list(batches)  # one partition of a metadata table: bounded by Spark's partitioning
        data = pa.Table.from_batches(batches) if batches else ex.arrow_schema(table).empty_table()
        part_no = TaskContext.get().partitionId()
        part = ex.write_part(fs, base, table, part_no, data, export_id)
        yield pa.RecordBatch.from_pylist([{"path": part.path, "rows": part.rows, "sha256": part.sha256, "error": None}],
                                         schema=_result_schema())
    return write


def _result_schema():
    import pyarrow as pa

    return pa.schema([("path", pa.string()), ("rows", pa.int64()), ("sha256", pa.string()), ("error", pa.string())])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tiering-export-metadata")
    p.add_argument("--dest", help="s3://bucket/path or a local path")
    p.add_argument("--overwrite", action="store_true", help="replace a complete export at DEST (its manifest "
                                                             "is deleted first)")
    p.add_argument("--topic", help="ignored: an export is always of every table")
    args = p.parse_args(argv)

    from tiering.jobs.runner import failure_line, load_settings, recorded, run_ref

    settings = load_settings("export_metadata")
    if settings is None:
        return 2
    engine = clients.engine(settings, pool_size=1)

    def body(outcome: JobOutcome, run_id: int) -> None:
        try:
            _export(settings, engine, args, run_id, outcome)
        except Exception as exc:  # noqa: BLE001 - the error inside a Spark failure, not its JVM trace
            outcome.errors.append(str(exc) if isinstance(exc, TieringError) else failure_line(exc))

    return recorded("export_metadata", run_ref("export_metadata"), None, engine, body)


def _export(settings: Settings, engine, args, run_id: int, outcome: JobOutcome) -> None:
    """Hold the location, claim it, write every table's parts from one snapshot, then the manifest; a
    failure removes this run's parts while the location is still held."""
    from tiering.jobs.runner import spark_session

    spark = spark_session("tiering-export-metadata", outcome)
    # the CLI's rule: GC's orphan sweep would delete an export written under the tier-2 prefix
    dest = check_export_location(args.dest or default_dest(settings, datetime.now(timezone.utc)), settings.bucket,
                                 settings.prefix)
    fs, base = ex.filesystem_for(dest, settings)
    export_id = f"{run_id}-{new_export_id()[:8]}"
    with only_writer(engine, fs, base):
        claim(fs, base, export_id, args.overwrite)
        outcome.details.update(dest=dest, export_id=export_id)
        try:
            manifest = _write(spark, settings, engine, fs, base, dest, export_id, outcome)
        except BaseException:
            outcome.details["parts_removed"] = discard(fs, base, export_id)
            raise
        release(fs, base, export_id)
    outcome.details.update(tables={t: m.rows for t, m in manifest.tables.items()})


def _write(spark, settings: Settings, engine, fs, base: str, dest: str, export_id: str, outcome: JobOutcome):
    opts = jdbc_options(settings)
    with engine.connect() as snap_conn:  # held open: the snapshot lives as long as its transaction
        snap_conn.exec_driver_sql("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        snapshot = snap_conn.exec_driver_sql("SELECT pg_export_snapshot()").scalar_one()
        init = f"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; SET TRANSACTION SNAPSHOT '{snapshot}'"
        parts = {}
        for table in ex.table_names():
            df = (spark.read.format("jdbc").options(**opts).option("query", ex.jdbc_query(table))
                  .option("sessionInitStatement", init).load())
            written = df.mapInArrow(_write_partitions(settings, dest, table, export_id),
                                    "path string, rows long, sha256 string, error string").collect()
            refused = sorted({r["error"] for r in written if r["error"]})
            if refused:
                raise TieringError(refused[0])
            parts[table] = sorted((ex.PartFile(r["path"], r["rows"], r["sha256"]) for r in written),
                                  key=lambda f: f.path)
            outcome.items_done += sum(f.rows for f in parts[table])
        manifest = ex.build_manifest(snap_conn, parts, export_id=export_id, bucket=settings.bucket)
        outcome.details["schemas"] = ex.schemas(snap_conn)  # where each table is, for lineage
    ex.write_manifest(fs, base, manifest)
    return manifest


if __name__ == "__main__":
    sys.exit(main())
