"""Every DAG run for real: `airflow dags test` submits the Spark job on local[2] against the run's
PostgreSQL and loopback S3, with settings from the Airflow connections only; then its effect is checked in
metadata and in the bucket. No output may contain the S3 secret or the database password."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.conftest import empty_world
from tests.dags.conftest import dags_test
from tests.integration.helpers import bucket_keys, entries, make_deps, produce
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.offload import offload_many
from tiering.ops.retention import retention
from tiering.read import Entry, Gap, ReadHandle
from tiering.tier2.reader import tier2_opener

pytestmark = pytest.mark.slow
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)


@pytest.fixture(scope="module")
def deps(airflow, engine, s3_client, run_bucket):
    empty_world(engine, s3_client, run_bucket)
    return make_deps(engine, s3_client, run_bucket, airflow.tier1_root)


def read(deps, topic):
    return list(ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket)).read(topic))


def last_job_run(deps, job):
    with deps.meta.engine.connect() as conn:
        return conn.execute(text("SELECT status, items_done, items_failed FROM tiering.job_run WHERE job = :j "
                                 "ORDER BY run_id DESC LIMIT 1"), {"j": job}).one()


def states(deps, topic):
    return [led.state for led in deps.meta.list_ledgers(topic)]


def test_offload_by_age(airflow, deps):
    produce(deps, "age", [entries("a", 20, 500), entries("b", 20, 500)], TopicPolicy(offload_after_seconds=0,
            deletion_lag_seconds=0, **BIG), open_tail=[b"open"])
    produce(deps, "never", [entries("n", 5, 10)], TopicPolicy(**BIG))
    done, out = dags_test(airflow, "tiering_offload_by_age")
    assert done.returncode == 0, out[-3000:]
    assert states(deps, "age") == [S.OFFLOADED, S.OFFLOADED, S.OPEN]
    assert states(deps, "never") == [S.SEALED]
    assert last_job_run(deps, "offload") == ("SUCCEEDED", 2, 0)
    # the log leads with the outcome, not with Spark's start-up chatter (WARN by default)
    assert "offload_by_age: SUCCEEDED: planned 2, done 2, skipped 0, failed 0" in out, out[-3000:]
    assert " INFO SparkContext" not in out and " INFO Executor" not in out, out[-3000:]
    assert "spark.openlineage" not in out  # lineage off (no transport): Spark gets no parent run


def test_offload_by_size(airflow, deps):
    produce(deps, "size", [entries(f"s{i}", 10, 100) for i in range(4)],
            TopicPolicy(offload_threshold_bytes=2500, **BIG))
    done, out = dags_test(airflow, "tiering_offload_by_size", {"topic": "size"})
    assert done.returncode == 0, out[-3000:]
    # 1000 bytes each, newest to oldest: sums 1000, 2000, 3000 (over), 4000 -> ledgers 0 and 1
    assert states(deps, "size") == [S.OFFLOADED, S.OFFLOADED, S.SEALED, S.SEALED]


def test_offload_prefix_with_params_and_a_refused_position(airflow, deps):
    produce(deps, "prefix", [[b"a"], [b"b"], [b"c"]], TopicPolicy(**BIG), open_tail=[b"d"])
    done, out = dags_test(airflow, "tiering_offload_prefix", {"topic": "prefix", "position": "2:0"})
    assert done.returncode == 0, out[-3000:]
    assert states(deps, "prefix") == [S.OFFLOADED, S.OFFLOADED, S.SEALED, S.OPEN]
    done, out = dags_test(airflow, "tiering_offload_prefix", {"topic": "prefix", "position": "two"})
    assert done.returncode != 0 and "does not match" in out
    assert states(deps, "prefix") == [S.OFFLOADED, S.OFFLOADED, S.SEALED, S.OPEN]
    done, out = dags_test(airflow, "tiering_offload_prefix", {"topic": "prefix", "position": "all"})
    assert done.returncode == 0, out[-3000:]
    assert states(deps, "prefix") == [S.OFFLOADED, S.OFFLOADED, S.OFFLOADED, S.OPEN]


def test_delete_lagged_then_reads_come_from_tier2(airflow, deps):
    expected = {(e.ledger_id, e.entry_id): e.data for e in read(deps, "age") if isinstance(e, Entry)}
    done, out = dags_test(airflow, "tiering_delete_lagged", {"topic": "age"})
    assert done.returncode == 0, out[-3000:]
    assert [led.tier1_present for led in deps.meta.list_ledgers("age")] == [False, False, True]
    assert not deps.tier1.exists("age", 0)
    assert {(e.ledger_id, e.entry_id): e.data for e in read(deps, "age") if isinstance(e, Entry)} == expected


def test_defrag_merges_the_small_objects(airflow, deps):
    produce(deps, "frag", [entries(f"f{i}", 5, 300) for i in range(4)], TopicPolicy(**BIG), open_tail=[b"x"])
    offload_many(deps, deps.meta.list_ledgers("frag", [S.SEALED]))
    before = {(e.ledger_id, e.entry_id): e.data for e in read(deps, "frag") if isinstance(e, Entry)}
    done, out = dags_test(airflow, "tiering_defrag", {"topic": "frag"})
    assert done.returncode == 0, out[-3000:]
    assert len({c.data_key for c in deps.meta.chunks("frag").values()}) == 1
    assert {(e.ledger_id, e.entry_id): e.data for e in read(deps, "frag") if isinstance(e, Entry)} == before


def test_retention_trims_the_head_up_to_the_slowest_reader(airflow, deps):
    produce(deps, "ret", [entries(f"r{i}", 4, 250) for i in range(3)],
            TopicPolicy(retention_bytes=1000, retain_unread=True, **BIG), open_tail=[b"o"])
    offload_many(deps, deps.meta.list_ledgers("ret", [S.SEALED])[:1])
    deps.meta.subs.create("ret", "reader", Position(0, 3))  # has read ledger 0 only
    done, out = dags_test(airflow, "tiering_retention", {"topic": "ret"})
    assert done.returncode == 0, out[-3000:]
    # the plan task logs what the run deletes and what the reader holds back, as `retention --dry-run`
    assert "retention plan: 'ret': delete 1 ledger(s)" in out and "held back by subscriptions" in out, out[-3000:]
    assert states(deps, "ret") == [S.DELETED, S.SEALED, S.SEALED, S.OPEN]
    deps.meta.subs.delete("ret", "reader")  # the reader gone, the same operation the job runs takes ledger 1
    assert retention(deps, "ret").deleted == [("ret", 1)]
    assert states(deps, "ret") == [S.DELETED, S.DELETED, S.SEALED, S.OPEN]
    assert read(deps, "ret")[0] == Gap("TRIMMED", Position(0, 0), Position(1, 3))


def test_gc_leaves_exactly_the_referenced_objects(airflow, deps):
    done, out = dags_test(airflow, "tiering_gc")
    assert done.returncode == 0, out[-3000:]
    with deps.meta.engine.connect() as conn:
        refs = {k for r in conn.execute(text("SELECT data_key, index_key FROM tiering.chunk")) for k in r}
        pending = conn.execute(text("SELECT count(*) FROM tiering.gc_task WHERE not_before <= now()")).scalar()
    assert pending == 0
    keys = bucket_keys(deps)
    assert refs <= keys
    # what remains unreferenced is exactly what waits for its GC delay (readers of old metadata)
    assert keys - refs <= _delayed_keys(deps)


def test_gc_sweep_lists_the_prefix_from_its_cursor_and_keeps_young_objects(airflow, deps):
    """The daily sweep DAG: one pass over this small prefix in one run, the cursor row updated;
    an unreferenced object younger than the 2 h grace is kept (a test in tests/integration/test_gc_sweep.py
    shows one older than the grace deleted)."""
    stray = "t/stray/young-orphan"
    deps.bucket.s3.put_object(Bucket=deps.bucket.name, Key=stray, Body=b"young")
    done, out = dags_test(airflow, "tiering_gc_sweep")
    assert done.returncode == 0, out[-3000:]
    assert last_job_run(deps, "gc_sweep") == ("SUCCEEDED", 0, 0)
    with deps.meta.engine.connect() as conn:
        cursor, passes, pages = conn.execute(text(
            "SELECT cursor, passes_completed, pages_listed FROM tiering.gc_sweep")).one()
    assert cursor == "" and passes == 1 and pages >= 1
    assert stray in bucket_keys(deps)
    deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=stray)


def _delayed_keys(deps):
    with deps.meta.engine.connect() as conn:
        return set(conn.execute(text("SELECT key FROM tiering.gc_task")).scalars())


def test_metadata_export_by_spark_over_jdbc_imports_back_exactly(airflow, deps, database_url, s3_settings):
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from tiering.metadata import make_engine, upgrade
    from tiering.ops.export_metadata import filesystem_for, table_names
    from tiering.ops.import_metadata import import_metadata

    from tiering.metadata.export_rows import qualified, table
    from tiering.metadata.table_sync import TableRows

    # a topic's table: its policy row and the catalog's rows (another catalog's too, which stay out)
    deps.meta.create_topic("tabled")
    TableRows(deps.meta.engine).set_policy("tabled", "ns.tabled", "keep")
    with deps.meta.engine.begin() as conn:
        conn.execute(text("INSERT INTO iceberg_tables (catalog_name, table_namespace, table_name, metadata_location)"
                          " VALUES ('tiering', 'ns', 'tabled', 's3://b/t/metadata/00001-x.metadata.json'),"
                          " ('theirs', 'ns', 'other', NULL)"))
        conn.execute(text("INSERT INTO iceberg_namespace_properties VALUES ('tiering', 'ns', 'exists', 'true'),"
                          " ('theirs', 'ns', 'exists', 'true')"))
    # The default location, in the bucket: executors write the Parquet parts with pyarrow's S3 client, which
    # must send Content-Length (RGW 16 refuses its default aws-chunked uploads with HTTP 411).
    done, out = dags_test(airflow, "tiering_metadata_export", {})
    assert done.returncode == 0, out[-3000:]
    b = deps.bucket
    [manifest] = [o["Key"] for o in b.s3.list_objects_v2(Bucket=b.name, Prefix="t-metadata/").get("Contents", [])
                  if o["Key"].endswith("/manifest.json")]
    assert not b.s3.list_multipart_uploads(Bucket=b.name).get("Uploads")
    server = make_url(database_url)
    name = server.database + "_imp"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    target = make_engine(server.set(database=name).render_as_string(hide_password=False))
    try:
        upgrade(target)
        fs, base = filesystem_for(f"s3://{b.name}/{manifest.rsplit('/', 1)[0]}",
                                  endpoint_url=s3_settings["endpoint_url"], region=s3_settings["region_name"],
                                  access_key=s3_settings["aws_access_key_id"],
                                  secret_key=s3_settings["aws_secret_access_key"])
        # the executors' parts carry their digests, which the import checks
        from tiering.ops.export_metadata import read_manifest

        written = read_manifest(fs, base)
        assert all(p.sha256 for t in written.tables.values() for p in t.files)
        assert written.bucket == b.name  # the job's manifest names the store's bucket, as the CLI's does
        import_metadata(target, fs, base, bucket=b.name)

        def dump(engine, tname):
            with engine.connect() as conn:
                return conn.execute(text(f"SELECT * FROM {qualified(table(tname))} ORDER BY 1, 2, 3")).all()

        for tname in table_names():
            source = dump(deps.meta.engine, tname)
            if tname == "job_run":  # the export's own run row is written after its snapshot
                source = [r for r in source if r.job != "export_metadata"]
                assert [r for r in dump(target, tname) if r.job != "export_metadata"] == source
            elif tname.startswith("iceberg_"):  # the product's catalog only
                assert [r for r in source if r.catalog_name == "tiering"] == dump(target, tname) != [], tname
            else:
                assert dump(target, tname) == source, tname
        with target.connect() as conn:
            assert conn.execute(text("SELECT identifier FROM tiering.topic_table")).scalars().all() == ["ns.tabled"]
    finally:
        target.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
