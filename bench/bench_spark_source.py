"""The `tiering` Spark source scanning offloaded ledgers, against `tiering verify` in one process
and a raw GET of the same objects, as ratios.

Writes --size-mib of ledgers (default 1 GiB in 16 ledgers) in --ledgers ledgers, offloads them and drops
their tier-1 copies, then times, on the same objects:
  raw GET      every data object fetched whole, 4 GETs in flight, bytes discarded (no check): the floor;
  verify       `tiering verify TOPIC` in one process (reads every entry, checks every page; the process's
               start and imports included);
  count(*)     spark.read.format("tiering")...count() on local[2] (every page read and CRC-checked);
  filter       the same with a filter on payload (a byte pattern no entry has): every payload to Spark;
  no payload   count(*) with option payload=false (metadata only: the Python Data Source API of pyspark
               4.2 has no column pruning, so this option is how a count skips the bytes).
The Spark session's start-up and a warm-up query (a first count(*): the Python workers' start and
imports, the JVM's first pass over Arrow) are not in the Spark figures, but reported. The machine is shared: verify and the Spark cases are interleaved
over --rounds rounds and each figure is the median, with the load average before and after.
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

from benchkit import MIB, ROOT, Env, endpoint, endpoint_kind, loadavg, machine, median, rnd  # noqa: E402
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


def session():
    from pyspark.sql import SparkSession

    return (SparkSession.builder.master("local[2]").appName("bench-spark-source")
            .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC").getOrCreate())


def rounds(env: Env, topic: str, n: int) -> dict:
    """Warm-up, then n rounds of verify, count(*), payload filter, payload=false, interleaved."""
    from tiering.spark import register

    spark = session()
    try:
        register(spark, Settings.from_env(env.job_env()))
        load = spark.read.format("tiering").option("topic", topic).load
        out: dict = {"partitions": load().rdd.getNumPartitions()}
        t = time.perf_counter()
        # A first full scan: starts the Python workers (imports, clients) and warms the JVM's Arrow path,
        # which on this machine made any first scan 3-15x slower, a synthetic in-memory source's included.
        out["warmup_rows"] = load().count()
        out["warmup_s"] = rnd(time.perf_counter() - t, 2)
        cases = {"verify": lambda: verify(env, topic),
                 "count": lambda: load().count(),
                 "filter": lambda: load().where("hex(substring(payload, 1, 4)) = 'FFFEFDFC'").count(),
                 "no_payload": lambda: spark.read.format("tiering").option("topic", topic)
                 .option("payload", "false").load().count()}
        times: dict = {k: [] for k in cases}
        for _ in range(n):
            for name, fn in cases.items():
                t = time.perf_counter()
                value = fn()
                times[name].append(time.perf_counter() - t)
                if name != "verify":
                    out[f"{name}_rows"] = value
        for name, xs in times.items():
            out[name] = {"median_s": rnd(median(xs), 2), "runs_s": [rnd(x, 2) for x in xs]}
        return out
    finally:
        spark.stop()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--ledgers", type=int, default=16)
    p.add_argument("--entry-size", type=int, default=16 * 1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args()
    t0 = time.perf_counter()
    with endpoint(False) as url:
        env = Env(url)
        try:
            topic, chunks = build(env, args.size_mib, args.ledgers, args.entry_size)
            raw_s, nbytes = raw_get(env, chunks)
            load_before = loadavg()
            got = rounds(env, topic, args.rounds)
            kind = endpoint_kind(env, False)
        finally:
            env.close()
    size = nbytes / MIB
    verify_s = got["verify"]["median_s"]
    result = {"size_mib": rnd(size), "ledgers": args.ledgers, "entry_size": args.entry_size,
              "raw_get_s": rnd(raw_s, 2), "spark": got, "endpoint": kind, "machine": machine(),
              "loadavg_before": load_before, "loadavg_after": loadavg(), "seconds": rnd(time.perf_counter() - t0)}
    rows = [("raw GET (4 in flight, no check)", raw_s), ("tiering verify, one process", verify_s),
            ("Spark count(*), local[2]", got["count"]["median_s"]),
            ("Spark filter on payload, local[2]", got["filter"]["median_s"]),
            ("Spark count(*) payload=false", got["no_payload"]["median_s"])]
    md = (f"### Spark source scan: {rnd(size)} MiB in {args.ledgers} offloaded ledgers, "
          f"{args.entry_size // 1024} KiB entries, {got['partitions']} partitions\n\n"
          f"Endpoint: {kind}. Medians of {args.rounds} interleaved rounds after a warm-up query "
          f"({got['warmup_s']} s). Load average before / after: {load_before} / {result['loadavg_after']}.\n\n"
          "| case | seconds (median) | runs | MiB/s | verify / case |\n|---|---|---|---|---|\n")
    for name, s in rows:
        key = {"tiering verify, one process": "verify", "Spark count(*), local[2]": "count",
               "Spark filter on payload, local[2]": "filter", "Spark count(*) payload=false": "no_payload"}.get(name)
        runs = ", ".join(str(x) for x in got[key]["runs_s"]) if key else "-"
        md += f"| {name} | {rnd(s, 2)} | {runs} | {rnd(size / s) if s else '-'} | {rnd(verify_s / s, 2)} |\n"
    md += "\n"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spark_source.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    md += (f"Run time: {result['seconds']} s. Command: `.venv/bin/python bench/bench_spark_source.py "
           f"--size-mib {args.size_mib} --ledgers {args.ledgers} --rounds {args.rounds}`.\n")
    (out / "spark_source.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    sys.exit(main())
