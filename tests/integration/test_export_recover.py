"""Metadata export/import (Parquet, local and S3) and recovery from the bucket, against the real PostgreSQL
and loopback S3. Every restore goes into a database of its own, created empty and migrated here."""
from __future__ import annotations

import dataclasses
import hashlib
import datetime as dt
import secrets
import time
import uuid

import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.integration.helpers import MIB, bucket_keys, entries, open_uploads, produce
from tiering.errors import BadInput
from tiering.format.index import decode_index, encode_index
from tiering.format.keys import data_key, index_key
from tiering.format.metadata import encode_metadata
from tiering.metadata import make_engine, upgrade
from tiering.metadata.attributes import AttributeUpdate, Attributes, Verb
from tiering.metadata import export_rows as R
from tiering.metadata.job_runs import JobOutcome, JobRuns
from tiering.metadata.repository import MetadataStore
from tiering.metadata.table_sync import TableRows
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.defrag import defrag
from tiering.ops.delete_lagged import delete_lagged
from tiering.ops.export_metadata import (arrow_schema, export_metadata, filesystem_for, jdbc_query, read_manifest, rows_to_table, table_names)
from tiering.ops.import_metadata import import_metadata
from tiering.ops.gc import run_gc
from tiering.ops.offload import offload_many
from tiering.ops.recover import recover_from_bucket
from tiering.ops.retention import truncate
from tiering.ops.topics import delete_topic
from tiering.read import Entry, ReadHandle
from tiering.tables.catalog import catalog
from tiering.tables.files import local_writer
from tiering.tables.sync import TableSync, sync_tables
from tiering.tier1 import Tier1Store
from tiering.tier2.reader import tier2_opener
from tiering.writer import ManagedLedgerWriter

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
PKS = {"topic": "topic_id", "ledger": "topic_id, ledger_id", "chunk": "topic_id, ledger_id",
       "gc_task": "task_id", "attribute": "topic_id, ledger_id, key", "job_run": "run_id",
       "subscription": "subscription_id", "subscription_loss": "loss_id", "topic_tombstone": "name",
       "topic_table": "topic_id", "iceberg_namespace_properties": "catalog_name, namespace, property_key",
       "iceberg_tables": "catalog_name, table_namespace, table_name"}
SLASHED = "tenant/ns/β topic"  # percent-encoded in keys


# ----------------------------------------------------------------------------------------------- fixtures
@pytest.fixture
def new_database(database_url):
    """Factory of extra databases (empty, migrated unless told otherwise), dropped after the test."""
    server = make_url(database_url)
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    made = []

    def make(migrate: bool = True):
        name = f"{server.database}_x{secrets.token_hex(3)}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        eng = make_engine(server.set(database=name).render_as_string(hide_password=False))
        made.append((name, eng))
        if migrate:
            upgrade(eng)
        return eng

    yield make
    for name, eng in made:
        eng.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def s3fs(s3_settings, bucket):
    def at(path: str):
        return filesystem_for(f"s3://{bucket}/{path}", endpoint_url=s3_settings["endpoint_url"],
                              access_key=s3_settings["aws_access_key_id"],
                              secret_key=s3_settings["aws_secret_access_key"], region=s3_settings["region_name"])
    return at


# ----------------------------------------------------------------------------------------------- helpers
def snapshot(engine) -> dict[str, list[dict]]:
    """Every row of every table, ordered by primary key."""
    with engine.connect() as conn:
        return {t: [dict(r._mapping) for r in conn.execute(
                    text(f"SELECT * FROM {R.qualified(R.table(t))} ORDER BY {PKS[t]}"))]
                for t in table_names()}


def offload_all(deps, topic):
    return offload_many(deps, deps.meta.list_ledgers(topic, [S.SEALED]))


