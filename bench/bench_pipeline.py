"""Pipeline benchmarks: the Spark jobs, defrag and GC against peers on the same endpoint, in one run.

1. Offload of many small ledgers: the offload Spark application (`spark-submit --master local[2]`, the
   DAG's job) vs the same selection offloaded by one process (`tiering offload-by-age`), run after run,
   alternating who goes first. Both are fresh processes, timed from launch to exit.
2. Per-job fixed overhead: spark-submit of the job with nothing to do (no SparkContext is started) and
   with one ledger, vs the CLI with one ledger.
3. Defrag of many offloaded ledgers of 100 KiB: objects before and after, bytes downloaded, copied
   server-side and written, time; vs a boto3 peer doing the bare data movement (download every data
   object, upload one concatenation with s3transfer; no index objects, no metadata). Every entry is read
   back afterwards.
4. GC throughput: `run_gc` draining queued keys (row locks, reference check, S3 DeleteObjects, dequeue,
   then the orphan sweep of the prefix) vs boto3 `delete_objects` of as many keys; plus the GC pass that
   follows the defrag.

Scratch database, bucket and tier-1 root of its own. Writes bench/results/pipeline.{md,json}.

    set -a; . .local/env; set +a
    .venv/bin/python bench/bench_pipeline.py --quick    # ~3 minutes
    .venv/bin/python bench/bench_pipeline.py            # 2,000 / 1,000 ledgers
    (on TIERING_S3_ENDPOINT_URL, the local Ceph RGW with `make services`; --private-moto for a moto of its own)
"""
from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchkit import (MIB, PREFIX, ROOT, Env, endpoint, endpoint_kind, loadavg, machine, median,  # noqa: E402
                      mib, rnd, save)
from tiering.model import LedgerState  # noqa: E402
from tiering.ops.defrag import defrag  # noqa: E402
from tiering.ops.gc import run_gc  # noqa: E402
from tiering.ops.offload import offload_many  # noqa: E402
from tiering.read import Entry as ReadEntry, ReadHandle  # noqa: E402
from tiering.tier2.objects import list_objects  # noqa: E402
from tiering.tier2.reader import ReaderCaches, tier2_opener  # noqa: E402
from tiering.workload import payload  # noqa: E402

KIB = 1024
FULL = dict(spark_ledgers=2000, spark_runs=2, overhead_runs=3, defrag_ledgers=1000, gc_keys=2000, gc_runs=3)
QUICK = dict(spark_ledgers=200, spark_runs=1, overhead_runs=2, defrag_ledgers=100, gc_keys=500, gc_runs=2)
SMALL_LEDGER = 16 * KIB  # four 4 KiB entries
DEFRAG_LEDGER = 100 * KIB
ENTRY = 4 * KIB
MASTER = "local[2]"


# ------------------------------------------------------------------------------------------ processes

def spark_submit_cmd(job: str, *args: str) -> list[str]:
    """What the DAG's operator runs, with the master fixed (the provider adds the same flags)."""
    cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", MASTER, "--name", f"bench-{job}",
           "--conf", "spark.ui.enabled=false"]
    zipped = ROOT / "build" / "tiering.zip"
    if zipped.exists():
        cmd += ["--py-files", str(zipped)]
    return cmd + [str(ROOT / "tiering" / "jobs" / f"{job}.py"), *args]


