"""The dashboard's queries on a large synthetic history (tests/integration/synthetic_history.py, 200k
ledgers): no query reads `ledger` or `chunk` with a sequential scan (the plans PostgreSQL chooses on these
statistics, EXPLAIN (FORMAT JSON)), and the answers are the old definitions' answers: the series of the
per-bucket full scans it replaced, the topics and tier usage of the aggregates over every ledger. The history
gains 10 subscriptions per topic at positions across it (one at the start, reading nothing): the
subscriptions query and the metrics' subscriptions statement read ledger through index ledger_live_by_topic
only, from each position, and their backlogs equal `subscription list`'s. No timings here (see the README's
Performance section for them)."""
from __future__ import annotations

import pytest
from sqlalchemy import event, text

from tests.conftest import empty_tables
from tests.integration import synthetic_history
from tiering import dashboard, metrics
from tiering.metadata.subscriptions import Subscriptions

# A year of history: the windows the API allows (up to 31 days) are a small part of it, as in production.
TOPICS, LEDGERS, HISTORY_DAYS = 200, 200_000, 365

# The views' former definitions, the reference the cheaper ones must agree with. The series: two scans of
# `ledger` per bucket.
OLD_SERIES_SQL = """
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
    ORDER BY bk.bucket_start"""

OLD_TOPICS_SQL = """
    SELECT t.name AS topic,
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
    ORDER BY t.name"""

OLD_TIER_USAGE_SQL = """
    SELECT t.name AS topic,
           count(*) FILTER (WHERE l.tier1_present AND l.state <> 'DELETED')                  AS tier1_ledgers,
           coalesce(sum(l.size_bytes) FILTER (WHERE l.tier1_present AND l.state <> 'DELETED'), 0)::bigint AS tier1_bytes,
           count(*) FILTER (WHERE l.state = 'OFFLOADED')                                      AS tier2_ledgers,
           coalesce(sum(l.size_bytes) FILTER (WHERE l.state = 'OFFLOADED'), 0)::bigint        AS tier2_bytes,
           coalesce(sum(c.data_length) FILTER (WHERE l.state = 'OFFLOADED'), 0)::bigint       AS tier2_stored_bytes,
           count(*) FILTER (WHERE l.state = 'DELETED')                                        AS deleted_ledgers
    FROM tiering.topic t
    LEFT JOIN tiering.ledger l USING (topic_id)
    LEFT JOIN tiering.chunk c USING (topic_id, ledger_id)
    GROUP BY t.name
    ORDER BY t.name"""

# Every dashboard query, as the API calls it (the series at the page's window and at the API's limits).
CALLS = {
    "topics": lambda c: dashboard.topics(c),
    "tier_usage": lambda c: dashboard.tier_usage(c),
    "offload_backlog": lambda c: dashboard.offload_backlog(c, 500),
    "lagged_copies": lambda c: dashboard.lagged_copies(c, 500),
    "gc_queue": lambda c: dashboard.gc_queue(c, 500),
    "job_runs": lambda c: dashboard.job_runs(c, 500),
    "series 24h": lambda c: dashboard.series(c, 24, 60),
    "series 168h": lambda c: dashboard.series(c, 168, 60),
    "series 744h": lambda c: dashboard.series(c, 744, 60 * 24),
    "series 16h by minute": lambda c: dashboard.series(c, 16, 1),
    "subscriptions": lambda c: dashboard.subscriptions(c, 500),
    "metrics subscriptions": lambda c: c.exec_driver_sql(metrics.STATEMENTS["subscriptions"]).all(),
    # lost ledgers: the partial index ledger_lost (empty here), never the history
    "integrity": lambda c: dashboard.integrity(c, 500),
    "metrics lost": lambda c: c.exec_driver_sql(metrics.STATEMENTS["lost"]).all(),
}
SUBSCRIPTIONS_PER_TOPIC = 10

