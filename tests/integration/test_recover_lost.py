"""Recovery from the bucket records every ledger id it has no good copy of, above the topic's retention trim
point, as a ledger marked lost: reads give an explicit DATALOSS gap naming it, status, stats and verify say
so, a rerun adds nothing, and no pipeline command reads, moves or deletes bytes for it. Ids below the trim
point (retention trimmed them) get no row and read as no loss. Through the real command on RGW and
PostgreSQL."""
from __future__ import annotations

from sqlalchemy import text

from tests.integration.helpers import bucket_keys, entries, produce
from tests.integration.test_cli import cli, read_data  # noqa: F401 - the fixture
from tests.integration.test_recover_tier1 import lose_metadata
from tiering.model import LedgerState as S, Position
from tiering.ops.offload import offload_many
from tiering.ops.retention import truncate
from tiering.spark.filters import Pushed
from tiering.spark.plan import plan


def _world(deps) -> dict:
    """Topic `lx`: six offloaded ledgers of 3 entries (100 bytes each), no tier-1 copies; ledger 0 truncated
    by retention (its marker written) and its objects collected; ledger 2's objects gone; a flipped byte in
    ledger 3's data (its index still describes it); ledger 5's index object gone (its data object's key
    still names it). Returns the entries of the ledgers whose copies are whole (1 and 4)."""
    data = produce(deps, "lx", [entries(f"x{i}", 3, 100) for i in range(6)])
    assert len(offload_many(deps, deps.meta.list_ledgers("lx", [S.SEALED])).offloaded) == 6
    chunks = deps.meta.chunks("lx")
    for led in deps.meta.list_ledgers("lx"):
        deps.tier1.delete("lx", led.ledger_id)
    truncate(deps, "lx", Position(1, 0))
    s3, name = deps.bucket.s3, deps.bucket.name
    for key in (chunks[0].data_key, chunks[0].index_key, chunks[2].data_key, chunks[2].index_key,
                chunks[5].index_key):
        s3.delete_object(Bucket=name, Key=key)
    body = bytearray(s3.get_object(Bucket=name, Key=chunks[3].data_key)["Body"].read())
    body[chunks[3].data_offset + 150] ^= 0x01
    s3.put_object(Bucket=name, Key=chunks[3].data_key, Body=bytes(body))
    return {k: v for k, v in data.items() if k[0] in (1, 4)}


def _rows(db) -> list[tuple]:
    with db.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT l.ledger_id, l.state::text, l.entry_count, l.size_bytes, l.lost_at IS NOT NULL, l.version, "
            "c.ledger_id IS NOT NULL FROM tiering.ledger l LEFT JOIN tiering.chunk c USING (topic_id, ledger_id) "
            "ORDER BY l.ledger_id"))]