def populate(deps, db, defrag_too: bool = True) -> None:
    """Several topics through the whole pipeline, plus attributes, job runs and queued GC keys."""
    # alpha: small ledgers and one of 6 MiB, offloaded, tier-1 copies deleted, then defragged into one object
    shapes = [entries("a0", 10, 1500), entries("a1", 6, MIB), entries("a2", 12, 900), entries("a3", 10, 1500)]
    produce(deps, "alpha", shapes, open_tail=[b"alpha-tail"], policy=TopicPolicy(deletion_lag_seconds=0, **BIG))
    offload_all(deps, "alpha")
    delete_lagged(deps, topic="alpha")
    if defrag_too:
        assert defrag(deps, topic="alpha", small_bytes=8 * MIB, max_merged_bytes=64 * MIB).groups == 1
    # a topic whose name needs percent-encoding, offloaded, tier-1 copies kept (lag not over)
    produce(deps, SLASHED, [entries("s0", 5, 300), [b"\x00\xff" * 50], entries("s2", 7, 64)],
            policy=TopicPolicy(**BIG))
    offload_all(deps, SLASHED)
    # gamma: offloaded, head truncated by retention, then GC: ledgers 0 and 1 are gone from the bucket
    produce(deps, "gamma", [entries(f"g{i}", 4, 700) for i in range(4)], policy=TopicPolicy(**BIG))
    offload_all(deps, "gamma")
    deps.meta.subs.create("gamma", "slow reader", None)  # its loss is recorded by the forced truncate
    deps.meta.subs.create("gamma", "caught up", Position(3, 3))
    truncate(deps, "gamma", Position(2, 0), force=True)
    # a deleted topic leaves a tombstone
    produce(deps, "gone", [entries("x", 2, 10)], policy=TopicPolicy(**BIG))
    delete_topic(deps, "gone")
    run_gc(deps, orphan_grace=dt.timedelta(hours=1))
    # delta: one offloaded, one attempt in flight (OFFLOADING), one sealed only, one empty
    produce(deps, "delta", [entries("d0", 3, 100), entries("d1", 3, 100), entries("d2", 3, 100), []],
            policy=TopicPolicy(offload_after_seconds=60, retention_seconds=86400, **BIG))
    offload_many(deps, [deps.meta.get_ledger("delta", 0)])
    led1 = deps.meta.get_ledger("delta", 1)
    attempt = str(uuid.uuid4())
    deps.meta.begin_offload(led1, attempt, [data_key("t/", "delta", attempt, 1), index_key("t/", "delta", attempt, 1)],
                            gc_delay=dt.timedelta(hours=1))
    # attributes, job runs (one still running), GC queue rows (one FAILED)
    attrs = Attributes(db)
    attrs.update("alpha", [AttributeUpdate("offsets", Verb.REPLACE, 2**62), AttributeUpdate("n", Verb.ACCUMULATE, -7)])
    attrs.update("alpha", [AttributeUpdate("marker", Verb.REPLACE, -(2**63))], ledger_id=2)
    runs = JobRuns(db)
    done = runs.start("offload", topic="alpha")
    runs.finish(done, JobOutcome(items_done=4, bytes=123456789, details={
        "ledgers": [0, 1, 2], "note": "ünïcode \"quoted\"", "nested": {"pi": 3.14159265358979, "big": 10**30}}))
    failed = runs.start("gc")
    runs.finish(failed, JobOutcome(items_failed=1, errors=["S3 DELETE of 'x' failed: SlowDown"]))
    runs.start("defrag", topic=SLASHED)
    deps.meta.enqueue_gc(["t/alpha/manual-1", "t/alpha/manual-2"], "by hand", delay=dt.timedelta(days=1))
    with db.begin() as conn:
        conn.execute(text("UPDATE tiering.gc_task SET state = 'FAILED', attempts = 5, last_error = 'boom' "
                          "WHERE key = 't/alpha/manual-2'"))


def sync_table(deps, settings, topic: str, identifier: str | None):
    """The topic given an Iceberg table (None: the one it has), synced once; returns the synced ledger ids."""
    if identifier is not None:
        TableRows(deps.meta.engine).set_policy(topic, identifier, "keep")
    [r] = sync_tables(TableSync(deps.meta.engine, settings, catalog(settings)), local_writer(deps, settings), topic)
    assert r.status == "synced", r.error
    return r.ledgers


def table_rows(settings, identifier: str) -> list[tuple]:
    t = catalog(settings).load_table(identifier).scan().to_arrow()
    return sorted(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist(), t["payload"].to_pylist()))


def read_ledger(meta, tier1, bkt, led):
    handle = ReadHandle(meta, tier1, tier2_opener(bkt), raise_on_dataloss=True)
    return [(e.ledger_id, e.entry_id, e.data) for e in handle.read(
        led.topic, Position(led.ledger_id, 0), Position(led.ledger_id, led.entry_count - 1)) if isinstance(e, Entry)]