def timed(cmd: list[str], env: Env) -> tuple[float, dict]:
    """Wall time of a fresh process from launch to exit, and the JSON summary it printed last."""
    run_env = {**env.job_env(), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
               "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return seconds, (json.loads(lines[-1]) if lines else {})


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tiering", *args]


def offloaded(env: Env, topic: str) -> int:
    return sum(1 for led in env.deps.meta.list_ledgers(topic) if led.state == LedgerState.OFFLOADED)


# ---------------------------------------------------------------------- cases 1 and 2: Spark vs one process

def bench_spark(env: Env, ledgers: int, runs: int) -> dict:
    times: dict[str, list[float]] = {"spark": [], "one_process": []}
    sides = {
        "spark": lambda t: spark_submit_cmd("offload", "--by=age", f"--topic={t}"),
        "one_process": lambda t: cli_cmd("offload-by-age", f"--topic={t}", "--json"),
    }
    for r in range(runs):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            topic, _, _ = env.write_ledgers(f"small-{name}", ledgers, SMALL_LEDGER, ENTRY, offload_after_seconds=0)
            seconds, _summary = timed(sides[name](topic), env)
            done = offloaded(env, topic)
            if done != ledgers:
                raise RuntimeError(f"{name}: {done} of {ledgers} ledgers offloaded")
            times[name].append(seconds)
            print(f"offload {ledgers} small ledgers, {name}: {seconds:.1f} s", flush=True)
        env.reset()
    s, p = median(times["spark"]), median(times["one_process"])
    return {"ledgers": ledgers, "ledger_kib": SMALL_LEDGER // KIB, "runs": runs, "master": MASTER,
            "seconds": {k: [rnd(x, 2) for x in v] for k, v in times.items()},
            "ledgers_per_s": {"spark": rnd(ledgers / s), "one_process": rnd(ledgers / p)},
            "ratio": rnd(p / s, 2)}


def bench_overhead(env: Env, runs: int) -> dict:
    """Fixed cost of a job: nothing to do, and one ledger; the CLI with one ledger for comparison."""
    times: dict[str, list[float]] = {"spark_empty": [], "spark_one": [], "cli_one": []}
    empty = env.new_topic("empty", offload_after_seconds=0)
    for r in range(runs):
        cases = [("spark_empty", None), ("spark_one", "spark"), ("cli_one", "cli")]
        cases = cases[r % 3:] + cases[:r % 3]
        for name, kind in cases:
            if kind is None:
                cmd = spark_submit_cmd("offload", "--by=age", f"--topic={empty}")
            else:
                topic, _, _ = env.write_ledgers(f"one-{kind}", 1, SMALL_LEDGER, ENTRY, offload_after_seconds=0)
                cmd = (spark_submit_cmd("offload", "--by=age", f"--topic={topic}") if kind == "spark"
                       else cli_cmd("offload-by-age", f"--topic={topic}", "--json"))
            seconds, _ = timed(cmd, env)
            if kind is not None and offloaded(env, topic) != 1:
                raise RuntimeError(f"{name}: the ledger was not offloaded")
            times[name].append(seconds)
    out = {k: rnd(median(v), 2) for k, v in times.items()}
    out["runs"] = runs
    out["spark_session_and_executor_s"] = rnd(out["spark_one"] - out["spark_empty"], 2)
    out["spark_over_cli_s"] = rnd(out["spark_one"] - out["cli_one"], 2)
    print(f"per-job overhead: spark-submit with nothing to do {out['spark_empty']} s, with one ledger "
          f"{out['spark_one']} s; CLI with one ledger {out['cli_one']} s", flush=True)
    env.reset()
    return out


# ------------------------------------------------------------------------------------------ case 3: defrag

def count_objects(env: Env) -> tuple[int, int]:
    n = size = 0
    for obj in list_objects(env.deps.bucket):
        n += 1
        size += obj["Size"]
    return n, size


def peer_concat(env: Env, keys: list[str]) -> float:
    """The data movement alone: GET every data object, one upload of their concatenation (s3transfer)."""
    from boto3.s3.transfer import TransferConfig

    t0 = time.perf_counter()
    buf = io.BytesIO()
    for k in keys:
        buf.write(env.s3.get_object(Bucket=env.bucket, Key=k)["Body"].read())
    buf.seek(0)
    cfg = TransferConfig(multipart_threshold=8 * MIB, multipart_chunksize=8 * MIB, max_concurrency=4)
    env.s3.upload_fileobj(buf, env.bucket, "peer/concat", Config=cfg, ExtraArgs={"ChecksumAlgorithm": "CRC32C"})
    seconds = time.perf_counter() - t0
    env.s3.delete_object(Bucket=env.bucket, Key="peer/concat")
    return seconds


def verify_topic(env: Env, topic: str, ledgers: list) -> int:
    """Every entry of the topic from tier 2, byte-exact; returns the entries read."""
    for led in ledgers:
        env.deps.tier1.delete(topic, led.ledger_id)
        env.deps.meta.mark_tier1_deleted(env.deps.meta.get_ledger(topic, led.ledger_id))
    handle = ReadHandle(env.deps.meta, env.deps.tier1, tier2_opener(env.deps.bucket, ReaderCaches.new()))
    per = DEFRAG_LEDGER // ENTRY
    n = 0
    for item in handle.read(topic):
        if not isinstance(item, ReadEntry) or item.data != payload(topic, item.entry_id, ENTRY):
            raise RuntimeError(f"defragged topic reads back wrong at {item}")
        n += 1
    if n != per * len(ledgers):
        raise RuntimeError(f"read {n} entries, expected {per * len(ledgers)}")
    return n


def bench_defrag(env: Env, ledgers: int) -> dict:
    topic, leds, _ = env.write_ledgers("defrag", ledgers, DEFRAG_LEDGER, ENTRY)
    t0 = time.perf_counter()
    report = offload_many(env.deps, leds)
    offload_s = time.perf_counter() - t0
    assert len(report.offloaded) == ledgers, report
    objects_before, bytes_before = count_objects(env)
    data_keys = [env.deps.meta.get_chunk(env.deps.meta.get_ledger(topic, led.ledger_id)).data_key for led in leds]
    peer_s = peer_concat(env, data_keys)
    t0 = time.perf_counter()
    rep = defrag(env.deps, topic)
    defrag_s = time.perf_counter() - t0
    chunks = env.deps.meta.chunks(topic).values()
    merged = {c.data_key for c in chunks} | {c.index_key for c in chunks}
    written = sum(env.s3.head_object(Bucket=env.bucket, Key=k)["ContentLength"] for k in merged)
    t0 = time.perf_counter()
    gc = run_gc(env.deps)
    gc_s = time.perf_counter() - t0
    objects_after, bytes_after = count_objects(env)
    entries = verify_topic(env, topic, leds)
    out = {"ledgers": ledgers, "ledger_kib": DEFRAG_LEDGER // KIB, "groups": rep.groups,
           "objects_before": objects_before, "objects_after_gc": objects_after,
           "mib_before": rnd(mib(bytes_before), 2), "mib_after": rnd(mib(bytes_after), 2),
           "mib_downloaded": rnd(mib(rep.bytes_downloaded), 2),
           "mib_copied_server_side": rnd(mib(rep.bytes_copied_server_side), 2), "mib_written": rnd(mib(written), 2),
           "defrag_s": rnd(defrag_s, 2), "peer_concat_s": rnd(peer_s, 2), "ratio": rnd(peer_s / defrag_s, 2),
           "offload_s": rnd(offload_s, 2), "gc_keys": len(gc.deleted), "gc_s": rnd(gc_s, 2),
           "gc_keys_per_s": rnd(len(gc.deleted) / gc_s), "entries_verified": entries}
    print(f"defrag {ledgers} x {out['ledger_kib']} KiB: objects {objects_before} -> {objects_after} after GC, "
          f"{out['mib_written']} MiB written, {defrag_s:.1f} s (bare download+upload {peer_s:.1f} s); GC "
          f"{len(gc.deleted)} keys in {gc_s:.1f} s; {entries} entries verified", flush=True)
    env.reset()
    return out


# ---------------------------------------------------------------------------------------------- case 4: GC

def put_objects(env: Env, prefix: str, n: int) -> list[str]:
    from concurrent.futures import ThreadPoolExecutor

    keys = [f"{prefix}{i:06d}" for i in range(n)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: env.s3.put_object(Bucket=env.bucket, Key=k, Body=b"x" * 64), keys))
    return keys


