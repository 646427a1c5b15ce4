"""`tiering topic set --table`, `tiering table sync|status|verify` as real subprocesses, and the Spark job
of the DAG tiering_table_sync (one spark-submit), on the run's PostgreSQL and RGW."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tests.integration.test_cli import make_cli
from tiering.ops.delete_lagged import delete_copy
from tiering.ops.offload import offload_ledger
from tiering.read import ReadHandle
from tiering.tables.catalog import catalog
from tiering.tier2.reader import tier2_opener

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(settings, db, bucket, tier1_root, tmp_path):
    catalog(settings)  # creates the catalog's tables on first use
    with db.begin() as conn:
        conn.execute(text("DELETE FROM iceberg_tables"))
    return make_cli(settings, bucket, tier1_root, tmp_path)


def _read(deps, topic):
    h = ReadHandle(deps.meta, deps.tier1, open_tier2=tier2_opener(deps.bucket))
    return {(e.ledger_id, e.entry_id): e.data for e in h.read(topic) if hasattr(e, "data")}


def _table(settings, identifier):
    t = catalog(settings).load_table(identifier).scan().to_arrow()
    keys = list(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist()))
    assert len(keys) == len(set(keys)), "a row appears twice"
    return dict(zip(keys, t["payload"].to_pylist()))


def test_bad_table_names_exit_2_with_one_line_and_nothing_written(cli, deps):
    produce(deps, "t", [entries("a", 1, 10)])
    for bad in ("nodot", "a.b.c", "Upper.case", "1ns.t", "ns.t__dlq", "ns.", ".t", "ns.t\n"):
        line = cli("topic", "set", "t", "--table", bad).one_line_error(2)
        assert "NAMESPACE.TABLE" in line or "dead-letter" in line, line
    assert "--table" in cli("topic", "create", "v", "--table-retention", "keep").one_line_error(2)
    assert "no table" in cli("table", "status", "t").one_line_error(2)
    for fields, why in (("id:int", "types are"), ("id", "NAME:TYPE"), ("payload:string", "own columns")):
        assert why in cli("topic", "set", "t", "--table", "ns.t", "--table-json-fields", fields).one_line_error(2)
    assert "no table" in cli("table", "status", "t").one_line_error(2)  # nothing was written
    assert cli("topic", "show", "v").returncode == 2  # the refused create wrote nothing
    cli("topic", "set", "t", "--table", "ns.t").ok()
    produce(deps, "w", [])
    assert "already the table of topic 't'" in cli("topic", "set", "w", "--table", "ns.t").one_line_error(2)


def test_a_decoder_field_named_as_the_partition_field_is_refused_not_a_sync_failing_for_ever(cli, deps, settings):
    """Iceberg refuses a partition field named as a column: a decoder field `sealed_at_day` was accepted,
    then every sync failed, and a decoder can only gain fields, so nothing but dropping the topic undid it."""
    produce(deps, "t", [entries("a", 3, 10)])
    line = cli("topic", "set", "t", "--table", "ns.t", "--table-json-fields", "sealed_at_day:string").one_line_error(2)
    assert "partition field" in line, line
    assert "no table" in cli("table", "status", "t").one_line_error(2)  # nothing was written
    cli("topic", "set", "t", "--table", "ns.t", "--table-json-fields", "v:int64").ok()
    text_status = cli("table", "status", "t").ok().stdout  # recorded, not made yet: no Python None shown
    assert "None" not in text_status and "metadata_location  -" in text_status, text_status
    cli("table", "sync", "--topic", "t").ok()
    line = cli("topic", "set", "t", "--table-json-fields", "v:int64,sealed_at_day:string").one_line_error(2)
    assert "partition field" in line, line
    cli("produce", "t", "--entries", "2", "--entry-size", "10", "--seal").ok()
    assert cli("table", "sync", "--topic", "t", "--json").ok().json["ledger_count"] == 1
    assert cli("table", "verify", "t", "--json").ok().json["failed"] == []
    assert [f.name for f in catalog(settings).load_table("ns.t").schema().fields][-1] == "v"


def test_a_sync_refused_by_a_running_maintenance_fails_it_is_not_skipped_as_done(cli, deps):
    """A sync finding another sync of the topic running leaves it the work (skipped, exit 0); one finding the
    table's maintenance running past its wait did nothing that anyone does for it: it said "another sync" and
    exit 0."""
    from tiering.cli.output import check_document
    from tiering.metadata.table_sync import TableRows, exclusive

    produce(deps, "m", [entries("a", 2, 10)])
    cli("topic", "set", "m", "--table", "ns.m").ok()
    topic_id = TableRows(deps.meta.engine).get("m").topic_id
    with exclusive(deps.meta.engine, topic_id, maintenance=True) as held:  # as `table maintain` holds it
        assert held
        res = cli("table", "sync", "--topic", "m", "--wait", "1s", "--json")
        assert res.returncode == 1, res.stdout
        assert "maintenance" in res.json["failed"][0]["error"] and res.json["ledger_count"] == 0
        assert "past the 1 s" in res.json["failed"][0]["error"]
    with exclusive(deps.meta.engine, topic_id) as held:  # as another sync holds it
        assert held
        res = cli("table", "sync", "--topic", "m", "--json").ok()
        assert res.json["topics"][0]["status"] == "skipped" and res.json["ledger_count"] == 0
        assert res.json["skipped"] == [{"topic": "m", "ledger": None}] and check_document(res.json) == []
    assert cli("table", "sync", "--topic", "m", "--json").ok().json["ledger_count"] == 1


def _held_for(engine, topic_id: int, seconds: float, maintenance: bool):
    """The table's lock held by a thread for `seconds` (or until `done` is set), as a running maintenance
    (or sync) holds it: (thread, done), once it is held."""
    import threading

    from tiering.metadata.table_sync import exclusive

    taken, done = threading.Event(), threading.Event()

    def hold():
        with exclusive(engine, topic_id, maintenance=maintenance) as held:
            assert held
            taken.set()
            done.wait(seconds)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert taken.wait(30)
    return t, done


def test_a_sync_meeting_a_maintenance_waits_for_it_and_then_syncs(cli, deps):
    """The hourly sync meeting the daily maintenance of the table failed and was left to Airflow's retries."""
    from tiering.metadata.table_sync import TableRows

    produce(deps, "w", [entries("a", 2, 10)])
    cli("topic", "set", "w", "--table", "ns.w").ok()
    topic_id = TableRows(deps.meta.engine).get("w").topic_id
    holder, _ = _held_for(deps.meta.engine, topic_id, 4, maintenance=True)
    res = cli("table", "sync", "--topic", "w", "--json").ok()
    assert not holder.is_alive()  # it waited for the maintenance to end
    assert res.json["ledger_count"] == 1 and res.json["failed"] == [], res.json