# ----------------------------------------------------------------------------------------------- export/import
def test_export_local_and_s3_then_import_gives_identical_tables(deps, db, settings, new_database, tmp_path, s3fs):
    populate(deps, db)
    assert sync_table(deps, settings, "gamma", "ns.gamma") == [2, 3]  # ledgers 0-1 were truncated
    in_table = table_rows(settings, "ns.gamma")
    assert len(in_table) == 8
    before = snapshot(db)
    assert all(before[t] for t in table_names())  # every table has rows to carry

    local = tmp_path / "export"
    manifest = export_metadata(db, *filesystem_for(str(local)), batch_rows=2, rows_per_part=3)
    assert manifest.row_counts == {t: len(rows) for t, rows in before.items()}
    # every migration applied, in order (read from the directory: a new migration needs no edit here)
    migrations_dir = __import__("pathlib").Path(__file__).resolve().parents[2] / "sql" / "migrations"
    assert [m["name"] for m in manifest.migrations] == sorted(p.name for p in migrations_dir.glob("*.sql"))
    assert len(manifest.tables["ledger"].files) > 1  # parts roll over
    first_ledger_part = local / manifest.tables["ledger"].files[0].path
    assert first_ledger_part.name == f"part-{manifest.export_id}-00000.parquet"
    assert (local / "manifest.json").exists() and first_ledger_part.exists()
    fs, base = s3fs("exports/2026-11-21")
    export_metadata(db, fs, base)
    assert read_manifest(fs, base).row_counts == manifest.row_counts
    assert "exports/2026-11-21/manifest.json" in bucket_keys(deps)
    # after the exports the source's table moves on: a new ledger, synced (a new metadata file)
    writer = ManagedLedgerWriter(deps.meta, deps.tier1, "gamma")
    for i in range(3):
        writer.append(b"after the export %d" % i)
    writer.seal()
    writer.close()
    assert sync_table(deps, settings, "gamma", None) == [4]
    assert len(table_rows(settings, "ns.gamma")) == 11

    # the files carry exact types: tz-aware UTC timestamps, uuids and state as strings, jsonb as JSON text
    ledgers = pq.read_table(local / "ledger").to_pylist()
    assert pq.read_schema(first_ledger_part).equals(arrow_schema("ledger"), check_metadata=False)
    assert {r["state"] for r in ledgers} == {"OPEN", "SEALED", "OFFLOADING", "OFFLOADED", "DELETED"}
    assert all(r["created_at"].utcoffset() == dt.timedelta(0) for r in ledgers)
    assert {str(uuid.UUID(r["offload_uuid"])) for r in ledgers if r["offload_uuid"]}

    for source in (filesystem_for(str(local)), (fs, base)):
        target = new_database()
        report = import_metadata(target, *source)
        assert report.rows == manifest.row_counts
        assert snapshot(target) == before
        # sequences moved past the imported ids: new rows do not collide
        meta = MetadataStore(target)
        assert meta.create_topic("after-import").topic_id > max(r["topic_id"] for r in before["topic"])
        assert JobRuns(target).start("x") > max(r["run_id"] for r in before["job_run"])
        meta.enqueue_gc(["t/new"], "after import")
        # the imported metadata works: the offloaded bytes read back through it
        for led in meta.list_ledgers("alpha", [S.OFFLOADED]):
            assert read_ledger(meta, deps.tier1, deps.bucket, led) == \
                read_ledger(deps.meta, deps.tier1, deps.bucket, deps.meta.get_ledger("alpha", led.ledger_id))
        # and so does the topic's table, as it was at the export: the imported catalog names the metadata
        # file of then, and a sync through the imported metadata has nothing to add (every entry stays in it once)
        at_target = dataclasses.replace(settings, database_url=target.url.render_as_string(hide_password=False))
        assert table_rows(at_target, "ns.gamma") == in_table
        [r] = sync_tables(TableSync(target, at_target, catalog(at_target)), local_writer(deps, at_target), "gamma")
        assert (r.status, r.ledgers, r.reconciled) == ("up_to_date", [], False), r
        assert table_rows(at_target, "ns.gamma") == in_table


