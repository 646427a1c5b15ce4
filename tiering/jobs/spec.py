"""The pipeline's jobs and DAGs as data, and the pure function that builds spark-submit arguments.

No Airflow and no Spark imports here: the DAG files and the tests use the same table. Secrets never enter
`application_args`; settings reach the job through the environment.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from tiering.errors import BadInput
from tiering.model import TOPIC_MAX, Position, check_topic_name, parse_int

JOBS_DIR = Path(__file__).resolve().parent
# Airflow's trigger form validates with these (JSON-schema patterns, which Airflow checks with Python's
# re.search, where `$` also matches before a trailing newline: `(?!\n)` refuses that; in a browser's regex
# `$` is the end already). Positions are ASCII digits; topic names have no control characters.
POSITION_PATTERN = r"^[0-9]{1,18}:[0-9]{1,18}$(?!\n)"
TOPIC_PATTERN = r"^[^\x00-\x1f\x7f-\x9f\u2028\u2029]+$(?!\n)"


def int_arg(what: str, lo: int, hi: int):
    """An argparse `type` for a job's integer argument: ASCII digits within [lo, hi], else exit 2."""
    def parse(text: str) -> int:
        try:
            return parse_int(text, what, lo, hi)
        except BadInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def position_arg(text: str) -> Position:
    """An argparse `type` for a job's `--position=L:E`."""
    try:
        return Position.parse(text)
    except BadInput as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class JobSpec:
    dag_id: str
    schedule: str | None
    application: str  # file name under tiering/jobs/
    summary: str
    fixed_args: tuple[str, ...] = ()
    tags: tuple[str, ...] = field(default_factory=tuple)
    needs_jdbc: bool = False

    @property
    def application_path(self) -> str:
        return str(JOBS_DIR / self.application)


JOBS: dict[str, JobSpec] = {j.dag_id: j for j in [
    JobSpec("tiering_offload_by_age", "*/15 * * * *", "offload.py",
            "Offload sealed ledgers older than their topic's offload-after.", ("--by=age",), ("offload",)),
    JobSpec("tiering_offload_by_size", "*/15 * * * *", "offload.py",
            "Offload the oldest ledgers while a topic's tier-1 tail exceeds its threshold.", ("--by=size",),
            ("offload",)),
    JobSpec("tiering_offload_prefix", None, "offload.py",
            "Pulsar's offloadPrefix: offload every sealed ledger before a position (manual, with a form).",
            (), ("offload", "manual")),
    JobSpec("tiering_delete_lagged", "@hourly", "delete_lagged.py",
            "Delete tier-1 copies of ledgers offloaded longer ago than the deletion lag.", (), ("tier1",)),
    JobSpec("tiering_retention", "@hourly", "retention.py",
            "Truncate topic heads by retention time and size; their objects go to GC.", (), ("retention",)),
    JobSpec("tiering_defrag", "@daily", "defrag.py", "Merge runs of small tier-2 objects.", (), ("tier2",)),
    JobSpec("tiering_gc", "@hourly", "gc.py",
            "Delete queued and orphaned tier-2 objects and stale multipart uploads.", (), ("tier2", "gc")),
    JobSpec("tiering_metadata_export", "@daily", "export_metadata.py",
            "Parquet snapshot of the metadata tables (Spark over JDBC).", (), ("metadata",), needs_jdbc=True),
]}


def spark_submit_args(dag_id: str, topic: str | None = None, position: str | None = None,
                      dest: str | None = None) -> list[str]:
    """`application_args` of a job: its fixed flags plus the run's parameters, validated."""
    spec = JOBS.get(dag_id)
    if spec is None:
        raise BadInput(f"unknown job {dag_id!r}")
    args = list(spec.fixed_args)
    if dag_id == "tiering_offload_prefix":
        if not topic or not position:
            raise BadInput("offloadPrefix needs a topic and a position L:E")
        Position.parse(position)  # ASCII digits, the whole string
        # "--flag=value": a topic that starts with "-" must not read as a flag
        return args + [f"--prefix={check_topic_name(topic)}", f"--position={position}"]
    if position:
        raise BadInput(f"{dag_id} takes no position")
    if topic:
        args += [f"--topic={check_topic_name(topic)}"]
    if dest:
        if spec.dag_id != "tiering_metadata_export":
            raise BadInput(f"{dag_id} takes no destination")
        args += [f"--dest={dest}"]
    return args
