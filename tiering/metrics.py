"""Prometheus metrics of the tiered store, read from the metadata database on each scrape (a custom
`prometheus_client` Collector: nothing is cached between scrapes, so what Prometheus stores is what the
views said at the scrape). Served by the dashboard plugin at /tiering/metrics (plugins/tiering_dashboard).

Every query costs what it reports, not what the store has held (checked with EXPLAIN on a 200k-ledger history
in tests/integration/test_metrics.py): tier figures from the maintained totals (`topic_usage` through view
`tier_usage`, one row per topic), the backlog and lagged copies from the partial indexes behind views
`offload_backlog` / `lagged_copies`, the GC queue from `gc_task`, the last runs through index
`job_run_job_started` (one skip scan over the jobs, then each job's newest runs), the subscriptions' backlogs
by one range scan per subscription from its position (index ledger_live_by_topic, the subquery
metadata/subscriptions.py's `subscription list` uses): the cost follows the subscriptions and their backlogs.

Families (all gauges; labels in braces):

    tiering_topics                                      topics defined
    tiering_tier_bytes{topic,tier}                      ledger bytes on tier 1 / tier 2 (a copy on both counts on both)
    tiering_tier_ledgers{topic,tier}                    ledgers on tier 1 / tier 2
    tiering_tier2_stored_bytes{topic}                   bytes of the topic's tier-2 data objects
    tiering_ledgers{topic,state}                        ledgers per state (OPEN, SEALED, OFFLOADING, OFFLOADED, DELETED)
    tiering_offload_backlog_ledgers{topic}              sealed non-empty ledgers not in tier 2 (incl. in flight)
    tiering_offload_backlog_bytes{topic}
    tiering_offload_backlog_in_flight_ledgers{topic}    of those, OFFLOADING now
    tiering_offload_backlog_oldest_age_seconds{topic}   age of the oldest backlog ledger's seal (0: none)
    tiering_lagged_copies{topic} / _bytes{topic}        tier-1 copies of offloaded ledgers waiting for their lag
    tiering_lagged_copies_due{topic} / _due_bytes{topic}  of those, past their lag (the next delete run's work)
    tiering_ledgers_lost{topic}                         ledgers marked lost by `tiering repair` (no good copy left)
    tiering_gc_tasks{state}                             GC queue: PENDING, FAILED
    tiering_gc_tasks_due                                PENDING tasks whose not-before has passed
    tiering_job_last_run_status{job,kind,status}        1 for the last run's status (RUNNING/SUCCEEDED/FAILED), else 0
    tiering_job_last_run_start_timestamp_seconds{job,kind}
    tiering_job_last_run_duration_seconds{job,kind}     ended - started (now - started while RUNNING)
    tiering_job_last_run_items_done{job,kind} / _items_failed{job,kind} / _bytes{job,kind}
    tiering_subscription_backlog_entries{topic,subscription}   entries after its position in SEALED ledgers (*)
    tiering_subscription_backlog_bytes{topic,subscription}     their bytes (a partly read ledger's prorated by entries)
    tiering_subscription_oldest_unread_age_seconds{topic,subscription}  age of the ledger holding its first
                                                        unread sealed entry (its creation; 0: nothing unread) (*)
    tiering_subscription_expired{topic,subscription}    1 when EXPIRED (no ack within the topic's expiry: it
                                                        holds nothing back), 0 when ACTIVE
    tiering_subscription_entries_deleted_unread_total{topic,subscription}  counter: entries deleted before it
                                                        read them (a ceiling, a forced truncate, no retain-unread,
                                                        or while EXPIRED); _created is the subscription's creation
    tiering_subscription_bytes_deleted_unread_total{topic,subscription}    counter: their bytes
    tiering_metrics_scrape_statements                   SQL statements this scrape ran

(*) Sealed ledgers only: the open ledger's length is in its tier-1 file, which the API server serving this
endpoint may not see (`tiering subscription list` adds it). A subscription that has read every sealed entry
shows 0 even while entries wait in the open ledger.

There are no S3 request/byte counters by operation: the jobs do not record them (job_run.details holds
planned/skipped counts and per-job figures, no request counts), and counting them here would be invented.
"""
from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from tiering.metadata.planning import _ACTIVE, _NOW
from tiering.metadata.subscriptions import BACKLOG_LATERAL