def test_gc_aborts_uploads_that_failed_exports_leave_at_the_default_location(deps):
    """A killed or refused export (pyarrow writes every Parquet part as a multipart upload) leaves uploads
    under `<prefix>-metadata/`, a killed table sync or maintenance under the tables' `<prefix>-tables/`; GC
    aborts them once older than the grace period, and nothing elsewhere; none under a prefix while an export
    or a table sync or maintenance runs (their uploads carry no attempt to tell whose they are)."""
    s3, name = deps.bucket.s3, deps.bucket.name
    ours = ["t-metadata/20260101T000000Z/ledger/part-00000.parquet", "t-tables/ns/orders/data/00000-0-x.parquet",
            "t-tables/ns/orders/metadata/00001-x.metadata.json"]
    foreign = ["t-metadata-other/x.parquet", "elsewhere/t-metadata/x.parquet", "t-tablesx/y.parquet"]
    for key in [*ours, *foreign]:
        s3.create_multipart_upload(Bucket=name, Key=key)
    assert run_gc(deps, orphan_grace=dt.timedelta(hours=1)).uploads_aborted == 0  # a running export is left
    # an export (of any location) or a table sync running: the uploads under its prefix may be its own
    from tiering.metadata import export_lock, table_sync
    with export_lock.writing(deps.meta.engine, "s3://b/t-metadata/now") as held:
        assert held and run_gc(deps, orphan_grace=dt.timedelta(0)).uploads_aborted == 2  # the tables' two
        with table_sync.exclusive(deps.meta.engine, 12345) as syncing:
            s3.create_multipart_upload(Bucket=name, Key=ours[1])
            assert syncing and run_gc(deps, orphan_grace=dt.timedelta(0)).uploads_aborted == 0
    assert run_gc(deps, orphan_grace=dt.timedelta(0)).uploads_aborted == 2  # theirs, once they ended
    assert sorted(u["Key"] for u in open_uploads(deps)) == sorted(foreign)


def test_import_refuses_a_non_empty_schema_and_changes_nothing(deps, db, new_database, tmp_path):
    populate(deps, db, defrag_too=False)
    export_metadata(db, *filesystem_for(str(tmp_path / "e")))
    for table_with_rows in ("job_run", "topic"):
        target = new_database()
        if table_with_rows == "job_run":
            JobRuns(target).start("already-here")
        else:
            MetadataStore(target).create_topic("already-here")
        before = snapshot(target)
        with pytest.raises(BadInput, match=f"tables {table_with_rows} hold rows") as err:
            import_metadata(target, *filesystem_for(str(tmp_path / "e")))
        assert "\n" not in str(err.value)
        assert snapshot(target) == before
    # the source itself is not empty either
    with pytest.raises(BadInput, match="hold rows"):
        import_metadata(db, *filesystem_for(str(tmp_path / "e")))


def test_import_refuses_a_catalog_with_tables_of_its_own_and_leaves_other_catalogs_alone(deps, db, new_database,
                                                                                         tmp_path):
    populate(deps, db, defrag_too=False)
    export_metadata(db, *filesystem_for(str(tmp_path / "e")))
    row = "INSERT INTO iceberg_tables (catalog_name, table_namespace, table_name, metadata_location) " \
          "VALUES (:c, 'ns', 'x', 's3://elsewhere/x.metadata.json')"
    target = new_database()
    with target.begin() as conn:
        conn.execute(text(row), {"c": "tiering"})
    before = snapshot(target)
    with pytest.raises(BadInput, match="tables iceberg_tables hold rows"):
        import_metadata(target, *filesystem_for(str(tmp_path / "e")))
    assert snapshot(target) == before
    # a catalog of another name shares the tables: its rows neither stop the import nor are exported or touched
    target = new_database()
    with target.begin() as conn:
        conn.execute(text(row), {"c": "theirs"})
    report = import_metadata(target, *filesystem_for(str(tmp_path / "e")))
    assert report.rows["topic"] > 0
    with target.connect() as conn:
        assert conn.execute(text("SELECT catalog_name, table_name FROM iceberg_tables")).all() == [("theirs", "x")]
    manifest = export_metadata(target, *filesystem_for(str(tmp_path / "again")))
    assert manifest.row_counts["iceberg_tables"] == 0


def test_import_writes_no_row_of_another_catalog_whatever_the_files_say(new_database):
    from tiering.metadata import import_rows
    from tiering.metadata.export_rows import migrations

    target = new_database()
    with target.connect() as conn:
        have = migrations(conn)

    def load(table, insert):  # files crafted to hold another catalog's row
        if table != "iceberg_tables":
            return 0
        insert([{"catalog_name": "theirs", "table_namespace": "ns", "table_name": "x", "metadata_location": None,
                 "previous_metadata_location": None, "iceberg_type": None}])
        return 1

    with pytest.raises(BadInput, match="holds a row of catalog 'theirs', not 'tiering'") as err:
        import_rows.restore(target, "crafted", have, {}, load)
    assert "\n" not in str(err.value)
    with target.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM iceberg_tables")).scalar_one() == 0


