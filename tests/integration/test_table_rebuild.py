"""`tiering table rebuild`: the way out of a table a sync cannot go on with (its metadata file gone or not
Iceberg metadata, dropped, rolled back), on PostgreSQL's catalog and the S3 server."""
from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tests.integration.test_tables_cli import _read, _table, cli, synced_twice_then_rolled_back  # noqa: F401
from tiering.errors import BadInput, ConditionalUpdateFailed
from tiering.metadata.table_sync import TableRows, exclusive
from tiering.tables.catalog import catalog, table_schema


def _other_tool(settings):
    """pyiceberg's own SQL catalog on the product's catalog tables, as another tool would use them."""
    from pyiceberg.catalog.sql import SqlCatalog

    ours = catalog(settings)
    return SqlCatalog(ours.name, **ours.properties)


def _synced(cli, deps, topic: str) -> None:
    produce(deps, topic, [entries("a", 3, 10), entries("b", 2, 10)])
    cli("topic", "set", topic, "--table", f"ns.{topic}").ok()
    cli("table", "sync", "--topic", topic).ok()


def _object(location: str) -> tuple[str, str]:
    parts = urlsplit(location)
    return parts.netloc, parts.path.lstrip("/")


def _catalog_rows(deps) -> list[tuple]:
    with deps.meta.engine.connect() as conn:
        return conn.execute(text("SELECT table_namespace, table_name, metadata_location FROM iceberg_tables "
                                 "ORDER BY 1, 2")).all()


def _keys(deps, location: str) -> set[str]:
    bucket, prefix = _object(location)
    pages = deps.bucket.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"] for page in pages for o in page.get("Contents", [])}


@pytest.mark.parametrize("damage", ["deleted", "garbage", "binary", "manifest list gone"])
def test_a_table_whose_metadata_file_is_gone_or_garbage_is_rebuilt_from_the_log_every_entry_once(
        cli, deps, settings, damage):
    """Its metadata file deleted (maintenance of another database sharing the location, an import of an old
    export, a hand) or overwritten: status, sync, verify and maintain said only pyiceberg's FileNotFoundError
    or validation error, and nothing in the product could make the table again."""
    _synced(cli, deps, "lost")
    location = catalog(settings).load_table("ns.lost").metadata_location
    bucket, key = _object(location)
    old_files = _keys(deps, location.rsplit("/metadata/", 1)[0] + "/data/")
    assert old_files
    if damage == "deleted":
        deps.bucket.s3.delete_object(Bucket=bucket, Key=key)
    elif damage == "manifest list gone":  # its snapshot expired and its files deleted (an old export's)
        snap = catalog(settings).load_table("ns.lost").current_snapshot()
        deps.bucket.s3.delete_object(Bucket=bucket, Key=_object(snap.manifest_list)[1])
    else:
        deps.bucket.s3.put_object(Bucket=bucket, Key=key,
                                  Body=b"{not iceberg" if damage == "garbage" else b"\xff\xfe\x00garbage")
    cli("produce", "lost", "--entries", "2", "--entry-size", "10", "--seal").ok()  # a sync has work
    st = cli("table", "status", "lost", "--json").ok().json
    assert "cannot be read" in st["problem"] and "tiering table rebuild" in st["problem"], st
    if damage == "manifest list gone":  # its metadata file is read: what it says is shown, not 0 rows and no file
        assert (st["metadata_location"], st["row_count"]) == (location, 5), st
    else:  # nothing read: not known (null), rather than a table holding nothing
        assert (st["metadata_location"], st["row_count"]) == (None, None), st
    for args in (("table", "sync", "--topic", "lost"), ("table", "maintain", "--topic", "lost"),
                 ("table", "verify", "lost")):
        line = cli(*args).one_line_error(1)
        assert "tiering table rebuild" in line, (args, line)

    before = _catalog_rows(deps)
    dry = cli("table", "rebuild", "lost", "--dry-run", "--json").ok().json
    assert dry["found"].startswith("unreadable") and dry["metadata_location"] == location, dry
    assert (dry["synced_through"], dry["retained_from"], dry["dry_run"]) == (1, 0, True), dry
    assert _catalog_rows(deps) == before and TableRows(deps.meta.engine).get("lost").synced_through == 1

    cli("table", "rebuild", "lost").ok()
    state = TableRows(deps.meta.engine).get("lost")
    assert (state.synced_through, state.trimmed_through, state.ledgers_committed, state.metadata_location) == \
        (-1, -1, 0, None)
    assert all(r[1] != "lost" for r in _catalog_rows(deps))
    again = cli("table", "rebuild", "lost", "--json").ok().json  # a rerun: nothing left to forget
    assert again["found"] == "absent", again

    assert cli("table", "sync", "--topic", "lost", "--json").ok().json["ledger_count"] == 3
    assert _table(settings, "ns.lost") == _read(deps, "lost")  # every entry, once (_table checks)
    cli("table", "verify", "lost").ok()
    if damage != "deleted":
        return
    new_location = catalog(settings).load_table("ns.lost").metadata_location
    assert new_location != location and new_location.rsplit("/metadata/", 1)[0] == location.rsplit("/metadata/", 1)[0]
    # the old table's data files are orphans of the new one: maintenance deletes them after its grace, and
    # only them
    cli("table", "maintain", "--topic", "lost", "--orphan-grace-seconds", "0").ok()
    assert not old_files & _keys(deps, location.rsplit("/metadata/", 1)[0] + "/data/")
    assert _table(settings, "ns.lost") == _read(deps, "lost")


