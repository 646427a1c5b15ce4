"""The table commands checked from outside, as an operator would hit them: hostile payloads, hostile state,
through `tiering` subprocesses on the run's PostgreSQL and RGW."""
from __future__ import annotations

from tests.integration.helpers import produce
from tests.integration.test_tables_cli import _table, cli  # noqa: F401 - the fixture
from tiering.metadata.table_sync import TableRows
from tiering.tables.catalog import catalog

POISON = [
    b'{"amount": 1' + b"0" * 400 + b"}",  # an integer no double holds
    b'{"at": "0001-01-01T00:00:00+01:00"}',  # before year 1 in UTC
    b'{"at": "9999-12-31T23:59:59-01:00"}',  # after year 9999 in UTC
    b'{"name": "\\ud800"}',  # a lone surrogate: no UTF-8 column holds it
    b"[" * 100_000,  # nested deeper than the JSON parser recurses
]


def test_payloads_that_do_not_decode_are_dead_letters_not_a_stuck_sync(cli, deps, settings):
    good = b'{"amount": 2.5, "at": "2024-01-01T00:00:00Z", "name": "ok"}'
    produce(deps, "p", [POISON + [good]])
    cli("topic", "set", "p", "--table", "ns.p", "--table-json-fields", "amount:double,at:timestamp,name:string").ok()
    out = cli("table", "sync", "--topic", "p", "--json").ok().json
    assert (out["failed"], out["ledger_count"], out["topics"][0]["entry_count"]) == ([], 1, len(POISON) + 1)
    rows = catalog(settings).load_table("ns.p").scan().to_arrow().sort_by("entry_id").to_pylist()
    assert [r["payload"] for r in rows] == POISON + [good]
    assert [r["amount"] for r in rows] == [None] * len(POISON) + [2.5]
    dead = catalog(settings).load_table("ns.p__dlq").scan().to_arrow().sort_by("entry_id").to_pylist()
    assert [r["entry_id"] for r in dead] == list(range(len(POISON))), dead
    assert all(r["reason"] for r in dead)
    assert cli("table", "verify", "p").returncode == 0


LENIENT = [
    b'{"amount": 1e400}',  # beyond a double: Python parsed it as infinity, stored as such
    b'{"amount": -1e999}',
    b'{"amount": NaN}',  # not JSON (Python's extension), stored as NaN
    b'{"amount": Infinity}',
    b'{"count": ' + b"9" * 5000 + b"}",  # more digits than Python converts
    '{"name": "utf-16"}'.encode("utf-16"),  # not UTF-8: json.loads of bytes also read UTF-16 and UTF-32
    b'{"name": "\xed\xa0\x80"}',  # an encoded surrogate: invalid UTF-8 (json.loads read it with surrogatepass)
]


def test_numbers_out_of_range_and_payloads_not_utf8_are_dead_letters_not_silently_stored(cli, deps, settings):
    fine = [b'\xef\xbb\xbf{"amount": 1.5}', b'{"amount": 2, "other": 1e400, "big": ' + b"9" * 5000 + b"}"]
    produce(deps, "n", [LENIENT + fine])
    cli("topic", "set", "n", "--table", "ns.n", "--table-json-fields", "amount:double,count:int64,name:string").ok()
    out = cli("table", "sync", "--topic", "n", "--json").ok().json
    assert (out["failed"], out["topics"][0]["entry_count"]) == ([], len(LENIENT) + len(fine))
    rows = catalog(settings).load_table("ns.n").scan().to_arrow().sort_by("entry_id").to_pylist()
    assert [r["payload"] for r in rows] == LENIENT + fine
    assert [(r["amount"], r["count"], r["name"]) for r in rows] == [(None, None, None)] * len(LENIENT) + [
        (1.5, None, None), (2.0, None, None)]  # a value in a field not declared is not looked at
    dead = catalog(settings).load_table("ns.n__dlq").scan().to_arrow().sort_by("entry_id").to_pylist()
    assert [r["entry_id"] for r in dead] == list(range(len(LENIENT))), dead
    reasons = [r["reason"] for r in dead]
    assert "out of range" in reasons[0] and "not a JSON value" in reasons[2] and "not UTF-8" in reasons[5], reasons
    assert cli("table", "verify", "n").returncode == 0