def test_ids_recovery_has_no_copy_of_become_lost_ledgers_that_reads_and_verify_name(cli, deps, db):  # noqa: F811
    whole = _world(deps)
    lose_metadata(cli, db)

    rec = cli("recover-from-bucket", "--check-pages", "--json").ok().json
    # ledger 0 lies below the trim marker: reported unknown as before, but never recorded as lost
    assert rec["unknown"] == {"lx": [[0, 0], [2, 3], [5, 5]]}
    assert rec["lost_recorded"] == [{"topic": "lx", "ledger": i} for i in (2, 3, 5)] and rec["lost_recorded_count"] == 3
    # (ledger id, state, entries, bytes, lost, version, chunk row): 2 and 5 of unknown size, 3 as its index says
    assert _rows(db) == [(1, "OFFLOADED", 3, 300, False, 0, True), (2, "OFFLOADED", 0, 0, True, 0, False),
                         (3, "OFFLOADED", 3, 300, True, 0, False), (4, "OFFLOADED", 3, 300, False, 0, True),
                         (5, "OFFLOADED", 0, 0, True, 0, False)]

    # a read across them is told, ledger by ledger; ledger 0 (trimmed) is no loss
    lines = cli("read", "lx", "--json").ok().json_lines
    assert [x for x in lines if "gap" in x] == [
        {"gap": "DATALOSS", "from": "2:0", "to": None}, {"gap": "DATALOSS", "from": "3:0", "to": "3:2"},
        {"gap": "DATALOSS", "from": "5:0", "to": None}]
    assert read_data(cli("read", "lx", "--json")) == whole
    text_out = cli("read", "lx", "--from", "2:1", "--to", "4:0").ok().stdout.splitlines()
    assert text_out[0] == "# DATALOSS gap from 2:1 to the end of ledger 2 (entry count unknown)"
    assert text_out[1] == "# DATALOSS gap from 3:0 to 3:2" and text_out[2].startswith("4:0\t")
    err = cli("read", "lx", "--fail-on-dataloss").one_line_error(1)
    assert "lx/2" in err and "ledger lx/2 entries 0..the end (entry count unknown)" in err

    status = {r["ledger"]: r for r in cli("status", "lx", "--json").ok().json["ledgers"]}
    assert [(status[i]["lost"], status[i]["entry_count"], status[i]["tiers"]) for i in (2, 3, 5)] == [
        (True, None, []), (True, 3, []), (True, None, [])]
    assert "       2 OFFLOADED           ?            ?  LOST (no good copy)" in cli("status", "lx").ok().stdout
    # the Spark source plans them as any ledger (a part each, which reads as their DATALOSS gap), not as empty
    parts, _ = plan(deps.meta, deps.tier1, ["lx"], Pushed(), sees_tier1=True)
    assert [(p.led.ledger_id, p.chunk) for p in parts if p.led.lost] == [(2, None), (3, None), (5, None)]
    stats = cli("topic", "stats", "lx", "--json").ok().json["topics"][0]
    assert stats["lost_count"] == 3
    assert "3 LOST" in cli("topic", "stats", "lx").ok().stdout

    verify = cli("verify", "lx", "--json")
    assert verify.returncode == 1
    problems = verify.json["problems"]
    assert len(problems) == 3 and all("marked lost" in p and "not repairable" in p for p in problems)
    assert problems[0].startswith("ledger 2: entries 2:0..the end of ledger 2 (entry count unknown) are in no tier")

    # a second run adds nothing and changes nothing
    before = _rows(db)
    again = cli("recover-from-bucket", "--check-pages", "--json").ok().json
    assert again["lost_recorded"] == [] and again["ledgers_recovered_count"] == 0 and _rows(db) == before
    # the topic stays writable after them
    assert cli("produce", "lx", "--entries", "1", "--entry-size", "10").ok().stdout == "6:0\n"


def test_no_pipeline_command_touches_bytes_of_a_lost_ledger_and_retention_trims_it(cli, deps, db):  # noqa: F811
    _world(deps)
    lose_metadata(cli, db)
    cli("recover-from-bucket", "--check-pages").ok()
    cli("topic", "set", "lx", "--deletion-lag", "0", "--offload-after", "0").ok()
    keys = bucket_keys(deps)
    rows = _rows(db)

    for args in (("offload-by-age", "--json"), ("delete-lagged", "--json"), ("defrag", "--json"),
                 ("gc", "--json"), ("gc", "--sweep", "--orphan-grace-seconds", "0", "--json"),
                 ("retention", "--json"), ("table", "sync", "--json")):
        done = cli(*args)
        assert done.returncode == 0 and done.stderr == "", (args, done.stderr)
        assert done.json["failed"] == [], args
    # nothing moved; the corrupt copy of ledger 3 and ledger 5's data object stay (a restored bucket or a
    # rerun of recovery may still want them)
    assert _rows(db) == rows and bucket_keys(deps) == keys

    repaired = cli("repair", "--topic", "lx", "--json")
    assert repaired.returncode == 1  # a ledger is lost: said, not failed
    assert [x["ledger"] for x in repaired.json["lost"]] == [2, 3, 5] and repaired.json["failed"] == []
    assert _rows(db) == rows

    # the trim runs through them like any ledger: the whole head up to 6:0 is TRIMMED, nothing queued for GC
    cli("produce", "lx", "--entries", "1", "--entry-size", "10", "--seal").ok()
    cli("truncate", "lx", "6:0").ok()
    assert [x for x in cli("read", "lx", "--json").ok().json_lines if "gap" in x] == [
        {"gap": "TRIMMED", "from": "1:0", "to": None}]  # to the end of ledger 5, whose size nobody knows
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.gc_task")).scalar_one() == 4  # 1's and 4's pairs
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.ledger WHERE state <> 'DELETED'")).scalar_one() == 1
    assert cli("topic", "stats", "lx", "--json").ok().json["topics"][0]["lost_count"] == 0
    assert cli("verify", "lx").returncode == 0