def test_a_maintenance_meeting_a_sync_waits_for_it_or_fails_saying_so(cli, deps):
    """A maintenance finding a sync running failed at once; one finding another maintenance running did the
    same, though that one does its work (and then reported zero work done, as a run with nothing to do)."""
    from tiering.metadata.table_sync import TableRows

    produce(deps, "x", [entries("a", 2, 10)])
    cli("topic", "set", "x", "--table", "ns.x").ok()
    cli("table", "sync", "--topic", "x").ok()
    topic_id = TableRows(deps.meta.engine).get("x").topic_id
    holder, _ = _held_for(deps.meta.engine, topic_id, 4, maintenance=False)
    res = cli("table", "maintain", "--topic", "x", "--json").ok()
    assert not holder.is_alive() and res.json["failed"] == [], res.json
    holder, done = _held_for(deps.meta.engine, topic_id, 60, maintenance=False)
    res = cli("table", "maintain", "--topic", "x", "--wait", "1s", "--json")
    done.set()
    holder.join()
    assert res.returncode == 1 and "sync of this topic ran on past the 1 s" in res.json["failed"][0]["error"]
    holder, done = _held_for(deps.meta.engine, topic_id, 60, maintenance=True)  # another maintenance: its work
    res = cli("table", "maintain", "--topic", "x", "--wait", "0s", "--json")
    text = cli("table", "maintain", "--topic", "x", "--wait", "0s")
    done.set()
    holder.join()
    assert res.json["failed"] == [] and res.returncode == 0, res.stdout
    assert res.json["skipped"] == [{"topic": "x", "ledger": None}], res.json
    assert "another maintenance" in res.json["tables"][0]["skipped"], res.json
    assert text.ok().stdout.strip() == ("x -> ns.x: skipped: another maintenance of this table is running: it does "
                                        "the work")


