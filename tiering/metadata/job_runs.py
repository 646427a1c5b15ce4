"""`job_run` rows: one per pipeline run, for the UI and for SQL."""
from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Engine

from tiering.metadata.tables import job_run


@dataclass
class JobOutcome:
    items_done: int = 0
    items_failed: int = 0
    bytes: int = 0
    errors: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)

    def add(self, other: "JobOutcome") -> None:
        self.items_done += other.items_done
        self.items_failed += other.items_failed
        self.bytes += other.bytes
        self.errors.extend(other.errors)


class JobRuns:
    def __init__(self, engine: Engine):
        self.engine = engine

    def start(self, job: str, topic: str | None = None) -> int:
        with self.engine.begin() as conn:
            return conn.execute(insert(job_run).values(job=job, topic=topic, status="RUNNING")
                                .returning(job_run.c.run_id)).scalar_one()

    def finish(self, run_id: int, outcome: JobOutcome) -> None:
        status = "FAILED" if outcome.items_failed or outcome.errors else "SUCCEEDED"
        with self.engine.begin() as conn:
            conn.execute(update(job_run).where(job_run.c.run_id == run_id).values(
                status=status, ended_at=func.now(), items_done=outcome.items_done,
                items_failed=outcome.items_failed, bytes=outcome.bytes,
                error=outcome.errors[0][:2000] if outcome.errors else None, details=outcome.details or None))

    def recent(self, limit: int = 50) -> list[dict]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(job_run).order_by(job_run.c.run_id.desc()).limit(limit))
            return [dict(r._mapping) for r in rows]
