"""Read-only queries behind the tiering dashboard (plugins/tiering_dashboard): SQL over the operators'
views in sql/views (`tier_usage`, `offload_backlog`, `lagged_copies`, `gc_queue`) and the tables they
summarise, each returning plain JSON-ready values (ints, floats, strings, ISO timestamps).

Every function takes an open `Connection` and only reads. `make_read_only_engine` builds the engine the
dashboard uses: every transaction it starts is READ ONLY (psycopg2 session flag and the server-side
`default_transaction_read_only`), REPEATABLE READ (one consistent snapshot per request) and bounded by a
statement timeout, so a dashboard request can neither write nor hold the database for long.
"""
from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from tiering.metadata.db import make_engine

STATEMENT_TIMEOUT_MS = 15_000
# Server-side settings of every dashboard session (libpq `options`): a second lock on writes, in case a
# statement ever ran outside the read-only transaction the engine opens.
READ_ONLY_CONNECT_ARGS = {
    "options": f"-c default_transaction_read_only=on -c statement_timeout={STATEMENT_TIMEOUT_MS}",
    "application_name": "tiering-dashboard",
    "connect_timeout": 5,
}
MAX_LIMIT = 500
MAX_SERIES_POINTS = 1000


def make_read_only_engine(url: str, pool_size: int = 2) -> Engine:
    """An engine whose transactions are read-only snapshots (no I/O here: connections open on first use)."""
    engine = make_engine(url, pool_size=pool_size, max_overflow=2, pool_recycle=1800,
                         connect_args=dict(READ_ONLY_CONNECT_ARGS))
    return engine.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)


# ---------------------------------------------------------------------------------------------- helpers

