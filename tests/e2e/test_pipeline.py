"""The whole pipeline on real PostgreSQL and loopback S3, in process (the DAG tests cover the same
operations through Airflow and Spark): produce -> offload by age and by size -> delete-lagged -> read
across tiers byte-exact -> defrag -> retention -> gc -> export -> import into an empty database ->
recover-from-bucket into another -> the same reads."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.integration.helpers import bucket_keys, entries, make_deps, open_uploads, produce
from tiering.metadata import make_engine, upgrade
from tiering.metadata.repository import MetadataStore
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.defrag import defrag
from tiering.ops.delete_lagged import delete_lagged
from tiering.ops.export_metadata import export_metadata, filesystem_for
from tiering.ops.import_metadata import import_metadata
from tiering.ops.gc import run_gc
from tiering.ops.offload import offload_many, plan_offload
from tiering.ops.recover import recover_from_bucket
from tiering.ops.retention import retention
from tiering.read import Entry, Gap, ReadHandle
from tiering.tier2.reader import tier2_opener

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)


@pytest.fixture
def scratch_databases(database_url):
    server = make_url(database_url)
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    made = []

    def new(suffix):
        name = f"{server.database}_{suffix}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        made.append(name)
        engine = make_engine(server.set(database=name).render_as_string(hide_password=False))
        upgrade(engine)
        return engine

    yield new
    with admin.connect() as conn:
        for name in made:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def snapshot(meta, deps, topics):
    handle = ReadHandle(meta, deps.tier1, tier2_opener(deps.bucket))
    return {t: [(e.ledger_id, e.entry_id, e.data) if isinstance(e, Entry) else (e.kind, str(e.start), str(e.end))
                for e in handle.read(t)] for t in topics}


def test_whole_pipeline_round_trip(db, s3_client, bucket, tier1_root, tmp_path, scratch_databases):
    deps = make_deps(db, s3_client, bucket, tier1_root)
    # Given: an age-offloaded topic of many small ledgers, a size-offloaded one, and one with retention
    age = produce(deps, "orders", [entries(f"o{i}", 30, 700) for i in range(6)],
                  TopicPolicy(offload_after_seconds=0, deletion_lag_seconds=0, **BIG), open_tail=[b"open"])
    size = produce(deps, "clicks", [entries(f"c{i}", 8, 4000) for i in range(5)],
                   TopicPolicy(offload_threshold_bytes=70_000, deletion_lag_seconds=0, **BIG))
    produce(deps, "audit", [entries(f"a{i}", 10, 1000) for i in range(4)],
            TopicPolicy(offload_after_seconds=0, retention_bytes=20_000, **BIG), open_tail=[b"tail"])

    # When: the pipeline runs in order
    by_age = offload_many(deps, plan_offload(deps, "age"))
    by_size = offload_many(deps, plan_offload(deps, "size"))
    assert len(by_age.offloaded) == 6 + 4 and by_age.first_error is None
    # 32,000 bytes each, summed newest to oldest: 32k, 64k, 96k > 70k -> ledgers 2, 1, 0
    assert by_size.offloaded == [0, 1, 2]
    assert len(delete_lagged(deps).deleted) == 6 + 3  # orders and clicks have no lag; audit keeps 4 h
    reads = snapshot(deps.meta, deps, ["orders", "clicks"])
    assert {(l, e): d for l, e, d in reads["orders"]} == age
    assert {(l, e): d for l, e, d in reads["clicks"]} == size
    assert [led.tier1_present for led in deps.meta.list_ledgers("clicks")] == [False, False, False, True, True]

    merged = defrag(deps, small_bytes=1 << 20, max_merged_bytes=64 << 20)
    assert merged.groups == 3 and merged.ledgers == 6 + 3 + 4
    trimmed = retention(deps)
    assert sorted(trimmed.deleted) == [("audit", 0), ("audit", 1)]
    deps_now = make_deps(db, s3_client, bucket, tier1_root, gc_delay=timedelta(0))
    run_gc(deps_now, orphan_grace=timedelta(hours=1))
    with db.connect() as conn:
        refs = {k for r in conn.execute(text("SELECT data_key, index_key FROM tiering.chunk")) for k in r}
    # retention queued the merged audit object, but audit ledgers 2..3 still reference it: GC keeps it
    assert bucket_keys(deps) == refs and open_uploads(deps) == []
    assert bucket_keys(deps, markers=True) - refs == {"t/audit/_trimmed"}
    topics = ["orders", "clicks", "audit"]
    before = snapshot(deps.meta, deps, topics)
    assert before["audit"][0] == ("TRIMMED", "0:0", "1:9")

    # Then: export -> import into an empty database reads the same
    fs, base = filesystem_for(str(tmp_path / "export"))
    export_metadata(db, fs, base)
    imported = scratch_databases("imported")
    import_metadata(imported, fs, base)
    assert snapshot(MetadataStore(imported), deps, topics) == before

    # And: with the database lost, the bucket alone rebuilds every offloaded ledger
    recovered = scratch_databases("recovered")
    report = recover_from_bucket(recovered, deps.bucket)
    assert report.ok and not report.errors
    meta2 = MetadataStore(recovered)
    for topic in topics:
        offloaded = [led.ledger_id for led in deps.meta.list_ledgers(topic, [S.OFFLOADED])]
        assert [led.ledger_id for led in meta2.list_ledgers(topic, [S.OFFLOADED])] == offloaded
        handle = ReadHandle(meta2, deps.tier1, tier2_opener(deps.bucket))
        got = [(e.ledger_id, e.entry_id, e.data) for e in handle.read(topic) if isinstance(e, Entry)]
        want = [x for x in before[topic] if len(x) == 3 and isinstance(x[2], bytes) and x[0] in offloaded]
        assert got == want
    assert not any(isinstance(e, Gap) and e.kind == "DATALOSS"
                   for e in ReadHandle(meta2, deps.tier1, tier2_opener(deps.bucket)).read("orders"))