def test_previews_take_no_turn_so_no_real_run_meeting_one_reports_skipped(cli, deps):
    """A `--dry-run` maintenance (or sync) took the table's turn: a real one meeting it was reported skipped,
    exit 0, as if the preview did its work. A preview now runs beside any holder and says what it would do."""
    from tiering.metadata.table_sync import TableRows

    produce(deps, "pv", [entries("a", 2, 10)])
    cli("topic", "set", "pv", "--table", "ns.pv").ok()
    cli("table", "sync", "--topic", "pv").ok()
    cli("produce", "pv", "--entries", "2", "--entry-size", "10", "--seal").ok()  # a ledger to plan
    topic_id = TableRows(deps.meta.engine).get("pv").topic_id
    for maintenance in (True, False):
        holder, done = _held_for(deps.meta.engine, topic_id, 60, maintenance=maintenance)
        try:
            m = cli("table", "maintain", "--topic", "pv", "--dry-run", "--wait", "0s", "--json").ok().json
            s = cli("table", "sync", "--topic", "pv", "--dry-run", "--wait", "0s", "--json").ok().json
        finally:
            done.set()
            holder.join()
        assert m["skipped"] == [] and m["tables"][0]["skipped"] is None and m["failed"] == [], m
        assert s["skipped"] == [] and s["planned_count"] == 1 and s["failed"] == [], s


def test_status_after_a_sync_stopped_between_commit_and_row_says_what_the_table_holds(cli, deps, settings):
    """A sync killed after its commit, before its row update: status gave the table's new metadata location
    beside the row's old mark and snapshot, and a lag of ledgers the table already held."""
    stopped_past_its_commit(cli, deps, settings, "st")
    st = cli("table", "status", "st", "--json").ok().json
    table = catalog(settings).load_table("ns.st")
    assert st["metadata_location"] == table.metadata_location
    assert (st["synced_through"], st["lag_ledger_count"], st["lag_bytes"]) == (1, 0, 0), st
    assert st["snapshot_id"] == table.current_snapshot().snapshot_id
    assert cli("table", "sync", "--topic", "st", "--json").ok().json["topics"][0]["reconciled"] is True
    assert cli("table", "status", "st", "--json").ok().json["synced_through"] == 1


def stopped_past_its_commit(cli, deps, settings, topic: str) -> None:
    """Two ledgers of the topic synced to ns.<topic>, the sync stopped after its commit, before its row."""
    from tests.integration.test_tables import Stop, _stop_at
    from tiering.tables.files import local_writer
    from tiering.tables.sync import TableSync, sync_tables

    produce(deps, topic, [entries("a", 3, 10), entries("b", 2, 10)])
    cli("topic", "set", topic, "--table", f"ns.{topic}").ok()
    with pytest.raises(Stop):
        sync_tables(TableSync(deps.meta.engine, settings, catalog(settings), fault=_stop_at("committed")),
                    local_writer(deps, settings))


def synced_twice_then_rolled_back(cli, deps, settings, topic: str) -> None:
    """Two syncs of the topic's table ns.<topic>, then a rollback to its first snapshot by another tool."""
    produce(deps, topic, [entries("a", 3, 10)])
    cli("topic", "set", topic, "--table", f"ns.{topic}").ok()
    cli("table", "sync", "--topic", topic).ok()
    cli("produce", topic, "--entries", "2", "--entry-size", "10", "--seal").ok()
    cli("table", "sync", "--topic", topic).ok()
    table = catalog(settings).load_table(f"ns.{topic}")
    table.manage_snapshots().rollback_to_snapshot(table.snapshots()[0].snapshot_id).commit()