# Per topic: sub-0 at the start (nothing read), sub-k k*30 ledgers behind the newest, acked k*10 min ago;
# topics with k % 4 = 0 expire subscriptions after 30 min (so some are EXPIRED).
_SUBSCRIPTIONS = """
INSERT INTO tiering.subscription (topic_id, name, ack_ledger_id, ack_entry_id, last_ack_at)
SELECT t.topic_id, 'sub-' || k, CASE WHEN k > 0 THEN greatest(h.last - k * 30, 0) END, CASE WHEN k > 0 THEN 0 END,
       CASE WHEN k > 0 THEN now() - make_interval(secs => k * 600) END
FROM tiering.topic t
CROSS JOIN LATERAL (SELECT max(l.ledger_id) AS last FROM tiering.ledger l WHERE l.topic_id = t.topic_id) h
CROSS JOIN generate_series(0, :n - 1) AS k"""


@pytest.fixture(scope="module")
def history(engine):
    empty_tables(engine)
    synthetic_history.load(engine, TOPICS, LEDGERS, HISTORY_DAYS)
    with engine.begin() as conn:
        conn.execute(text(_SUBSCRIPTIONS), {"n": SUBSCRIPTIONS_PER_TOPIC})
        conn.execute(text("UPDATE tiering.topic SET subscription_expiry_seconds = 1800 WHERE topic_id % 4 = 0"))
        conn.execute(text("ANALYZE tiering.subscription"))
        conn.execute(text("ANALYZE tiering.topic"))
    yield engine
    empty_tables(engine)


def _rows(conn, sql, **params):
    return [dict(r._mapping) for r in conn.execute(text(sql), params)]


def _statements(engine, call) -> list[tuple[str, object]]:
    """The statements `call` runs, with their parameters (as the driver received them)."""
    seen = []

    def record(conn, cursor, statement, parameters, context, executemany):
        seen.append((statement, parameters))

    with engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", record)
        try:
            call(conn)
        finally:
            event.remove(conn, "before_cursor_execute", record)
    return seen


def _scans(plan: dict):
    yield plan.get("Node Type"), plan.get("Relation Name"), plan.get("Index Name")
    for child in plan.get("Plans", []):
        yield from _scans(child)


def test_the_history_has_what_the_queries_must_handle(history):
    """The data is large and has every case the series distinguishes (so the comparisons below can fail)."""
    with history.connect() as conn:
        row = conn.execute(text("""
            SELECT count(*) AS ledgers,
                   count(*) FILTER (WHERE offloaded_at > now() - interval '24 hours') AS offloaded_24h,
                   count(*) FILTER (WHERE deleted_at > now() - interval '24 hours' AND offloaded_at IS NOT NULL)
                       AS deleted_offloaded_24h,
                   count(*) FILTER (WHERE deleted_at > now() - interval '7 days' AND offloaded_at IS NULL
                                     AND entry_count > 0) AS deleted_unoffloaded_7d,
                   count(*) FILTER (WHERE state IN ('SEALED', 'OFFLOADING') AND entry_count > 0) AS backlog,
                   count(*) FILTER (WHERE state = 'SEALED' AND entry_count > 0
                                     AND sealed_at < now() - interval '7 days') AS stuck,
                   count(*) FILTER (WHERE state = 'OFFLOADED' AND tier1_present) AS lagged,
                   count(*) FILTER (WHERE entry_count = 0 AND state <> 'OPEN') AS empty
            FROM tiering.ledger""")).one()._asdict()
    assert row["ledgers"] >= LEDGERS
    assert all(v > 0 for v in row.values()), row


@pytest.mark.parametrize("name", list(CALLS))
def test_no_dashboard_query_scans_the_ledger_history(history, name):
    statements = [s for s in _statements(history, CALLS[name]) if s[0].strip() != "SELECT now()"]
    assert statements
    reads_ledger = False
    with history.connect() as conn:
        for statement, params in statements:
            [[plan]] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, params).one()
            for node, relation, index in _scans(plan["Plan"]):
                assert not (node == "Seq Scan" and relation in ("ledger", "chunk")), (name, statement)
                reads_ledger |= relation == "ledger"
    # the ones that read ledgers do so through an index (not through the totals: those have no ledger)
    assert reads_ledger == (name not in ("topics", "tier_usage", "gc_queue", "job_runs"))


