"""Synthetic metadata and bucket for bench_scale.py: a store of `topics` topics and `ledgers` ledgers where
NOTHING is due, loaded with set-based SQL (generate_series), and a bucket of tiny objects newer than GC's
grace. Not a benchmark itself.

Shape per topic (ledger ids ascending = time ascending, ~60 days):
- ids 0..d-1 DELETED by retention (topics with a retention limit: d = 10 %), offloaded before, no chunk;
- ids d..n-7 OFFLOADED, tier-1 copy deleted after the 4 h lag, chunk row each: most topics batched (50-100
  ledgers of 1-8 MiB share one data/index object pair at increasing offsets), every 5th topic lone objects
  of 8-64 MiB (one pair per ledger, so nothing is small enough for defrag);
- ids n-6..n-4 OFFLOADED 30 min ago in one batch (the same pair), tier-1 copy still within the deletion lag;
- ids n-3, n-2 SEALED 2 h and 1 h ago (offload-after is 1 day);
- id n-1 OPEN, with a real tier-1 file (offload-by-size reads its live size there).
Policies: offload-after 1 day everywhere, deletion lag 4 h, an offload threshold on even topics (twice the
tier-1 tail plus 64 MiB), retention time on topic_id % 3 == 0 (one hour beyond the oldest live ledger),
retention size on topic_id % 3 == 1 (a quarter above the live bytes); the rest unlimited.

Subscriptions (`subscriptions` in all, 10 per topic by default), slot k = number % 10 on each topic:
k 0-3 at the last entry of the newest sealed ledger (caught up), k 4 inside the open ledger, k 5 half-way
through the second newest sealed ledger, k 6 at the end of a recently offloaded ledger, k 7 NULL (nothing
read yet; created an hour ago, or 40 days ago on every 8th topic), k 8 half-way through the live history,
k 9 at the first entry of the head (the oldest live ledger), last ack 30 days ago. Policies: retain_unread on
topic_id % 9 IN (0, 1, 2) (a third: time-retention, size-retention and unlimited topics alike), a
subscription expiry of 7 days on topic_id % 4 == 0 (there slot 9, and slot 7 on every 8th topic, are
EXPIRED), ceilings on topic_id % 6 == 0 (time: the retention plus a day) and topic_id % 6 == 1 (size: twice
the retention). Nothing is due with or without the holds: the retention limits alone keep every live ledger.

The load runs with `session_replication_role = replica` inside its transaction: the per-row deferred
ledger/chunk consistency triggers (and FK triggers) would otherwise cost minutes at 1M rows; the rows are
consistent by construction. Afterwards every `tiering.recompute*()` function (maintained totals added by
later migrations) is called in the same transaction (triggers still off), then VACUUM ANALYZE.
"""
from __future__ import annotations

import concurrent.futures
import secrets

from sqlalchemy import create_engine, text

from tiering.tier1 import Tier1Store

MIB = 1024 * 1024
TAIL = 6  # 3 recently offloaded + 2 sealed + 1 open