def test_a_copy_back_in_the_bucket_turns_a_recorded_lost_ledger_into_an_ordinary_one(cli, deps, db):  # noqa: F811
    """The bucket restored from a backup after a recovery recorded a ledger lost: the next recovery gives
    it its copy back (one compare-free update of the row the earlier recovery made), and it reads again."""
    data = produce(deps, "ly", [entries(f"y{i}", 2, 50) for i in range(3)])
    offload_many(deps, deps.meta.list_ledgers("ly", [S.SEALED]))
    mid = deps.meta.chunks("ly")[1]
    for led in deps.meta.list_ledgers("ly"):
        deps.tier1.delete("ly", led.ledger_id)
    s3, name = deps.bucket.s3, deps.bucket.name
    saved = {k: s3.get_object(Bucket=name, Key=k)["Body"].read() for k in (mid.data_key, mid.index_key)}
    for k in saved:
        s3.delete_object(Bucket=name, Key=k)
    lose_metadata(cli, db)
    assert cli("recover-from-bucket", "--json").ok().json["lost_recorded_count"] == 1
    for k, body in saved.items():
        s3.put_object(Bucket=name, Key=k, Body=body)
    rec = cli("recover-from-bucket", "--json").ok().json
    assert rec["ledgers_recovered_count"] == 1 and rec["lost_recorded"] == []
    assert [r[:5] for r in _rows(db)] == [(i, "OFFLOADED", 2, 100, False) for i in range(3)]
    assert read_data(cli("read", "ly", "--json")) == data
    assert cli("verify", "ly").returncode == 0


def test_a_stray_key_naming_a_far_ledger_id_records_no_lost_rows_and_fails_saying_so(cli, deps, db):  # noqa: F811
    """Every unknown id below the largest a key names became a lost-ledger row: one stray object naming ledger
    10**12 had recovery build and insert a row for each id below it, in one transaction. One naming
    2**63 - 1, an id after which no next_ledger_id fits a bigint, failed the whole recovery (every topic).
    A stray whose content is not a ledger's (no block header of entry 0 at its start) names nothing: it is
    reported ignored and the topic recovers whole; one that starts as a ledger does (a ledger's data
    copied under a far id) is a ledger that existed, and the topic fails saying why."""
    import uuid

    from tiering.format.keys import data_key
    from tiering.metadata.recovery import MAX_LOST_ROWS

    produce(deps, "far", [entries("f", 3, 100)])
    produce(deps, "near", [entries("n", 2, 100)])
    assert len(offload_many(deps, deps.meta.list_ledgers("far", [S.SEALED])).offloaded) == 1
    assert len(offload_many(deps, deps.meta.list_ledgers("near", [S.SEALED])).offloaded) == 1
    far = 10**12
    s3, name, prefix = deps.bucket.s3, deps.bucket.name, deps.bucket.prefix
    junk = [data_key(prefix, "far", str(uuid.uuid4()), far), data_key(prefix, "far", str(uuid.uuid4()), far + 1),
            f"{data_key(prefix, 'near', str(uuid.uuid4()), 0)[:-1]}{2**63 - 1}"]
    for key, body in zip(junk, (b"not a ledger", b"\xfb" * 4096, b"x")):
        s3.put_object(Bucket=name, Key=key, Body=body)
    lose_metadata(cli, db)
    rec = cli("recover-from-bucket", "--json").ok().json
    assert rec["lost_recorded"] == [] and rec["unknown"] == {} and rec["errors"] == [], rec
    assert rec["ledgers_recovered_count"] == 2, rec
    assert rec["ignored_count"] >= 2, rec  # the two under "far" (the third's id is past any ledger id)
    with db.connect() as conn:
        assert conn.execute(text("SELECT name, next_ledger_id FROM tiering.topic ORDER BY name")).all() == \
            [("far", 1), ("near", 1)]

    ledger_data = s3.get_object(Bucket=name, Key=deps.meta.get_chunk(deps.meta.get_ledger("far", 0)).data_key)
    s3.put_object(Bucket=name, Key=junk[0], Body=ledger_data["Body"].read())  # a ledger's start, at id 10**12
    lose_metadata(cli, db)
    for _ in range(2):  # a rerun does the same: nothing half-written by the first
        res = cli("recover-from-bucket", "--json")
        assert res.returncode == 1, (res.stdout, res.stderr)
        rec = res.json
        assert rec["lost_recorded"] == [] and rec["unknown"] == {"far": [[1, far]]}, rec
        assert [e for e in rec["errors"] if f"more than the {MAX_LOST_ROWS}" in e and "'far'" in e], rec["errors"]
        assert rec["ledgers_recovered_count"] + rec["already_known_count"] == 2 and rec["ignored_count"] >= 1, rec
    with db.connect() as conn:
        assert conn.execute(text("SELECT name, next_ledger_id FROM tiering.topic ORDER BY name")).all() == \
            [("far", far + 1), ("near", 1)]