@pytest.mark.parametrize("name", ["subscriptions", "metrics subscriptions"])
def test_the_subscription_backlogs_read_ledger_from_each_position(history, name):
    """Per subscription a range of ledger_live_by_topic (from its position), never the history by another
    index or a scan: the cost follows the subscriptions and their backlogs."""
    [(statement, params)] = _statements(history, CALLS[name])
    with history.connect() as conn:
        [[plan]] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement, params).one()
    scans = list(_scans(plan["Plan"]))
    assert not [s for s in scans if s[0] == "Seq Scan" and s[1] in ("ledger", "chunk")], scans
    # the ledger indexes read (a bitmap heap scan names its relation, its bitmap index scan the index)
    indexes = {index for node, _, index in scans if index and index.startswith("ledger")}
    assert "ledger_live_by_topic" in indexes, scans
    # besides the backlog's range, only the one-row probe of each topic's OPEN ledger (the dashboard's)
    assert indexes <= {"ledger_live_by_topic", "ledger_one_open_per_topic"}, scans
    assert {r for _, r, _ in scans if r} <= {"ledger", "subscription", "topic"}, scans


def test_subscription_backlogs_equal_subscription_list(history):
    listed = {(s.topic, s.name): (b.entries, b.bytes, s.state) for s, b in Subscriptions(history).with_backlog()}
    with history.connect() as conn:
        body = dashboard.subscriptions(conn, dashboard.MAX_LIMIT)
        data = metrics.read(conn)["subscriptions"]
    assert len(listed) == TOPICS * SUBSCRIPTIONS_PER_TOPIC == body["total"]["subscriptions"] == len(data)
    states = [v[2] for v in listed.values()]
    assert body["total"]["expired"] == states.count("EXPIRED") > 0 and "ACTIVE" in states
    assert body["total"]["backlog_entries"] == sum(v[0] for v in listed.values())
    assert body["total"]["backlog_bytes"] == sum(v[1] for v in listed.values())
    for r in body["subscriptions"]:
        assert listed[(r["topic"], r["name"])] == (r["backlog_entries"], r["backlog_bytes"], r["state"])
    assert {(r["topic"], r["subscription"]): (r["entries"], r["bytes"], "EXPIRED" if r["expired"] else "ACTIVE")
            for r in data} == listed
    assert len({v[0] for v in listed.values()}) > TOPICS  # backlogs differ: the comparison can fail


@pytest.mark.parametrize("hours,step_minutes", [(24, 60), (6, 7), (26 * 24, 24 * 60), (1, 1)])
def test_series_equals_the_old_per_bucket_scans(history, hours, step_minutes):
    step = step_minutes * 60
    with history.connect() as conn:  # one transaction: one now() for both
        new = dashboard.series(conn, hours, step_minutes)["points"]
        old = [{k: dashboard._json_value(v) for k, v in r.items()}
               for r in _rows(conn, OLD_SERIES_SQL, step=step, count=-(-hours * 3600 // step))]
    assert new == old
    assert any(p["offloaded_ledgers"] for p in new) and any(p["job_runs"] for p in new)
    assert len({p["backlog_ledgers"] for p in new}) > 1 or len(new) == 1  # the backlog moves


def test_topics_and_tier_usage_equal_the_aggregates_over_every_ledger(history):
    with history.connect() as conn:
        topics = [{k: r[k] for k in ("topic", "open_ledgers", "sealed_ledgers", "offloading_ledgers",
                                     "offloaded_ledgers", "deleted_ledgers", "entries", "size_bytes")}
                  for r in dashboard.topics(conn)["topics"]]
        assert topics == _rows(conn, OLD_TOPICS_SQL)
        assert dashboard.tier_usage(conn)["topics"] == _rows(conn, OLD_TIER_USAGE_SQL)
    assert len(topics) == TOPICS and sum(t["deleted_ledgers"] for t in topics) > 0
