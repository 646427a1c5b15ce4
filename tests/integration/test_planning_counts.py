"""A scheduled run with nothing due costs what is due, not what the store holds: on 1,000 topics
with history (bench/scale_data.py's shape, loaded set-based: deleted, offloaded, recently offloaded, sealed
and open ledgers, shared and lone objects, limits on some topics), each idle command and each Spark job's
plan() makes at most 20 SQL statements and 2 S3 requests. Counted on the engine (before_cursor_execute)
and on the S3 client (before-send), so a per-topic query or GET anywhere in the path fails it."""
from __future__ import annotations

import argparse
from contextlib import contextmanager

import pytest
from sqlalchemy import event

from bench.scale_data import load_metadata, write_tier1
from tiering.jobs import defrag as defrag_job, delete_lagged as lagged_job, offload as offload_job
from tiering.jobs import retention as retention_job
from tiering.model import MIB
from tiering.ops.defrag import merge_groups, plan_defrag
from tiering.ops.delete_lagged import delete_lagged
from tiering.ops.offload import offload_by_topic, plan_offload
from tiering.ops.retention import retention

TOPICS, LEDGERS = 1000, 12
MAX_SQL, MAX_S3 = 20, 2


class Counts:
    def __init__(self, deps):
        self.deps, self.sql, self.s3 = deps, 0, 0

    def _on_sql(self, *_a, **_kw):
        self.sql += 1

    def _on_send(self, **_kw):
        self.s3 += 1

    @contextmanager
    def window(self):
        self.sql = self.s3 = 0
        engine, events = self.deps.meta.engine, self.deps.bucket.s3.meta.events
        event.listen(engine, "before_cursor_execute", self._on_sql)
        events.register("before-send.s3", self._on_send)
        try:
            yield self
        finally:
            event.remove(engine, "before_cursor_execute", self._on_sql)
            events.unregister("before-send.s3", self._on_send)


@pytest.fixture
def store(deps, database_url):
    loaded = load_metadata(database_url, TOPICS, LEDGERS, deps.bucket.prefix)
    write_tier1(deps.tier1.root, database_url)
    assert loaded["ledgers"] == TOPICS * LEDGERS
    # The synthetic store has trimmed history whose markers were never written: the first retention run
    # after loading (as after upgrading to migration 0004) writes them once; from then on nothing is due.
    first = retention(deps)
    assert first.deleted == [] and first.files_removed == 0
    return deps


def _args(**kw):
    return argparse.Namespace(**{"topic": None, "prefix": None, "position": None, "by": None, **kw})


RUNS = {
    "offload-by-age": lambda d: offload_by_topic(d, plan_offload(d, "age")),
    "offload-by-size": lambda d: offload_by_topic(d, plan_offload(d, "size")),
    "delete-lagged": delete_lagged,
    "retention": retention,
    "defrag": lambda d: merge_groups(d, plan_defrag(d)),
    "job offload by age plan": lambda d: offload_job.plan(d, _args(by="age")),
    "job offload by size plan": lambda d: offload_job.plan(d, _args(by="size")),
    "job delete_lagged plan": lambda d: lagged_job.plan(d, _args()),
    "job retention plan": lambda d: retention_job.plan(d, _args()),
    "job defrag plan": lambda d: defrag_job.plan(d, _args(small_bytes=8 * MIB, max_merged_bytes=256 * MIB)),
}


def test_idle_scheduled_runs_cost_what_is_due(store):
    counts = Counts(store)
    cost = {}
    for name, run in RUNS.items():
        with counts.window():
            result = run(store)
        cost[name] = (counts.sql, counts.s3)
        # nothing is due: an empty plan or a report with nothing done
        assert not result or not any(getattr(result, f, None) for f in ("offloaded", "deleted", "groups")), name
    over = {k: v for k, v in cost.items() if v[0] > MAX_SQL or v[1] > MAX_S3}
    assert not over, f"over {MAX_SQL} SQL statements or {MAX_S3} S3 requests: {over} (all: {cost})"


def test_a_due_trim_writes_its_marker_once(store):
    """Retention that trims PUTs the marker (GET + PUT) once; the next run makes no S3 request at all."""
    from sqlalchemy import text

    with store.meta.engine.begin() as conn:  # one topic's retention now covers its oldest live ledger
        name = conn.execute(text(
            "UPDATE tiering.topic SET retention_seconds = 0, retention_bytes = -1 WHERE topic_id = "
            "(SELECT min(topic_id) FROM tiering.topic) RETURNING name")).scalar_one()
    counts = Counts(store)
    with counts.window():
        report = retention(store, name)
    assert report.deleted and counts.s3 == 2
    with counts.window():
        again = retention(store)
    assert not again.deleted and counts.s3 == 0 and counts.sql <= MAX_SQL


def test_topic_stats_is_one_statement_whatever_the_history(store):
    """`tiering topic stats` over 1,000 topics with history: one SQL statement (the maintained totals and
    partial indexes, metadata/stats.py), and the same one for one topic; no S3 request."""
    from tiering.metadata.stats import topic_stats

    counts = Counts(store)
    with counts.window():
        every, _ = topic_stats(store.meta.engine)
    assert (counts.sql, counts.s3) == (1, 0) and len(every) == TOPICS
    with counts.window():
        [one], _ = topic_stats(store.meta.engine, every[0]["topic"])
    assert (counts.sql, counts.s3) == (1, 0) and one["live_count"] == every[0]["live_count"]
    assert sum(r["deleted_count"] for r in every) > 0  # the history is there, and not read ledger by ledger