def test_a_table_rolled_back_to_an_older_snapshot_stops_the_sync_rather_than_leave_a_hole(cli, deps, settings):
    """A rollback keeps the table's properties: its mark still said ledger 1 was in, the sync went on from
    there (exit 0) and ledger 1 was missing for good (only verify said so)."""
    synced_twice_then_rolled_back(cli, deps, settings, "rb")
    cli("produce", "rb", "--entries", "2", "--entry-size", "10", "--seal").ok()
    assert "rolled back" in cli("table", "sync", "--topic", "rb").one_line_error(1)
    assert "rolled back" in cli("table", "sync", "--topic", "rb", "--dry-run").one_line_error(1)
    assert "rolled back" in cli("table", "maintain", "--topic", "rb").one_line_error(1)
    assert catalog(settings).load_table("ns.rb").scan().to_arrow().num_rows == 3  # nothing appended past it


def test_sync_status_verify(cli, deps, settings):
    produce(deps, "orders", [entries("a", 5, 100), entries("b", 3, 50), entries("c", 4, 10)],
            open_tail=entries("d", 1, 10))
    delete_copy(deps, offload_ledger(deps, deps.meta.list_ledgers("orders")[0]))  # tier 2 only; 1 both; 2 tier 1
    offload_ledger(deps, deps.meta.list_ledgers("orders")[1])
    cli("topic", "set", "orders", "--table", "sales.orders", "--table-retention", "keep").ok()
    st = cli("table", "status", "orders", "--json").ok().json
    assert st["command"] == "table status" and st["identifier"] == "sales.orders"
    assert (st["lag_ledger_count"], st["metadata_location"]) == (3, None) and st["lag_bytes"] > 0
    assert (st["row_count"], st["dlq_pending_commit_count"], st["problem"]) == (0, 0, None)  # not made yet: empty
    dry = cli("table", "sync", "--dry-run", "--json").ok().json
    assert dry["planned"] == [{"topic": "orders", "ledger": i} for i in (0, 1, 2)] and dry["ledger_count"] == 0
    assert not catalog(settings).table_exists("sales.orders")  # a dry run creates nothing
    out = cli("table", "sync", "--topic", "orders", "--json").ok().json
    assert out["ledgers"] == [{"topic": "orders", "ledger": i} for i in (0, 1, 2)]
    assert out["failed"] == [] and out["failed_count"] == 0 and out["topics"][0]["entry_count"] == 12
    assert _table(settings, "sales.orders") == {k: v for k, v in _read(deps, "orders").items() if k[0] < 3}
    st = cli("table", "status", "orders", "--json").ok().json
    assert (st["lag_ledger_count"], st["lag_bytes"], st["synced_through"]) == (0, 0, 2)
    assert (st["ledger_count"], st["entry_count"], st["row_count"]) == (3, 12, 12)
    assert st["metadata_location"].startswith(f"s3://{settings.bucket}/t-tables/sales/orders/metadata/")
    assert st["synced_at"].endswith("Z")
    v = cli("table", "verify", "orders", "--json").ok().json
    assert (v["failed"], v["ledger_count"], v["entry_count"]) == ([], 3, 12)
    from pyiceberg.expressions import EqualTo

    catalog(settings).load_table("sales.orders").delete(EqualTo("ledger_id", 1))  # a difference made by hand
    bad = cli("table", "verify", "orders", "--json")
    assert bad.returncode == 1, bad.stderr
    assert bad.json["failed"] == [{"topic": "orders", "ledger": 1, "error": "not in the table"}]
    # what syncs committed stays; what the table holds now does not
    st = cli("table", "status", "orders", "--json").ok().json
    assert (st["ledger_count"], st["entry_count"], st["row_count"]) == (3, 12, 9)