def bench_gc(env: Env, keys: int, runs: int) -> dict:
    times: dict[str, list[float]] = {"ours": [], "delete_objects": []}
    for r in range(runs):
        for name in (["ours", "delete_objects"] if r % 2 == 0 else ["delete_objects", "ours"]):
            if name == "ours":
                ks = put_objects(env, f"{PREFIX}gc-bench/{r}/", keys)
                env.deps.meta.enqueue_gc(ks, "bench")
                t0 = time.perf_counter()
                rep = run_gc(env.deps)
                times[name].append(time.perf_counter() - t0)
                if len(rep.deleted) != keys:
                    raise RuntimeError(f"gc deleted {len(rep.deleted)} of {keys}")
            else:
                ks = put_objects(env, f"peer/gc/{r}/", keys)
                t0 = time.perf_counter()
                for i in range(0, len(ks), 1000):
                    env.s3.delete_objects(Bucket=env.bucket, Delete={"Objects": [{"Key": k} for k in ks[i:i + 1000]],
                                                                     "Quiet": True})
                times[name].append(time.perf_counter() - t0)
        left = count_objects(env)[0]
        if left:
            raise RuntimeError(f"{left} objects left after GC run {r}")
    o, p = median(times["ours"]), median(times["delete_objects"])
    out = {"keys": keys, "runs": runs, "seconds": {k: [rnd(x, 3) for x in v] for k, v in times.items()},
           "keys_per_s": {"ours": rnd(keys / o), "delete_objects": rnd(keys / p)}, "ratio": rnd(p / o, 2)}
    print(f"GC of {keys} queued keys: {out['keys_per_s']['ours']} keys/s; bare delete_objects "
          f"{out['keys_per_s']['delete_objects']} keys/s; ratio {out['ratio']}", flush=True)
    return out


# ------------------------------------------------------------------------------------------------ report