# One temp table with every generated column; ledger and chunk rows are inserted from it.
_GEN = """
CREATE TEMP TABLE gen ON COMMIT DROP AS
WITH base AS (
    SELECT t, i, :n AS n,
           CASE WHEN t % 3 IN (0, 1) THEN :n / 10 ELSE 0 END AS d,
           (t % 5 = 0) AS lone,
           50 + t % 51 AS b,
           -- deterministic pseudo-random sizes
           CASE WHEN t % 5 = 0 THEN 8 * :mib + ((t * 7919 + i * 104729) % 56) * :mib + (i * 31337) % :mib
                ELSE 1 * :mib + ((t * 7919 + i * 104729) % 7) * :mib + (i * 31337) % :mib END AS size
    FROM generate_series(1, :topics) t, generate_series(0, :n - 1) i
), shaped AS (
    SELECT *,
           CASE WHEN i = n - 1 THEN 'OPEN'
                WHEN i >= n - 3 THEN 'SEALED'
                WHEN i >= n - 6 THEN 'RECENT'
                WHEN i < d THEN 'DELETED'
                ELSE 'OFFLOADED' END AS kind,
           CASE WHEN i = n - 1 THEN NULL
                WHEN i >= n - 3 THEN now() - make_interval(hours => n - i - 1)
                WHEN i >= n - 6 THEN now() - make_interval(hours => 24 + n - i - 3)
                ELSE now() - interval '60 days' + (interval '60 days' - interval '30 hours') * i / (n - 6) END
             AS sealed,
           CASE WHEN i >= n - 6 THEN 'r'
                WHEN t % 5 = 0 THEN i::text
                ELSE (i / (50 + t % 51))::text END AS batch
    FROM base
)
SELECT s.*,
       md5(t || ':' || batch)::uuid AS attempt,
       CASE WHEN kind = 'RECENT' THEN now() - interval '30 minutes'
            WHEN kind IN ('OFFLOADED', 'DELETED') THEN sealed + interval '1 day 20 minutes' END AS offloaded,
       min(i) OVER w AS first_in_batch,
       coalesce(sum(size) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS data_off,
       coalesce(sum(512 + size / 4096) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS index_off
FROM shaped s
WINDOW w AS (PARTITION BY t, batch ORDER BY i)
"""

_TOPICS = """
INSERT INTO tiering.topic (topic_id, name, offload_after_seconds, deletion_lag_seconds, next_ledger_id, created_at)
SELECT t, 'scale-' || lpad(t::text, 5, '0'), 86400, 14400, :n, now() - interval '61 days'
FROM generate_series(1, :topics) t
"""

_LEDGERS = """
INSERT INTO tiering.ledger (topic_id, ledger_id, state, entry_count, size_bytes, created_at, sealed_at,
                            tier1_present, tier1_deleted_at, offload_uuid, offload_started_at, offloaded_at,
                            deleted_at, version)
SELECT t, i,
       (CASE kind WHEN 'RECENT' THEN 'OFFLOADED' ELSE kind END)::tiering.ledger_state,
       CASE WHEN kind = 'OPEN' THEN 0 ELSE size / 1024 END,
       CASE WHEN kind = 'OPEN' THEN 0 ELSE size END,
       coalesce(sealed - interval '40 minutes', now() - interval '50 minutes'),
       sealed,
       kind IN ('OPEN', 'SEALED', 'RECENT'),
       CASE WHEN kind IN ('OFFLOADED', 'DELETED') THEN offloaded + interval '4 hours 30 minutes' END,
       CASE WHEN offloaded IS NOT NULL THEN attempt END,
       offloaded - interval '1 minute',
       offloaded,
       CASE WHEN kind = 'DELETED' THEN least(now() - interval '1 minute', sealed + interval '54 days') END,
       CASE WHEN kind = 'OPEN' THEN 0 WHEN kind = 'SEALED' THEN 1 WHEN kind = 'DELETED' THEN 4 ELSE 3 END
FROM gen
"""

_CHUNKS = """
INSERT INTO tiering.chunk (topic_id, ledger_id, data_key, data_offset, data_length, index_key, index_offset,
                           index_length, first_entry_id, last_entry_id, created_at)
SELECT t, i, k, data_off, size, k || '-index', index_off, 512 + size / 4096, 0, size / 1024 - 1, offloaded
FROM (SELECT g.*, :prefix || 'scale-' || lpad(t::text, 5, '0') || '/' || attempt || '-ledger-' || first_in_batch AS k
      FROM gen g WHERE kind IN ('OFFLOADED', 'RECENT')) x
"""