@pytest.mark.slow
def test_spark_job_syncs_a_mixed_topic(deps, settings, cli):
    produce(deps, "sp", [entries("a", 50, 200), entries("b", 30, 100), [], entries("c", 20, 10)])
    delete_copy(deps, offload_ledger(deps, deps.meta.list_ledgers("sp")[0]))
    cli("topic", "set", "sp", "--table", "ns.sp").ok()
    bindir = Path(sys.executable).parent
    env = {**os.environ, **settings.to_env(), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
    cmd = [str(bindir / "spark-submit"), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           str(ROOT / "tiering" / "jobs" / "table_sync.py")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _table(settings, "ns.sp") == _read(deps, "sp")
    with deps.meta.engine.connect() as conn:
        row = conn.execute(text("SELECT status, items_done, details FROM tiering.job_run WHERE job = 'table_sync'")).one()
    assert row.status == "SUCCEEDED" and row.items_done == 3 and row.details["entries"] == 100
    # nothing new: the plan is empty, Spark is not started
    from tiering.jobs.table_sync import build_parser, plan

    assert plan(deps, build_parser().parse_args([])) == []


def test_maintenance_job_and_command(cli, deps, settings):
    from tiering.metadata.table_sync import TableRows
    from tiering.tables.files import local_writer
    from tiering.tables.sync import Limits, TableSync, sync_tables

    expected = produce(deps, "m", [entries(str(i), 3, 20) for i in range(5)])
    cli("topic", "set", "m", "--table", "ns.m").ok()
    sync = TableSync(deps.meta.engine, settings, catalog(settings), limits=Limits(round_ledgers=1))
    assert [r.rounds for r in sync_tables(sync, local_writer(deps, settings))] == [5]
    # the job never starts Spark: it runs as a plain Python process here
    env = {**os.environ, **settings.to_env(), "PYTHONPATH": str(ROOT)}
    job = subprocess.run([sys.executable, str(ROOT / "tiering" / "jobs" / "table_maintenance.py"),
                          "--expire-after-seconds=0", "--orphan-grace-seconds=0"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    with deps.meta.engine.connect() as conn:
        row = conn.execute(text("SELECT status, items_done, details FROM tiering.job_run "
                                "WHERE job = 'table_maintenance'")).one()
    assert (row.status, row.items_done) == ("SUCCEEDED", 1)
    assert (row.details["files_before"], row.details["files_after"], row.details["spark"]) == (5, 1, "skipped")
    assert _table(settings, "ns.m") == expected
    out = cli("table", "maintain", "--topic", "m", "--json").ok().json
    assert out["command"] == "table maintain" and out["failed"] == [] and out["failed_count"] == 0
    assert out["tables"][0]["partitions_compacted_count"] == 0  # one file left: nothing to compact
    assert cli("table", "verify", "m").ok().stdout.rstrip().endswith("the same")
    assert TableRows(deps.meta.engine).get("m").metadata_location == \
        catalog(settings).load_table("ns.m").metadata_location


def test_status_of_a_table_dropped_or_rolled_back_says_so_rather_than_claim_its_rows(cli, deps, settings):
    """Sync, verify and maintain refuse a table dropped behind the store's back or rolled back, but status
    gave no problem and the row's mark (ledgers the table no longer holds) with a lag of 0."""
    produce(deps, "gone", [entries("a", 3, 10), entries("b", 2, 10)])
    cli("topic", "set", "gone", "--table", "ns.gone").ok()
    cli("table", "sync", "--topic", "gone").ok()
    catalog(settings).drop_table("ns.gone")
    st = cli("table", "status", "gone", "--json").ok().json
    assert st["problem"] and "dropped" in st["problem"], st

    synced_twice_then_rolled_back(cli, deps, settings, "rolled")
    st = cli("table", "status", "rolled", "--json").ok().json
    assert st["problem"] and "rolled back" in st["problem"], st


def test_status_after_a_sync_stopped_past_its_commit_counts_the_rows_the_table_took(cli, deps, settings):
    """Status gave the table's mark (ledgers through 1, no lag) beside the row's counts: 0 ledgers and 0
    entries committed, until the next sync caught the row up."""
    stopped_past_its_commit(cli, deps, settings, "cnt")
    st = cli("table", "status", "cnt", "--json").ok().json
    assert (st["synced_through"], st["ledger_count"], st["entry_count"]) == (1, 2, 5), st
    cli("table", "sync", "--topic", "cnt").ok()
    st = cli("table", "status", "cnt", "--json").ok().json
    assert (st["synced_through"], st["ledger_count"], st["entry_count"]) == (1, 2, 5), st
