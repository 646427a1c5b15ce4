"""The `tiering` Spark source scanning offloaded ledgers, against `tiering verify` in one process
and a raw GET of the same objects, as ratios.

Writes --size-mib of ledgers (default 1 GiB in 16 ledgers: ~90 s in all on this shared 2-core machine)
in --ledgers ledgers, offloads them and drops their tier-1 copies, then times, on the same objects:
  raw GET      every data object fetched whole, 4 GETs in flight, bytes discarded (no check): the floor;
  verify       `tiering verify TOPIC` in one process (reads every entry, checks every page);
  count(*)     spark.read.format("tiering")...count() on local[2] (every page read and CRC-checked);
  filter       the same with a filter on payload (a byte pattern no entry has): every payload to Spark;
  no payload   count(*) with option payload=false (metadata only: the Python Data Source API of pyspark
               4.2 has no column pruning, so this option is how a count skips the bytes).
The Spark session's start-up (~7 s) is not in the Spark figures; each Spark figure is its first run.
Writes bench/results/spark_source.{md,json}.

    set -a; . .local/env; set +a
    PYSPARK_PYTHON=.venv/bin/python SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python bench/bench_spark_source.py
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import MIB, PREFIX, ROOT, Env, endpoint, endpoint_kind, loadavg, machine, rnd  # noqa: E402
from tiering.config import Settings  # noqa: E402
from tiering.model import LedgerState  # noqa: E402
from tiering.ops.offload import offload_many  # noqa: E402


def build(env: Env, size_mib: int, ledgers: int, entry_size: int):
    topic, leds, _ = env.write_ledgers("spark", ledgers, size_mib * MIB // ledgers, entry_size)
    report = offload_many(env.deps, leds)
    assert len(report.offloaded) == ledgers, report.failed
    for led in env.deps.meta.list_ledgers(topic, [LedgerState.OFFLOADED]):
        env.deps.tier1.delete(topic, led.ledger_id)
        env.deps.meta.mark_tier1_deleted(led)
    return topic, list(env.deps.meta.chunks(topic).values())


def raw_get(env: Env, chunks) -> tuple[float, int]:
    def get(ch):
        body = env.s3.get_object(Bucket=env.bucket, Key=ch.data_key,
                                 Range=f"bytes={ch.data_offset}-{ch.data_offset + ch.data_length - 1}")["Body"]
        n = 0
        for part in body.iter_chunks(1 << 20):
            n += len(part)
        return n

    t = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        n = sum(pool.map(get, chunks))
    return time.perf_counter() - t, n


def verify(env: Env, topic: str) -> float:
    t = time.perf_counter()
    subprocess.run([str(ROOT / ".venv/bin/tiering"), "verify", topic], env=env.job_env(), check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def spark_cases(env: Env, topic: str) -> dict:
    from pyspark.sql import SparkSession

    from tiering.spark import register

    settings = Settings.from_env(env.job_env())
    spark = (SparkSession.builder.master("local[2]").appName("bench-spark-source")
             .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC").getOrCreate())
    try:
        register(spark, settings)
        out = {}

        def timed(name, fn):
            t = time.perf_counter()
            value = fn()
            out[name] = {"seconds": rnd(time.perf_counter() - t, 2), "result": value}

        df = spark.read.format("tiering").option("topic", topic).load()
        out["partitions"] = df.rdd.getNumPartitions()
        timed("count", lambda: df.count())
        timed("filter", lambda: df.where("hex(substring(payload, 1, 4)) = 'FFFEFDFC'").count())
        timed("no_payload", lambda: spark.read.format("tiering").option("topic", topic)
              .option("payload", "false").load().count())
        return out
    finally:
        spark.stop()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--ledgers", type=int, default=16)
    p.add_argument("--entry-size", type=int, default=16 * 1024)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args()
    t0 = time.perf_counter()
    with endpoint(False) as url:
        env = Env(url)
        try:
            topic, chunks = build(env, args.size_mib, args.ledgers, args.entry_size)
            raw_s, nbytes = raw_get(env, chunks)
            verify_s = verify(env, topic)
            spark = spark_cases(env, topic)
            kind = endpoint_kind(env, False)
        finally:
            env.close()
    size = nbytes / MIB
    result = {"size_mib": rnd(size), "ledgers": args.ledgers, "entry_size": args.entry_size,
              "raw_get_s": rnd(raw_s, 2), "verify_s": rnd(verify_s, 2), "spark": spark,
              "endpoint": kind, "machine": machine(), "loadavg": loadavg(),
              "seconds": rnd(time.perf_counter() - t0)}
    rows = [("raw GET (4 in flight, no check)", raw_s), ("tiering verify, one process", verify_s),
            ("Spark count(*), local[2]", spark["count"]["seconds"]),
            ("Spark filter on payload, local[2]", spark["filter"]["seconds"]),
            ("Spark count(*) payload=false", spark["no_payload"]["seconds"])]
    md = (f"### Spark source scan: {rnd(size)} MiB in {args.ledgers} offloaded ledgers, "
          f"{args.entry_size // 1024} KiB entries, {spark['partitions']} partitions\n\n"
          f"Endpoint: {kind}. Load average at the end: {result['loadavg']}.\n\n"
          "| case | seconds | MiB/s | vs raw GET | vs verify |\n|---|---|---|---|---|\n")
    for name, s in rows:
        md += (f"| {name} | {rnd(s, 2)} | {rnd(size / s) if s else '-'} | {rnd(s / raw_s, 2)} | "
               f"{rnd(s / verify_s, 2)} |\n")
    md += "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spark_source.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    md += f"Run time: {result['seconds']} s. Command: `.venv/bin/python bench/bench_spark_source.py --size-mib {args.size_mib}`.\n"
    (out / "spark_source.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    sys.exit(main())
