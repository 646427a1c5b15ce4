"""Read-only queries behind the tiering dashboard (plugins/tiering_dashboard): SQL over the operators'
views in sql/views (`tier_usage`, `offload_backlog`, `lagged_copies`, `gc_queue`) and the tables they
summarise, each returning plain JSON-ready values (ints, floats, strings, ISO timestamps).

Each answer costs what it shows, not what the store has held: per-topic counts come from the maintained
totals (`topic_usage`, migration 0003), the backlog, lagged copies and GC queue from partial indexes, job
runs from the newest ones, the series from maintained hourly counters (`ledger_hourly`, migration 0010;
steps of whole hours) or range scans over its window (other steps; see `_SERIES_SQL`), the
subscriptions' backlogs from one range scan per subscription from its position (see `subscriptions`).

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
from tiering.metadata.subscriptions import _STATE, BACKLOG_LATERAL

STATEMENT_TIMEOUT_MS = 15_000
# Server-side settings of every dashboard session (libpq `options`): a second lock on writes, in case a
# statement ever ran outside the read-only transaction the engine opens.
READ_ONLY_CONNECT_ARGS = {
    # jit off: the dashboard's statements are short; compiling one costs more than running it (~0.4 s)
    "options": f"-c default_transaction_read_only=on -c statement_timeout={STATEMENT_TIMEOUT_MS} -c jit=off",
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
    """Every topic: its policy (with the subscription policy of migration 0006: retain_unread, the ceilings
    max_retention_seconds / max_retention_bytes and subscription_expiry_seconds, -1 meaning off), how many
    ledgers it has in each state (from the maintained totals, table `topic_usage`: one row per topic, whatever
    the store's history) and how many subscriptions it has."""
    return {"topics": _rows(conn, """
        SELECT t.name AS topic, t.offload_after_seconds, t.offload_threshold_bytes, t.deletion_lag_seconds,
               t.retention_seconds, t.retention_bytes, t.rollover_entries, t.rollover_bytes, t.next_ledger_id,
               t.created_at, t.retain_unread, t.max_retention_seconds, t.max_retention_bytes,
               t.subscription_expiry_seconds, coalesce(sc.subscriptions, 0) AS subscriptions,
               coalesce(u.open_ledgers, 0)       AS open_ledgers,
               coalesce(u.sealed_ledgers, 0)     AS sealed_ledgers,
               coalesce(u.offloading_ledgers, 0) AS offloading_ledgers,
               coalesce(u.offloaded_ledgers, 0)  AS offloaded_ledgers,
               coalesce(u.deleted_ledgers, 0)    AS deleted_ledgers,
               coalesce(u.live_entries, 0)       AS entries,
               coalesce(u.live_bytes, 0)         AS size_bytes
        FROM tiering.topic t
        LEFT JOIN tiering.topic_usage u USING (topic_id)
        LEFT JOIN (SELECT topic_id, count(*) AS subscriptions FROM tiering.subscription GROUP BY topic_id) sc
            USING (topic_id)
        ORDER BY t.name""")}


def tier_usage(conn: Connection) -> dict:
    """Bytes and ledgers per tier per topic (view `tier_usage`, over `topic_usage`): a ledger offloaded
    whose tier-1 copy still waits for its deletion lag counts on both tiers. `tier2_stored_bytes` is the
    bytes of its tier-2 data objects (PIP-17 block headers and padding included)."""
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


# Every subscription with its backlog (BACKLOG_LATERAL of metadata/subscriptions.py, the subquery `tiering
# subscription list` uses: a range of index ledger_live_by_topic from the position), its state by the one
# definition of EXPIRED, and the totals over all of them (window aggregates, computed before the LIMIT).
_SUBSCRIPTIONS_SQL = f"""
    WITH subs AS (
        SELECT t.name AS topic, s.name, s.ack_ledger_id, s.ack_entry_id, {_STATE} AS state, s.created_at,
               s.last_ack_at, b.entries AS backlog_entries, b.bytes AS backlog_bytes, b.oldest_unread_at,
               extract(epoch FROM now() - b.oldest_unread_at)::float8 AS oldest_unread_age_seconds,
               s.entries_deleted_unread, s.bytes_deleted_unread, s.last_loss_at, s.last_loss_reason,
               o.ledger_id AS open_ledger_id
        FROM tiering.subscription s JOIN tiering.topic t ON t.topic_id = s.topic_id
        CROSS JOIN LATERAL {BACKLOG_LATERAL} b
        LEFT JOIN tiering.ledger o ON o.topic_id = s.topic_id AND o.state = 'OPEN')
    SELECT subs.*,
           count(*) OVER () AS n_total, count(*) FILTER (WHERE state = 'EXPIRED') OVER () AS n_expired,
           (sum(backlog_entries) OVER ())::bigint AS sum_backlog_entries,
           (sum(backlog_bytes) OVER ())::bigint AS sum_backlog_bytes,
           (sum(entries_deleted_unread) OVER ())::bigint AS sum_entries_deleted_unread,
           (sum(bytes_deleted_unread) OVER ())::bigint AS sum_bytes_deleted_unread,
           count(*) FILTER (WHERE entries_deleted_unread > 0) OVER () AS n_with_losses
    FROM subs
    ORDER BY backlog_bytes DESC, backlog_entries DESC, topic, name
    LIMIT :limit"""
_SUBSCRIPTION_TOTALS = {"n_total": "subscriptions", "n_expired": "expired", "sum_backlog_entries": "backlog_entries",
                        "sum_backlog_bytes": "backlog_bytes", "sum_entries_deleted_unread": "entries_deleted_unread",
                        "sum_bytes_deleted_unread": "bytes_deleted_unread", "n_with_losses": "with_losses"}


def subscriptions(conn: Connection, limit: int = 100) -> dict:
    """Subscriptions (table `subscription`, migration 0006), the `limit` with the largest backlog first, each
    with its position ("L:E" of the last entry read, null before the first), state (ACTIVE | EXPIRED), backlog
    (entries after the position and their bytes, a partly read ledger's prorated by entries; the age of the
    ledger holding its first unread entry), what retention deleted before it read it, and the last loss's reason
    and time; `total` sums over every subscription. The backlog counts SEALED ledgers only: the open ledger's
    length is in its tier-1 file, which the API server may not see (`tiering subscription list` adds it);
    `open_ledger_id` names the topic's open ledger, whose entries may be unread too."""
    rows = _rows(conn, _SUBSCRIPTIONS_SQL, limit=_limit(limit), now=None)
    total = {name: (rows[0][key] if rows else 0) for key, name in _SUBSCRIPTION_TOTALS.items()}
    out = []
    for r in rows:
        for key in _SUBSCRIPTION_TOTALS:
            del r[key]
        l_id, e_id = r.pop("ack_ledger_id"), r.pop("ack_entry_id")
        out.append({"topic": r.pop("topic"), "name": r.pop("name"),
                    "position": None if l_id is None else f"{l_id}:{e_id}", **r})
    return {"total": total, "subscriptions": out}


def integrity(conn: Connection, limit: int = 100) -> dict:
    """Lost ledgers (marked by `tiering repair`: no tier holds a good copy; reads give their DATALOSS gap),
    from the partial index `ledger_lost`, and what the newest scrub that looked found: tier-2 copies
    `repairable` from a verified tier-1 copy and `unrepairable` ones (null before any such scrub)."""
    by_topic = _rows(conn, """
        SELECT t.name AS topic, count(*) AS lost FROM tiering.ledger l JOIN tiering.topic t USING (topic_id)
        WHERE l.lost_at IS NOT NULL AND l.state <> 'DELETED' GROUP BY t.name ORDER BY t.name""")
    ledgers = _rows(conn, """
        SELECT t.name AS topic, l.ledger_id, l.entry_count, l.size_bytes, l.lost_at, l.lost_reason
        FROM tiering.ledger l JOIN tiering.topic t USING (topic_id)
        WHERE l.lost_at IS NOT NULL AND l.state <> 'DELETED' ORDER BY l.lost_at DESC, t.name, l.ledger_id
        LIMIT :limit""", limit=_limit(limit))
    last = _rows(conn, """
        SELECT run_id, started_at, (details->>'repairable')::bigint AS repairable,
               (details->>'unrepairable')::bigint AS unrepairable, (details->>'repaired')::bigint AS repaired
        FROM tiering.job_run WHERE job = 'scrub' AND status <> 'RUNNING' AND details ? 'repairable'
        ORDER BY started_at DESC LIMIT 1""")
    scrub = last[0] if last else {"run_id": None, "started_at": None, "repairable": None, "unrepairable": None,
                                  "repaired": None}
    return {"lost": sum(r["lost"] for r in by_topic), "by_topic": by_topic, "ledgers": ledgers, "last_scrub": scrub}


def job_runs(conn: Connection, limit: int = 50) -> dict:
    """The most recent pipeline runs (table `job_run`), newest first, with their kind (offload_by_age, ...)
    and the Airflow DAG run and try that ran them (null for runs started by hand)."""
    return {"runs": _rows(conn, """
        SELECT run_id, job, coalesce(kind, job) AS kind, dag_id, dag_run_id, try_number, topic, status,
               started_at, ended_at,
               extract(epoch FROM coalesce(ended_at, now()) - started_at)::float8 AS duration_seconds,
               items_done, items_failed, bytes, error
        FROM tiering.job_run ORDER BY run_id DESC LIMIT :limit""", limit=_limit(limit))}


# The parts both series queries share: the buckets, the sums per bucket, and the job runs' events in them.
_BUCKETS = """
    WITH buckets AS (
        SELECT i, CAST(:w AS timestamptz) + make_interval(secs => :step * i) AS bucket_start,
               CAST(:w AS timestamptz) + make_interval(secs => :step * (i + 1)) AS bucket_end
        FROM generate_series(0, :count - 1) AS i),"""
_COUNTS_HEAD = """
        SELECT k, sum(ob) AS offloaded_bytes, sum(ol) AS offloaded_ledgers, sum(bb) AS backlog_bytes,
               sum(bn) AS backlog_ledgers, sum(jr) AS job_runs, sum(jb) AS job_bytes
        FROM (
"""
_JOB_EVENTS = """            UNION ALL
            SELECT date_bin(make_interval(secs => :step), j.started_at, :w), 0, 0, 0, 0, 1, 0
            FROM tiering.job_run j WHERE j.started_at >= :w AND j.started_at < :w_end
            UNION ALL
            SELECT date_bin(make_interval(secs => :step), j.ended_at, :w), 0, 0, 0, 0, 0, j.bytes
            FROM tiering.job_run j WHERE j.ended_at >= :w AND j.ended_at < :w_end) AS x
        GROUP BY k)
"""
# The series reads only rows that can fall in its window, through indexes (migration 0003), so its cost
# follows the window and the backlog, not the history:
# - offloaded per bucket: one range scan of `offloaded_at` over the window (index ledger_series_offloaded);
# - the backlog at each bucket end `at`: a ledger is in it while sealed_at <= at < end, with
#   end = least(offloaded_at, deleted_at) (null: not yet). Every `at` is after the window start W, so a
#   ledger with end <= W is in no bucket; the others are those not yet ended (partial index
#   ledger_series_unended, as small as the backlog) and those offloaded or deleted after W (range scans).
#   Each adds +1 at sealed_at and -1 at end; the backlog at a bucket end is the running sum of the events
#   up to it, exactly the set the old per-bucket scan counted (tests/integration/test_dashboard_scale.py
#   compares both);
# - job runs started / ended per bucket: range scans of job_run's started_at / ended_at.
# Every row lands in its bucket by date_bin (exact microseconds). An event at t counts from the first bucket
# whose end is >= t: the bin of t - 1 us (timestamps have microsecond resolution), W's for t <= W. W, its end
# and now are bound as values, so the planner sees the ranges it reads.
_SERIES_SQL = _BUCKETS + """
    spans AS (
        SELECT l.sealed_at, NULL::timestamptz AS end_at, l.size_bytes
        FROM tiering.ledger l
        WHERE l.offloaded_at IS NULL AND l.deleted_at IS NULL AND l.entry_count > 0 AND l.sealed_at <= :now
        UNION ALL
        SELECT l.sealed_at, least(l.offloaded_at, l.deleted_at), l.size_bytes
        FROM tiering.ledger l
        WHERE l.offloaded_at > :w AND l.entry_count > 0 AND l.sealed_at <= :now
        UNION ALL
        SELECT l.sealed_at, least(l.offloaded_at, l.deleted_at), l.size_bytes
        FROM tiering.ledger l
        WHERE l.deleted_at > :w AND (l.offloaded_at IS NULL OR l.offloaded_at <= :w)
          AND l.entry_count > 0 AND l.sealed_at <= :now),
    counts AS (""" + _COUNTS_HEAD + """            SELECT date_bin(make_interval(secs => :step), l.offloaded_at, :w) AS k,
                   l.size_bytes AS ob, 1 AS ol, 0 AS bb, 0 AS bn, 0 AS jr, 0 AS jb
            FROM tiering.ledger l WHERE l.offloaded_at >= :w AND l.offloaded_at < :w_end
            UNION ALL
            SELECT greatest(date_bin(make_interval(secs => :step), e.at - interval '1 microsecond', :w),
                            CAST(:w AS timestamptz)),
                   0, 0, e.b, e.n, 0, 0
            FROM spans s
            CROSS JOIN LATERAL (VALUES (s.sealed_at, 1, s.size_bytes), (s.end_at, -1, -s.size_bytes)) AS e (at, n, b)
            WHERE (s.end_at IS NULL OR (s.end_at > :w AND s.end_at > s.sealed_at)) AND e.at <= :now
""" + _JOB_EVENTS + """    SELECT bk.bucket_start, bk.bucket_end,
           coalesce(c.offloaded_bytes, 0)::bigint AS offloaded_bytes,
           coalesce(c.offloaded_ledgers, 0)::bigint AS offloaded_ledgers,
           (sum(coalesce(c.backlog_bytes, 0)) OVER upto)::bigint AS backlog_bytes,
           (sum(coalesce(c.backlog_ledgers, 0)) OVER upto)::bigint AS backlog_ledgers,
           coalesce(c.job_runs, 0)::bigint AS job_runs, coalesce(c.job_bytes, 0)::bigint AS job_bytes
    FROM buckets bk
    LEFT JOIN counts c ON c.k = bk.bucket_start
    WINDOW upto AS (ORDER BY bk.i ROWS UNBOUNDED PRECEDING)
    ORDER BY bk.i"""
# Buckets of whole hours (the page's 24 h and the API's week and month) read the maintained hourly counters
# (`ledger_hourly`, migration 0010) instead: one row per topic and hour of the window, whatever number of
# ledgers the window holds. Offloads per bucket are the sum of its hours. The backlog at a bucket's end is
# the backlog now (partial index ledger_series_unended, as small as the backlog) minus the net changes of
# the hours after the bucket: the counters put an event at t in the hour (h, h + 1 h], as the query above
# puts it in its bucket, so the two agree (tests/integration/test_dashboard_scale.py compares both with the
# old per-bucket definition). The last bucket holds now: its backlog is the backlog now.
_SERIES_HOURLY_SQL = _BUCKETS + """
    backlog_now AS (
        SELECT count(*) AS n, coalesce(sum(l.size_bytes), 0) AS b
        FROM tiering.ledger l
        WHERE l.offloaded_at IS NULL AND l.deleted_at IS NULL AND l.entry_count > 0 AND l.sealed_at <= :now),
    counts AS (""" + _COUNTS_HEAD + """            SELECT date_bin(make_interval(secs => :step), h.hour, :w) AS k,
                   h.offloaded_bytes AS ob, h.offloaded_ledgers AS ol, h.backlog_bytes AS bb,
                   h.backlog_ledgers AS bn, 0 AS jr, 0 AS jb
            FROM tiering.ledger_hourly h WHERE h.hour >= :w AND h.hour < :w_end
""" + _JOB_EVENTS + """    SELECT bk.bucket_start, bk.bucket_end,
           coalesce(c.offloaded_bytes, 0)::bigint AS offloaded_bytes,
           coalesce(c.offloaded_ledgers, 0)::bigint AS offloaded_ledgers,
           (bn.b - coalesce(sum(c.backlog_bytes) OVER later, 0))::bigint AS backlog_bytes,
           (bn.n - coalesce(sum(c.backlog_ledgers) OVER later, 0))::bigint AS backlog_ledgers,
           coalesce(c.job_runs, 0)::bigint AS job_runs, coalesce(c.job_bytes, 0)::bigint AS job_bytes
    FROM buckets bk
    CROSS JOIN backlog_now bn
    LEFT JOIN counts c ON c.k = bk.bucket_start
    WINDOW later AS (ORDER BY bk.i ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING)
    ORDER BY bk.i"""
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def series_window(now: dt.datetime, step: int, count: int) -> dict:
    """The bound values of the series query: buckets of `step` seconds aligned on the epoch, the last one
    holding `now` (a timestamptz from the database, microseconds exact)."""
    now_us = (now - _EPOCH) // dt.timedelta(microseconds=1)
    w_epoch = now_us // (step * 1_000_000) * step - step * (count - 1)
    w = _EPOCH + dt.timedelta(seconds=w_epoch)
    return {"now": now, "w": w, "w_end": w + dt.timedelta(seconds=step * count),
            "step": step, "count": count}


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
    count = -(-int(hours) * 3600 // step) if step > 0 else 0  # ceil
    if step <= 0 or count <= 0 or count > MAX_SERIES_POINTS:
        raise ValueError(f"hours/step_minutes give {count} points; 1 to {MAX_SERIES_POINTS} allowed")
    # the database's clock, bound into the query with the window it gives (constants the planner can use)
    now = conn.execute(text("SELECT now()")).scalar_one()
    sql = _SERIES_HOURLY_SQL if step % 3600 == 0 else _SERIES_SQL
    points = _rows(conn, sql, **series_window(now, step, count))
    return {"hours": int(hours), "step_seconds": step, "points": points}