def test_the_top_ledger_whose_index_is_left_without_its_data_is_recorded_lost(cli, deps, db):  # noqa: F811
    """The last ledger's data object gone, its index object still there and whole: the index names the
    ledger, so it is recorded lost (its size as the index says) and its id is never handed out again."""
    produce(deps, "top", [entries(f"t{i}", 3, 100) for i in range(4)])
    assert len(offload_many(deps, deps.meta.list_ledgers("top", [S.SEALED])).offloaded) == 4
    for led in deps.meta.list_ledgers("top"):
        deps.tier1.delete("top", led.ledger_id)
    deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=deps.meta.chunks("top")[3].data_key)
    lose_metadata(cli, db)
    rec = cli("recover-from-bucket", "--json").ok().json
    assert rec["lost_recorded"] == [{"topic": "top", "ledger": 3}] and rec["unknown"] == {"top": [[3, 3]]}, rec
    assert _rows(db)[3] == (3, "OFFLOADED", 3, 300, True, 0, False)
    with db.connect() as conn:
        assert conn.execute(text("SELECT next_ledger_id FROM tiering.topic WHERE name = 'top'")).scalar() == 4


def test_subscriptions_may_name_any_entry_of_a_lost_ledger_of_unknown_size(cli, deps, db):  # noqa: F811
    """Subscriptions are not in the bucket: after a recovery the operator makes them again from the
    positions their readers had. One inside a lost ledger whose entry count nobody knows is taken (its
    reader gets the DATALOSS gap from there); one past the end of a lost ledger whose count is known is not."""
    _world(deps)
    lose_metadata(cli, db)
    cli("recover-from-bucket", "--check-pages").ok()
    made = cli("subscription", "create", "lx", "s", "--from", "2:57", "--json").ok().json
    assert made["position"] == "2:56"
    lines = cli("read", "lx", "--subscription", "s", "--json").ok().json_lines
    assert lines[0] == {"gap": "DATALOSS", "from": "2:57", "to": None}
    assert cli("subscription", "ack", "lx", "s", "5:9", "--json").ok().json["position"] == "5:9"
    assert "beyond the end of ledger 3 (3 entries)" in cli("subscription", "create", "lx", "t", "--from",
                                                           "3:5").one_line_error(2)
    assert "beyond the end of ledger 3 (3 entries)" in cli("subscription", "ack", "lx", "s", "3:3",
                                                           "--reset").one_line_error(2)