def test_a_table_whose_data_file_is_gone_is_named_by_verify_and_rebuilt_without_force(cli, deps, settings):
    """One data file of the current snapshot deleted by hand: maintain named `table rebuild`, which refused
    ("readable and in step ... nothing to rebuild") without --force, and verify said only pyiceberg's
    FileNotFoundError."""
    _synced(cli, deps, "hole")
    location = catalog(settings).load_table("ns.hole").metadata_location
    data = sorted(_keys(deps, location.rsplit("/metadata/", 1)[0] + "/data/"))
    bucket, _ = _object(location)
    deps.bucket.s3.delete_object(Bucket=bucket, Key=data[0])
    for args in (("table", "verify", "hole"), ("table", "maintain", "--topic", "hole")):
        line = cli(*args).one_line_error(1)
        assert "gone" in line and "tiering table rebuild hole" in line, (args, line)
    assert "data file(s) of its current snapshot are gone" in cli("table", "verify", "hole").one_line_error(1)
    r = cli("table", "rebuild", "hole", "--json").ok().json
    assert r["found"].startswith("unreadable") and "data file(s)" in r["found"], r
    assert cli("table", "sync", "--topic", "hole", "--json").ok().json["ledger_count"] == 2
    assert _table(settings, "ns.hole") == _read(deps, "hole")
    cli("table", "verify", "hole").ok()
    # a readable table in step is still refused without --force
    assert "nothing to rebuild" in cli("table", "rebuild", "hole").one_line_error(2)


def test_a_dropped_table_is_rebuilt_from_the_retained_log(cli, deps, settings):
    """Dropped behind the store's back, the sync refused it for ever (its row's marks claim rows no table
    holds) and a rename was refused too: the topic could never have a table again."""
    _synced(cli, deps, "drop")
    catalog(settings).drop_table("ns.drop")
    assert "tiering table rebuild drop" in cli("table", "sync", "--topic", "drop").one_line_error(1)
    cli("truncate", "drop", "1:0").ok()  # ledger 0 is no longer retained: the rebuilt table starts at 1
    r = cli("table", "rebuild", "drop", "--json").ok().json
    assert r["found"].startswith("dropped") and (r["retained_from"], r["metadata_location"]) == (1, None), r
    cli("table", "sync", "--topic", "drop").ok()
    assert _table(settings, "ns.drop") == _read(deps, "drop") and {k[0] for k in _read(deps, "drop")} == {1}


def test_a_rolled_back_table_is_rebuilt(cli, deps, settings):
    synced_twice_then_rolled_back(cli, deps, settings, "rolled")
    assert "tiering table rebuild rolled" in cli("table", "sync", "--topic", "rolled").one_line_error(1)
    r = cli("table", "rebuild", "rolled", "--json").ok().json
    assert "rolled back" in r["found"], r
    cli("table", "sync", "--topic", "rolled").ok()
    assert _table(settings, "ns.rolled") == _read(deps, "rolled") and len(_read(deps, "rolled")) == 5


