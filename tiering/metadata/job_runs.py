"""`job_run` rows: one per pipeline run, for the UI and for SQL.

A RUNNING row is owned by the process that started it through a PostgreSQL session advisory lock taken in
the INSERT itself and held on a connection kept open until `finish`. A driver that is killed (Airflow's
execution_timeout, kill -9, OOM) loses its connection and so the lock; the next `start` of the same job
finds its row RUNNING and unlocked and closes it as FAILED ("abandoned"). A live run's row is never
touched: its lock is held. (A machine that vanishes without closing its TCP connections keeps the lock
until PostgreSQL's keepalive notices.)"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sqlalchemy import func, insert, literal, select, update
from sqlalchemy.engine import Engine

from tiering.metadata.tables import job_run


log = logging.getLogger(__name__)

# Advisory-lock keys of job_run rows: this base + run_id (one bigint key space, apart from small keys).
LOCK_BASE = 0x7469_6572 << 32


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


@dataclass(frozen=True)
class RunRef:
    """What started a run: its kind (offload_by_age, offload_prefix, ...) and, under Airflow, the DAG, the
    DAG run and the try, so a row leads back to its Airflow run."""
    kind: str | None = None
    dag_id: str | None = None
    dag_run_id: str | None = None
    try_number: int | None = None

    def values(self) -> dict:
        return {"kind": self.kind, "dag_id": self.dag_id, "dag_run_id": self.dag_run_id,
                "try_number": self.try_number}


def status_of(outcome: JobOutcome) -> str:
    return "FAILED" if outcome.items_failed or outcome.errors else "SUCCEEDED"


class JobRuns:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._held: dict = {}  # run_id -> the connection holding its lock

    def start(self, job: str, topic: str | None = None, ref: RunRef | None = None) -> int:
        """Insert the run's RUNNING row, owned by this process until `finish` (see the module's doc), after
        closing the rows of this job whose owner is gone."""
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            # try-lock, never a blocking one: the key of a fresh run_id is free unless ids were reused
            # (a restored or truncated table) while some session still holds the old key; then this run
            # goes on without an owner lock instead of waiting forever on that session.
            run_id, owned = conn.execute(insert(job_run).values(
                job=job, topic=topic, status="RUNNING", **(ref or RunRef(kind=job)).values()).returning(
                job_run.c.run_id, func.pg_try_advisory_lock(literal(LOCK_BASE) + job_run.c.run_id))).first()
            if not owned:
                log.warning("job_run %s: its owner lock is held by another session (reused run id); "
                            "a later run cannot tell whether this one is alive", run_id)
            self.close_abandoned(job, run_id)
        except BaseException:
            conn.close()  # back to the pool, which drops the lock (metadata/db.py)
            raise
        self._held[run_id] = conn
        return run_id

    def close_abandoned(self, job: str, by_run: int) -> list[int]:
        """Close as FAILED every RUNNING row of `job` whose owner holds no lock any more; their ids."""
        closed = []
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            running = conn.execute(select(job_run.c.run_id).where(
                job_run.c.job == job, job_run.c.status == "RUNNING", job_run.c.run_id != by_run)).scalars().all()
            for rid in running:
                if not conn.execute(select(func.pg_try_advisory_lock(LOCK_BASE + rid))).scalar():
                    continue  # its driver is alive
                try:
                    done = conn.execute(update(job_run).where(
                        job_run.c.run_id == rid, job_run.c.status == "RUNNING").values(
                        status="FAILED", ended_at=func.now(),
                        error=f"abandoned: the process running it stopped without recording an outcome "
                              f"(killed or timed out); closed by run {by_run}")).rowcount
                finally:
                    conn.execute(select(func.pg_advisory_unlock(LOCK_BASE + rid)))
                if done:
                    closed.append(rid)
        return closed

    def record(self, job: str, topic: str | None, ref: RunRef, outcome: JobOutcome) -> int:
        """One finished run in one statement: a run refused before it started (bad input) or one with
        nothing to do (no Spark started)."""
        with self.engine.begin() as conn:
            return conn.execute(insert(job_run).values(
                job=job, topic=topic, status=status_of(outcome), ended_at=func.now(), **ref.values(),
                **_outcome_values(outcome)).returning(job_run.c.run_id)).scalar_one()

    def by_airflow_run(self, dag_id: str, dag_run_id: str, try_number: int | None = None) -> dict | None:
        """The newest row of an Airflow run (of one try when given)."""
        query = select(job_run).where(job_run.c.dag_id == dag_id, job_run.c.dag_run_id == dag_run_id)
        if try_number is not None:
            query = query.where(job_run.c.try_number == try_number)
        with self.engine.connect() as conn:
            row = conn.execute(query.order_by(job_run.c.run_id.desc()).limit(1)).first()
        return dict(row._mapping) if row else None

    def finish(self, run_id: int, outcome: JobOutcome) -> None:
        status = status_of(outcome)
        try:
            with self.engine.begin() as conn:
                conn.execute(update(job_run).where(job_run.c.run_id == run_id).values(
                    status=status, ended_at=func.now(), **_outcome_values(outcome)))
        finally:  # not recorded: the row stays RUNNING, unlocked, and the next run closes it
            self._release(run_id)

    def _release(self, run_id: int) -> None:
        conn = self._held.pop(run_id, None)
        if conn is None:
            return
        try:  # explicitly: a pooled connection is not closed, and session locks outlive transactions
            conn.execute(select(func.pg_advisory_unlock(LOCK_BASE + run_id)))
        finally:
            conn.close()

    def recent(self, limit: int = 50) -> list[dict]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(job_run).order_by(job_run.c.run_id.desc()).limit(limit))
            return [dict(r._mapping) for r in rows]


def _outcome_values(outcome: JobOutcome) -> dict:
    return {"items_done": outcome.items_done, "items_failed": outcome.items_failed, "bytes": outcome.bytes,
            "error": outcome.errors[0][:2000] if outcome.errors else None, "details": outcome.details or None}
