"""Offload under an upload limit, on the real S3 endpoint, unthrottled peer in the same run.

1. One process: one 64 MiB ledger in 8 MiB parts, and four 32 MiB ledgers of one request each (64 MiB blocks),
   offloaded with TIERING_OFFLOAD_MAX_BYTES_PER_SECOND = 8 MiB/s and without a limit, alternating, medians;
   goal: the limited rate >= 0.9 of min(limit, the unlimited rate) (start times are paced).
2. The Spark offload job (`spark-submit --master local[N]`, N = 1 and 2) offloading 8 x 8 MiB ledgers under a
   job-wide limit of 16 MiB/s: the job splits it across the tasks running at once, so with 2 executors
   (cores) each task gets 8 MiB/s and the job's rate stays at the limit. The rate is the bytes over the time
   between the first and the last data object's upload as the store recorded them (LastModified, 1 s
   resolution), so Spark's start-up is not counted; the job's wall time is given too.

    set -a; . .local/env; set +a
    .venv/bin/python bench/bench_throttle.py           # about 2 minutes
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipeline import spark_submit_cmd, timed  # noqa: E402
from benchkit import MIB, ROOT, Env, endpoint, endpoint_kind, loadavg, machine, median, rnd, save  # noqa: E402
from tiering.ops.offload import offload_many  # noqa: E402
from tiering.tier2 import throttle  # noqa: E402

LIMIT = 8 * MIB
JOB_LIMIT = 16 * MIB


class EndPaced(throttle.RateLimiter):
    """The limiter before start times were paced: each request waited for its reservation to END, then sent
    (the peer that shows what pacing start times changed)."""

    def acquire(self, nbytes: int) -> float:
        waited = super().acquire(nbytes)
        self._sleep(nbytes / self.rate)
        return waited + nbytes / self.rate


# (name, ledgers, bytes each, block size, limit): one ledger in parts, ledgers that are one request each, and
# a limit near what the link gives (where waiting for a reservation's end cost the most)
SHAPES = (("1 x 64 MiB, 8 MiB parts", 1, 64 * MIB, 8 * MIB, LIMIT),
          ("4 x 32 MiB, one request each (64 MiB blocks)", 4, 32 * MIB, 64 * MIB, LIMIT),
          ("4 x 32 MiB, one request each, limit 48 MiB/s", 4, 32 * MIB, 64 * MIB, 48 * MIB))


def one_process(env: Env, runs: int) -> list[dict]:
    """Each shape offloaded with the limit and without (the peer: what the link gives), alternating in the
    same run; the goal is limited rate >= 0.9 of min(limit, unlimited rate). Each limited run starts with a
    fresh limiter (the process's shared one would make it pay the previous run's last share)."""
    results = []
    for name, count, size, block, limit in SHAPES:
        total = count * size
        out = {"limited": [], "unlimited": [], "end_paced": []}
        cases = list(out)
        for i in range(runs):
            for case in cases[i % 3:] + cases[:i % 3]:  # rotate who goes first
                _, leds, _ = env.write_ledgers(f"one-{case}", count, size, 64 * 1024)
                deps = replace(env.deps, knobs=replace(env.deps.knobs, batch_small_bytes=0, block_size=block,
                                                       max_bytes_per_second=0 if case == "unlimited" else limit))
                throttle._shared.clear()
                if case == "end_paced":
                    throttle._shared[limit] = EndPaced(limit)
                t0 = time.perf_counter()
                report = offload_many(deps, leds)
                out[case].append(time.perf_counter() - t0)
                assert not report.failed, report.first_error
                env.reset()
        med = {k: median(v) for k, v in out.items()}
        limited_rate, link_rate = total / med["limited"], total / med["unlimited"]
        results.append({"shape": name, "mib": total / MIB, "block_mib": block / MIB, "limit_mib_s": limit / MIB,
                        "runs": runs, "limited_seconds": [rnd(x, 2) for x in out["limited"]],
                        "unlimited_seconds": [rnd(x, 2) for x in out["unlimited"]],
                        "limited_median_s": rnd(med["limited"], 2), "unlimited_median_s": rnd(med["unlimited"], 2),
                        "limited_rate_mib_s": rnd(limited_rate / MIB, 2),
                        "unlimited_rate_mib_s": rnd(link_rate / MIB, 1),
                        "vs_min_limit_link": rnd(limited_rate / min(limit, link_rate), 3),
                        "end_paced_seconds": [rnd(x, 2) for x in out["end_paced"]],
                        "end_paced_vs_min_limit_link": rnd(total / med["end_paced"] / min(limit, link_rate), 3)})
    return results


def spark_job(env: Env, cores: int) -> dict:
    import bench_pipeline

    topic, leds, _ = env.write_ledgers(f"spark{cores}", 8, 8 * MIB, 64 * 1024, offload_after_seconds=0)
    bench_pipeline.MASTER = f"local[{cores}]"
    env_overrides = {"TIERING_OFFLOAD_BATCH_BYTES": "0"}
    saved = env.job_env
    env.job_env = lambda: {**saved(), **env_overrides}
    try:
        seconds, summary = timed(spark_submit_cmd("offload", "--by=age", f"--topic={topic}",
                                                  f"--max-bytes-per-second={JOB_LIMIT}"), env)
    finally:
        env.job_env = saved
    prefix = f"{topic.replace('/', '%2F')}"
    objs = [o for page in env.s3.get_paginator("list_objects_v2").paginate(Bucket=env.bucket)
            for o in page.get("Contents", []) if prefix in o["Key"] and not o["Key"].endswith("-index")]
    times = sorted(o["LastModified"].timestamp() for o in objs)
    nbytes = sum(o["Size"] for o in objs)
    # the first object finished one share-time after the job began uploading: count it in
    span = (times[-1] - times[0]) + (8 * MIB) / (JOB_LIMIT / cores) if times else None
    return {"cores": cores, "job_limit_mib_s": JOB_LIMIT / MIB, "objects": len(objs), "mib": rnd(nbytes / MIB),
            "job_wall_s": rnd(seconds, 1), "upload_span_s": rnd(span, 1) if span else None,
            "rate_mib_s": rnd(nbytes / MIB / span, 2) if span else None,
            "rate_vs_limit": rnd(nbytes / span / JOB_LIMIT, 2) if span else None, "done": summary.get("done")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 runs instead of 5 in case 1")
    ap.add_argument("--no-spark", action="store_true", help="case 1 only")
    ap.add_argument("--private-moto", action="store_true", help="a moto server of the bench's own")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    with endpoint(args.private_moto) as url:
        env = Env(url)
        try:
            result = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
                      "endpoint": endpoint_kind(env, args.private_moto), "load_before": loadavg(),
                      "one_process": one_process(env, 3 if args.quick else 5),
                      "spark": [] if args.no_spark else [spark_job(env, 1), spark_job(env, 2)]}
        finally:
            env.close()
    result["load_after"] = loadavg()
    result["seconds"] = rnd(time.perf_counter() - t0)
    md = (f"# Offload under an upload limit ({result['when']}, {result['endpoint']}; load {result['load_before']} "
          f"-> {result['load_after']})\n\n"
          f"| one process (limit 8 MiB/s unless said) | limited s (median) | MiB/s | unlimited s (peer) | MiB/s | "
          f"limited / min(limit, unlimited) | the same, end-paced (before) |\n|---|---|---|---|---|---|---|\n" +
          "".join(f"| {o['shape']} | {o['limited_median_s']} | {o['limited_rate_mib_s']} | {o['unlimited_median_s']} "
                  f"| {o['unlimited_rate_mib_s']} | {o['vs_min_limit_link']} | {o['end_paced_vs_min_limit_link']} |\n"
                  for o in result["one_process"]) +
          "\n"
          f"| Spark offload job, 8 x 8 MiB, job limit 16 MiB/s | wall s | upload span s | rate MiB/s | vs limit |\n"
          f"|---|---|---|---|---|\n" +
          "".join(f"| local[{s['cores']}] | {s['job_wall_s']} | {s['upload_span_s']} | {s['rate_mib_s']} | "
                  f"{s['rate_vs_limit']} |\n" for s in result["spark"]) + "\n")
    save(args.out, "throttle", result, md, "bench_throttle.py", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
