"""The pipeline's jobs and DAGs as data, and the pure function that builds spark-submit arguments.

No Airflow and no Spark imports here: the DAG files and the tests use the same table. Secrets never enter
`application_args`; settings reach the job through the environment.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tiering.argtypes import arg_type
from tiering.errors import BadInput
from tiering.model import (CONTROL_CHARS, INT64_MAX, POSITION_REGEX, TOPIC_MAX, Position, check_export_location,
                           check_topic_name, parse_int)
from tiering.units import SIZE_HELP, SIZE_PATTERN, parse_duration, parse_size

JOBS_DIR = Path(__file__).resolve().parent
# Airflow's trigger form validates with these (JSON-schema patterns, which Airflow checks with Python's
# re.search, where `$` also matches before a trailing newline: `(?!\n)` refuses that; in a browser's regex
# `$` is the end already). Positions are ASCII digits; topic names have no control characters.
POSITION_PATTERN = rf"^{POSITION_REGEX}$(?!\n)"
# offloadPrefix's position: L:E, or ALL_SEALED (every sealed ledger: the CLI's `offload-prefix --all-sealed`)
ALL_SEALED = "all"
PREFIX_POSITION_PATTERN = rf"^({ALL_SEALED}|{POSITION_REGEX})$(?!\n)"
TOPIC_PATTERN = rf"^[^{CONTROL_CHARS}]+$(?!\n)"


def int_arg(what: str, lo: int, hi: int):
    """An argparse `type` for a job's integer argument: ASCII digits within [lo, hi], else exit 2."""
    return arg_type(parse_int, what, lo, hi)


def size_arg(what: str, lo: int, hi: int):
    """An argparse `type` for a job's size argument: bytes, or a number with a unit (tiering/units.py)."""
    return arg_type(parse_size, what, lo, hi)


def duration_arg(what: str, lo: int, hi: int):
    """An argparse `type` for a job's duration argument: seconds, or a number with a unit."""
    return arg_type(parse_duration, what, lo, hi)


# an argparse `type` for a job's `--position=L:E`
position_arg = arg_type(Position.parse)


def prefix_position_arg(text: str) -> Position | str:
    """offloadPrefix's `--position`: L:E, or ALL_SEALED."""
    return ALL_SEALED if text == ALL_SEALED else position_arg(text)


@dataclass(frozen=True)
class RunParam:
    """A run parameter a job takes (an Airflow param and `dag_run.conf` key) and the job argument it becomes."""
    name: str  # "topic", "position", "dest" or "check_pages": how it is validated (CHECKS)
    flag: str  # the job's argument, written as "--flag=value": a value starting with "-" cannot read as a flag
    # (a switch, in SWITCHES, is written as the bare flag when true and left out when false)
    required: bool = False


def _check_position(text: str) -> str:
    if text != ALL_SEALED:
        Position.parse(text)  # ASCII digits, the whole string
    return text


def _check_switch(value: object) -> bool:
    if not isinstance(value, bool):  # "false" would be true: only a JSON boolean is a switch's value
        raise BadInput(f"a switch is true or false, got {value!r}")
    return value


def _check_rate(value: object) -> str:
    """Bytes per second: a JSON integer, or a string with a unit ("10MiB"); passed on as bytes. JSON does not
    tell 8 from 8.0 and neither does the form's schema ("integer" takes both), so a whole float is its integer."""
    if isinstance(value, float) and value.is_integer() and 0 <= value <= INT64_MAX:
        value = int(value)
    if isinstance(value, str):
        return str(parse_size(value, "an upload limit (per second, 0: unlimited)", 0, INT64_MAX))
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX:
        raise BadInput(f"an upload limit is a whole number of bytes per second, or a size per second "
                       f"({SIZE_HELP}; 0: unlimited), got {value!r}")
    return str(value)


def run_job_name(job: str, dry_run: bool) -> str:
    """A run's `job_run.job`: a preview is a job of its own ("recover_dry_run"), so it never stands as the
    job's last run in `topic stats`, the metrics or a query for the last recovery."""
    return f"{job}_dry_run" if dry_run else job