def report(res: dict) -> str:
    m = res["machine"]
    L = [f"# Pipeline benchmark ({'quick' if res['quick'] else 'full'} run, {res['date']})", "",
         f"Machine: {m['cpus']} cores, Python {m['python']}, {m['platform']}; boto3 {m['boto3']}. Endpoint: "
         f"{res['endpoint_kind']}. Load average at start {res['loadavg_start']}, at end {res['loadavg_end']}. "
         "Medians; ratio = peer time / our time (>1: ours faster).", ""]
    if "spark" in res:
        s = res["spark"]
        L += [f"## 1. Offload of {s['ledgers']} ledgers of {s['ledger_kib']} KiB ({s['runs']} runs each)", "",
              "| case | seconds | ledgers/s |", "|---|---:|---:|",
              f"| Spark job on {s['master']} (spark-submit to exit) | {median(s['seconds']['spark']):.1f} | "
              f"{s['ledgers_per_s']['spark']} |",
              f"| one process (`tiering offload-by-age`) | {median(s['seconds']['one_process']):.1f} | "
              f"{s['ledgers_per_s']['one_process']} |",
              f"| ratio (one process / Spark) | {s['ratio']:.2f} | |", ""]
    if "overhead" in res:
        o = res["overhead"]
        L += [f"## 2. Per-job fixed overhead ({o['runs']} runs, seconds from launch to exit)", "",
              "| case | seconds |", "|---|---:|",
              f"| spark-submit, nothing to do (JVM, Python driver, planning; no SparkContext started) | {o['spark_empty']} |",
              f"| spark-submit, one ledger (adds the SparkContext and a Python worker) | {o['spark_one']} |",
              f"| CLI, one ledger | {o['cli_one']} |",
              f"| Spark over the CLI for one ledger | {o['spark_over_cli_s']} |", ""]
    if "defrag" in res:
        d = res["defrag"]
        L += [f"## 3. Defrag of {d['ledgers']} offloaded ledgers of {d['ledger_kib']} KiB", "",
              "| figure | value |", "|---|---:|",
              f"| objects before / after defrag and GC | {d['objects_before']} / {d['objects_after_gc']} |",
              f"| MiB stored before / after | {d['mib_before']} / {d['mib_after']} |",
              f"| MiB downloaded (sources under 5 MiB) / copied server-side / written | {d['mib_downloaded']} / "
              f"{d['mib_copied_server_side']} / {d['mib_written']} |",
              f"| defrag seconds (data, indexes, one metadata transaction) | {d['defrag_s']} |",
              f"| peer: GET every data object + one s3transfer upload (no indexes, no metadata), seconds | "
              f"{d['peer_concat_s']} |",
              f"| ratio (peer / ours) | {d['ratio']:.2f} |",
              f"| GC of the replaced objects: keys, seconds, keys/s | {d['gc_keys']}, {d['gc_s']}, "
              f"{d['gc_keys_per_s']} |",
              f"| entries read back byte-exact from tier 2 afterwards | {d['entries_verified']} |", ""]
    if "gc" in res:
        g = res["gc"]
        L += [f"## 4. GC throughput ({g['keys']} queued keys, {g['runs']} runs)", "",
              "| case | keys/s |", "|---|---:|",
              f"| `run_gc` (claim, reference check, DeleteObjects, dequeue, orphan sweep) | {g['keys_per_s']['ours']} |",
              f"| boto3 `delete_objects`, 1,000 keys per request | {g['keys_per_s']['delete_objects']} |",
              f"| ratio (peer time / ours) | {g['ratio']:.2f} |", ""]
    return "\n".join(L) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer ledgers and runs (~3 minutes)")
    ap.add_argument("--cases", default="1,2,3,4", help="which cases to run, e.g. 1,3")
    ap.add_argument("--private-moto", action="store_true",
                    help="start a moto server of our own instead of TIERING_S3_ENDPOINT_URL")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    plan = dict(QUICK if args.quick else FULL)
    cases = {int(c) for c in args.cases.split(",")}
    with endpoint(args.private_moto) as url:
        env = Env(url)
        res = {"quick": args.quick, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "machine": machine(), "endpoint_kind": endpoint_kind(env, args.private_moto), "plan": plan,
               "loadavg_start": loadavg()}
        t0 = time.perf_counter()
        try:
            if 1 in cases:
                res["spark"] = bench_spark(env, plan["spark_ledgers"], plan["spark_runs"])
            if 2 in cases:
                res["overhead"] = bench_overhead(env, plan["overhead_runs"])
            if 3 in cases:
                res["defrag"] = bench_defrag(env, plan["defrag_ledgers"])
            if 4 in cases:
                res["gc"] = bench_gc(env, plan["gc_keys"], plan["gc_runs"])
        finally:
            env.close()
    res["seconds"] = rnd(time.perf_counter() - t0)
    res["loadavg_end"] = loadavg()
    save(args.out, "pipeline-quick" if args.quick else "pipeline", res, report(res), "bench_pipeline.py", args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
