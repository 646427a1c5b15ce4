"""The OpenLineage datasets and run facet of a tiering run, from its kind, settings and job_run row (pure:
tiering.jobs.lineage), and the per-topic summary of what a run moved (tiering.jobs.runner.moved_ledgers)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tiering.jobs import lineage
from tiering.jobs.runner import moved_ledgers
from tiering.jobs.spec import JOBS

SETTINGS = SimpleNamespace(database_url="postgresql+psycopg2://tiering:pw-Secret1@db.example:5432/meta",
                           bucket="bkt", prefix="t/")
TOPIC_NS = "tiering://db.example/meta"


def test_every_job_kind_has_its_roles():
    assert {spec.kind for spec in JOBS.values()} <= set(lineage.ROLES)


def test_offload_reads_the_topic_and_writes_its_tier2_prefix():
    ins, outs = lineage.datasets("offload_by_age", SETTINGS, ["orders"])
    assert ins == [(TOPIC_NS, "orders")] and outs == [("s3://bkt", "t/orders")]


def test_namespaces_carry_no_credentials_and_keep_a_non_default_port():
    assert lineage.topic_namespace("postgresql://u:pw@h:6543/d?sslmode=require") == "tiering://h:6543/d"
    assert lineage.topic_namespace("postgresql:///d?host=/run/postgresql") == "tiering:///run/postgresql/d"
    assert lineage.tables_namespace(SETTINGS.database_url) == ("postgres://db.example:5432", "meta")
    assert lineage.location_dataset("s3://key:secret@backups/tiering/2026") == ("s3://backups", "tiering/2026")
    assert lineage.location_dataset("/srv/exports/x") == ("file", "/srv/exports/x")


def test_export_reads_the_tables_it_wrote_to_its_location():
    details = {"dest": "s3://bkt/t-metadata/20260101T000000Z", "tables": {"topic": 2, "ledger": 5}}
    ins, outs = lineage.datasets("export_metadata", SETTINGS, [], details)
    assert ins == [("postgres://db.example:5432", "meta.tiering.ledger"),
                   ("postgres://db.example:5432", "meta.tiering.topic")]
    assert outs == [("s3://bkt", "t-metadata/20260101T000000Z")]
    # the Iceberg catalog's tables are named in the schema the export found them in
    details.update(tables={"topic": 2, "iceberg_tables": 1}, schemas={"topic": "tiering", "iceberg_tables": "public"})
    ins, _ = lineage.datasets("export_metadata", SETTINGS, [], details)
    assert ins == [("postgres://db.example:5432", "meta.public.iceberg_tables"),
                   ("postgres://db.example:5432", "meta.tiering.topic")]


def test_gc_writes_the_whole_prefix_and_a_job_may_name_more_datasets():
    assert lineage.datasets("gc", SETTINGS, []) == ([], [("s3://bkt", "t/")])
    iceberg = {"lineage": {"outputs": [{"namespace": "s3://wh", "name": "ns.orders"}, {"name": "no namespace"}]}}
    assert lineage.datasets("table_sync", SETTINGS, ["orders"], iceberg) == (
        [(TOPIC_NS, "orders")], [("s3://wh", "ns.orders")])


def test_run_summary_from_a_job_run_row():
    row = {"run_id": 7, "status": "SUCCEEDED", "items_done": 3, "items_failed": 0, "bytes": 4096, "error": None,
           "details": {"planned": 3, "moved": {
               "a": {"ledgers": 2, "entries": 20, "first_ledger": 0, "last_ledger": 1},
               "b": {"ledgers": 1, "entries": 5, "first_ledger": 4, "last_ledger": 4}}}}
    got = lineage.run_summary(row)
    assert got["jobRunId"] == 7 and got["ledgers"] == 3 and got["entries"] == 25 and got["bytes"] == 4096
    assert (got["firstLedgerId"], got["lastLedgerId"]) == (0, 4)
    assert got["topics"]["b"] == {"ledgers": 1, "entries": 5, "firstLedgerId": 4, "lastLedgerId": 4}
    assert lineage.topics_of({"topic": "x"}, row["details"]) == ["a", "b"]
    assert lineage.topics_of({"topic": "x"}, {}) == ["x"] and lineage.topics_of({}, None) == []
    assert lineage.run_summary(None) == {}


def test_operator_lineage_has_statistics_and_the_run_facet():
    pytest.importorskip("airflow.providers.openlineage")
    row = {"run_id": 9, "status": "SUCCEEDED", "items_done": 1, "items_failed": 0, "bytes": 100,
           "details": {"moved": {"a": {"ledgers": 1, "entries": 4, "first_ledger": 2, "last_ledger": 2}}}}
    ol = lineage.operator_lineage("offload_prefix", SETTINGS, {"topic": "a"}, row)
    [out] = ol.outputs
    assert (out.namespace, out.name) == ("s3://bkt", "t/a")
    assert out.outputFacets["outputStatistics"].rowCount == 4 and out.outputFacets["outputStatistics"].size == 100
    facet = ol.run_facets[lineage.FACET]
    assert facet.jobRunId == 9 and facet.firstLedgerId == 2 and facet._schemaURL == lineage.SCHEMA_URL
    assert lineage.operator_lineage("offload_prefix", SETTINGS, {}, None).run_facets == {}


def test_moved_ledgers_per_topic_from_ledger_and_batch_items():
    items = [{"topic": "a", "ledger_ids": [3, 4]}, {"topic": "a", "ledger_id": 1}, {"topic": "b", "ledger_id": 9}]
    counts = {("a", 3): 10, ("a", 4): 5, ("a", 1): 2}  # b/9 has no row any more
    asked = []

    def entry_counts(pairs):
        asked.append(pairs)
        return counts

    assert moved_ledgers(items, entry_counts) == {
        "a": {"ledgers": 3, "entries": 17, "first_ledger": 1, "last_ledger": 4},
        "b": {"ledgers": 1, "entries": 0, "first_ledger": 9, "last_ledger": 9}}
    assert len(asked) == 1  # one query for the run
    assert moved_ledgers([{"topic": "a"}], entry_counts) == {} and moved_ledgers([], entry_counts) == {}


def test_a_recoverys_preview_reads_the_bucket_and_writes_nothing():
    assert lineage.datasets("recover", SETTINGS, ["a"]) == ([("s3://bkt", "t/a")], [(TOPIC_NS, "a")])
    assert lineage.datasets("recover", SETTINGS, ["a"], {"dry_run": True}) == ([("s3://bkt", "t/a")], [])
    row = {"run_id": 9, "status": "SUCCEEDED", "items_done": 1, "items_failed": 0, "bytes": 0,
           "details": {"dry_run": True, "planned": 1}}
    assert lineage.run_summary(row)["dryRun"] is True
    assert "dryRun" not in lineage.run_summary({**row, "details": {"planned": 1}})