def test_rebuild_refuses_a_table_another_tool_made_and_a_topic_without_a_table(cli, deps, settings):
    """Another tool's table of the topic's name: in the warehouse (readable, its owner says so), elsewhere in
    the bucket, or on a store this host cannot read (its metadata looked gone, and its catalog row was
    deleted): never dropped."""
    cat = _other_tool(settings)
    cat.create_namespace_if_not_exists("ns")
    for topic, location in (("mine", None), ("there", f"s3://{settings.bucket}/elsewhere/there"),
                            ("far", None)):
        produce(deps, topic, [entries("a", 2, 10)])
        cli("topic", "set", topic, "--table", f"ns.{topic}").ok()
        cat.create_table(f"ns.{topic}", table_schema(), **({"location": location} if location else {}))
    with deps.meta.engine.begin() as conn:  # as if it lived on another host's disk
        conn.execute(text("UPDATE iceberg_tables SET metadata_location = 'file:///nonexistent/far/m.json' "
                          "WHERE table_name = 'far'"))
    before = _catalog_rows(deps)
    line = cli("table", "rebuild", "mine").one_line_error(2)
    assert "not made by tiering" in line and "drops only a table" in line, line
    for topic in ("there", "far"):
        for args in (("table", "rebuild", topic), ("table", "rebuild", topic, "--dry-run")):
            assert "not a table tiering made" in cli(*args).one_line_error(2)
    assert _catalog_rows(deps) == before
    produce(deps, "bare", [])
    assert "has no table" in cli("table", "rebuild", "bare").one_line_error(2)
    assert "does not exist" in cli("table", "rebuild", "nosuch").one_line_error(2)


def test_rebuild_never_drops_another_tools_dead_letter_table_and_says_when_there_is_nothing(cli, deps, settings):
    """With no main table yet, the rebuild deleted the catalog row of `TABLE__dlq` without looking at it."""
    produce(deps, "d", [[b'{"a": 1}']])
    cli("topic", "set", "d", "--table", "ns.d", "--table-json-fields", "a:int64").ok()
    r = cli("table", "rebuild", "d", "--json").ok().json  # nothing yet: nothing to forget
    assert r["found"] == "absent", r
    assert "nothing to forget" in cli("table", "rebuild", "d").ok().stdout
    other = _other_tool(settings)
    other.create_namespace_if_not_exists("ns")
    other.create_table("ns.d__dlq", table_schema(dlq=True))
    before = _catalog_rows(deps)
    assert "drops only a table" in cli("table", "rebuild", "d", "--force").one_line_error(2)
    assert _catalog_rows(deps) == before


def test_a_dead_letter_table_that_cannot_be_read_is_named_and_rebuilt_with_its_table(cli, deps, settings):
    """Its metadata file gone, the main table sound: sync failed naming the rebuild, status said no problem and
    the rebuild refused the table as in step (only --force, warning of rows lost)."""
    produce(deps, "j", [[b'{"a": 1}', b"not json"]])
    cli("topic", "set", "j", "--table", "ns.j", "--table-json-fields", "a:int64").ok()
    cli("table", "sync", "--topic", "j").ok()
    dlq = catalog(settings).load_table("ns.j__dlq")
    assert dlq.scan().to_arrow().num_rows == 1
    deps.bucket.s3.delete_object(Bucket=_object(dlq.metadata_location)[0], Key=_object(dlq.metadata_location)[1])
    st = cli("table", "status", "j", "--json").ok().json
    assert "ns.j__dlq" in st["problem"] and "tiering table rebuild" in st["problem"], st
    r = cli("table", "rebuild", "j", "--json").ok().json
    assert r["found"].startswith("unreadable") and "ns.j__dlq" in r["found"], r
    cli("table", "sync", "--topic", "j").ok()
    assert _table(settings, "ns.j") == _read(deps, "j")
    assert catalog(settings).load_table("ns.j__dlq").scan().to_arrow().num_rows == 1


def test_a_table_on_a_store_this_host_cannot_read_fails_its_topic_at_once_and_the_others_sync(cli, deps, settings):
    """A row of the shared catalog naming gs:// metadata (another engine's table) held the hourly sync of
    every topic for as long as pyarrow's GCS client waited."""
    for topic in ("gcs", "fine"):
        produce(deps, topic, [entries("a", 2, 10)])
        cli("topic", "set", topic, "--table", f"ns.{topic}").ok()
    cat = _other_tool(settings)
    cat.create_namespace_if_not_exists("ns")
    cat.create_table("ns.gcs", table_schema())
    with deps.meta.engine.begin() as conn:
        conn.execute(text("UPDATE iceberg_tables SET metadata_location = 'gs://other/wh/ns/gcs/m.json' "
                          "WHERE table_name = 'gcs'"))
    res = cli("table", "sync", "--json")
    assert res.returncode == 1, res.stderr
    assert [f["topic"] for f in res.json["failed"]] == ["gcs"], res.json
    assert "not a table tiering made" in res.json["failed"][0]["error"]
    assert _table(settings, "ns.fine") == _read(deps, "fine")
    # maintenance too: that topic fails, the others are maintained (it stopped at the first such table)
    res = cli("table", "maintain", "--json")
    assert res.returncode == 1 and [f["topic"] for f in res.json["failed"]] == ["gcs"], res.stdout
    assert [t["table"] for t in res.json["tables"]] == ["ns.fine", "ns.gcs"], res.json
    st = cli("table", "status", "gcs", "--json").ok().json  # a problem named, not a refusal of the status
    assert "not a table tiering made" in st["problem"], st