def test_a_corrupt_object_fails_the_sync_and_leaves_no_file_of_the_round_dead_letters_included(cli, deps, settings):
    """The round's data files were discarded, but the dead-letter file of the ledger read before the corrupt
    one stayed under TABLE__dlq: a partial file of a failed round, left for maintenance to find a day later."""
    from tiering.ops.delete_lagged import delete_copy
    from tiering.ops.offload import offload_ledger

    produce(deps, "z", [[b'{"v": 1}', b"not json", b'{"v": "x"}'], [b'{"v": 2}'] * 50])
    delete_copy(deps, offload_ledger(deps, deps.meta.list_ledgers("z")[1]))  # ledger 1: tier 2 only
    key = deps.meta.get_chunk(deps.meta.get_ledger("z", 1)).data_key
    s3, name = deps.bucket.s3, deps.bucket.name
    body = bytearray(s3.get_object(Bucket=name, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0x5A
    s3.put_object(Bucket=name, Key=key, Body=bytes(body))
    cli("topic", "set", "z", "--table", "ns.z", "--table-json-fields", "v:int64").ok()
    out = cli("table", "sync", "--topic", "z", "--json")
    assert out.returncode == 1 and "corrupt" in out.json["failed"][0]["error"], out.stdout
    assert out.json["ledger_count"] == 0
    prefix = f"{catalog(settings).load_table('ns.z').location().split('/', 3)[3]}"  # ns/z and ns/z__dlq
    files = [o["Key"] for o in s3.list_objects_v2(Bucket=name, Prefix=prefix).get("Contents", [])
             if o["Key"].endswith(".parquet")]
    assert files == [], files
    assert catalog(settings).load_table("ns.z").current_snapshot() is None
    assert catalog(settings).load_table("ns.z__dlq").current_snapshot() is None


def test_a_table_dropped_behind_the_stores_back_fails_sync_and_preview_alike_and_is_not_made_again(
        cli, deps, settings, db):
    from sqlalchemy import text

    produce(deps, "d", [[b"1"], [b"2"]])
    produce(deps, "r", [[b"1"]])
    for topic in ("d", "r"):
        cli("topic", "set", topic, "--table", f"ns.{topic}").ok()
    cli("table", "sync").ok()
    catalog(settings).drop_table("ns.d")
    with db.begin() as conn:  # the other: its catalog row deleted by hand
        conn.execute(text("DELETE FROM iceberg_tables WHERE table_name = 'r'"))
    for topic in ("d", "r"):
        for dry in ((), ("--dry-run",)):
            out = cli("table", "sync", "--topic", topic, "--json", *dry)
            assert out.returncode == 1, (dry, out.stdout, out.stderr)
            assert out.json["failed_count"] == 1 and "dropped" in out.json["failed"][0]["error"], out.json
            assert "dropped" in out.one_line_error(1)  # the first error on stderr too, not only in the JSON
        assert not catalog(settings).table_exists(f"ns.{topic}")  # no empty table hides what happened
        # not bad input: a state the store is in, as for sync (exit 1), with the way out named
        assert f"dropped; `tiering table rebuild {topic}`" in cli("table", "verify", topic).one_line_error(1)
        out = cli("table", "maintain", "--topic", topic, "--json")  # was: nothing to do, exit 0
        assert out.returncode == 1 and "dropped" in out.json["failed"][0]["error"], out.stdout
        assert "dropped" in out.one_line_error(1)


def test_topic_set_with_a_refused_table_change_leaves_the_policy_unchanged(cli, deps):
    produce(deps, "s", [[b'{"a": 1}']])
    produce(deps, "o", [])
    cli("topic", "set", "s", "--table", "ns.s", "--table-json-fields", "a:int64").ok()
    cli("topic", "set", "o", "--table", "ns.o").ok()
    cli("table", "sync").ok()
    before = cli("topic", "show", "s", "--json").ok().json
    for change, why in ((("--table", "ns.other"), "cannot be renamed"),
                        (("--table-json-fields", "a:string"), "can only add fields"),
                        (("--table", "ns.o"), "already the table")):
        assert why in cli("topic", "set", "s", "--offload-after", "4h", *change).one_line_error(2)
        assert cli("topic", "show", "s", "--json").ok().json == before  # nothing written
    assert cli("topic", "set", "s", "--offload-after", "4h", "--table-retention", "keep", "--json").ok() \
        .json["offload_after_seconds"] == 4 * 3600


def test_maintain_leaves_a_table_that_is_not_the_topics_alone(cli, deps, settings, s3_client, bucket):
    """`topic set --table` names a table another tool made: the sync refuses it, and so must maintenance
    (its snapshots and its unreferenced files are that tool's)."""
    import time

    import pyarrow as pa

    cat = catalog(settings)
    cat.create_namespace_if_not_exists("ns")
    foreign = cat.create_table("ns.f", pa.schema([("x", pa.int64())]))
    for i in range(2):
        foreign.append(pa.table({"x": [i]}))
        foreign = foreign.refresh()
    staged = foreign.location().split("://", 1)[1].split("/", 1)[1] + "/data/staged-by-the-other-tool.parquet"
    s3_client.put_object(Bucket=bucket, Key=staged, Body=b"not yet committed")
    time.sleep(1.1)
    produce(deps, "f", [[b"1"]])
    cli("topic", "set", "f", "--table", "ns.f").ok()
    assert cli("table", "sync", "--topic", "f").returncode == 1  # refused: not this topic's table
    out = cli("table", "maintain", "--topic", "f", "--expire-after-seconds", "0", "--orphan-grace-seconds", "0",
              "--json")
    assert out.returncode == 1, out.stdout
    assert "not made by tiering" in out.json["failed"][0]["error"]
    assert len(cat.load_table("ns.f").snapshots()) == 2  # nothing expired
    s3_client.head_object(Bucket=bucket, Key=staged)  # nothing deleted


def test_a_topic_made_again_under_its_old_name_does_not_adopt_the_old_table(cli, deps, settings):
    """Deleting a topic keeps its table; a new topic of the same name with the same table name would append
    to it (the old topic's rows in the new topic's table: verify fails for ever): refused, nothing written."""
    produce(deps, "z", [[b"old0"], [b"old1"]])
    cli("topic", "set", "z", "--table", "ns.z").ok()
    cli("table", "sync").ok()
    cli("topic", "delete", "z", "--force").ok()
    cli("topic", "create", "z", "--table", "ns.z").ok()
    cli("produce", "z", "--stdin-lines", "--seal", stdin=b"new\n").ok()
    before = catalog(settings).load_table("ns.z").metadata_location
    out = cli("table", "sync", "--topic", "z", "--json")
    assert out.returncode == 1 and "earlier topic 'z'" in out.json["failed"][0]["error"], out.stdout
    assert catalog(settings).load_table("ns.z").metadata_location == before
    out = cli("table", "maintain", "--topic", "z", "--json")
    assert out.returncode == 1 and "earlier topic 'z'" in out.json["failed"][0]["error"], out.stdout
    status = cli("table", "status", "z", "--json").ok().json  # says whose it is, not its location as this one's
    assert "earlier topic 'z'" in status["problem"] and status["metadata_location"] is None
    assert status["row_count"] is None and status["metadata_location"] is None  # the earlier topic's: not this one's
    assert "earlier topic 'z'" in cli("table", "verify", "z").one_line_error(1)
    cli("topic", "set", "z", "--table", "ns.z2").ok()  # the other way out: another name (nothing synced yet)
    cli("topic", "set", "z", "--table", "ns.z").ok()
    catalog(settings).drop_table("ns.z")  # the way out the message names
    cli("table", "sync", "--topic", "z").ok()
    assert [r["payload"] for r in catalog(settings).load_table("ns.z").scan().to_arrow().to_pylist()] == [b"new"]
    assert cli("table", "verify", "z").returncode == 0


def test_maintain_dry_run_counts_what_the_run_does_and_writes_nothing(cli, deps, settings, s3_client, bucket):
    import time

    from tests.integration.helpers import entries
    from tiering.tables.files import local_writer
    from tiering.tables.sync import Limits, TableSync, sync_tables

    produce(deps, "m", [entries(str(i), 3, 20) for i in range(5)])
    cli("topic", "set", "m", "--table", "ns.m").ok()
    sync = TableSync(deps.meta.engine, settings, catalog(settings), limits=Limits(round_ledgers=1))
    sync_tables(sync, local_writer(deps, settings))  # five rounds: five small files, five snapshots
    loc = catalog(settings).load_table("ns.m").location().split("://", 1)[1].split("/", 1)[1]
    s3_client.put_object(Bucket=bucket, Key=f"{loc}/data/left-by-a-killed-run.parquet", Body=b"x")
    time.sleep(1.1)

    def keys():
        return sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket, Prefix=loc)["Contents"])

    before, where = keys(), catalog(settings).load_table("ns.m").metadata_location
    flags = ("maintain", "--topic", "m", "--expire-after-seconds", "0", "--orphan-grace-seconds", "1", "--json")
    dry = cli("table", *flags, "--dry-run").ok().json
    assert dry["dry_run"] is True and (keys(), catalog(settings).load_table("ns.m").metadata_location) == (before, where)
    real = cli("table", *flags).ok().json
    counted = ("partitions_compacted_count", "files_before_count", "files_after_count")
    assert [dry["tables"][0][k] for k in counted] == [real["tables"][0][k] for k in counted] == [1, 5, 1]
    assert dry["tables"][0]["snapshots_expired_count"] >= 4
    # orphans are counted against today's references: what the expiry releases comes on top in the real run
    assert dry["tables"][0]["orphans_deleted_count"] == 1 <= real["tables"][0]["orphans_deleted_count"]