STATES = ("OPEN", "SEALED", "OFFLOADING", "OFFLOADED", "DELETED")
RUN_STATUSES = ("RUNNING", "SUCCEEDED", "FAILED")
# The last run of each kind is looked for among its job's newest runs: a kind not run in its job's last
# RECENT_RUNS runs has no series (it is that stale). Bounds the read per job whatever the history.
RECENT_RUNS = 200

_TIERS = """
    SELECT t.name AS topic, coalesce(u.tier1_ledgers, 0) AS tier1_ledgers, coalesce(u.tier1_bytes, 0) AS tier1_bytes,
           coalesce(u.tier2_ledgers, 0) AS tier2_ledgers, coalesce(u.tier2_bytes, 0) AS tier2_bytes,
           coalesce(u.tier2_stored_bytes, 0) AS tier2_stored_bytes,
           coalesce(u.open_ledgers, 0) AS "OPEN", coalesce(u.sealed_ledgers, 0) AS "SEALED",
           coalesce(u.offloading_ledgers, 0) AS "OFFLOADING", coalesce(u.offloaded_ledgers, 0) AS "OFFLOADED",
           coalesce(u.deleted_ledgers, 0) AS "DELETED"
    FROM tiering.topic t LEFT JOIN tiering.topic_usage u USING (topic_id)"""
_BACKLOG = """
    SELECT topic, count(*) AS ledgers, coalesce(sum(size_bytes), 0)::bigint AS bytes,
           count(*) FILTER (WHERE state = 'OFFLOADING') AS in_flight,
           coalesce(extract(epoch FROM max(sealed_for)), 0)::float8 AS oldest_age
    FROM tiering.offload_backlog GROUP BY topic"""
_LAGGED = """
    SELECT topic, count(*) AS copies, coalesce(sum(size_bytes), 0)::bigint AS bytes,
           count(*) FILTER (WHERE due) AS due, coalesce(sum(size_bytes) FILTER (WHERE due), 0)::bigint AS due_bytes
    FROM tiering.lagged_copies GROUP BY topic"""
# gc_task directly, not view gc_queue: its `referenced` column probes chunk per task, not needed here.
_GC = """
    SELECT count(*) FILTER (WHERE state = 'PENDING') AS pending, count(*) FILTER (WHERE state = 'FAILED') AS failed,
           count(*) FILTER (WHERE state = 'PENDING' AND not_before <= now()) AS due
    FROM tiering.gc_task"""
# Distinct jobs by a recursive skip scan of job_run_job_started (one index probe per job, not a scan of
# every run), then per job its newest RECENT_RUNS runs (the same index, backwards) and the newest per kind.
_LAST_RUNS = f"""
    WITH RECURSIVE jobs AS (
        (SELECT job FROM tiering.job_run ORDER BY job LIMIT 1)
        UNION ALL
        SELECT (SELECT j.job FROM tiering.job_run j WHERE j.job > jobs.job ORDER BY j.job LIMIT 1)
        FROM jobs WHERE jobs.job IS NOT NULL)
    SELECT DISTINCT ON (r.job, r.kind) r.job, r.kind, r.status, extract(epoch FROM r.started_at)::float8 AS started,
           extract(epoch FROM coalesce(r.ended_at, now()) - r.started_at)::float8 AS duration,
           r.items_done, r.items_failed, r.bytes
    FROM jobs
    CROSS JOIN LATERAL (
        SELECT j.job, coalesce(j.kind, j.job) AS kind, j.status, j.started_at, j.ended_at, j.items_done,
               j.items_failed, j.bytes, j.run_id
        FROM tiering.job_run j WHERE j.job = jobs.job
        ORDER BY j.started_at DESC LIMIT {RECENT_RUNS}) r
    WHERE jobs.job IS NOT NULL
    ORDER BY r.job, r.kind, r.started_at DESC, r.run_id DESC"""
# Per subscription its backlog among sealed ledgers (BACKLOG_LATERAL: a range of ledger_live_by_topic from
# its position) and whether it is ACTIVE (the one definition, planning._ACTIVE, on the database's clock).
_SUBSCRIPTIONS = f"""
    SELECT t.name AS topic, s.name AS subscription, NOT {_ACTIVE.replace(_NOW, "now()")} AS expired,
           b.entries, b.bytes,
           coalesce(extract(epoch FROM now() - b.oldest_unread_at), 0)::float8 AS oldest_unread_age,
           s.entries_deleted_unread, s.bytes_deleted_unread, extract(epoch FROM s.created_at)::float8 AS created
    FROM tiering.subscription s JOIN tiering.topic t ON t.topic_id = s.topic_id
    CROSS JOIN LATERAL {BACKLOG_LATERAL} b
    ORDER BY t.name, s.name"""
