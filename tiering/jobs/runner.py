"""The frame every Spark job runs in: the driver reads settings from the environment and records the run
as one `job_run` row (`recorded`: summary on stdout, errors on stderr, exit 1 on a failure), starts Spark and
waits for its executors, recording the missing ones and the executors' hosts (`spark_context`,
`spark_session`, `fan_out`); items fan out with `mapPartitions` (`executor_partition`: each executor checks
it sees the driver's tier-1 root and builds its own clients from the settings shipped in the closure, never
from argv) and each item is retried on one schedule (`retried`). `run` is the whole of a job whose items are
`work(deps, item)` calls; recovery, the scrub and the metadata export use the same parts.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from typing import Callable, Iterable, Iterator, TypeVar

from tiering import clients
from tiering.config import Settings
from tiering.errors import BadInput, ConditionalUpdateFailed, RecoveryRunning, TieringError
from tiering.jobs.executors import executor_hosts, wait_on
from tiering.metadata.job_runs import JobOutcome, JobRuns, RunRef
from tiering.ops.context import Deps
from tiering.tier1.marker import check_root, root_token

T = TypeVar("T")
RETRIES = 2
BACKOFF_SECONDS = 1.0

# work(deps, item) -> (bytes done, skipped?)  — raising means the item failed (retried first)
Work = Callable[[Deps, dict], tuple[int, bool]]
# check(deps, items) -> one sentence per piece of work the items planned that is not done although no
# executor reported it failed (an executor lost mid-item whose task Spark retried elsewhere)
Check = Callable[[Deps, list[dict]], list[str]]


class ItemFailed(TieringError):
    """An item that failed after retrying in its own way (GC: a delete S3 refused is retried by its queue
    row, on the row's schedule): counted failed and not attempted again here, where a new attempt would do
    other work and hide this failure."""


def deps_from(settings: Settings, **knobs) -> Deps:
    return clients.deps(settings, pool_size=2, **knobs)


def topic_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--topic", help="limit the job to one topic")


def retried(attempt: Callable[[], T], again: Callable[[T], bool]) -> T:
    """`attempt()` until `again(result)` is false, at most RETRIES more times with a doubling backoff: the one
    retry schedule of every job's items. Returns the last result."""
    for n in range(RETRIES + 1):
        result = attempt()
        if n == RETRIES or not again(result):
            return result
        time.sleep(BACKOFF_SECONDS * 2 ** n)
    raise AssertionError("unreachable")


def executor_partition(settings: Settings, token: str | None, items: Iterable[dict],
                       run_items: Callable[[Deps, Iterable[dict]], dict],
                       refused: Callable[[list[dict], TieringError], dict]) -> Iterator[dict]:
    """Runs on an executor, the frame of every job's partition: unless this worker sees the driver's tier-1
    root (jobs that touch tier 1 ship its token; None: not checked) the partition's one summary is
    `refused(items, why)`; else one set of clients serves the partition, `run_items(deps, items)` is its
    summary, and the clients are disposed of."""
    try:
        check_root(settings.tier1_root, token)
    except TieringError as exc:
        yield refused(list(items), exc)
        return
    deps = deps_from(settings)
    try:
        summary = run_items(deps, items)
    finally:
        deps.meta.engine.dispose()
    yield summary


def _attempt(work: Work, deps: Deps, item: dict) -> tuple[str, int, str | None]:
    """One attempt at an item: (done | skipped | lost | failed | bad, bytes, error)."""
    try:
        nbytes, skipped = work(deps, item)
        return ("skipped" if skipped else "done"), nbytes, None
    except ConditionalUpdateFailed:
        return "lost", 0, None
    except (BadInput, ItemFailed, RecoveryRunning) as exc:  # not transient, retried already, or refused: no retry
        return "bad", 0, f"{item}: {exc}"
    except Exception as exc:  # noqa: BLE001 - counted, reported, retried
        return "failed", 0, f"{item}: {type(exc).__name__}: {exc}"


def _work_items(work: Work) -> Callable[[Deps, Iterable[dict]], dict]:
    def run_items(deps: Deps, items: Iterable[dict]) -> dict:
        out = _summary()
        for item in items:
            # A lost compare-and-set is "skipped" only when another worker holds or finished the item; a
            # lost attempt of our own (a commit GC's claim beat, a batch undone under us) is retried: work()
            # re-reads the current rows (done by another: skipped; free again: offloaded). Only an item that
            # lost every attempt is someone else's: a failure is never counted as skipped.
            status, nbytes, error = retried(lambda: _attempt(work, deps, item), lambda r: r[0] in ("lost", "failed"))
            if status in ("bad", "failed"):
                out["failed"] += 1
                out["failed_items"].append(item)
                out["errors"].append(error)
            else:
                out["skipped" if status in ("skipped", "lost") else "done"] += 1
                out["bytes"] += nbytes
        return out
    return run_items


def _summary() -> dict:
    return {"done": 0, "failed": 0, "skipped": 0, "bytes": 0, "errors": [], "failed_items": []}


def _not_run(items: list[dict], exc: TieringError) -> dict:
    return {**_summary(), "failed": len(items), "failed_items": items,
            "errors": [f"{len(items)} item(s) not run: {exc}"]}


def _do_items(settings: Settings, work: Work, items: Iterable[dict],
              tier1_token: str | None = None) -> Iterator[dict]:
    """Runs on an executor: each item retried, the partition's counts summed into one summary."""
    return executor_partition(settings, tier1_token, items, _work_items(work), _not_run)


def executor_task(settings: Settings, work: Work, tier1_token: str | None) -> Callable[[Iterable[dict]], Iterator[dict]]:
    """The function Spark pickles and ships to every executor with its closure: the settings travel without
    their secrets (Settings.__reduce__), which each executor resolves where it runs."""
    return lambda items: _do_items(settings, work, items, tier1_token)


def run_ref(kind: str, environ=None) -> RunRef:
    """The run's kind, and the Airflow DAG, run and try the operator passes in the environment (absent when
    the job is started by hand)."""
    env = os.environ if environ is None else environ
    try_number = env.get("TIERING_AIRFLOW_TRY_NUMBER", "")
    return RunRef(kind=kind, dag_id=env.get("TIERING_AIRFLOW_DAG_ID") or None,
                  dag_run_id=env.get("TIERING_AIRFLOW_DAG_RUN_ID") or None,
                  try_number=int(try_number) if try_number.isascii() and try_number.isdigit() else None)


def planned_ledgers(items: list) -> int | None:
    """Ledgers in a plan's items (a batch item holds several: offload), None when its items are not ledgers."""
    if not all(isinstance(i, dict) and ("ledger_id" in i or "ledger_ids" in i) for i in items):
        return None
    return sum(len(i["ledger_ids"]) if "ledger_ids" in i else 1 for i in items)


def planned_text(planned, ledgers) -> str:
    """"3 ledger(s) in 1 batch(es)" where items are batches of ledgers, else the item count."""
    if ledgers is None or planned in (None, "?") or ledgers == planned:
        return f"{planned}"
    return f"{planned} ({ledgers} ledger(s) in {planned} batch(es))"


def outcome_lines(kind: str, row: dict) -> list[str]:
    """A job_run row as the few lines a task log shows: planned, done, skipped, failed, bytes."""
    details = row.get("details") or {}
    planned = planned_text(details.get("planned", "?"), details.get("planned_ledgers"))
    lines = [f"{kind}: {row['status']}: planned {planned}, done {row['items_done']}, "
             f"skipped {details.get('skipped', 0)}, failed {row['items_failed']}, {_size(row['bytes'])}"]
    if details.get("spark") == "skipped":
        lines.append(f"{kind}: nothing to do: Spark not started")
    return lines


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def load_settings(job: str) -> Settings | None:
    """The settings from the environment; None after one line on stderr (the job then exits 2)."""
    try:
        return Settings.from_env()
    except TieringError as exc:
        print(f"{job}: error: {exc}", file=sys.stderr)
        return None


# a line naming an error: "OSError: ...", "java.lang.IllegalStateException: ...", "pyspark...PySparkRuntimeError: ..."
_ERROR_LINE = re.compile(r"(?:[A-Za-z_][\w$]*\.)*[A-Z][\w$]*(?:Error|Exception)\b:? ?.*")


def failure_line(exc: BaseException) -> str:
    """One line saying why a job failed, for its job_run row and the task's last line. A Spark failure's
    first line says only where it surfaced ("An exception was thrown from the Python worker", "An error
    occurred while calling o72.x"); the error inside is the last line of its message that names one (the
    worker's own exception, the JVM's). Else the exception's type and first line."""
    lines = [line.strip().lstrip(": ") for line in str(exc).splitlines() if line.strip()]
    inner = [line for line in lines[1:] if _ERROR_LINE.fullmatch(line)]
    line = inner[-1] if inner else f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return line[:1000]


def recorded(job: str, ref: RunRef, topic: str | None, engine, body: Callable[[JobOutcome, int], None],
             outcome: JobOutcome | None = None) -> int:
    """Run `body(outcome, run_id)` as one job_run row: started first, finished with whatever the body
    recorded, also when it raised (a TieringError by its sentence, anything else by type and message, its
    traceback on stderr). Then the summary JSON on stdout, the outcome lines when run by hand (under Airflow
    the operator logs them from the row, once) and the first errors on stderr. Exit 1 when an item failed or
    an error was recorded, else 0. Every Spark job runs in it."""
    runs = JobRuns(engine)
    run_id = runs.start(job, topic, ref)
    outcome = outcome if outcome is not None else JobOutcome()
    try:
        body(outcome, run_id)
    except TieringError as exc:
        outcome.errors.append(str(exc))
    except Exception as exc:  # noqa: BLE001 - recorded in job_run, then the job fails
        outcome.errors.append(failure_line(exc))
        traceback.print_exc(file=sys.stderr)  # the whole of it in the task's log
    finally:
        runs.finish(run_id, outcome)
    failed = bool(outcome.items_failed or outcome.errors)
    print(json.dumps({"job": job, "run_id": run_id, "done": outcome.items_done, "failed": outcome.items_failed,
                      "bytes": outcome.bytes, **outcome.details}, default=str))
    if ref.dag_id is None:
        row = {"status": "FAILED" if failed else "SUCCEEDED", "items_done": outcome.items_done,
               "items_failed": outcome.items_failed, "bytes": outcome.bytes, "details": outcome.details}
        for line in outcome_lines(ref.kind, row):
            print(line)
    for err in outcome.errors[:20]:
        print(f"{ref.kind}: error: {err}", file=sys.stderr)
    return 1 if failed else 0


def spark_context(app: str, outcome: JobOutcome):
    """A bare SparkContext (jobs on RDDs only: a SparkSession costs ~4 s more to start), its executors
    waited for."""
    from pyspark import SparkConf, SparkContext

    sc = SparkContext.getOrCreate(SparkConf().setAppName(app))
    _waited(sc, outcome)
    return sc


def spark_session(app: str, outcome: JobOutcome):
    """A SparkSession in UTC (jobs on DataFrames), its executors waited for."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(app).config("spark.sql.session.timeZone", "UTC").getOrCreate()
    _waited(spark.sparkContext, outcome)
    return spark


def _waited(sc, outcome: JobOutcome) -> None:
    # a cluster's executors that never register: fail with the cause, not at the timeout; some missing:
    # recorded in the row (spark.tiering.expectedExecutors)
    if missing := wait_on(sc):
        outcome.details["executors_missing"] = missing
    # the Airflow task's OpenLineage run, which the operator passes when lineage is on: the row names the
    # lineage run it belongs to (its Spark-side events, where a listener emits them, are that run's children)
    if parent := sc.getConf().get("spark.openlineage.parentRunId", None):
        outcome.details["lineage_parent_run"] = parent


def fan_out(sc, items: list[dict], task: Callable[[Iterable[dict]], Iterator[dict]],
            outcome: JobOutcome) -> list[dict]:
    """The items in up to two partitions per core, `task` run on each partition, the partitions' summaries
    collected on the driver; on a cluster the executors' hosts are recorded."""
    slices = max(1, min(len(items), sc.defaultParallelism * 2))
    parts = sc.parallelize(items, slices).mapPartitions(task).collect()
    if not sc.master.startswith("local"):
        outcome.details["executor_hosts"] = executor_hosts(sc)
    return parts


def driver_job(job: str, topic: str | None, body_of: Callable[[Settings, Deps], Callable[[JobOutcome, int], None]],
               outcome: JobOutcome | None = None, kind: str | None = None) -> int:
    """A job's frame: settings (exit 2 when they are wrong), its clients, `body_of(settings, deps)` recorded
    as one job_run row (of `kind`, default the job's name), the engine disposed at the end. The body runs on
    the driver and starts Spark itself when it has work."""
    settings = load_settings(job)
    if settings is None:
        return 2
    deps = deps_from(settings)
    try:
        return recorded(job, run_ref(kind or job), topic, deps.meta.engine, body_of(settings, deps), outcome)
    finally:
        deps.meta.engine.dispose()


def run(job: str, argv: list[str] | None, parser: argparse.ArgumentParser,
        plan: Callable[[Deps, argparse.Namespace], list[dict]], work: Work,
        finish: Callable[[Deps, argparse.Namespace, JobOutcome], None] | None = None, tier1: bool = True,
        kind: Callable[[argparse.Namespace], str] | None = None,
        prepare: Callable[[Deps, argparse.Namespace, list[dict], int], list[dict]] | None = None,
        check: Check | None = None) -> int:
    """Parse args, plan on the driver, run items on executors, record one job_run row. `tier1`: the job
    works on tier-1 files, so executors check they see the driver's root. `prepare(deps, args, items,
    parallelism)` adjusts the items once Spark is up and its parallelism known (offload: the rate budget).
    `check(deps, items)`: after the items ran (or the Spark job failed), what the items not reported failed
    left undone; each sentence is a failure of the run (a lost attempt is never a green run)."""
    args = parser.parse_args(argv)

    def body_of(settings: Settings, deps: Deps) -> Callable[[JobOutcome, int], None]:
        def body(outcome: JobOutcome, _run_id: int) -> None:
            items = plan(deps, args)
            outcome.details["planned"] = len(items)
            if (ledgers := planned_ledgers(items)) is not None and ledgers != len(items):
                outcome.details["planned_ledgers"] = ledgers
            if items:
                _fan_out_items(job, settings, deps, args, items, outcome, work, tier1, prepare, check)
            if finish is not None:
                finish(deps, args, outcome)
        return body

    topic = getattr(args, "topic", None) or getattr(args, "prefix", None)
    return driver_job(job, topic, body_of, kind=kind(args) if kind else None)


def _fan_out_items(job: str, settings: Settings, deps: Deps, args: argparse.Namespace, items: list[dict],
                   outcome: JobOutcome, work: Work, tier1: bool, prepare, check: Check | None) -> None:
    """The planned items on the executors, their reports added to `outcome`, what they left undone checked."""
    sc = spark_context(f"tiering-{job}", outcome)
    if prepare is not None:
        items = prepare(deps, args, items, sc.defaultParallelism)
    token = root_token(settings.tier1_root) if tier1 else None
    try:
        parts = fan_out(sc, items, executor_task(settings, work, token), outcome)
    except BaseException:
        if check is not None:  # the job failed: name what it left undone, then fail with its cause
            _checked(deps, check, items, outcome)
        raise
    reported = []
    for p in parts:
        outcome.add(JobOutcome(p["done"], p["failed"], p["bytes"], p["errors"]))
        outcome.details["skipped"] = outcome.details.get("skipped", 0) + p["skipped"]
        reported += p["failed_items"]
    failed = {json.dumps(i, sort_keys=True) for i in reported}
    unfailed = [i for i in items if json.dumps(i, sort_keys=True) not in failed]
    if check is not None:
        _checked(deps, check, unfailed, outcome)
    try:
        if moved := moved_ledgers(unfailed, deps.meta.planning.entry_counts):
            outcome.details["moved"] = moved
    except Exception as exc:  # noqa: BLE001 - lineage's numbers never fail work that was done
        print(f"{job}: warning: what moved not recorded: {type(exc).__name__}", file=sys.stderr)


def _checked(deps: Deps, check: Check, items: list[dict], outcome: JobOutcome) -> None:
    lost = check(deps, items)
    outcome.items_failed += len(lost)
    outcome.errors.extend(lost)
    if lost:
        outcome.details["lost"] = len(lost)


def moved_ledgers(items: list[dict], entry_counts: Callable[[list[tuple[str, int]]], dict]) -> dict:
    """Per topic, the ledgers of a run's ledger items that no executor reported failed: how many, their
    entries and their id range (job_run.details["moved"], which the DAGs' lineage reports; an item another
    worker finished first counts too). {} when the items are not ledgers."""
    if not items or planned_ledgers(items) is None:
        return {}
    pairs = [(i["topic"], lid) for i in items for lid in (i["ledger_ids"] if "ledger_ids" in i else [i["ledger_id"]])]
    counts = entry_counts(pairs)
    out: dict[str, dict] = {}
    for topic, lid in pairs:
        m = out.setdefault(topic, {"ledgers": 0, "entries": 0, "first_ledger": lid, "last_ledger": lid})
        m["ledgers"] += 1
        m["entries"] += counts.get((topic, lid), 0)
        m["first_ledger"], m["last_ledger"] = min(m["first_ledger"], lid), max(m["last_ledger"], lid)
    return out


def ledger_item(led) -> dict:
    return {"topic": led.topic, "ledger_id": led.ledger_id}