# every run parameter's check, in the order a parameter the job does not take is refused (position first)
CHECKS = {"position": _check_position, "topic": check_topic_name, "dest": check_export_location,
          "check_pages": _check_switch, "max_bytes_per_second": _check_rate, "repair": _check_switch,
          "retry_failed": _check_switch, "dry_run": _check_switch}
NOUNS = {"topic": "topic", "position": "position", "dest": "destination",  # in "<dag> takes no <noun>"
         "check_pages": "page check", "max_bytes_per_second": "upload limit", "repair": "repair",
         "retry_failed": "retry of FAILED GC keys", "dry_run": "dry run"}
SWITCHES = frozenset({"check_pages", "repair", "retry_failed", "dry_run"})
TOPIC = RunParam("topic", "--topic")
DEST = RunParam("dest", "--dest")
CHECK_PAGES = RunParam("check_pages", "--check-pages")
# the offload job's rate budget for this run (split across its tasks; tiering/tier2/throttle.py)
RATE = RunParam("max_bytes_per_second", "--max-bytes-per-second")
# the scrub's repair step (tiering/ops/repair.py) on the topics it found broken; off unless asked for
REPAIR = RunParam("repair", "--repair")
# GC's queue keys FAILED after their last refused delete made due again first (`tiering gc --retry-failed`)
RETRY_FAILED = RunParam("retry_failed", "--retry-failed")
# a recovery's preview: each topic's decisions made and rolled back (`tiering recover-from-bucket --dry-run`)
DRY_RUN = RunParam("dry_run", "--dry-run")


@dataclass(frozen=True)
class JobSpec:
    dag_id: str
    schedule: str | None
    application: str  # file name under tiering/jobs/
    summary: str
    fixed_args: tuple[str, ...] = ()
    tags: tuple[str, ...] = field(default_factory=tuple)
    needs_jdbc: bool = False
    params: tuple[RunParam, ...] = (TOPIC,)  # the run parameters it takes, in the form's order
    missing: str = ""  # the sentence when a required parameter is missing
    planned_before_spark: bool = False  # the job's plan() is the whole decision: preflight skips idle runs
    run_kind: str = ""  # job_run.kind of its runs; default: the DAG id without "tiering_"

    @property
    def application_path(self) -> str:
        return str(JOBS_DIR / self.application)

    @property
    def module(self) -> str:
        return f"tiering.jobs.{self.application.removesuffix('.py')}"

    @property
    def kind(self) -> str:
        return self.run_kind or self.dag_id.removeprefix("tiering_")

    def param_names(self) -> set[str]:
        return {p.name for p in self.params}