# Ledgers `tiering repair` marked lost (no tier holds a good copy) and not deleted since: the partial index
# ledger_lost holds the marked rows only, so this reads nothing when nothing is lost.
_LOST = """
    SELECT t.name AS topic, count(*) AS ledgers
    FROM tiering.ledger l JOIN tiering.topic t ON t.topic_id = l.topic_id
    WHERE l.lost_at IS NOT NULL AND l.state <> 'DELETED' GROUP BY t.name"""
STATEMENTS = {"tiers": _TIERS, "backlog": _BACKLOG, "lagged": _LAGGED, "gc": _GC, "last_runs": _LAST_RUNS,
              "subscriptions": _SUBSCRIPTIONS, "lost": _LOST}


def read(conn: Connection) -> dict[str, list[dict]]:
    """Every figure the metrics show, as rows (one statement per entry of STATEMENTS, in one transaction
    when `conn` is the dashboard's read-only REPEATABLE READ engine: one snapshot per scrape)."""
    return {name: [dict(r._mapping) for r in conn.execute(text(sql))] for name, sql in STATEMENTS.items()}


def families(data: dict[str, list[dict]]) -> list[GaugeMetricFamily]:
    """The metric families of `read`'s rows. Every topic gets every per-topic series (0 when it has no
    backlog or lagged copy), so an alert on a series sees it go to 0, not vanish."""
    def gauge(name, doc, labels=()):
        return GaugeMetricFamily(name, doc, labels=list(labels))

    topics = sorted(r["topic"] for r in data["tiers"])
    out = []
    n = gauge("tiering_topics", "Topics defined.")
    n.add_metric([], len(topics))
    out.append(n)

    tier_bytes = gauge("tiering_tier_bytes", "Ledger bytes on a tier (a copy on both tiers counts on both).",
                       ("topic", "tier"))
    tier_ledgers = gauge("tiering_tier_ledgers", "Ledgers on a tier.", ("topic", "tier"))
    stored = gauge("tiering_tier2_stored_bytes", "Bytes of the topic's tier-2 data objects (PIP-17 framing "
                   "included).", ("topic",))
    states = gauge("tiering_ledgers", "Ledgers per state (maintained totals).", ("topic", "state"))
    for r in sorted(data["tiers"], key=lambda r: r["topic"]):
        for tier in ("1", "2"):
            tier_bytes.add_metric([r["topic"], tier], r[f"tier{tier}_bytes"])
            tier_ledgers.add_metric([r["topic"], tier], r[f"tier{tier}_ledgers"])
        stored.add_metric([r["topic"]], r["tier2_stored_bytes"])
        for state in STATES:
            states.add_metric([r["topic"], state], r[state])
    out += [tier_bytes, tier_ledgers, stored, states]

    out += _per_topic(topics, {r["topic"]: r for r in data["backlog"]}, [
        ("tiering_offload_backlog_ledgers", "Sealed non-empty ledgers not yet in tier 2 (in flight included).", "ledgers"),
        ("tiering_offload_backlog_bytes", "Bytes of the offload backlog.", "bytes"),
        ("tiering_offload_backlog_in_flight_ledgers", "Backlog ledgers being offloaded now.", "in_flight"),
        ("tiering_offload_backlog_oldest_age_seconds", "Seconds since the oldest backlog ledger was sealed "
         "(0: no backlog).", "oldest_age")])
    out += _per_topic(topics, {r["topic"]: r for r in data["lagged"]}, [
        ("tiering_lagged_copies", "Tier-1 copies of offloaded ledgers waiting for their deletion lag.", "copies"),
        ("tiering_lagged_copies_bytes", "Bytes of those copies.", "bytes"),
        ("tiering_lagged_copies_due", "Copies past their lag (the next delete run's work).", "due"),
        ("tiering_lagged_copies_due_bytes", "Bytes of the due copies.", "due_bytes")])

    out += _per_topic(topics, {r["topic"]: r for r in data["lost"]}, [
        ("tiering_ledgers_lost", "Ledgers no tier holds a good copy of (marked lost by `tiering repair`; reads "
         "give their DATALOSS gap).", "ledgers")])

    [gc] = data["gc"]
    tasks = gauge("tiering_gc_tasks", "Tier-2 keys in the GC queue, by state.", ("state",))
    tasks.add_metric(["PENDING"], gc["pending"])
    tasks.add_metric(["FAILED"], gc["failed"])
    due = gauge("tiering_gc_tasks_due", "PENDING GC tasks whose not-before has passed.")
    due.add_metric([], gc["due"])
    out += [tasks, due]

    labels = ("job", "kind")
    status = gauge("tiering_job_last_run_status", "1 for the status of the last run of a job kind, 0 for the "
                   "others.", labels + ("status",))
    run_gauges = [(gauge(f"tiering_job_last_run_{name}", doc, labels), key) for name, doc, key in (
        ("start_timestamp_seconds", "When the last run started (Unix time).", "started"),
        ("duration_seconds", "The last run's duration (so far, while RUNNING).", "duration"),
        ("items_done", "Items the last run did.", "items_done"),
        ("items_failed", "Items the last run failed.", "items_failed"),
        ("bytes", "Bytes the last run reported.", "bytes"))]
    for r in data["last_runs"]:
        for s in RUN_STATUSES:
            status.add_metric([r["job"], r["kind"], s], 1 if r["status"] == s else 0)
        for g, key in run_gauges:
            g.add_metric([r["job"], r["kind"]], float(r[key]))
    out += [status] + [g for g, _ in run_gauges]

    out += _subscriptions(data["subscriptions"])

    count = gauge("tiering_metrics_scrape_statements", "SQL statements the scrape ran.")
    count.add_metric([], len(STATEMENTS))
    out.append(count)
    return out


