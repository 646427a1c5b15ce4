"""Topics as Iceberg tables on the project's RGW and PostgreSQL: the table read back with pyiceberg equals
`tiering read` for tier-1-only, tier-2-only and mixed topics; a run stopped between its Iceberg commit and its
row update, then rerun, gives every entry once; two syncs of one round commit once; retention follows."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tiering.metadata.table_sync import TableRows
from tiering.ops.delete_lagged import delete_copy
from tiering.ops.offload import offload_ledger
from tiering.read import ReadHandle
from tiering.tables.catalog import catalog
from tiering.tables.files import local_writer
from tiering.tables.sync import Limits, TableSync, sync_tables
from tiering.tier2.reader import tier2_opener
from tiering.writer import ManagedLedgerWriter


@pytest.fixture
def cat(settings, db):
    c = catalog(settings)
    with db.begin() as conn:  # the bucket is emptied per test: forget the previous tests' tables
        conn.execute(text("DELETE FROM iceberg_tables"))
    return c


def _read(deps, topic):
    h = ReadHandle(deps.meta, deps.tier1, open_tier2=tier2_opener(deps.bucket))
    return {(e.ledger_id, e.entry_id): e.data for e in h.read(topic) if hasattr(e, "data")}


def _table_rows(cat, identifier):
    t = cat.load_table(identifier).scan().to_arrow()
    keys = list(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist()))
    assert len(keys) == len(set(keys)), "a row appears twice"
    return dict(zip(keys, t["payload"].to_pylist())), t


def _sync(deps, settings, cat, topic=None, **kw):
    s = TableSync(deps.meta.engine, settings, cat, **kw)
    return sync_tables(s, local_writer(deps, settings), topic)


def test_mixed_topic_equals_read(deps, settings, cat):
    produce(deps, "mixed", [entries("a", 5, 100), entries("b", 3, 50), [], entries("c", 4, 10)],
            open_tail=entries("d", 2, 10))
    for led in deps.meta.list_ledgers("mixed")[:2]:
        delete_copy(deps, offload_ledger(deps, led))  # ledgers 0-1 in tier 2 only
    TableRows(deps.meta.engine).set_policy("mixed", "ns.mixed", "follow")
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced", r.error
    assert r.ledgers == [0, 1, 3] and r.passed == [2]  # the empty ledger passed over, the open one not taken
    got, t = _table_rows(cat, "ns.mixed")
    expected = {k: v for k, v in _read(deps, "mixed").items() if k[0] != 4}
    assert got == expected
    assert set(t["topic"].to_pylist()) == {"mixed"}
    state = TableRows(deps.meta.engine).get("mixed")
    assert (state.synced_through, state.ledgers_committed, state.entries_committed) == (3, 3, 12)
    assert state.metadata_location == cat.load_table("ns.mixed").metadata_location
    [again] = _sync(deps, settings, cat)
    assert again.status == "up_to_date" and again.ledgers == []
    assert _table_rows(cat, "ns.mixed")[0] == expected



class Stop(BaseException):
    """A run stopped at a step (as kill -9 there would: nothing after it happens)."""


def _stop_at(step):
    def fault(at):
        if at == step:
            raise Stop(at)
    return fault


def test_stopped_after_commit_then_rerun_gives_each_entry_once(deps, settings, cat):
    expected = produce(deps, "kill", [entries("a", 4, 30), entries("b", 2, 30)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy("kill", "ns.kill", "keep")
    s = TableSync(deps.meta.engine, settings, cat, fault=_stop_at("committed"))
    with pytest.raises(Stop):
        s.sync_topic(rows.get("kill"), local_writer(deps, settings))
    assert rows.get("kill").synced_through == -1  # the table has the round, the row does not
    assert _table_rows(cat, "ns.kill")[0] == expected
    # a preview before the rerun plans from the table's mark, not the row's: only what the table lacks
    writer = ManagedLedgerWriter(deps.meta, deps.tier1, "kill")
    more = {(writer.append(data).ledger_id, i): data for i, data in enumerate(entries("c", 2, 30))}
    writer.seal()
    writer.close()
    [preview] = sync_tables(TableSync(deps.meta.engine, settings, cat), local_writer(deps, settings), None, True)
    assert preview.status == "planned" and preview.planned == [2], preview
    assert rows.get("kill").synced_through == -1  # the preview wrote nothing
    [r] = _sync(deps, settings, cat)  # the rerun finds the table ahead: catches the row up, appends the rest
    assert r.reconciled and r.ledgers == [2]
    expected = {**expected, **more}
    assert _table_rows(cat, "ns.kill")[0] == expected
    state = rows.get("kill")
    assert (state.synced_through, state.ledgers_committed, state.entries_committed) == (2, 3, 8)


def test_stopped_before_commit_then_rerun_commits_once(deps, settings, cat):
    expected = produce(deps, "kill2", [entries("a", 3, 30)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy("kill2", "ns.kill2", "keep")
    s = TableSync(deps.meta.engine, settings, cat, fault=_stop_at("written"))
    with pytest.raises(Stop):
        s.sync_topic(rows.get("kill2"), local_writer(deps, settings))
    assert cat.load_table("ns.kill2").current_snapshot() is None  # files written, nothing committed
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.ledgers == [0]
    assert _table_rows(cat, "ns.kill2")[0] == expected


def test_two_rounds_from_one_mark_commit_once(deps, settings, cat):
    """Two syncs planned from the same mark (as two runs without the lock would): one commits, the other's
    commit is refused by the table's own check and its files are discarded; no row twice."""
    expected = produce(deps, "race", [entries("a", 3, 30), entries("b", 3, 30)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy("race", "ns.race", "keep")
    from tiering.tables.catalog import ensure_table
    from tiering.tables.sync import TopicResult

    a, b = (TableSync(deps.meta.engine, settings, catalog(settings)) for _ in range(2))
    state = rows.get("race")
    table_a = ensure_table(a.catalog, settings, "ns.race", "race")
    table_b = b.catalog.load_table("ns.race")
    round_a, round_b = a.plan_round(state, table_a), b.plan_round(state, table_b)
    write = local_writer(deps, settings)
    a.run_round(state, table_a, round_a, write, TopicResult("race", "ns.race"))
    with pytest.raises(Exception, match="another sync committed"):
        b.run_round(state, table_b, round_b, write, TopicResult("race", "ns.race"))
    assert _table_rows(cat, "ns.race")[0] == expected
    table = cat.load_table("ns.race")
    referenced = {f.file.file_path for f in table.scan().plan_files()}
    assert not any(p["path"] in referenced for p in round_b.items)
    from tiering.tables.files import s3_filesystem_for
    import pyarrow.fs as pafs

    fs, _ = s3_filesystem_for(settings)(round_b.items[0]["path"])
    assert all(fs.get_file_info(i["path"].split("://", 1)[1]).type == pafs.FileType.NotFound for i in round_b.items)


def test_concurrent_sync_of_a_topic_is_skipped(deps, settings, cat):
    produce(deps, "lock", [entries("a", 2, 10)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy("lock", "ns.lock", "keep")
    from tiering.metadata.table_sync import exclusive

    with exclusive(deps.meta.engine, rows.get("lock").topic_id) as held:
        assert held
        [r] = _sync(deps, settings, cat)
    assert r.status == "skipped" and "another sync" in r.error
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.ledgers == [0]


def test_retention_follows_unless_keep(deps, settings, cat):
    from tiering.model import Position
    from tiering.ops.retention import truncate

    for name, mode in (("fol", "follow"), ("kep", "keep")):
        produce(deps, name, [entries("a", 2, 10), entries("b", 2, 10), entries("c", 2, 10)])
        TableRows(deps.meta.engine).set_policy(name, f"ns.{name}", mode)
    _sync(deps, settings, cat)
    for name in ("fol", "kep"):
        truncate(deps, name, Position(2, 0))  # ledgers 0 and 1 deleted
    results = {r.topic: r for r in _sync(deps, settings, cat)}
    assert results["fol"].deleted == [0, 1] and results["kep"].deleted == []
    assert {k[0] for k in _table_rows(cat, "ns.fol")[0]} == {2}
    assert {k[0] for k in _table_rows(cat, "ns.kep")[0]} == {0, 1, 2}
    assert TableRows(deps.meta.engine).get("fol").trimmed_through == 1
    # verify: rows of deleted ledgers are fine where the table keeps them, a difference where its own
    # trimmed mark says they were deleted (here the mark moved by hand, the rows left)
    from tiering.tables.naming import PROP_TRIMMED
    from tiering.tables.verify import verify_table

    h = ReadHandle(deps.meta, deps.tier1)
    assert verify_table(h, deps.meta, cat.load_table("ns.fol"), "fol").differences == []
    assert verify_table(h, deps.meta, cat.load_table("ns.kep"), "kep").differences == []
    with cat.load_table("ns.kep").transaction() as tx:
        tx.set_properties({PROP_TRIMMED: "1"})
    diffs = verify_table(h, deps.meta, cat.load_table("ns.kep"), "kep").differences
    assert [d["ledger"] for d in diffs] == [0, 1] and "yet rows are in the table" in diffs[0]["reason"]


def test_compaction_and_expiry_keep_the_rows_and_the_sync_goes_on(deps, settings, cat):
    import time

    import pyarrow.fs as pafs

    from tiering.tables.files import s3_filesystem_for
    from tiering.tables.maintenance import maintain_topic
    from tiering.tables.verify import verify_table

    expected = produce(deps, "small", [entries(str(i), 3, 20) for i in range(6)], open_tail=entries("t", 2, 5))
    rows = TableRows(deps.meta.engine)
    rows.set_policy("small", "ns.small", "follow")
    s = TableSync(deps.meta.engine, settings, cat, limits=Limits(round_ledgers=1))  # a file per ledger
    [r] = sync_tables(s, local_writer(deps, settings))
    assert r.rounds == 6
    table = cat.load_table("ns.small")
    assert len(list(table.scan().plan_files())) == 6 and len(table.snapshots()) == 6
    from datetime import timedelta

    fs = s3_filesystem_for(settings)
    stray = f"{table.location()}/data/sealed_at_day=2026-01-01/killed-run.parquet"  # a killed run's file
    f, path = fs(stray)
    with f.open_output_stream(path) as out:
        out.write(b"x")
    time.sleep(1.1)
    report = maintain_topic(s, rows.get("small"), timedelta(0), min_files=4, orphan_grace=timedelta(seconds=1))
    assert report.errors == [] and (report.files_before, report.files_after) == (6, 1)
    # the stray file, the 6 compacted-away data files, the expired snapshots' manifest lists and manifests
    assert report.orphans_deleted > 7 and f.get_file_info(path).type == pafs.FileType.NotFound
    table = cat.load_table("ns.small")
    assert len(list(table.scan().plan_files())) == 1 and len(table.snapshots()) == 1
    sealed = {k: v for k, v in expected.items() if k[0] < 6}
    assert _table_rows(cat, "ns.small")[0] == sealed
    assert rows.get("small").metadata_location == table.metadata_location  # the row caught up
    h = ReadHandle(deps.meta, deps.tier1, open_tier2=tier2_opener(deps.bucket))
    assert verify_table(h, deps.meta, table, "small").differences == []
    from tiering.writer import ManagedLedgerWriter

    w = ManagedLedgerWriter(deps.meta, deps.tier1, "small")
    w.seal()
    w.close()
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.ledgers == [6]
    assert _table_rows(cat, "ns.small")[0] == expected


def _json_ledgers(start, n, bad_every=0):
    import json as _json

    out = []
    for i in range(start, start + n):
        if bad_every and i % bad_every == 0:
            out.append(b"not json" if i % 2 else _json.dumps({"id": "seven", "name": "x"}).encode())
        else:
            out.append(_json.dumps({"id": i, "name": f"n{i}", "amount": i * 1.5}).encode())
    return out


def test_json_decoder_dead_letters_and_an_added_field(deps, settings, cat):
    from tiering.tables.decoder import check_change, parse_fields

    expected = produce(deps, "js", [_json_ledgers(0, 6, bad_every=3), _json_ledgers(6, 4)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy("js", "ns.js", "follow", parse_fields("id:int64,name:string"), check_change)
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.dead_letters == 2, r.error
    got, t = _table_rows(cat, "ns.js")
    assert got == expected  # every entry is in the table, decoded or not
    by_key = dict(zip(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist()), t["id"].to_pylist()))
    assert by_key[(0, 1)] == 1 and by_key[(0, 0)] is None and by_key[(0, 3)] is None and by_key[(1, 0)] == 6
    dlq = cat.load_table("ns.js__dlq").scan().to_arrow()
    reasons = dict(zip(zip(dlq["ledger_id"].to_pylist(), dlq["entry_id"].to_pylist()), dlq["reason"].to_pylist()))
    assert set(reasons) == {(0, 0), (0, 3)}
    assert "field 'id'" in reasons[(0, 0)] and "not JSON" in reasons[(0, 3)]
    old_snapshot = cat.load_table("ns.js").current_snapshot().snapshot_id

    with pytest.raises(Exception, match="can only add fields"):
        rows.set_policy("js", None, None, parse_fields("id:string,name:string"), check_change)
    rows.set_policy("js", None, None, parse_fields("id:int64,name:string,amount:double"), check_change)
    from tiering.writer import ManagedLedgerWriter

    w = ManagedLedgerWriter(deps.meta, deps.tier1, "js")
    for data in _json_ledgers(10, 2):
        w.append(data)
    w.seal()
    w.close()
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.ledgers == [2], r.error
    table = cat.load_table("ns.js")
    t = table.scan().to_arrow()
    amounts = dict(zip(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist()), t["amount"].to_pylist()))
    assert amounts[(2, 0)] == 15.0 and amounts[(1, 0)] is None  # old files read the new column as null
    old = table.scan(snapshot_id=old_snapshot).to_arrow()  # the old snapshot still reads, in its schema
    assert old.num_rows == 10 and "amount" not in old.column_names
    assert cat.load_table("ns.js__dlq").scan().to_arrow().num_rows == 2
    from tiering.model import Position
    from tiering.ops.retention import truncate

    truncate(deps, "js", Position(1, 0))  # ledger 0, with both dead letters, deleted: 'follow' in both tables
    [r] = _sync(deps, settings, cat)
    assert r.deleted == [0], r.error
    assert cat.load_table("ns.js__dlq").scan().to_arrow().num_rows == 0
    assert {k[0] for k in _table_rows(cat, "ns.js")[0]} == {1, 2}


def test_stopped_before_the_dead_letters_commit_then_rerun_adds_each_once(deps, settings, cat):
    from tiering.tables.decoder import check_change, parse_fields

    produce(deps, "jd", [_json_ledgers(0, 6, bad_every=3)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy("jd", "ns.jd", "follow", parse_fields("id:int64"), check_change)
    s = TableSync(deps.meta.engine, settings, cat, fault=_stop_at("before-dlq"))
    with pytest.raises(Stop):
        s.sync_topic(rows.get("jd"), local_writer(deps, settings))
    assert cat.load_table("ns.jd__dlq").scan().to_arrow().num_rows == 0
    for _ in range(2):
        [r] = _sync(deps, settings, cat)
        assert r.status == "up_to_date", r.error
    dlq = cat.load_table("ns.jd__dlq").scan().to_arrow()
    assert sorted(dlq["entry_id"].to_pylist()) == [0, 3]


def test_due_topics_in_one_statement(deps, settings, cat):
    from sqlalchemy import event

    from tiering.model import Position
    from tiering.ops.retention import truncate
    from tiering.tables.sync import due_topics

    produce(deps, "open", [], open_tail=entries("o", 2, 10))  # only an open ledger: not due
    produce(deps, "new", [entries("n", 2, 10)])
    produce(deps, "done", [entries("d", 2, 10), entries("e", 2, 10)])
    produce(deps, "none", [entries("x", 1, 10)])  # no table
    rows = TableRows(deps.meta.engine)
    for t in ("open", "new", "done"):
        rows.set_policy(t, f"ns.{t}", "follow")
    _sync(deps, settings, cat, topic="done")
    assert [s.topic for s in due_topics(deps.meta.engine)] == ["new"]
    truncate(deps, "done", Position(1, 0))  # a deleted ledger for 'follow' to delete
    statements = []

    def count(*_a, **_k):
        statements.append(1)

    event.listen(deps.meta.engine, "before_cursor_execute", count)
    try:
        assert [s.topic for s in due_topics(deps.meta.engine)] == ["done", "new"]
    finally:
        event.remove(deps.meta.engine, "before_cursor_execute", count)
    assert len(statements) == 1
    with pytest.raises(Exception, match="has no table"):
        due_topics(deps.meta.engine, "none")


def test_trimmed_head_and_batched_objects_equal_read(db, s3_client, bucket, tier1_root, settings, cat):
    """Ledgers offloaded together into one object pair (the product's default batching), the head trimmed
    before the first sync (passed over: never readable), the rest in tier 2 only and tier 1."""
    from tests.integration.helpers import MIB, make_deps
    from tiering.model import LedgerState as S, Position
    from tiering.ops.offload import offload_many
    from tiering.ops.retention import truncate

    deps = make_deps(db, s3_client, bucket, tier1_root, batch_small_bytes=8 * MIB)
    produce(deps, "bt", [entries(f"b{i}", 4, 200) for i in range(6)], open_tail=entries("t", 2, 10))
    report = offload_many(deps, deps.meta.list_ledgers("bt", [S.SEALED])[:4])
    assert len(report.offloaded) == 4 and len({c.data_key for c in deps.meta.chunks("bt").values()}) == 1
    for led in deps.meta.list_ledgers("bt", [S.OFFLOADED])[1:]:
        delete_copy(deps, led)
    truncate(deps, "bt", Position(2, 0))  # ledgers 0 and 1 deleted before the table existed
    TableRows(deps.meta.engine).set_policy("bt", "ns.bt", "keep")
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.passed == [0, 1] and r.ledgers == [2, 3, 4, 5], r.error
    expected = {k: v for k, v in _read(deps, "bt").items() if k[0] < 6}
    assert _table_rows(cat, "ns.bt")[0] == expected and {k[0] for k in expected} == {2, 3, 4, 5}


def test_a_round_of_deleted_ledgers_only_moves_the_mark(deps, settings, cat):
    from tiering.model import Position
    from tiering.ops.retention import truncate

    produce(deps, "gone", [entries("a", 2, 10), entries("b", 2, 10)], open_tail=entries("c", 1, 10))
    truncate(deps, "gone", Position(2, 0))
    TableRows(deps.meta.engine).set_policy("gone", "ns.gone", "follow")
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.ledgers == [] and r.passed == [0, 1], r.error
    table = cat.load_table("ns.gone")
    assert table.properties["tiering.synced-through"] == "1" and table.current_snapshot() is None
    assert TableRows(deps.meta.engine).get("gone").synced_through == 1
    [r] = _sync(deps, settings, cat)  # the passed-over ledgers need no delete: only the trimmed mark moves
    assert r.status == "up_to_date" and r.deleted == [] and cat.load_table("ns.gone").current_snapshot() is None
    from tiering.tables.sync import due_topics

    assert due_topics(deps.meta.engine) == []


def test_a_policy_change_during_a_sync_does_not_fail_its_committed_round(deps, settings, cat):
    expected = produce(deps, "pc", [entries("a", 4, 30), entries("b", 2, 30)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy("pc", "ns.pc", "follow")

    def change_policy(step):
        if step == "committed":  # `topic set pc --table-retention keep` between the commit and the record
            rows.set_policy("pc", None, "keep")
    [r] = _sync(deps, settings, cat, fault=change_policy)
    assert r.status == "synced" and r.ledgers == [0, 1], r.error
    state = rows.get("pc")
    assert (state.synced_through, state.retention, state.ledgers_committed) == (1, "keep", 2)
    assert _table_rows(cat, "ns.pc")[0] == expected


def test_a_table_is_not_renamed_while_synced_or_syncing(deps, settings, cat):
    """Renamed once it holds ledgers, the topic would be synced again into a second table from ledger 0."""
    from tiering.errors import BadInput, ConditionalUpdateFailed
    from tiering.tables.marks import check_renamable

    produce(deps, "rn", [entries("a", 3, 30)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy("rn", "ns.rn", "keep")

    def rename(**kw):
        return rows.set_policy("rn", "ns.other", None, check_rename=lambda old, t: check_renamable(cat, old, t.name, t.topic_id), **kw)
    tried = []

    def during(step):
        if step == "planned":  # a sync holds the topic's sync lock
            with pytest.raises(ConditionalUpdateFailed, match="a sync or maintenance of it running"):
                rename()
            tried.append(step)
        if step == "committed":
            raise Stop(step)  # killed after its commit, before its record: the row still says nothing synced
    with pytest.raises(Stop):
        TableSync(deps.meta.engine, settings, cat, fault=during).sync_topic(rows.get("rn"),
                                                                            local_writer(deps, settings))
    assert tried == ["planned"] and rows.get("rn").synced_through == -1
    with pytest.raises(BadInput, match="already holds ledgers through 0"):
        rename()
    assert rows.get("rn").identifier == "ns.rn" and not cat.table_exists("ns.other")


def test_a_decoder_change_is_refused_while_a_sync_runs_and_applies_from_the_next_run(deps, settings, cat):
    """A field added while a sync ran went through (exit 0), and the rounds that sync committed after it had
    the new column null on every row, for good (no later sync decodes a ledger again). It is refused, as a
    rename is, until the sync has ended."""
    from tiering.errors import ConditionalUpdateFailed
    from tiering.tables.decoder import check_change, parse_fields

    expected = produce(deps, "jd", [_json_ledgers(0, 3), _json_ledgers(3, 3), _json_ledgers(6, 1)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy("jd", "ns.jd", "keep", parse_fields("id:int64"), check_change)
    tried = []

    def add_field(step):
        if step == "committed" and not tried:
            with pytest.raises(ConditionalUpdateFailed, match="a sync or maintenance of it running: change its JSON"):
                rows.set_policy("jd", None, None, parse_fields("id:int64,name:string"), check_change)
            rows.set_policy("jd", None, "keep", parse_fields("id:int64"), check_change)  # the same fields: no lock
            tried.append(step)
    [r] = _sync(deps, settings, cat, limits=Limits(round_ledgers=1, max_rounds=2), fault=add_field)
    assert r.status == "synced" and r.ledgers == [0, 1] and tried, r.error
    assert rows.get("jd").decoder == parse_fields("id:int64")
    assert _table_rows(cat, "ns.jd")[0] == {k: v for k, v in expected.items() if k[0] < 2}
    rows.set_policy("jd", None, None, parse_fields("id:int64,name:string"), check_change)  # no sync now
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.ledgers == [2], r.error
    t = cat.load_table("ns.jd").scan().to_arrow()
    assert dict(zip(t["ledger_id"].to_pylist(), t["name"].to_pylist()))[2] == "n6"  # the next run's decoder


def test_a_data_file_cut_short_in_the_bucket_before_the_commit_is_not_committed(deps, settings, cat):
    """Between the writers and the commit a round's data file was replaced by a valid Parquet file holding
    fewer rows: add_files took it as it was, the sync said `synced` with the writers' entry count, and the
    ledger's missing rows were never synced again (the mark had passed it)."""
    import pyarrow.parquet as pq

    expected = produce(deps, "cut", [entries("a", 20, 30), entries("b", 10, 30)])
    TableRows(deps.meta.engine).set_policy("cut", "ns.cut", "keep")
    cut = {}

    def cut_short(step):
        if step != "written" or cut.get("done"):
            return
        import pyarrow.fs as pafs

        from tiering.tables.files import s3_filesystem_for

        fs, base = s3_filesystem_for(settings)(cat.load_table("ns.cut").location())
        [path, *_] = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(base, recursive=True))
                            if i.path.endswith(".parquet"))
        with fs.open_input_file(path) as f:
            rows = pq.read_table(f)
        with fs.open_output_stream(path) as out:
            pq.write_table(rows.slice(0, rows.num_rows - 1), out)
        cut["done"] = True

    [r] = _sync(deps, settings, cat, fault=cut_short)
    assert r.status == "failed" and "row" in r.error, r
    assert TableRows(deps.meta.engine).get("cut").synced_through == -1
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.ledgers == [0, 1]
    assert _table_rows(cat, "ns.cut")[0] == expected


def test_maintenance_after_a_sync_stopped_past_its_commit_counts_the_round_before_expiring_it(deps, settings, cat):
    """The row is caught up from the snapshot summaries of the commits it has not counted; maintenance
    expired those snapshots first and caught the row up after, so the round's ledgers and entries were
    never counted (status said 0 ledgers in a table holding 2)."""
    from datetime import timedelta

    from tiering.tables.maintenance import maintain_topic

    produce(deps, "mx", [entries("a", 3, 10), entries("b", 2, 10)])
    rows = TableRows(deps.meta.engine)
    rows.set_policy("mx", "ns.mx", "keep")
    s = TableSync(deps.meta.engine, settings, cat, fault=_stop_at("committed"))
    with pytest.raises(Stop):
        s.sync_topic(rows.get("mx"), local_writer(deps, settings))
    assert len(list(cat.load_table("ns.mx").scan().plan_files())) == 2
    # compaction's commit makes the round's snapshot an old one, which the expiry then removes
    report = maintain_topic(TableSync(deps.meta.engine, settings, cat), rows.get("mx"), timedelta(0), min_files=2)
    assert report.errors == [], report
    state = rows.get("mx")
    assert (state.synced_through, state.ledgers_committed, state.entries_committed) == (1, 2, 5), state


def test_verify_counts_the_rows_of_a_deleted_ledger_the_table_keeps(deps, settings, cat):
    """Retention 'keep': a ledger deleted from the topic cannot be read back, and verify skipped its rows
    altogether: held twice in the table, it still said the table was the same as the topic."""
    from tiering.model import Position
    from tiering.ops.retention import truncate
    from tiering.tables.verify import verify_table

    produce(deps, "kd", [entries("a", 3, 10), entries("b", 2, 10)])
    TableRows(deps.meta.engine).set_policy("kd", "ns.kd", "keep")
    _sync(deps, settings, cat)
    truncate(deps, "kd", Position(1, 0))  # ledger 0 deleted, kept in the table
    h = ReadHandle(deps.meta, deps.tier1)
    assert verify_table(h, deps.meta, cat.load_table("ns.kd"), "kd").differences == []
    table = cat.load_table("ns.kd")
    from pyiceberg.expressions import EqualTo

    table.append(table.scan(row_filter=EqualTo("ledger_id", 0)).to_arrow())  # its rows twice
    diffs = verify_table(h, deps.meta, cat.load_table("ns.kd"), "kd").differences
    assert [d["ledger"] for d in diffs] == [0], diffs


def test_a_dead_letter_file_gone_from_the_bucket_before_the_commit_fails_the_round_not_every_sync(deps, settings, cat):
    """The table's commit names its round's dead-letter files, which the dead-letter table then takes: one
    deleted between its write and that commit made every later sync (and maintenance) of the topic fail
    taking it, for good."""
    from tiering.tables.decoder import check_change, parse_fields
    from tiering.tables.files import s3_filesystem_for

    expected = produce(deps, "dg", [_json_ledgers(0, 6, bad_every=3)])
    TableRows(deps.meta.engine).set_policy("dg", "ns.dg", "follow", parse_fields("id:int64"), check_change)
    gone = {}

    def delete_dead_letters(step):
        if step != "written" or gone:
            return
        import pyarrow.fs as pafs

        fs, base = s3_filesystem_for(settings)(cat.load_table("ns.dg").location() + "__dlq")
        for info in fs.get_file_info(pafs.FileSelector(base, recursive=True)):
            if info.path.endswith(".parquet"):
                fs.delete_file(info.path)
                gone[info.path] = True

    [r] = _sync(deps, settings, cat, fault=delete_dead_letters)
    assert gone and r.status == "failed", r
    [r] = _sync(deps, settings, cat)
    assert r.status == "synced" and r.ledgers == [0], r.error
    assert _table_rows(cat, "ns.dg")[0] == expected
    dlq = cat.load_table("ns.dg__dlq").scan().to_arrow()
    assert sorted(dlq["entry_id"].to_pylist()) == [0, 3]


def test_compaction_is_one_snapshot_no_reader_sees_the_table_without_the_compacted_rows(deps, settings, cat):
    """Compaction committed pyiceberg's overwrite: a snapshot deleting the group's rows, then one appending
    them again. A reader of that first snapshot (time travel) saw a table without them, and an incremental
    reader took the append as new rows (each compacted row twice)."""
    from datetime import timedelta

    from tiering.tables.maintenance import maintain_topic

    expected = produce(deps, "one", [entries(str(i), 3, 20) for i in range(5)])
    TableRows(deps.meta.engine).set_policy("one", "ns.one", "keep")
    s = TableSync(deps.meta.engine, settings, cat, limits=Limits(round_ledgers=1))  # a file per ledger
    sync_tables(s, local_writer(deps, settings))
    before = len(cat.load_table("ns.one").snapshots())
    report = maintain_topic(s, TableRows(deps.meta.engine).get("one"), timedelta(days=7), min_files=4)
    assert report.errors == [] and (report.files_before, report.files_after) == (5, 1), report
    table = cat.load_table("ns.one")
    assert len(table.snapshots()) == before + 1
    assert table.current_snapshot().summary["total-records"] == "15"
    assert len(list(table.scan().plan_files())) == 1
    assert _table_rows(cat, "ns.one")[0] == expected


def test_a_table_policy_change_moves_the_topic_version(deps):
    from tiering.errors import ConditionalUpdateFailed

    t = deps.meta.create_topic("ver")
    TableRows(deps.meta.engine).set_policy("ver", "ns.ver", "keep")
    assert deps.meta.get_topic("ver").version == t.version + 1
    with pytest.raises(ConditionalUpdateFailed):  # a policy read before the table's change is stale
        deps.meta.set_policy("ver", t.version, t.policy)
    TableRows(deps.meta.engine).set_policy("ver", None, "follow")
    assert deps.meta.get_topic("ver").version == t.version + 2