_POLICIES = """
UPDATE tiering.topic tp SET
    offload_threshold_bytes = CASE WHEN tp.topic_id % 2 = 0 THEN 2 * a.tail + 64 * :mib ELSE -1 END,
    retention_seconds = CASE WHEN tp.topic_id % 3 = 0
                             THEN extract(epoch FROM now() - a.oldest_live)::bigint + 3600 ELSE -1 END,
    retention_bytes = CASE WHEN tp.topic_id % 3 = 1 THEN a.live * 5 / 4 + 64 * :mib ELSE -1 END,
    retain_unread = tp.topic_id % 9 IN (0, 1, 2),
    subscription_expiry_seconds = CASE WHEN tp.topic_id % 4 = 0 THEN 7 * 86400 ELSE -1 END,
    max_retention_seconds = CASE WHEN tp.topic_id % 6 = 0
                                 THEN extract(epoch FROM now() - a.oldest_live)::bigint + 3600 + 86400 ELSE -1 END,
    max_retention_bytes = CASE WHEN tp.topic_id % 6 = 1 THEN 2 * (a.live * 5 / 4 + 64 * :mib) ELSE -1 END
FROM (SELECT t, sum(size) FILTER (WHERE i >= n - :tail) AS tail, min(sealed) FILTER (WHERE kind <> 'DELETED') AS oldest_live,
             sum(size) FILTER (WHERE kind NOT IN ('DELETED', 'OPEN')) AS live
      FROM gen GROUP BY t) a
WHERE tp.topic_id = a.t
"""

# `subs` subscriptions per topic, positioned by slot (see the module's docstring) on gen's rows (entry_count =
# size / 1024 for sealed ledgers; the open ledger's tier-1 file has 4 entries).
_SUBSCRIPTIONS = """
INSERT INTO tiering.subscription (topic_id, name, ack_ledger_id, ack_entry_id, created_at, last_ack_at)
SELECT x.t, 'sub-' || lpad(x.k::text, 4, '0'),
       g.i, CASE WHEN x.slot = 4 THEN 1 WHEN x.slot IN (5, 8) THEN g.size / 2048
                 WHEN x.slot = 9 THEN 0 ELSE g.size / 1024 - 1 END,
       CASE WHEN x.slot = 7 AND x.t % 8 <> 0 THEN now() - interval '1 hour' ELSE now() - interval '40 days' END,
       CASE WHEN x.slot = 7 THEN NULL
            WHEN x.slot = 9 THEN now() - interval '30 days'
            ELSE now() - make_interval(secs => 60 + (x.t * 7 + x.k * 13) % 3600) END
FROM (SELECT t, k, k % 10 AS slot,
             CASE k % 10 WHEN 4 THEN :n - 1 WHEN 5 THEN :n - 3 WHEN 6 THEN :n - 5 WHEN 7 THEN NULL
                         WHEN 8 THEN (d + :n - 7) / 2 WHEN 9 THEN d ELSE :n - 2 END AS at
      FROM generate_series(1, :topics) t, generate_series(0, :subs - 1) k,
           LATERAL (SELECT CASE WHEN t % 3 IN (0, 1) THEN :n / 10 ELSE 0 END AS d) dd) x
LEFT JOIN gen g ON g.t = x.t AND g.i = x.at
"""

# GC tasks not yet due (objects merged away or trimmed minutes ago, waiting for the GC delay) and an hourly
# history of pipeline runs (the dashboard's series counts them).
_GC_TASKS = """
INSERT INTO tiering.gc_task (key, reason, not_before)
SELECT :prefix || 'scale-' || lpad((1 + g % :topics)::text, 5, '0') || '/' || md5('gc' || g)::uuid || '-ledger-' || g,
       'retention', now() + make_interval(secs => 300 + g)
FROM generate_series(1, 100) g
"""
_JOB_RUNS = """
INSERT INTO tiering.job_run (job, kind, status, started_at, ended_at, items_done, bytes)
SELECT j, j, 'SUCCEEDED', h, h + interval '40 seconds', 0, 0
FROM generate_series(now() - interval '60 days', now() - interval '1 hour', interval '1 hour') h,
     unnest(ARRAY['offload_by_age', 'offload_by_size', 'delete_lagged', 'retention', 'defrag', 'gc']) j
"""