_SEALED_ONLY = " Sealed ledgers only: the open ledger's entries (in its tier-1 file) are not counted."


def _subscriptions(rows) -> list:
    labels = ["topic", "subscription"]
    gauges = [(GaugeMetricFamily(name, doc, labels=labels), key) for name, doc, key in (
        ("tiering_subscription_backlog_entries", "Entries after the subscription's position." + _SEALED_ONLY,
         "entries"),
        ("tiering_subscription_backlog_bytes", "Bytes of those entries (a partly read ledger's bytes prorated "
         "by entries)." + _SEALED_ONLY, "bytes"),
        ("tiering_subscription_oldest_unread_age_seconds", "Seconds since the ledger holding the first unread "
         "entry was created (0: nothing unread)." + _SEALED_ONLY, "oldest_unread_age"),
        ("tiering_subscription_expired", "1 when the subscription is EXPIRED (no ack within the topic's "
         "subscription expiry: it holds nothing back), 0 when ACTIVE.", "expired"))]
    counters = [(CounterMetricFamily(name, doc, labels=labels), key) for name, doc, key in (
        ("tiering_subscription_entries_deleted_unread", "Entries deleted before the subscription read them "
         "(past a ceiling, by a forced truncate, without retain-unread, or while EXPIRED).", "entries_deleted_unread"),
        ("tiering_subscription_bytes_deleted_unread", "Bytes of the entries deleted before the subscription "
         "read them.", "bytes_deleted_unread"))]
    for r in rows:
        values = [r["topic"], r["subscription"]]
        for g, key in gauges:
            g.add_metric(values, float(r[key]))
        for c, key in counters:
            c.add_metric(values, float(r[key]), created=r["created"])
    return [g for g, _ in gauges] + [c for c, _ in counters]


def _per_topic(topics, rows, specs) -> list[GaugeMetricFamily]:
    out = []
    for name, doc, key in specs:
        g = GaugeMetricFamily(name, doc, labels=["topic"])
        for topic in topics:
            g.add_metric([topic], float(rows[topic][key]) if topic in rows else 0)
        out.append(g)
    return out


class TieringCollector(Collector):
    """Reads the metadata on each `collect` (one connection, one transaction) through `engine()`, a callable
    so the engine can be built lazily by the caller. A database error propagates: the scrape fails (the
    endpoint answers 503) rather than reporting stale or zero figures."""

    def __init__(self, engine: Callable[[], Engine]):
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self.engine().connect() as conn:
            data = read(conn)
        yield from families(data)