def test_topic_set_writes_its_policy_and_table_together_or_not_at_all(cli, deps):
    """Two topics asking for one table name at once: one wins; the other's policy flags are not written
    either (the policy and the table change are one transaction), and `--expect-version` guards a
    table-only change as it guards the policy."""
    for name in ("p1", "p2", "p3", "p4"):
        produce(deps, name, [])
    results = cli.many([("topic", "set", name, "--retention-time", f"{i + 1}h", "--table", "ns.shared")
                        for i, name in enumerate(("p1", "p2", "p3", "p4"))])
    won = [r for r in results if r.returncode == 0]
    assert len(won) == 1, [(r.returncode, r.stderr) for r in results]
    for r in results:
        shown = deps.meta.get_topic(r.args[2])
        if r.returncode == 0:
            assert shown.version == 1 and shown.policy.retention_seconds > 0
        else:
            assert "already the table" in r.one_line_error(2)
            assert shown.version == 0 and shown.policy.retention_seconds != 3600 * int(r.args[2][1])
    winner = won[0].args[2]
    assert "conditional update" in cli("topic", "set", winner, "--expect-version", "0",
                                       "--table-retention", "keep").one_line_error(1)
    assert TableRows(deps.meta.engine).get(winner).retention == "follow"
    done = cli("topic", "set", winner, "--expect-version", "1", "--table-retention", "keep", "--json").ok().json
    assert done["version"] == 2 and done["table"]["retention"] == "keep"
    # a table-only change made without the guard moves the version too: a guarded writer that read version 2
    # learns of it instead of writing over it
    assert cli("topic", "set", winner, "--table-retention", "follow", "--json").ok().json["version"] == 3
    assert "conditional update" in cli("topic", "set", winner, "--expect-version", "2",
                                       "--table-retention", "keep").one_line_error(1)
    assert TableRows(deps.meta.engine).get(winner).retention == "follow"