def _json_value(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _rows(conn: Connection, sql: str, **params) -> list[dict]:
    return [{k: _json_value(v) for k, v in row._mapping.items()} for row in conn.execute(text(sql), params)]


def _one(conn: Connection, sql: str, **params) -> dict:
    return _rows(conn, sql, **params)[0]


def _limit(limit: int) -> int:
    return max(1, min(int(limit), MAX_LIMIT))


# ---------------------------------------------------------------------------------------------- queries

def topics(conn: Connection) -> dict:
    """Every topic: its policy and how many ledgers it has in each state."""
    return {"topics": _rows(conn, """
        SELECT t.name AS topic, t.offload_after_seconds, t.offload_threshold_bytes, t.deletion_lag_seconds,
               t.retention_seconds, t.retention_bytes, t.rollover_entries, t.rollover_bytes, t.next_ledger_id,
               t.created_at,
               count(l.ledger_id) FILTER (WHERE l.state = 'OPEN')       AS open_ledgers,
               count(l.ledger_id) FILTER (WHERE l.state = 'SEALED')     AS sealed_ledgers,
               count(l.ledger_id) FILTER (WHERE l.state = 'OFFLOADING') AS offloading_ledgers,
               count(l.ledger_id) FILTER (WHERE l.state = 'OFFLOADED')  AS offloaded_ledgers,
               count(l.ledger_id) FILTER (WHERE l.state = 'DELETED')    AS deleted_ledgers,
               coalesce(sum(l.entry_count) FILTER (WHERE l.state <> 'DELETED'), 0)::bigint AS entries,
               coalesce(sum(l.size_bytes) FILTER (WHERE l.state <> 'DELETED'), 0)::bigint AS size_bytes
        FROM tiering.topic t
        LEFT JOIN tiering.ledger l USING (topic_id)
        GROUP BY t.topic_id
        ORDER BY t.name""")}


def tier_usage(conn: Connection) -> dict:
    """Bytes and ledgers per tier per topic (view `tier_usage`): a ledger offloaded whose tier-1 copy still
    waits for its deletion lag counts on both tiers. `tier2_stored_bytes` is the bytes of its tier-2 data
    objects (PIP-17 block headers and padding included)."""
    rows = _rows(conn, """
        SELECT topic, tier1_ledgers, tier1_bytes::bigint AS tier1_bytes, tier2_ledgers,
               tier2_bytes::bigint AS tier2_bytes, tier2_stored_bytes::bigint AS tier2_stored_bytes,
               deleted_ledgers
        FROM tiering.tier_usage ORDER BY topic""")
    keys = ("tier1_ledgers", "tier1_bytes", "tier2_ledgers", "tier2_bytes", "tier2_stored_bytes", "deleted_ledgers")
    totals = {k: sum(r[k] for r in rows) for k in keys}
    return {"topics": rows, "totals": {"topics": len(rows), **totals}}


def offload_backlog(conn: Connection, limit: int = 100) -> dict:
    """Sealed ledgers not yet in tier 2 and offloads in flight (view `offload_backlog`): per topic, and the
    oldest `limit` ledgers."""
    by_topic = _rows(conn, """
        SELECT topic, count(*) AS ledgers, sum(size_bytes)::bigint AS bytes,
               count(*) FILTER (WHERE state = 'OFFLOADING') AS offloading, min(sealed_at) AS oldest_sealed_at,
               extract(epoch FROM max(sealed_for))::float8 AS oldest_sealed_for_seconds
        FROM tiering.offload_backlog GROUP BY topic ORDER BY topic""")
    ledgers = _rows(conn, """
        SELECT topic, ledger_id, state::text AS state, entry_count, size_bytes, sealed_at,
               extract(epoch FROM sealed_for)::float8 AS sealed_for_seconds, offload_uuid::text AS offload_uuid,
               offload_started_at, extract(epoch FROM attempt_age)::float8 AS attempt_age_seconds
        FROM tiering.offload_backlog ORDER BY sealed_at, topic, ledger_id LIMIT :limit""", limit=_limit(limit))
    total = {"ledgers": sum(r["ledgers"] for r in by_topic), "bytes": sum(r["bytes"] for r in by_topic),
             "offloading": sum(r["offloading"] for r in by_topic)}
    return {"total": total, "by_topic": by_topic, "ledgers": ledgers}


def lagged_copies(conn: Connection, limit: int = 100) -> dict:
    """Tier-1 copies of offloaded ledgers waiting for their deletion lag (view `lagged_copies`); `due`
    ones are what the next `tiering_delete_lagged` run deletes."""
    by_topic = _rows(conn, """
        SELECT topic, count(*) AS copies, sum(size_bytes)::bigint AS bytes,
               count(*) FILTER (WHERE due) AS due, coalesce(sum(size_bytes) FILTER (WHERE due), 0)::bigint AS due_bytes,
               min(deletable_at) FILTER (WHERE NOT due) AS next_deletable_at
        FROM tiering.lagged_copies GROUP BY topic ORDER BY topic""")
    ledgers = _rows(conn, """
        SELECT topic, ledger_id, size_bytes, offloaded_at, deletion_lag_seconds, deletable_at, due
        FROM tiering.lagged_copies ORDER BY deletable_at, topic, ledger_id LIMIT :limit""", limit=_limit(limit))
    keys = ("copies", "bytes", "due", "due_bytes")
    return {"total": {k: sum(r[k] for r in by_topic) for k in keys}, "by_topic": by_topic, "ledgers": ledgers}


def gc_queue(conn: Connection, limit: int = 20) -> dict:
    """The GC queue (view `gc_queue`) summarised by state and reason; `due` counts PENDING keys whose
    not-before has passed (what the next `tiering_gc` run takes), `next` lists the first `limit` tasks."""
    summary = _rows(conn, """
        SELECT state, reason, count(*) AS tasks, count(*) FILTER (WHERE due AND state = 'PENDING') AS due,
               count(*) FILTER (WHERE referenced) AS referenced, max(attempts) AS max_attempts,
               min(not_before) AS next_not_before
        FROM tiering.gc_queue GROUP BY state, reason ORDER BY state, reason""")
    counts = _one(conn, """
        SELECT count(*) AS total, count(*) FILTER (WHERE state = 'PENDING') AS pending,
               count(*) FILTER (WHERE state = 'PENDING' AND due) AS due,
               count(*) FILTER (WHERE state = 'FAILED') AS failed
        FROM tiering.gc_queue""")
    upcoming = _rows(conn, """
        SELECT task_id, key, reason, state, attempts, not_before, due, referenced, last_error
        FROM tiering.gc_queue ORDER BY (state = 'FAILED'), not_before, task_id LIMIT :limit""", limit=_limit(limit))
    return {**counts, "summary": summary, "next": upcoming}


def job_runs(conn: Connection, limit: int = 50) -> dict:
    """The most recent pipeline runs (table `job_run`), newest first, with their kind (offload_by_age, ...)
    and the Airflow DAG run and try that ran them (null for runs started by hand)."""
    return {"runs": _rows(conn, """
        SELECT run_id, job, coalesce(kind, job) AS kind, dag_id, dag_run_id, try_number, topic, status,
               started_at, ended_at,
               extract(epoch FROM coalesce(ended_at, now()) - started_at)::float8 AS duration_seconds,
               items_done, items_failed, bytes, error
        FROM tiering.job_run ORDER BY run_id DESC LIMIT :limit""", limit=_limit(limit))}


def series(conn: Connection, hours: int = 24, step_minutes: int = 60) -> dict:
    """Time buckets of `step_minutes` over the last `hours` (the last bucket holds now), oldest first:

    - `offloaded_bytes` / `offloaded_ledgers`: ledgers whose offload completed in the bucket (their
      `offloaded_at`, kept when retention later deletes them);
    - `backlog_bytes` / `backlog_ledgers`: the offload backlog at the bucket's end (now for the last one):
      non-empty ledgers sealed by then and neither offloaded nor deleted by then, the same set as view
      `offload_backlog` at that moment;
    - `job_runs` / `job_bytes`: pipeline runs started in the bucket, and the bytes runs that ended in it
      reported (table `job_run`).
    """
    step = int(step_minutes) * 60
    count = -(-int(hours) * 3600 // step)  # ceil
    if step <= 0 or count <= 0 or count > MAX_SERIES_POINTS:
        raise ValueError(f"hours/step_minutes give {count} points; 1 to {MAX_SERIES_POINTS} allowed")
    points = _rows(conn, """
        WITH now_ AS (SELECT now() AS now),
        buckets AS (
            SELECT b AS bucket_start, b + make_interval(secs => :step) AS bucket_end,
                   least(b + make_interval(secs => :step), n.now) AS at
            FROM now_ n,
                 generate_series(to_timestamp(floor(extract(epoch FROM n.now) / :step) * :step)
                                   - make_interval(secs => :step * (:count - 1)),
                                 n.now, make_interval(secs => :step)) AS b)
        SELECT bk.bucket_start, bk.bucket_end,
               coalesce(o.bytes, 0)::bigint AS offloaded_bytes, coalesce(o.ledgers, 0) AS offloaded_ledgers,
               coalesce(bl.bytes, 0)::bigint AS backlog_bytes, coalesce(bl.ledgers, 0) AS backlog_ledgers,
               coalesce(js.runs, 0) AS job_runs, coalesce(je.bytes, 0)::bigint AS job_bytes
        FROM buckets bk
        LEFT JOIN LATERAL (
            SELECT sum(l.size_bytes) AS bytes, count(*) AS ledgers FROM tiering.ledger l
            WHERE l.offloaded_at >= bk.bucket_start AND l.offloaded_at < bk.bucket_end) o ON true
        LEFT JOIN LATERAL (
            SELECT sum(l.size_bytes) AS bytes, count(*) AS ledgers FROM tiering.ledger l
            WHERE l.entry_count > 0 AND l.sealed_at <= bk.at
              AND (l.offloaded_at IS NULL OR l.offloaded_at > bk.at)
              AND (l.deleted_at IS NULL OR l.deleted_at > bk.at)) bl ON true
        LEFT JOIN LATERAL (
            SELECT count(*) AS runs FROM tiering.job_run j
            WHERE j.started_at >= bk.bucket_start AND j.started_at < bk.bucket_end) js ON true
        LEFT JOIN LATERAL (
            SELECT sum(j.bytes) AS bytes FROM tiering.job_run j
            WHERE j.ended_at >= bk.bucket_start AND j.ended_at < bk.bucket_end) je ON true
        ORDER BY bk.bucket_start""", step=step, count=count)
    return {"hours": int(hours), "step_seconds": step, "points": points}
