"""A synthetic metadata history of any size, written in a few set-based statements (INSERT ... SELECT
generate_series) with the per-row triggers off (session_replication_role = replica), then the per-topic
totals and hourly counters rebuilt (tiering.recompute_topic_usage, recompute_ledger_hourly) and the
tables analysed.

Its shape follows the pipeline: every topic seals ledgers at a steady rate over `history_days`; a ledger is
offloaded 5 min to 3 h after its seal (OFFLOADING in its last 10 min, SEALED before), its tier-1 copy goes 4 h
later; on two topics in three retention deletes ledgers 20 days after their seal, offloaded or not. One
ledger in 499 is never offloaded (a stuck backlog), one in 97 is empty, each topic's newest ledger is OPEN.
A few ledgers sit exactly on hour boundaries (the edges of the dashboard's hourly buckets). Job runs: four
jobs an hour. Everything is relative to the loading transaction's now().
"""
from __future__ import annotations

from sqlalchemy import text

RETENTION_DAYS = 20

_TOPICS = """
INSERT INTO tiering.topic (name, retention_seconds, deletion_lag_seconds)
SELECT 'syn-' || k, CASE WHEN k % 3 = 0 THEN -1 ELSE :retention END, 14400
FROM generate_series(0, :topics - 1) AS k
"""

# g: global ledger number; k: topic ordinal; j: ledger id in its topic; r: a pseudo-random 0..998.
_LEDGERS = """
WITH tp AS (
    SELECT topic_id, (row_number() OVER (ORDER BY topic_id) - 1)::bigint AS k, retention_seconds
    FROM tiering.topic WHERE name LIKE 'syn-%'),
g AS (
    SELECT g, g % :topics AS k, g / :topics AS j, (g * 7919 + 13) % 999 AS r
    FROM generate_series(0::bigint, :ledgers - 1) AS g),
t AS (
    SELECT tp.topic_id, g.j, g.r, g.g, g.j = :per_topic - 1 AS is_open,
           now() - make_interval(secs => (:per_topic - 2 - g.j) * :span + g.k * :span / :topics
                                         + g.r * 0.001) AS sealed,
           CASE WHEN g.r % 97 = 0 THEN 0 ELSE 100 + g.r END AS entries,
           tp.retention_seconds AS retention
    FROM g JOIN tp ON tp.k = g.k),
p AS (
    SELECT t.*,
           CASE WHEN t.is_open OR t.entries = 0 OR t.g % 499 = 1 THEN NULL  -- open, empty, or stuck
                ELSE t.sealed + make_interval(secs => 300 + t.r * 10.81) END AS planned_offload,
           CASE WHEN NOT t.is_open AND t.retention > 0
                THEN t.sealed + make_interval(secs => t.retention) END AS planned_delete
    FROM t),
s AS (
    SELECT p.*,
           CASE WHEN p.is_open THEN 'OPEN'
                WHEN p.planned_delete <= now() THEN 'DELETED'
                WHEN p.planned_offload <= now() THEN 'OFFLOADED'
                WHEN p.planned_offload - interval '10 minutes' <= now() THEN 'OFFLOADING'
                ELSE 'SEALED' END::tiering.ledger_state AS state
    FROM p)
INSERT INTO tiering.ledger (topic_id, ledger_id, state, entry_count, size_bytes, created_at, sealed_at,
                            tier1_present, tier1_deleted_at, offload_uuid, offload_started_at, offloaded_at,
                            deleted_at)
SELECT topic_id, j, state,
       CASE WHEN is_open THEN 0 ELSE entries END,
       CASE WHEN is_open THEN 0 ELSE entries * 1000 END,
       sealed - interval '5 minutes',
       CASE WHEN NOT is_open THEN sealed END,
       CASE WHEN state = 'DELETED' THEN false
            WHEN state = 'OFFLOADED' THEN planned_offload + interval '4 hours' > now() ELSE true END,
       CASE WHEN state = 'DELETED' THEN planned_delete
            WHEN state = 'OFFLOADED' AND planned_offload + interval '4 hours' <= now()
                THEN planned_offload + interval '4 hours' END,
       CASE WHEN state = 'OFFLOADING' OR planned_offload <= least(planned_delete, now()) THEN md5(g::text)::uuid END,
       CASE WHEN state = 'OFFLOADING' OR planned_offload <= least(planned_delete, now())
            THEN planned_offload - interval '10 minutes' END,
       CASE WHEN state <> 'OFFLOADING' AND planned_offload <= least(planned_delete, now()) THEN planned_offload END,
       CASE WHEN state = 'DELETED' THEN planned_delete END
FROM s
"""

