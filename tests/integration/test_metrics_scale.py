"""The metrics' queries (tiering/metrics.py) on the 200k-ledger synthetic history of
tests/integration/synthetic_history.py: no statement a scrape runs reads `ledger` or `chunk` with a
sequential scan, nor `job_run` (its last runs come through index job_run_job_started), in the plans
PostgreSQL chooses on these statistics (EXPLAIN (FORMAT JSON)); and the figures equal the aggregates over
every ledger they replace. No timings (see the README)."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.conftest import empty_tables
from tests.integration import synthetic_history
from tiering import metrics

TOPICS, LEDGERS, HISTORY_DAYS = 200, 200_000, 365


@pytest.fixture(scope="module")
def history(engine):
    empty_tables(engine)
    synthetic_history.load(engine, TOPICS, LEDGERS, HISTORY_DAYS)
    yield engine
    empty_tables(engine)


def _scans(plan: dict):
    yield plan.get("Node Type"), plan.get("Relation Name"), plan.get("Index Name")
    for child in plan.get("Plans", []):
        yield from _scans(child)


@pytest.mark.parametrize("name", list(metrics.STATEMENTS))
def test_no_metrics_query_scans_the_history(history, name):
    with history.connect() as conn:
        [[plan]] = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + metrics.STATEMENTS[name]).one()
    scans = list(_scans(plan["Plan"]))
    for node, relation, index in scans:
        assert not (node == "Seq Scan" and relation in ("ledger", "chunk", "job_run")), (name, scans)
    relations = {relation for _, relation, _ in scans if relation}
    if name in ("backlog", "lagged"):
        assert "ledger" in relations  # through its partial index: the assertion above can fail
    if name == "last_runs":
        job_run = [(n, i) for n, r, i in scans if r == "job_run"]
        assert all(i for _, i in job_run) and "job_run_job_started" in {i for _, i in job_run}, scans


def test_the_figures_equal_the_aggregates_over_every_ledger(history):
    with history.connect() as conn:
        data = metrics.read(conn)
        old = conn.execute(text("""
            SELECT t.name AS topic,
                   count(*) FILTER (WHERE l.tier1_present AND l.state <> 'DELETED') AS t1n,
                   coalesce(sum(l.size_bytes) FILTER (WHERE l.tier1_present AND l.state <> 'DELETED'), 0) AS t1b,
                   count(*) FILTER (WHERE l.state = 'OFFLOADED') AS t2n,
                   count(*) FILTER (WHERE l.state IN ('SEALED', 'OFFLOADING') AND l.entry_count > 0) AS bn,
                   coalesce(sum(l.size_bytes) FILTER (WHERE l.state IN ('SEALED', 'OFFLOADING')
                                                      AND l.entry_count > 0), 0) AS bb
            FROM tiering.topic t LEFT JOIN tiering.ledger l USING (topic_id) GROUP BY t.name""")).all()
        jobs = conn.execute(text("SELECT count(DISTINCT (job, coalesce(kind, job))) FROM tiering.job_run")).scalar()
    tiers = {r["topic"]: r for r in data["tiers"]}
    backlog = {r["topic"]: r for r in data["backlog"]}
    assert len(tiers) == TOPICS and sum(r.bn for r in old) > 0
    for r in old:
        assert (tiers[r.topic]["tier1_ledgers"], tiers[r.topic]["tier1_bytes"], tiers[r.topic]["tier2_ledgers"]) \
            == (r.t1n, r.t1b, r.t2n)
        b = backlog.get(r.topic, {"ledgers": 0, "bytes": 0})
        assert (b["ledgers"], b["bytes"]) == (r.bn, r.bb)
    assert len(data["last_runs"]) == jobs > 0
    families = {f.name for f in metrics.families(data)}
    assert {"tiering_tier_bytes", "tiering_offload_backlog_bytes", "tiering_job_last_run_status"} <= families
