"""Spark on a standalone cluster vs Spark on local[2] vs one CLI process: the same offload workloads.

Workloads (each a fresh topic per side and run; every ledger must end OFFLOADED):
  many small: N ledgers of 16 KiB (four 4 KiB entries)   (--small, default 2,000; --quick 200)
  few large:  20 ledgers of 8 MiB (one block each)
  one:        one ledger of 16 KiB
Sides, each a fresh process timed from launch to exit, alternating the order run after run:
  cluster   spark-submit --master spark://... (a standalone master and 2 workers x 1 core from the venv's
            pyspark, started by this script on loopback, client mode: the DAG's job as the DAG runs it)
  local[2]  spark-submit --master local[2]
  one       tiering offload-by-age (one process, the same ops)
Medians. Writes bench/results/cluster.{md,json}.

    set -a; . .local/env; set +a
    .venv/bin/python bench/bench_cluster.py --quick      # ~5 minutes on two cores
    .venv/bin/python bench/bench_cluster.py --private-moto --runs 1   # 2,000 small ledgers once
"""
from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_pipeline import ENTRY, KIB, cli_cmd, offloaded, timed  # noqa: E402
from benchkit import MIB, ROOT, Env, endpoint, endpoint_kind, loadavg, machine, median, rnd, save  # noqa: E402
from tests.cluster import sparkcluster  # noqa: E402

from tiering.jobs.submit import py_files_archive  # noqa: E402


def spark_cmd(master: str, topic: str) -> list[str]:
    return [str(Path(sys.executable).parent / "spark-submit"), "--master", master, "--name", "bench-offload",
            "--conf", "spark.ui.enabled=false", "--py-files", str(py_files_archive()),
            str(ROOT / "tiering" / "jobs" / "offload.py"), "--by=age", f"--topic={topic}"]


def bench(env: Env, sides: dict, name: str, count: int, size: int, runs: int) -> dict:
    times: dict[str, list[float]] = {s: [] for s in sides}
    for r in range(runs):
        order = list(sides)[r % len(sides):] + list(sides)[:r % len(sides)]
        for side in order:
            topic, _, _ = env.write_ledgers(f"{name}-{side.replace('[', '').replace(']', '')}", count, size,
                                            min(ENTRY, size), offload_after_seconds=0)
            seconds, _ = timed(sides[side](topic), env)
            done = offloaded(env, topic)
            if done != count:
                raise RuntimeError(f"{name}/{side}: {done} of {count} ledgers offloaded")
            times[side].append(seconds)
            print(f"{name} ({count} x {size // KIB} KiB), {side}: {seconds:.1f} s", flush=True)
        env.reset()
    med = {s: rnd(median(v), 2) for s, v in times.items()}
    return {"ledgers": count, "ledger_kib": size // KIB, "runs": runs,
            "seconds": {s: [rnd(x, 2) for x in v] for s, v in times.items()}, "median_s": med,
            "one_process_over": {s: rnd(med["one"] / med[s], 2) for s in sides if s != "one"}}


def report(res: dict) -> str:
    lines = [f"# Spark standalone cluster vs local[2] vs one process ({res['date']})", "",
             f"Machine: {res['machine']['cpus']} cores; endpoint: {res['endpoint_kind']}; cluster: "
             f"{res['cluster']}; load average {res['loadavg_start']} -> {res['loadavg_end']}.", "",
             "| workload | cluster 2 x 1 core, s | local[2], s | one process, s | one process / cluster | "
             "one process / local[2] |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, w in res["workloads"].items():
        m, q = w["median_s"], w["one_process_over"]
        lines.append(f"| {name}: {w['ledgers']} x {w['ledger_kib']} KiB (median of {w['runs']}) | {m['cluster']} | "
                     f"{m['local[2]']} | {m['one']} | {q['cluster']} | {q['local[2]']} |")
    return "\n".join(lines) + "\n\nA ratio above 1 means Spark was faster than one process.\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="200 small ledgers, one run each")
    ap.add_argument("--small", type=int, default=None, help="ledgers in the many-small workload")
    ap.add_argument("--runs", type=int, default=None, help="runs of the many-small workload")
    ap.add_argument("--runs-short", type=int, default=3, help="runs of the few-large and one-ledger workloads")
    ap.add_argument("--private-moto", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    # a TERM (Ctrl-C, timeout) still stops the cluster and drops the scratch database
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    small = args.small or (200 if args.quick else 2000)
    runs = args.runs or (1 if args.quick else 3)
    state = Path(tempfile.mkdtemp(prefix="tiering-bench-cluster-"))
    cluster = sparkcluster.start(state, workers=2, cores=1, memory="1g")
    try:
        with endpoint(args.private_moto) as url:
            env = Env(url)
            sides = {"cluster": lambda t: spark_cmd(cluster.master_url, t),
                     "local[2]": lambda t: spark_cmd("local[2]", t),
                     "one": lambda t: cli_cmd("offload-by-age", f"--topic={t}", "--json")}
            res = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
                   "endpoint_kind": endpoint_kind(env, args.private_moto), "cluster": "standalone, 2 workers x 1 "
                   "core, 1 GiB each, loopback", "loadavg_start": loadavg(), "workloads": {}}
            t0 = time.perf_counter()
            try:
                for name, count, size, n in (("many small", small, 16 * KIB, runs),
                                             ("few large", 20, 8 * MIB, args.runs_short),
                                             ("one", 1, 16 * KIB, args.runs_short)):
                    res["workloads"][name] = bench(env, sides, name.replace(" ", "-"), count, size, n)
            finally:
                env.close()
    finally:
        sparkcluster.stop(state)
    res["seconds"] = rnd(time.perf_counter() - t0)
    res["loadavg_end"] = loadavg()
    save(args.out, "cluster-quick" if args.quick else "cluster", res, report(res), "bench_cluster.py", args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
