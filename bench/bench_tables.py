"""Topics as Iceberg tables: the sync's throughput against the `tiering` Spark source's scan of the same
ledgers, a query over the table against the same query through the source, and an idle sync's cost at
1,000 topics with tables.

Writes --size-mib of ledgers (default 256 MiB in 16 ledgers of 16 KiB entries), offloads half of them and
drops those tier-1 copies (a mixed topic), then on local[2] (one Spark session: its start-up is in none of
the figures) times:
  scan         spark.read.format("tiering") count(*) with a filter on payload (every payload to Spark);
  sync         TableSync with the Spark job's writer: executors write the Parquet files, the driver commits;
  table query  the same count and filter over the table: pyiceberg plans the files, pyarrow reads them (Spark
               here has no s3a jars to read the data files itself: ENVIRONMENT.md);
  idle plan    the DAG's plan at 1,000 topics with tables and nothing new: SQL statements and S3 requests.
Writes bench/results/tables.{md,json}.

    set -a; . .local/env; set +a
    PYSPARK_PYTHON=.venv/bin/python SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python bench/bench_tables.py
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import MIB, ROOT, Env, endpoint, endpoint_kind, loadavg, machine, rnd  # noqa: E402
from tiering.config import Settings  # noqa: E402
from tiering.model import LedgerState  # noqa: E402
from tiering.ops.offload import offload_many  # noqa: E402

PATTERN = b"\xff\xfe\xfd\xfc"  # no entry starts with it: every payload is looked at


def build(env: Env, size_mib: int, ledgers: int, entry_size: int) -> str:
    topic, leds, _ = env.write_ledgers("tables", ledgers, size_mib * MIB // ledgers, entry_size)
    report = offload_many(env.deps, leds[: ledgers // 2])
    assert len(report.offloaded) == ledgers // 2, report.failed
    for led in env.deps.meta.list_ledgers(topic, [LedgerState.OFFLOADED]):
        env.deps.tier1.delete(topic, led.ledger_id)
        env.deps.meta.mark_tier1_deleted(led)
    return topic


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--ledgers", type=int, default=16)
    p.add_argument("--entry-size", type=int, default=16 * 1024)
    p.add_argument("--idle-topics", type=int, default=1000)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args()
    from pyspark.sql import SparkSession
    from sqlalchemy import event

    from tiering.jobs.table_sync import spark_writer
    from tiering.metadata.job_runs import JobOutcome
    from tiering.metadata.table_sync import TableRows
    from tiering.spark import register
    from tiering.tables.catalog import catalog
    from tiering.tables.sync import TableSync, due_topics

    t0 = time.perf_counter()
    with endpoint(False) as url:
        env = Env(url)
        try:
            topic = build(env, args.size_mib, args.ledgers, args.entry_size)
            settings = Settings.from_env(env.job_env())
            spark = (SparkSession.builder.master("local[2]").appName("bench-tables")
                     .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC").getOrCreate())
            try:
                register(spark, settings)
                df = spark.read.format("tiering").option("topic", topic).load()
                t = time.perf_counter()
                rows = df.count()
                count_s = time.perf_counter() - t
                t = time.perf_counter()
                matched = df.where("hex(substring(payload, 1, 4)) = 'FFFEFDFC'").count()
                scan_s = time.perf_counter() - t  # one pass with every payload to Spark: the sync's reading
                rows_api = TableRows(env.engine)
                rows_api.set_policy(topic, "bench.tables", "follow")
                cat = catalog(settings)
                sync = TableSync(env.engine, settings, cat)
                write, _ = spark_writer(settings, JobOutcome())
                t = time.perf_counter()
                result = sync.sync_topic(rows_api.get(topic), write)
                sync_s = time.perf_counter() - t
                assert result.status == "synced", result.error
            finally:
                spark.stop()
            import pyarrow.compute as pc

            t = time.perf_counter()
            table = cat.load_table("bench.tables").scan(selected_fields=("payload",)).to_arrow()
            table_rows = table.num_rows
            heads = pc.binary_slice(table["payload"], 0, 4)
            table_matched = pc.sum(pc.equal(heads, PATTERN).cast("int64")).as_py() or 0
            query_s = time.perf_counter() - t
            assert table_rows == rows and table_matched == matched == 0
            for i in range(args.idle_topics):  # topics with tables and nothing new
                name = env.new_topic("idle")
                rows_api.set_policy(name, f"idle.t{i}", "follow")
            statements = []

            def count(*_a, **_k):
                statements.append(1)

            event.listen(env.engine, "before_cursor_execute", count)
            before = env.counter.snapshot()
            t = time.perf_counter()
            due = due_topics(env.engine)
            idle_s = time.perf_counter() - t
            event.remove(env.engine, "before_cursor_execute", count)
            s3_requests = env.counter.snapshot()[0] - before[0]
            assert due == []
            kind = endpoint_kind(env, False)
        finally:
            env.close()
    size = args.size_mib
    res = {"size_mib": size, "ledgers": args.ledgers, "entry_size": args.entry_size, "rows": rows,
           "count_s": rnd(count_s, 2), "scan_s": rnd(scan_s, 2), "sync_s": rnd(sync_s, 2), "sync_vs_scan": rnd(sync_s / scan_s, 2),
           "table_query_s": rnd(query_s, 2), "source_vs_table_query": rnd((count_s + scan_s) / query_s, 2),
           "idle_topics": args.idle_topics, "idle_plan_statements": len(statements),
           "idle_plan_s3_requests": s3_requests, "idle_plan_s": rnd(idle_s, 3), "endpoint": kind,
           "machine": machine(), "loadavg": loadavg(), "seconds": rnd(time.perf_counter() - t0)}
    md = (f"### Iceberg table sync: {size} MiB in {args.ledgers} ledgers (half tier 2 only), "
          f"{args.entry_size // 1024} KiB entries, local[2]\n\nEndpoint: {kind}. Load average at the end: "
          f"{res['loadavg']}.\n\n| case | seconds | MiB/s | ratio |\n|---|---|---|---|\n"
          f"| `tiering` source: filter on payload (one pass, every payload) | {res['scan_s']} | {rnd(size / scan_s)} | 1 |\n"
          f"| `tiering` source: count(*) then the filter | {rnd(count_s + scan_s, 2)} | - | - |\n"
          f"| table sync (Spark writes, driver commits) | {res['sync_s']} | {rnd(size / sync_s)} | "
          f"{res['sync_vs_scan']}x the scan (goal <= 1.5) |\n"
          f"| table query: count + filter (pyiceberg + pyarrow) | {res['table_query_s']} | {rnd(size / query_s)} | "
          f"source {res['source_vs_table_query']}x slower (goal >= 3) |\n\n"
          f"Idle plan at {args.idle_topics} topics with tables: {len(statements)} SQL statement(s), "
          f"{s3_requests} S3 request(s), {res['idle_plan_s']} s.\n\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tables.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    md += f"Run time: {res['seconds']} s. Command: `.venv/bin/python bench/bench_tables.py --size-mib {size}`.\n"
    (out / "tables.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    sys.exit(main())