def test_import_refuses_incomplete_exports_and_other_migrations(deps, db, new_database, tmp_path, s3fs):
    populate(deps, db, defrag_too=False)
    target = new_database()
    empty = snapshot(target)
    fs, base = s3fs("exports/partial")
    export_metadata(db, fs, base)
    with pytest.raises(BadInput, match="already holds a complete export"):
        export_metadata(db, fs, base)
    fs.delete_file(f"{base}/manifest.json")  # an export cut short before its manifest
    with pytest.raises(BadInput, match="no manifest.json"):
        import_metadata(target, fs, base)

    fs, base = filesystem_for(str(tmp_path / "e"))
    chunk_part = export_metadata(db, fs, base).tables["chunk"].files[0].path
    fs.delete_file(f"{base}/{chunk_part}")
    with pytest.raises(BadInput, match=f"incomplete: {chunk_part} is missing"):
        import_metadata(target, fs, base)
    export_metadata(db, fs, base, overwrite=True)
    with target.begin() as conn:  # the target is at another schema version
        conn.execute(text("INSERT INTO tiering.schema_migrations (name, checksum) VALUES ('0002_future.sql', 'x')"))
    with pytest.raises(BadInput, match="migrations"):
        import_metadata(target, fs, base)
    assert snapshot(target) == empty
    with target.begin() as conn:
        conn.execute(text("DELETE FROM tiering.schema_migrations WHERE name = '0002_future.sql'"))
    # an export whose rows break a constraint: the whole import rolls back
    with db.begin() as conn:  # TRUNCATE fires no row triggers: OFFLOADED ledgers are left without chunks
        conn.execute(text("TRUNCATE tiering.chunk"))
    export_metadata(db, *filesystem_for(str(tmp_path / "broken")))
    with pytest.raises(BadInput, match="nothing was imported: .*has no chunk"):
        import_metadata(target, *filesystem_for(str(tmp_path / "broken")))
    assert snapshot(target) == empty
    # and the good export still imports
    import_metadata(target, fs, base)
    assert snapshot(target)["ledger"]