def test_rebuild_waits_for_no_one_and_changes_nothing_while_a_sync_runs(cli, deps, settings):
    _synced(cli, deps, "busy")
    rows = TableRows(deps.meta.engine)
    before = _catalog_rows(deps), rows.get("busy")
    with exclusive(deps.meta.engine, rows.get("busy").topic_id) as held:  # as a running sync holds it
        assert held
        assert "sync or maintenance of it running" in cli("table", "rebuild", "busy", "--force").one_line_error(1)
    assert (_catalog_rows(deps), rows.get("busy")) == before


def test_reset_is_a_compare_and_set_on_the_catalog_row_and_the_sync_state(cli, deps, settings):
    """A table committed to, or a sync state moved, between the rebuild's checks and its transaction: it
    refuses, and nothing is forgotten."""
    _synced(cli, deps, "cas")
    rows = TableRows(deps.meta.engine)
    state = rows.get("cas")
    location = catalog(settings).load_table("ns.cas").metadata_location
    before = _catalog_rows(deps), rows.get("cas")
    with pytest.raises(ConditionalUpdateFailed, match="catalog row of table ns.cas"):
        rows.reset(state, {"cas": "s3://somewhere/else.metadata.json", "cas__dlq": None})
    with pytest.raises(ConditionalUpdateFailed, match="changed meanwhile"):
        from dataclasses import replace

        rows.reset(replace(state, synced_through=0), {"cas": location, "cas__dlq": None})
    assert (_catalog_rows(deps), rows.get("cas")) == before
    with pytest.raises(BadInput):
        rows.list("nosuch")


def test_a_sync_holding_the_old_table_cannot_commit_into_it_after_a_rebuild(cli, deps, settings):
    """A sync that lost its lock (its session gone) but runs on holds the forgotten table: the catalog's
    compare-and-set on the metadata location finds no row, so nothing lands in a table no one reads."""
    from pyiceberg.exceptions import CommitFailedException, NoSuchTableError

    _synced(cli, deps, "zombie")
    stale = catalog(settings).load_table("ns.zombie")
    cli("truncate", "zombie", "1:0").ok()
    # in step with its sync state: refused unless forced, naming what would not come back
    line = cli("table", "rebuild", "zombie").one_line_error(2)
    assert "nothing to rebuild" in line and "ledgers before 1" in line, line
    cli("table", "rebuild", "zombie", "--force").ok()
    with pytest.raises((CommitFailedException, NoSuchTableError)):
        stale.transaction().set_properties({"tiering.synced-through": "99"}).commit_transaction()
    assert not catalog(settings).table_exists("ns.zombie")
    cli("table", "sync", "--topic", "zombie").ok()
    assert _table(settings, "ns.zombie") == _read(deps, "zombie")


def test_verify_names_a_catalog_row_set_back_and_a_manifest_gone_as_sync_does(cli, deps, settings):
    """verify compared up to the table's own marks: a catalog row set back to the previous metadata file
    (ledger 1 missing) was "the same", exit 0, where sync and maintain named the rollback; a manifest gone
    printed pyiceberg's FileNotFoundError without the way out."""
    _synced(cli, deps, "back")
    cli("produce", "back", "--entries", "2", "--entry-size", "10", "--seal").ok()
    cli("table", "sync", "--topic", "back").ok()
    with deps.meta.engine.begin() as conn:
        conn.execute(text("UPDATE iceberg_tables SET metadata_location = previous_metadata_location "
                          "WHERE table_name = 'back'"))
    line = cli("table", "verify", "back").one_line_error(1)
    assert "rolled back" in line and "tiering table rebuild back" in line, line

    _synced(cli, deps, "mani")
    table = catalog(settings).load_table("ns.mani")
    manifest = table.current_snapshot().manifests(table.io)[0].manifest_path
    bucket, key = _object(manifest)
    deps.bucket.s3.delete_object(Bucket=bucket, Key=key)
    line = cli("table", "verify", "mani").one_line_error(1)
    assert line.startswith("tiering: error: a file of the table is gone") and "tiering table rebuild mani" in line, line