def load_metadata(url: str, topics: int, ledgers_per_topic: int, prefix: str, subscriptions: int = 0) -> dict:
    """Replace the store's rows by the synthetic shape (TRUNCATE first: each size is loaded fresh, the same
    topics grown to more history), with `subscriptions` subscriptions spread evenly over the topics. Returns
    counts and what was recomputed."""
    n = ledgers_per_topic
    subs = subscriptions // topics
    if n < TAIL + 4:
        raise ValueError(f"at least {TAIL + 4} ledgers per topic")
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    params = {"n": n, "topics": topics, "mib": MIB, "prefix": prefix, "tail": TAIL, "subs": subs}
    try:
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            conn.execute(text("TRUNCATE tiering.topic, tiering.ledger, tiering.chunk, tiering.gc_task, "
                              "tiering.job_run, tiering.attribute, tiering.subscription, tiering.subscription_loss, "
                              "tiering.topic_tombstone RESTART IDENTITY CASCADE"))
            conn.execute(text(_GEN), params)
            conn.execute(text(_TOPICS), params)
            conn.execute(text(_LEDGERS), params)
            conn.execute(text(_CHUNKS), params)
            conn.execute(text(_POLICIES), params)
            if subs:
                conn.execute(text(_SUBSCRIPTIONS), params)
            conn.execute(text(_GC_TASKS), params)
            conn.execute(text(_JOB_RUNS), params)
            conn.execute(text("SELECT setval('tiering.topic_topic_id_seq', :topics)"), params)
            # still without the per-row triggers: a recompute that UPDATEs a million chunk rows would
            # otherwise queue a million deferred consistency checks (over 10 minutes here)
            recomputed = []
            fns = conn.execute(text(
                "SELECT p.proname FROM pg_proc p JOIN pg_namespace ns ON ns.oid = p.pronamespace "
                "WHERE ns.nspname = 'tiering' AND p.proname LIKE 'recompute%' AND p.pronargs = 0 "
                "ORDER BY p.proname")).scalars().all()
            for fn in fns:
                conn.execute(text(f"SELECT tiering.{fn}()"))
                recomputed.append(fn)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
            counts = dict(conn.execute(text(
                "SELECT state::text, count(*) FROM tiering.ledger GROUP BY state")).all())
            chunks, objects = conn.execute(text(
                "SELECT count(*), count(DISTINCT data_key) FROM tiering.chunk")).one()
            sub_counts = conn.execute(text("""
                SELECT count(*) AS subscriptions, count(*) FILTER (WHERE s.ack_ledger_id IS NULL) AS no_position,
                       count(*) FILTER (WHERE t.retain_unread) AS on_retain_unread,
                       count(*) FILTER (WHERE t.subscription_expiry_seconds >= 0 AND COALESCE(s.last_ack_at,
                           s.created_at) <= now() - make_interval(secs => t.subscription_expiry_seconds)) AS expired
                FROM tiering.subscription s JOIN tiering.topic t USING (topic_id)""")).one()._asdict()
    finally:
        engine.dispose()
    return {"ledgers": topics * n, "by_state": counts, "chunks": chunks, "data_objects": objects,
            "recomputed": recomputed, "subscriptions": sub_counts}


def write_tier1(root, url: str) -> int:
    """Real tier-1 files for every ledger whose metadata says it has one: the open ledger (a few entries,
    not sealed) and the sealed / recently offloaded ones (sealed files), written through tier 1's own
    writer. Returns the number of files."""
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text(
                "SELECT t.name, l.ledger_id, l.state::text FROM tiering.ledger l JOIN tiering.topic t "
                "USING (topic_id) WHERE l.tier1_present")).all()
    finally:
        engine.dispose()
    store = Tier1Store(root)
    body = b"x" * 1024
    for name, lid, state in rows:
        with store.create_ledger(name, lid) as w:
            for _ in range(4):
                w.append(body)
            if state != "OPEN":
                w.seal()
    return len(rows)


def fill_bucket(s3, bucket: str, prefix: str, count: int, topics: int, threads: int = 32) -> float:
    """`count` tiny objects under the prefix, named like data objects of the topics but referenced by no
    chunk and queued nowhere (orphans, yet newer than GC's grace: the sweep must keep them). Returns the
    seconds it took."""
    import time

    run = secrets.token_hex(4)
    keys = [f"{prefix}scale-{1 + k % topics:05d}/{run}{k:08x}-0000-4000-8000-000000000000-ledger-{k}"
            for k in range(count)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for f in [pool.submit(s3.put_object, Bucket=bucket, Key=k, Body=b"o") for k in keys]:
            f.result()
    return time.perf_counter() - t0