def test_import_refuses_parts_that_are_not_this_exports_before_locking_anything(deps, db, new_database, tmp_path):
    import json
    import os

    populate(deps, db, defrag_too=False)
    target = new_database()
    empty = snapshot(target)
    fs, first = filesystem_for(str(tmp_path / "a"))
    m = export_metadata(db, fs, first)
    _, second = filesystem_for(str(tmp_path / "b"))
    other = export_metadata(db, fs, second)
    topic_part, other_topic_part = m.tables["topic"].files[0].path, other.tables["topic"].files[0].path
    original = (tmp_path / "a" / topic_part).read_bytes()
    # another export's part at this one's path, rows and columns alike: only its footer tells
    (tmp_path / "a" / topic_part).write_bytes((tmp_path / "b" / other_topic_part).read_bytes())
    with pytest.raises(BadInput, match=f"{topic_part} belongs to export '{other.export_id}', not to this one"):
        import_metadata(target, fs, first)
    # another table's part of this export
    (tmp_path / "a" / topic_part).write_bytes((tmp_path / "a" / m.tables["ledger"].files[0].path).read_bytes())
    with pytest.raises(BadInput, match=f"{topic_part} holds table 'ledger', not topic"):
        import_metadata(target, fs, first)
    # cut short: not a Parquet file any more
    (tmp_path / "a" / topic_part).write_bytes(original[:len(original) // 2])
    with pytest.raises(BadInput, match=f"{topic_part} is not a readable Parquet file"):
        import_metadata(target, fs, first)
    # a fifo would block the open forever, with every table locked
    (tmp_path / "a" / topic_part).unlink()
    os.mkfifo(tmp_path / "a" / topic_part)
    with pytest.raises(BadInput, match=f"{topic_part} is not a regular file"):
        import_metadata(target, fs, first)
    assert snapshot(target) == empty
    # a manifest whose time is not a time (escapes, a second line) is not this format's
    (tmp_path / "a" / topic_part).unlink()
    (tmp_path / "a" / topic_part).write_bytes(original)
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    (tmp_path / "a" / "manifest.json").write_text(json.dumps({**manifest, "exported_at": "\x1b[2Jnow\nthen"}))
    with pytest.raises(BadInput, match="exported_at must be an ISO 8601 time with its zone"):
        import_metadata(target, fs, first)
    (tmp_path / "a" / "manifest.json").write_text(json.dumps(manifest))
    import_metadata(target, fs, first)
    assert snapshot(target)["ledger"]


def test_import_refuses_a_part_changed_since_its_export_though_it_is_parquet_with_its_rows(
        deps, db, new_database, tmp_path, s3fs):
    """A part edited (or a bit flipped in a value) since the export, still Parquet with its row count, of this
    table and this export: imported as the store's metadata (a ledger of 1,050 entries where it had 50)."""
    import json

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    populate(deps, db, defrag_too=False)
    target = new_database()
    empty = snapshot(target)
    for fs, base in (filesystem_for(str(tmp_path / "a")), s3fs("edited")):
        m = export_metadata(db, fs, base)
        for table in m.tables.values():  # each part's digest is that of the bytes the export left
            for part in table.files:
                with fs.open_input_stream(f"{base}/{part.path}") as f:
                    assert hashlib.sha256(f.read()).hexdigest() == part.sha256
        rel = m.tables["ledger"].files[0].path
        with fs.open_input_file(f"{base}/{rel}") as f:
            data = pq.read_table(f)
        edited = data.set_column(data.schema.get_field_index("entry_count"), "entry_count",
                                 pc.add(data["entry_count"], 1000))
        with fs.open_output_stream(f"{base}/{rel}") as out:  # the footer's metadata (table, export id) kept
            pq.write_table(edited.replace_schema_metadata(data.schema.metadata), out, compression="zstd")
        with pytest.raises(BadInput, match=f"{rel} is not the file its export wrote"):
            import_metadata(target, fs, base)
        assert snapshot(target) == empty
    # an export written before parts had digests is still imported (its parts are checked as before)
    fs, base = filesystem_for(str(tmp_path / "old"))
    m = export_metadata(db, fs, base)
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    for table in manifest["tables"].values():
        for part in table["files"]:
            del part["sha256"]
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    import_metadata(target, fs, base)
    assert snapshot(target) == snapshot(db)


def test_import_loads_the_bytes_it_checked_when_a_part_is_replaced_after_the_check(
        deps, db, new_database, tmp_path, monkeypatch):
    """A part replaced between the checks (before any lock) and the load: the import parses the copy it read
    and checked then, never the file read a second time; the replaced part fails its digest, nothing written."""
    import os

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tiering.ops import import_metadata as importer

    populate(deps, db, defrag_too=False)
    target = new_database()
    empty = snapshot(target)
    fs, base = filesystem_for(str(tmp_path / "a"))
    m = export_metadata(db, fs, base)
    rel = m.tables["ledger"].files[0].path
    original = (tmp_path / "a" / rel).read_bytes()
    data = pq.read_table(tmp_path / "a" / rel)
    edited = data.set_column(data.schema.get_field_index("entry_count"), "entry_count",
                             pc.add(data["entry_count"], 1000)).replace_schema_metadata(data.schema.metadata)
    restore = importer.import_rows.restore

    def replaced_then_restore(*args, **kwargs):  # the checks passed: the part changes before the load
        pq.write_table(edited, tmp_path / "a" / rel, compression="zstd")
        return restore(*args, **kwargs)

    monkeypatch.setattr(importer.import_rows, "restore", replaced_then_restore)
    with pytest.raises(BadInput, match=f"{rel} is not the file its export wrote"):
        import_metadata(target, fs, base)
    assert snapshot(target) == empty
    # replaced by a fifo (its open would block the import, holding every lock), or deleted: said, not hung
    part = tmp_path / "a" / rel
    for change, said in ((lambda: (part.unlink(), os.mkfifo(part)), "is not a regular file"),
                         (lambda: part.unlink(), "is missing")):
        def changed_then_restore(*args, change=change, **kwargs):
            change()
            return restore(*args, **kwargs)

        part.unlink()
        part.write_bytes(original)  # the export's bytes back, for the checks to pass
        monkeypatch.setattr(importer.import_rows, "restore", changed_then_restore)
        with pytest.raises(BadInput, match=f"{rel} {said}"):
            import_metadata(target, fs, base)
        assert snapshot(target) == empty


def test_rows_from_jdbc_or_spark_give_the_same_files(deps, db, tmp_path):
    """What the Spark job does: rows as JDBC hands them (strings for uuid/enum/jsonb, naive local timestamps)
    -> rows_to_table -> the same Arrow table export_metadata wrote."""
    populate(deps, db, defrag_too=False)
    export_metadata(db, *filesystem_for(str(tmp_path / "e")))
    tz = dt.timezone(dt.timedelta(hours=-5))
    for table in table_names():
        with db.connect() as conn:
            rows = [dict(r._mapping) for r in conn.execute(text(jdbc_query(table) + f" ORDER BY {PKS[table]}"))]
        for r in rows:  # PySpark gives TimestampType as naive datetimes in the executor's zone
            for k, v in r.items():
                if isinstance(v, dt.datetime):
                    r[k] = v.astimezone(tz).replace(tzinfo=None)
        built = rows_to_table(table, rows, naive_tz=tz)
        written = pq.read_table(tmp_path / "e" / table, schema=arrow_schema(table))
        assert built.equals(written), table
    with pytest.raises(BadInput, match="NOT NULL"):
        rows_to_table("topic", [{"topic_id": 1}])


# ----------------------------------------------------------------------------------------------- recovery
def test_recover_from_bucket_rebuilds_every_offloaded_ledger(deps, db, new_database, tmp_path):
    populate(deps, db)
    target = new_database()
    report = recover_from_bucket(target, deps.bucket)
    assert report.ok, report.errors
    offloaded = {(t.name, led.ledger_id) for t in deps.meta.list_topics()
                 for led in deps.meta.list_ledgers(t.name, [S.OFFLOADED])}
    assert sorted(report.ledgers_recovered) == sorted(offloaded)
    assert sorted(report.topics_created) == sorted(["alpha", SLASHED, "gamma", "delta"])
    # retention removed gamma 0..1 and GC their objects; delta 1..3 were never offloaded and lie above
    assert report.unknown == {"gamma": [(0, 1)]}

    meta2, tier1_empty = MetadataStore(target), Tier1Store(tmp_path / "no-tier1")
    (tmp_path / "no-tier1").mkdir()
    for topic, ledger_id in offloaded:
        orig, rec = deps.meta.get_ledger(topic, ledger_id), meta2.get_ledger(topic, ledger_id)
        assert (rec.state, rec.tier1_present, rec.entry_count, rec.size_bytes) == \
            (S.OFFLOADED, False, orig.entry_count, orig.size_bytes)
        assert abs(rec.sealed_at - orig.sealed_at) < dt.timedelta(milliseconds=1)
        assert str(rec.offload_uuid) == str(orig.offload_uuid)
        # no ETags: recovery records them only after checking the pages (`--check-pages`)
        assert meta2.get_chunk(rec) == dataclasses.replace(deps.meta.get_chunk(orig), version=0, data_etag=None,
                                                           index_etag=None)
        got = read_ledger(meta2, tier1_empty, deps.bucket, rec)
        assert got and got == read_ledger(deps.meta, deps.tier1, deps.bucket, orig)
    # next ledger ids are past the largest recovered id: a new ledger does not collide
    assert meta2.get_topic("alpha").next_ledger_id == 4
    assert meta2.open_ledger("gamma").ledger_id == 4
    # alpha's four ledgers come out of one merged object pair, at the offsets defrag chose
    assert len({meta2.get_chunk(led).data_key for led in meta2.list_ledgers("alpha")}) == 1

    before = snapshot(target)
    again = recover_from_bucket(target, deps.bucket)
    assert again.ledgers_recovered == [] and again.topics_created == []
    assert sorted(again.already_known) == sorted(offloaded)
    assert snapshot(target) == before
    # one topic at a time, into a database of its own
    only = new_database()
    one = recover_from_bucket(only, deps.bucket, topic=SLASHED)
    assert one.topics_created == [SLASHED] and len(one.ledgers_recovered) == 3
    assert [t.name for t in MetadataStore(only).list_topics()] == [SLASHED]


def test_recover_prefers_the_complete_copy_over_dead_attempts(deps, db, new_database):
    expected = produce(deps, "z", [entries("z0", 20, 800), entries("z1", 5, 50)], policy=TopicPolicy(**BIG))
    offload_all(deps, "z")
    led0 = deps.meta.get_ledger("z", 0)
    real = deps.meta.get_chunk(led0)
    s3, name = deps.bucket.s3, deps.bucket.name
    real_data = s3.get_object(Bucket=name, Key=real.data_key)["Body"].read()
    real_index = s3.get_object(Bucket=name, Key=real.index_key)["Body"].read()
    time.sleep(1.1)  # the leftovers are newer than the committed copy

    def index_for(attempt):
        ix = decode_index(real_index)
        meta = dataclasses.replace(ix.metadata, offload_uuid=attempt)
        return encode_index(ix.entries, ix.data_object_len, encode_metadata(meta))

    def keys(attempt):
        return data_key("t/", "z", attempt, 0), index_key("t/", "z", attempt, 0)

    short, unfinished, corrupt, data_only = (str(uuid.uuid4()) for _ in range(4))
    # an attempt whose data object is short (written by something else, or cut)
    s3.put_object(Bucket=name, Key=keys(short)[0], Body=real_data[:-100])
    s3.put_object(Bucket=name, Key=keys(short)[1], Body=index_for(short))
    # an attempt that died with its multipart upload open (the data object does not exist), index written
    s3.create_multipart_upload(Bucket=name, Key=keys(unfinished)[0])
    s3.put_object(Bucket=name, Key=keys(unfinished)[1], Body=index_for(unfinished))
    # a corrupt index next to a full data object; a data object whose index was never written
    s3.put_object(Bucket=name, Key=keys(corrupt)[0], Body=real_data)
    s3.put_object(Bucket=name, Key=keys(corrupt)[1], Body=b"\xde\x47\xde\x47" + b"\x00" * 60)
    s3.put_object(Bucket=name, Key=keys(data_only)[0], Body=real_data)
    # a stray object under the prefix that is not a ledger object
    s3.put_object(Bucket=name, Key="t/z/README", Body=b"not ours")

    target = new_database()
    report = recover_from_bucket(target, deps.bucket)
    assert report.ok and sorted(report.ledgers_recovered) == [("z", 0), ("z", 1)]
    ignored = dict(report.ignored)
    assert set(ignored) == {keys(short)[1], keys(unfinished)[1], keys(corrupt)[1], keys(data_only)[0]}
    assert "bytes, the index says" in ignored[keys(short)[1]]
    assert "no data object" in ignored[keys(unfinished)[1]]
    assert "invalid" in ignored[keys(corrupt)[1]]
    assert report.foreign_objects == 1
    meta2 = MetadataStore(target)
    assert meta2.get_chunk(meta2.get_ledger("z", 0)) == dataclasses.replace(real, data_etag=None, index_etag=None)
    got = {(lid, eid): data for lid, eid, data in read_ledger(meta2, deps.tier1, deps.bucket,
                                                              meta2.get_ledger("z", 0))}
    assert got == {k: v for k, v in expected.items() if k[0] == 0}

    # a complete, valid copy newer than the committed one wins (the bytes are the same)
    newer = str(uuid.uuid4())
    s3.put_object(Bucket=name, Key=keys(newer)[0], Body=real_data)
    s3.put_object(Bucket=name, Key=keys(newer)[1], Body=index_for(newer))
    target2 = new_database()
    report2 = recover_from_bucket(target2, deps.bucket, topic="z")
    assert dict(report2.ignored)[real.index_key].startswith("superseded")
    meta3 = MetadataStore(target2)
    rec = meta3.get_ledger("z", 0)
    assert meta3.get_chunk(rec).data_key == keys(newer)[0] and str(rec.offload_uuid) == newer
    assert read_ledger(meta3, deps.tier1, deps.bucket, rec) == read_ledger(meta2, deps.tier1, deps.bucket,
                                                                           meta2.get_ledger("z", 0))


def test_the_migration_keeps_a_catalog_made_before_it_wherever_the_search_path_finds_it(new_database):
    """pyiceberg made the catalog's tables at a table's first sync before migration 0014 existed: an older
    layout (no `iceberg_type`), in `public`, behind a schema first in the search_path. The migration keeps its
    rows, adds the column and makes no second table in front of it."""
    target = new_database(migrate=False)
    with target.begin() as conn:
        conn.execute(text("CREATE SCHEMA extra"))
        conn.execute(text(f'ALTER DATABASE "{target.url.database}" SET search_path = extra, public'))
        conn.execute(text("CREATE TABLE public.iceberg_tables (catalog_name varchar(255) NOT NULL, "
                          "table_namespace varchar(255) NOT NULL, table_name varchar(255) NOT NULL, "
                          "metadata_location varchar(1000), previous_metadata_location varchar(1000), "
                          "PRIMARY KEY (catalog_name, table_namespace, table_name))"))
        conn.execute(text("INSERT INTO public.iceberg_tables VALUES ('tiering', 'ns', 't', 's3://b/m.json', NULL)"))
    target.dispose()  # new sessions take the database's search_path
    upgrade(target)
    with target.connect() as conn:
        assert conn.execute(text("SELECT * FROM iceberg_tables")).all() == [("tiering", "ns", "t", "s3://b/m.json",
                                                                           None, None)]
        where = dict(conn.execute(text(
            "SELECT c.relname, n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname IN ('iceberg_tables', 'iceberg_namespace_properties') AND c.relkind = 'r'")).all())
    assert where == {"iceberg_tables": "public", "iceberg_namespace_properties": "extra"}
