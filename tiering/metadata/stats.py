"""`tiering topic stats`: per topic, ledgers and bytes per tier and state, the offload backlog, lagged
tier-1 copies, the oldest live ledger, subscriptions; with the GC queue and the last successful run of each
job. ONE statement whose cost follows what is live, never the history: the maintained totals
(`topic_usage`), the partial indexes of the backlog (`ledger_backlog`) and of lagged copies
(`ledger_lagged_copies`), ledgers marked lost (`ledger_lost`), the first live ledger on `ledger_live_by_topic`, the GC queue's `gc_task_due`, and
a skip scan of `job_run_job_started` (one probe per job name, whatever the number of runs)."""
from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Engine

# The GC queue holds keys, not sizes: its PENDING count and the part due now are what it can say.
STATS_SQL = """
WITH picked AS (
    SELECT topic_id, name, deletion_lag_seconds FROM tiering.topic
    WHERE (CAST(:topic AS text) IS NULL OR name = :topic)
), backlog AS (
    SELECT l.topic_id, count(*) AS ledger_count, sum(l.size_bytes)::bigint AS bytes,
           count(*) FILTER (WHERE l.state = 'OFFLOADING') AS offloading_count, min(l.sealed_at) AS oldest_sealed_at
    FROM tiering.ledger l
    WHERE l.state IN ('SEALED', 'OFFLOADING') AND l.entry_count > 0 AND l.topic_id IN (SELECT topic_id FROM picked)
    GROUP BY l.topic_id
), lagged AS (
    SELECT l.topic_id, count(*) AS copy_count, sum(l.size_bytes)::bigint AS bytes,
           count(*) FILTER (WHERE l.offloaded_at + make_interval(secs => p.deletion_lag_seconds) <= now())
               AS due_count
    FROM tiering.ledger l JOIN picked p USING (topic_id)
    WHERE l.state = 'OFFLOADED' AND l.tier1_present
    GROUP BY l.topic_id
), lost AS (
    -- no tier holds a good copy (marked by `tiering repair`, or recorded by recovery without any copy)
    SELECT l.topic_id, count(*) AS lost_count FROM tiering.ledger l
    WHERE l.lost_at IS NOT NULL AND l.state <> 'DELETED' AND l.topic_id IN (SELECT topic_id FROM picked)
    GROUP BY l.topic_id
), subs AS (
    SELECT s.topic_id, count(*) AS subscription_count FROM tiering.subscription s
    WHERE s.topic_id IN (SELECT topic_id FROM picked) GROUP BY s.topic_id
), gc AS (
    SELECT count(*) FILTER (WHERE state = 'PENDING') AS pending_count,
           count(*) FILTER (WHERE state = 'PENDING' AND not_before <= now()) AS due_count,
           count(*) FILTER (WHERE state = 'FAILED') AS failed_count
    FROM tiering.gc_task WHERE state IN ('PENDING', 'FAILED')
)
SELECT x.*, gc.pending_count AS gc_pending_count, gc.due_count AS gc_due_count,
       gc.failed_count AS gc_failed_count, now() AS now,
       (SELECT coalesce(jsonb_object_agg(j.job, to_char(r.ended_at AT TIME ZONE 'UTC',
                                                     'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')), '{}'::jsonb)
        FROM (WITH RECURSIVE names(job) AS (
                  SELECT min(job) FROM tiering.job_run
                  UNION ALL
                  SELECT (SELECT min(job) FROM tiering.job_run WHERE job > names.job) FROM names
                  WHERE names.job IS NOT NULL)
              SELECT job FROM names WHERE job IS NOT NULL) j
        CROSS JOIN LATERAL (SELECT ended_at FROM tiering.job_run r
                            WHERE r.job = j.job AND r.status = 'SUCCEEDED'
                            ORDER BY r.started_at DESC LIMIT 1) r) AS last_success
FROM gc LEFT JOIN (
    SELECT p.name AS topic,
       coalesce(u.open_ledgers, 0) AS open_count, coalesce(u.sealed_ledgers, 0) AS sealed_count,
       coalesce(u.offloading_ledgers, 0) AS offloading_count, coalesce(u.offloaded_ledgers, 0) AS offloaded_count,
       coalesce(u.deleted_ledgers, 0) AS deleted_count, coalesce(u.live_ledgers, 0) AS live_count,
       coalesce(u.live_entries, 0) AS live_entry_count, coalesce(u.live_bytes, 0) AS live_bytes,
       coalesce(u.tier1_ledgers, 0) AS tier1_count, coalesce(u.tier1_bytes, 0) AS tier1_bytes,
       coalesce(u.tier2_ledgers, 0) AS tier2_count, coalesce(u.tier2_bytes, 0) AS tier2_bytes,
       coalesce(u.tier2_stored_bytes, 0) AS tier2_stored_bytes,
       coalesce(b.ledger_count, 0) AS backlog_count, coalesce(b.bytes, 0) AS backlog_bytes,
       coalesce(b.offloading_count, 0) AS backlog_offloading_count, b.oldest_sealed_at AS backlog_oldest_sealed_at,
       coalesce(g.copy_count, 0) AS lagged_count, coalesce(g.bytes, 0) AS lagged_bytes,
       coalesce(g.due_count, 0) AS lagged_due_count, coalesce(x_lost.lost_count, 0) AS lost_count,
       o.ledger_id AS oldest_ledger, o.created_at AS oldest_created_at, o.sealed_at AS oldest_ledger_sealed_at,
       coalesce(s.subscription_count, 0) AS subscription_count
    FROM picked p
    LEFT JOIN tiering.topic_usage u USING (topic_id)
    LEFT JOIN backlog b USING (topic_id)
    LEFT JOIN lagged g USING (topic_id)
    LEFT JOIN lost x_lost USING (topic_id)
    LEFT JOIN subs s USING (topic_id)
    LEFT JOIN LATERAL (SELECT l.ledger_id, l.created_at, l.sealed_at FROM tiering.ledger l
                       WHERE l.topic_id = p.topic_id AND l.state <> 'DELETED'
                       ORDER BY l.ledger_id LIMIT 1) o ON true) x ON true
ORDER BY x.topic
"""


def topic_stats(engine: Engine, topic: str | None = None) -> tuple[list[dict], dict]:
    """(one row per topic, in name order: only `topic`'s when given, none when it does not exist; what is
    not per topic: the GC queue's counts, each job's last successful run and the database's `now`)."""
    shared = ("gc_pending_count", "gc_due_count", "gc_failed_count", "last_success", "now")
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text(STATS_SQL), {"topic": topic})]
    common = {k: rows[0][k] for k in shared}
    return [{k: v for k, v in r.items() if k not in shared} for r in rows if r["topic"] is not None], common
