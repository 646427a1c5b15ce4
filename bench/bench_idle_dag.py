"""What an idle scheduled offload run costs: the whole DAG run now (the `plan` task finds nothing and skips
the Spark task) against its peer, the Spark task alone, which is what every idle run paid before the plan
task existed (same Airflow, same job, same empty database). Both through `airflow ... test` in one run, on
the scratch database and bucket; median of N runs each, as a ratio.

    make dist && .venv/bin/python bench/bench_idle_dag.py [--runs 3]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_pipeline import spark_submit_cmd, timed  # noqa: E402
from benchkit import ROOT, Env, endpoint, loadavg, machine, median, rnd, save  # noqa: E402

DAG = "tiering_offload_by_age"


def _airflow_env(env: Env, home: Path) -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("airflow_env", ROOT / ".ci" / "airflow_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    job = env.job_env()
    settings = {k: job[k] for k in ("TIERING_DATABASE_URL", "TIERING_BUCKET", "TIERING_PREFIX",
                                    "TIERING_TIER1_ROOT", "TIERING_S3_ENDPOINT_URL", "PATH")}
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        if os.environ.get(k):
            settings[k] = os.environ[k]
    return {**os.environ, **module.airflow_env(settings, home)}


def _timed(cmd: list[str], env: dict, cwd: Path) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    args.quick, args.private_moto = False, False  # for benchkit.save's command line
    airflow = str(Path(sys.executable).parent / "airflow")
    with endpoint(False) as url:
        env = Env(url)
        home = Path(tempfile.mkdtemp(prefix="tiering-bench-airflow-"))
        res = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
               "runs": args.runs, "loadavg_start": loadavg()}
        t0 = time.perf_counter()
        try:
            env.new_topic("idle")  # a topic with nothing due: offload_after -1
            aenv = _airflow_env(env, home)
            for cmd in (["db", "migrate"], ["pools", "set", "tiering_spark", "2", "bench"]):
                _timed([airflow, *cmd], aenv, home)
            # the worker-side work alone, without the airflow CLI's start: the plan in-process vs spark-submit
            from tiering.jobs.preflight import preflight
            from tiering.metadata.job_runs import RunRef

            plan_s, submit_s = [], []
            for i in range(args.runs):
                t = time.perf_counter()
                result = preflight(DAG, {}, {}, {"topic"}, lambda: env.deps, RunRef("offload_by_age", DAG, f"b{i}", 1))
                plan_s.append(time.perf_counter() - t)
                assert result.planned == 0
                submit_s.append(timed(spark_submit_cmd("offload", "--by=age"), env)[0])
            res.update(plan_median_s=rnd(median(plan_s), 3), spark_submit_median_s=rnd(median(submit_s), 2))
            after, before = [], []
            for i in range(args.runs):
                after.append(_timed([airflow, "dags", "test", DAG, f"2026-01-0{i + 1}T00:00:00+00:00"], aenv, home))
                before.append(_timed([airflow, "tasks", "test", DAG, "offload", f"2026-02-0{i + 1}T00:00:00+00:00"],
                                     aenv, home))
            res.update(after_s=[rnd(x, 2) for x in after], before_s=[rnd(x, 2) for x in before],
                       after_median_s=rnd(median(after), 2), before_median_s=rnd(median(before), 2),
                       ratio=rnd(median(before) / median(after), 2))
        finally:
            env.close()
    res["seconds"] = rnd(time.perf_counter() - t0)
    res["loadavg_end"] = loadavg()
    md = (f"## Idle scheduled offload run ({DAG}, nothing due), median of {args.runs}\n\n"
          f"| what | seconds |\n| --- | ---: |\n"
          f"| before: the Spark task alone (`airflow tasks test ... offload`), what every idle run paid | "
          f"{res['before_median_s']} |\n"
          f"| after: the whole DAG run (`airflow dags test`), plan finds nothing, Spark skipped | "
          f"{res['after_median_s']} |\n"
          f"| ratio before / after | {res['ratio']}x |\n"
          f"| worker side before: `spark-submit offload.py --by=age`, nothing to do | {res['spark_submit_median_s']} |\n"
          f"| worker side after: the plan task's work in-process (validate, one plan query, one row) | "
          f"{res['plan_median_s']} |\n\n"
          f"The first two include the `airflow` CLI's start and DAG parsing (most of their time on a loaded "
          f"machine); the last two are the work a worker does per idle run. Load average {res['loadavg_start']} -> "
          f"{res['loadavg_end']} on {res['machine']['cpus']} cores.\n")
    save(args.out, "idle-dag", res, md, "bench_idle_dag.py", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