def test_topic_create_with_a_taken_table_creates_no_topic(cli, deps):
    cli("topic", "create", "c1", "--table", "ns.c").ok()
    assert "already the table of topic 'c1'" in cli("topic", "create", "c2", "--table", "ns.c").one_line_error(2)
    assert "does not exist" in cli("topic", "show", "c2").one_line_error(2)


def test_dead_letters_behind_their_table_are_shown_and_dead_letters_removed_by_another_tool_are_found(
        cli, deps, settings):
    """A sync killed between the table's commit and the dead letters' left TABLE__dlq behind: status said
    nothing (no lag, no problem) and the next sync caught up unseen. Rows another tool deleted from
    TABLE__dlq never came back, and `table verify` said "the same", exit 0."""
    import pytest

    from tests.integration.test_tables import Stop, _json_ledgers, _stop_at
    from tiering.tables.files import local_writer
    from tiering.tables.sync import TableSync

    produce(deps, "dl", [_json_ledgers(0, 6, bad_every=3), _json_ledgers(6, 3, bad_every=3)])
    cli("topic", "set", "dl", "--table", "ns.dl", "--table-json-fields", "id:int64").ok()
    rows = TableRows(deps.meta.engine)
    with pytest.raises(Stop):  # killed there
        TableSync(deps.meta.engine, settings, catalog(settings), fault=_stop_at("before-dlq")).sync_topic(
            rows.get("dl"), local_writer(deps, settings))
    status = cli("table", "status", "dl", "--json").ok().json
    assert (status["problem"], status["dlq_pending_commit_count"], status["row_count"]) == (None, 1, 9), status
    checked = cli("table", "verify", "dl").ok()  # the table is sound; its dead letters wait for the next sync
    assert "the dead letters of 1 commit(s) not in 'ns.dl__dlq' yet" in checked.stdout, checked.stdout
    cli("table", "sync", "--topic", "dl").ok()
    assert cli("table", "status", "dl", "--json").ok().json["dlq_pending_commit_count"] == 0
    dead = catalog(settings).load_table("ns.dl__dlq")
    assert sorted(dead.scan().to_arrow()["entry_id"].to_pylist()) == [0, 0, 3]  # ledger 0: 0 and 3; ledger 1: 0
    assert cli("table", "verify", "dl").returncode == 0

    dead.delete("entry_id = 3")  # another Iceberg tool
    bad = cli("table", "verify", "dl", "--json")
    assert "not committed by a sync: dead letters it removed are not in the table" in bad.one_line_error(1)
    assert bad.json["failed"][0]["ledger"] is None and bad.json["dlq_pending_commit_count"] == 0