# Ledgers on the hour grid: sealed 3 h before the current hour, one offloaded 1 h before it, one deleted
# unoffloaded exactly 2 h before it, one still sealed (ids past the generated ones).
_EDGES = """
INSERT INTO tiering.ledger (topic_id, ledger_id, state, entry_count, size_bytes, sealed_at, tier1_present,
                            tier1_deleted_at, offload_uuid, offload_started_at, offloaded_at, deleted_at)
SELECT t.topic_id, 1000000 + e.n, e.state::tiering.ledger_state, 7, 7000 + e.n,
       date_trunc('hour', now()) - interval '3 hours', e.state <> 'DELETED',
       CASE WHEN e.state = 'DELETED' THEN date_trunc('hour', now()) - interval '2 hours' END,
       CASE WHEN e.state = 'OFFLOADED' THEN md5('edge' || e.n)::uuid END,
       CASE WHEN e.state = 'OFFLOADED' THEN date_trunc('hour', now()) - interval '1 hour 10 minutes' END,
       CASE WHEN e.state = 'OFFLOADED' THEN date_trunc('hour', now()) - interval '1 hour' END,
       CASE WHEN e.state = 'DELETED' THEN date_trunc('hour', now()) - interval '2 hours' END
FROM (SELECT topic_id FROM tiering.topic WHERE name LIKE 'syn-%' ORDER BY topic_id LIMIT 1) t,
     (VALUES (0, 'OFFLOADED'), (1, 'DELETED'), (2, 'SEALED')) AS e (n, state);
-- and one whose deletion time is before its seal time (no code path does that; the schema allows it)
INSERT INTO tiering.ledger (topic_id, ledger_id, state, entry_count, size_bytes, sealed_at, tier1_present,
                            tier1_deleted_at, deleted_at)
SELECT topic_id, 1000003, 'DELETED', 7, 7003, date_trunc('hour', now()) - interval '1 hour', false,
       date_trunc('hour', now()) - interval '2 hours', date_trunc('hour', now()) - interval '2 hours'
FROM tiering.topic WHERE name LIKE 'syn-%' ORDER BY topic_id LIMIT 1
"""

_CHUNKS = """
INSERT INTO tiering.chunk (topic_id, ledger_id, data_key, data_offset, data_length, index_key, index_offset,
                           index_length, first_entry_id, last_entry_id, created_at)
SELECT topic_id, ledger_id, 'syn/' || topic_id || '/' || ledger_id || '/data', 0, size_bytes + 64 * entry_count,
       'syn/' || topic_id || '/' || ledger_id || '/index', 0, 40 + 8 * entry_count, 0,
       greatest(entry_count - 1, 0), offloaded_at
FROM tiering.ledger WHERE state = 'OFFLOADED'
"""

_JOB_RUNS = """
INSERT INTO tiering.job_run (job, kind, status, started_at, ended_at, items_done, bytes)
SELECT j.job, j.job, 'SUCCEEDED', h.at + make_interval(mins => j.n * 7), h.at + make_interval(mins => j.n * 7 + 3),
       j.n, 1000000 * j.n
FROM generate_series(date_trunc('hour', now()) - make_interval(days => :days), now(), interval '1 hour') AS h (at),
     (VALUES (0, 'offload_by_age'), (1, 'delete_lagged'), (2, 'retention'), (3, 'gc')) AS j (n, job)
WHERE h.at + make_interval(mins => j.n * 7 + 3) <= now()
"""

_GC_TASKS = """
INSERT INTO tiering.gc_task (key, reason, not_before)
SELECT 'syn/gone/' || i, 'retention', now() + make_interval(secs => i - 500) FROM generate_series(1, 1000) AS i
"""


def load(engine, topics: int, ledgers: int, history_days: int = 40) -> dict:
    """Write the history into the (empty) schema in one transaction; returns what was asked for."""
    per_topic = -(-ledgers // topics)
    span = history_days * 86400 / per_topic  # seconds between two seals of one topic
    params = dict(topics=topics, ledgers=per_topic * topics, per_topic=per_topic, span=span,
                  retention=RETENTION_DAYS * 86400, days=history_days)
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))  # no per-row triggers
        for sql in (_TOPICS, _LEDGERS, _EDGES, _CHUNKS, _JOB_RUNS, _GC_TASKS):
            conn.execute(text(sql), params)
        conn.execute(text("UPDATE tiering.topic t SET next_ledger_id = coalesce(m.next, 0) FROM "
                          "(SELECT topic_id, max(ledger_id) + 1 AS next FROM tiering.ledger GROUP BY topic_id) m "
                          "WHERE m.topic_id = t.topic_id"))
        # the maintained derivations the dashboard reads, rebuilt from the rows (the schema may predate them)
        for fn in ("recompute_topic_usage", "recompute_ledger_hourly"):
            if conn.execute(text(f"SELECT to_regproc('tiering.{fn}')")).scalar():
                conn.execute(text("SET LOCAL session_replication_role = origin"))
                conn.execute(text(f"SELECT tiering.{fn}()"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE tiering.topic, tiering.ledger, tiering.chunk, tiering.job_run, tiering.gc_task"))
        if conn.execute(text("SELECT to_regclass('tiering.ledger_hourly')")).scalar():
            conn.execute(text("ANALYZE tiering.ledger_hourly"))
    return params
