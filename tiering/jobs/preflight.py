"""What a DAG run does on the Airflow worker before it pays for a Spark start (no Airflow imports here; the
`plan` task of every DAG calls `preflight`):

- refuses bad input once: a conf key the DAG does not take, a parameter the job does not use, a malformed
  or unknown topic or position. The refusal is a `BadInput` with a sentence, recorded as a FAILED
  `job_run` row, and the task fails without retries (a retry cannot fix the input).
- plans with the job's own `plan()` (a few metadata queries) for the jobs whose plan is cheap and complete;
  when there is nothing to do, it records a SUCCEEDED row (planned 0) and the Spark task is skipped: an idle
  scheduled run costs about a second instead of a Spark start.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from tiering.errors import BadInput
from tiering.jobs.runner import planned_ledgers
from tiering.jobs.spec import CHECKS, JOBS, run_job_name, spark_submit_args
from tiering.metadata.job_runs import JobOutcome, JobRuns, RunRef
from tiering.model import check_export_location, check_topic_name, preview_marks

@dataclass(frozen=True)
class Preflight:
    args: list[str]  # the job's arguments, validated
    planned: int | None  # items the job would take now; None: not planned here (the job always runs)
    ledgers: int | None = None  # ledgers in those items, when they are batches of ledgers (offload)

    @property
    def run_spark(self) -> bool:
        return self.planned != 0


def check_conf(dag_id: str, conf: dict | None, allowed: set[str]) -> None:
    """A conf key the DAG does not take is a typo or a misunderstanding: refuse it by name."""
    unknown = sorted(set(conf or {}) - allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) if allowed else "no parameters"
        raise BadInput(f"{dag_id} does not take {', '.join(repr(k) for k in unknown)}; it takes: {takes}")


def job_args(dag_id: str, params: dict) -> list[str]:
    """The job's arguments from the run's params (the plan task and the Spark task both build them here)."""
    return spark_submit_args(dag_id, **{name: params.get(name) for name in CHECKS})


def plan_count(dag_id: str, args: list[str], deps) -> tuple[int | None, int | None]:
    """(items, ledgers in them) of the job's plan now; (None, None) when it is not planned here."""
    spec = JOBS[dag_id]
    if not spec.planned_before_spark:  # GC, retention and the export always run (JobSpec)
        return None, None
    module = importlib.import_module(spec.module)
    items = module.plan(deps, module.build_parser().parse_args(args))
    return len(items), planned_ledgers(items)


def _storable(topic: object) -> str | None:
    """The refused run's topic for its row, if PostgreSQL text can hold it (a refused name may be a list, or
    hold NUL or bytes that are not UTF-8: recording it would fail the task with a traceback, and be retried)."""
    try:
        return None if topic is None else check_topic_name(topic, existing=True)
    except BadInput:
        return None


def preflight(dag_id: str, conf: dict | None, params: dict, allowed: set[str], deps_factory, ref: RunRef,
              settings=None) -> Preflight:
    """Validate, plan, and record the run's row when it ends here. `deps_factory()` gives the job's clients
    (called once; its engine is disposed here); `settings` their settings (an export's S3 location is
    looked at with them). Raises `BadInput` (already recorded) on bad input."""
    topic = params.get("topic") or None
    dry_run = params.get("dry_run") is True
    job = run_job_name(JOBS[dag_id].application.removesuffix(".py"), dry_run)
    marks = preview_marks(dry_run)
    deps = None
    try:
        deps = deps_factory()
        try:
            check_conf(dag_id, conf, allowed)
            args = job_args(dag_id, params)
            if params.get("dest"):  # an export under the tier-2 prefix would be deleted by GC's orphan sweep
                check_export_location(params["dest"], deps.bucket.name, deps.bucket.prefix)
                # what the job would refuse only after Spark started, and be retried: a local path it cannot
                # use, a bucket that does not exist, a complete export there, files that are not an export's
                from tiering.ops.export_metadata import check_export_target  # pyarrow: only for an export

                check_export_target(params["dest"], settings)
            if topic and not JOBS[dag_id].planned_before_spark:
                # a job planned here finds its topic in its plan; the others (the scrub) would start Spark,
                # and retry it, only to be told the topic does not exist
                deps.meta.get_topic(topic)
            planned, ledgers = plan_count(dag_id, args, deps)
        except BadInput as exc:
            JobRuns(deps.meta.engine).record(job, _storable(topic), ref, JobOutcome(errors=[f"bad input: {exc}"],
                                                                                    details={"planned": 0, **marks}))
            raise
        if planned == 0:
            JobRuns(deps.meta.engine).record(job, topic, ref, JobOutcome(
                details={"planned": 0, "spark": "skipped", **marks}))
        return Preflight(args, planned, ledgers)
    finally:
        if deps is not None:
            deps.meta.engine.dispose()