# The DAGs whose plan() is the whole decision, read from metadata (and tier-1 sizes for by-size) have
# planned_before_spark; so has GC, whose plan is a count of due queue rows and a listing of stale multipart
# uploads (its cost follows the queue; the orphan sweep, which must list the bucket, is tiering_gc_sweep).
# So has retention: its plan names the topics with ledgers due, a trim marker behind the trim point or a
# trimmed ledger's tier-1 copy left (a trim interrupted by a crash), so an idle hour starts no Spark. The
# sweep (its plan cannot know about orphans without the listing that is its work) and the export always run.
JOBS: dict[str, JobSpec] = {j.dag_id: j for j in [
    JobSpec("tiering_offload_by_age", "*/15 * * * *", "offload.py",
            "Offload sealed ledgers older than their topic's offload-after.", ("--by=age",), ("offload",),
            params=(TOPIC, RATE), planned_before_spark=True),
    JobSpec("tiering_offload_by_size", "*/15 * * * *", "offload.py",
            "Offload the oldest ledgers while a topic's tier-1 tail exceeds its threshold.", ("--by=size",),
            ("offload",), params=(TOPIC, RATE), planned_before_spark=True),
    JobSpec("tiering_offload_prefix", None, "offload.py",
            "Pulsar's offloadPrefix: offload every sealed ledger before a position (manual, with a form).",
            (), ("offload", "manual"),
            params=(RunParam("topic", "--prefix", required=True), RunParam("position", "--position", required=True),
                    RATE),
            missing="offloadPrefix needs a topic and a position L:E", planned_before_spark=True),
    JobSpec("tiering_delete_lagged", "@hourly", "delete_lagged.py",
            "Delete tier-1 copies of ledgers offloaded longer ago than the deletion lag.", (), ("tier1",),
            planned_before_spark=True),
    JobSpec("tiering_retention", "@hourly", "retention.py",
            "Truncate topic heads by retention time and size; their objects go to GC.", (), ("retention",),
            planned_before_spark=True),
    JobSpec("tiering_defrag", "@daily", "defrag.py", "Merge runs of small tier-2 objects.", (), ("tier2",),
            planned_before_spark=True),
    # GC works on the whole bucket prefix: a topic filter would be ignored
    JobSpec("tiering_gc", "@hourly", "gc.py",
            "Delete due queued tier-2 objects and abort stale multipart uploads.", (), ("tier2", "gc"),
            params=(RETRY_FAILED,), planned_before_spark=True),
    JobSpec("tiering_gc_sweep", "@daily", "gc_sweep.py",
            "Sweep orphaned tier-2 objects: a page budget per run, resuming from a persisted cursor.", (),
            ("tier2", "gc"), params=()),
    # manual: rebuild the metadata of a lost database from the bucket and tier 1 (tiering/jobs/recover.py)
    JobSpec("tiering_recover", None, "recover.py",
            "Recover the metadata from the bucket's index objects and tier 1 (manual, after losing the database).",
            (), ("metadata", "manual"), params=(TOPIC, CHECK_PAGES, DRY_RUN), planned_before_spark=True),
    # an export is always of every table: no topic
    JobSpec("tiering_metadata_export", "@daily", "export_metadata.py",
            "Parquet snapshot of the metadata tables (Spark over JDBC).", (), ("metadata",), needs_jdbc=True,
            params=(DEST,), run_kind="export_metadata"),
    # hourly and after every offload (airflow_dags.RUNS_ON); its plan is metadata queries only
    JobSpec("tiering_table_sync", "@hourly", "table_sync.py",
            "Append every sealed ledger of topics with a table to their Iceberg tables, exactly once.", (),
            ("tables",), planned_before_spark=True),
    # pyiceberg on the driver only: its plan names the topics whose table exists
    JobSpec("tiering_table_maintenance", "@daily", "table_maintenance.py",
            "Compact small data files of the topics' Iceberg tables and expire old snapshots.", (),
            ("tables",), planned_before_spark=True),
    # weekly and manual, paused when first deployed (dags/tiering_scrub.py): it reads every byte of tier 2
    JobSpec("tiering_scrub", "@weekly", "scrub.py",
            "Scrub every topic through the Spark source: read every entry, check every page (paused by default).",
            (), ("verify", "tier2"), params=(TOPIC, REPAIR)),
]}


def spark_submit_args(dag_id: str, **given) -> list[str]:
    """`application_args` of a job: its fixed flags plus the run's parameters (those its spec takes, by their
    names in CHECKS; None, "" and false are "not given"), validated. Required parameters are checked first,
    then a parameter the job does not take is refused."""
    spec = JOBS.get(dag_id)
    if spec is None:
        raise BadInput(f"unknown job {dag_id!r}")
    unknown = set(given) - set(CHECKS)
    if unknown:  # a caller's mistake, not the user's: no run parameter has that name
        raise TypeError(f"no run parameter named {', '.join(sorted(unknown))}")
    given = {name: given.get(name) for name in CHECKS}
    if any(p.required and not given[p.name] for p in spec.params):
        raise BadInput(spec.missing or f"{dag_id} needs {' and '.join(p.name for p in spec.params if p.required)}")
    for name in CHECKS:
        if given[name] is not None and given[name] != "" and given[name] is not False \
                and name not in spec.param_names():
            raise BadInput(f"{dag_id} takes no {NOUNS[name]}")
    # validated in reverse form order: offloadPrefix reports a bad position before a bad topic, as it did
    values = {p.name: CHECKS[p.name](given[p.name]) for p in reversed(spec.params) if given[p.name] is not None
              and (given[p.name] != "" or p.name in SWITCHES)}
    return list(spec.fixed_args) + [p.flag if p.name in SWITCHES else f"{p.flag}={values[p.name]}"
                                    for p in spec.params if values.get(p.name) not in (None, False)]
