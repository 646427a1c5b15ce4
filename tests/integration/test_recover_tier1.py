"""Recovery from the bucket takes tier 1 into account: a ledger that tier 1 still holds
and the bucket never got must not collide with the next ledger a producer creates, the tier-1 copy of an
offloaded ledger is recorded, an open ledger file is sealed and adopted, and a topic that only tier 1 knows
comes back. Through the real command on RGW and PostgreSQL."""
from __future__ import annotations

from sqlalchemy import text

from tests.integration.test_cli import cli, read_data  # noqa: F401 - the fixture
from tests.integration.test_export_recover import new_database  # noqa: F401  (extra databases)
from tiering.metadata.repository import MetadataStore
from tiering.workload import payload

TABLES = "tiering.topic, tiering.ledger, tiering.chunk, tiering.gc_task, tiering.attribute, tiering.job_run"


def lose_metadata(cli, db) -> None:
    """The database is lost: every row gone, the schema upgraded again (the sequence an operator
    recovering from the bucket goes through)."""
    with db.begin() as conn:
        conn.execute(text(f"TRUNCATE {TABLES} CASCADE"))
    cli("db", "upgrade").ok()


def rows(status) -> list[tuple]:
    return [(r["ledger"], r["state"], r["entry_count"], r["bytes"], r["tiers"]) for r in status.ok().json["ledgers"]]


def test_a_lost_database_with_tier1_ahead_of_the_bucket_ends_with_a_writable_topic(cli, db):
    cli("topic", "create", "r1", "--offload-after", "0").ok()
    cli("produce", "r1", "--entries", "3", "--entry-size", "100", "--seal").ok()
    assert "offloaded 1" in cli("offload-by-age").ok().stdout
    cli("produce", "r1", "--entries", "3", "--entry-size", "100", "--seal", "--seed", "b").ok()  # tier 1 only
    lose_metadata(cli, db)

    rec = cli("recover-from-bucket", "--json").ok().json_lines[0]
    assert rec["ledgers_recovered_count"] == 1 and rec["topics_created"] == ["r1"]
    # today's code: "ledger 1 of topic 'r1' already exists in tier 1"
    assert cli("produce", "r1", "--entries", "3", "--entry-size", "100", "--seed", "c").ok().stdout == "2:2\n"
    assert rec["tier1_adopted_count"] == 1 and rec["tier1_copies_recorded_count"] == 1, rec
    assert rec["unknown"] == {} and rec["errors"] == []
    assert rows(cli("status", "r1", "--json")) == [
        (0, "OFFLOADED", 3, 300, [1, 2]),  # its tier-1 copy is recorded (delete-lagged will remove it)
        (1, "SEALED", 3, 300, [1]),  # adopted from tier 1: offload-by-age takes it next
        (2, "OPEN", 3, 300, [1])]
    expected = {(0, i): payload("demo", i, 100) for i in range(3)}
    expected |= {(1, i): payload("b", i, 100) for i in range(3)} | {(2, i): payload("c", i, 100) for i in range(3)}
    assert read_data(cli("read", "r1", "--json")) == expected
    cli("produce", "r1", "--entries", "2", "--entry-size", "10", "--seal").ok()  # and again: still writable
    assert cli("produce", "r1", "--entries", "1", "--entry-size", "10").ok().stdout == "3:0\n"
    # ledgers 1 and 2 are ordinary SEALED ones (policies are not in the bucket: offload by prefix)
    assert [x["ledger"] for x in cli("offload-prefix", "r1", "3:0", "--json").ok().json["offloaded"]] == [1, 2]
    # a second run adds nothing and changes nothing
    again = cli("recover-from-bucket", "--json").ok().json_lines[0]
    assert again["ledgers_recovered_count"] == 0 and again["tier1_adopted_count"] == 0 and again["tier1_sealed_count"] == 0


def test_an_open_ledger_file_is_sealed_and_a_tier1_only_topic_comes_back(cli, db, tier1_root):
    cli("topic", "create", "o", "--offload-after", "0").ok()
    cli("produce", "o", "--entries", "4", "--entry-size", "50", "--seal").ok()
    cli("offload-by-age").ok()
    cli("produce", "o", "--entries", "2", "--entry-size", "50", "--seed", "open").ok()  # ledger 1 stays OPEN
    cli("topic", "create", "only/in tier 1").ok()  # never offloaded: the bucket knows nothing of it
    cli("produce", "only/in tier 1", "--entries", "5", "--entry-size", "20", "--seal").ok()
    cli("produce", "only/in tier 1", "--entries", "1", "--entry-size", "20").ok()
    lose_metadata(cli, db)

    rec = cli("recover-from-bucket", "--json").ok().json_lines[0]
    assert sorted(rec["topics_created"]) == ["o", "only/in tier 1"], rec
    assert rec["tier1_adopted_count"] == 3 and rec["tier1_sealed_count"] == 2, rec  # o/1, only/0, only/1 (the last two open)
    assert rows(cli("status", "o", "--json")) == [(0, "OFFLOADED", 4, 200, [1, 2]), (1, "SEALED", 2, 100, [1])]
    assert rows(cli("status", "only/in tier 1", "--json")) == [(0, "SEALED", 5, 100, [1]), (1, "SEALED", 1, 20, [1])]
    assert cli("produce", "o", "--entries", "1", "--entry-size", "5", "--seed", "n").ok().stdout == "2:0\n"
    assert cli("produce", "only/in tier 1", "--entries", "1", "--entry-size", "5").ok().stdout == "2:0\n"
    data = read_data(cli("read", "o", "--json"))
    assert data[(1, 1)] == payload("open", 1, 50) and data[(2, 0)] == payload("n", 0, 5) and len(data) == 7


def test_a_file_being_written_fails_its_topic_and_a_foreign_copy_is_reported(deps, db, new_database):  # noqa: F811
    from tests.integration.helpers import entries, produce
    from tiering.model import LedgerState as S
    from tiering.ops.offload import offload_many
    from tiering.ops.recover import recover_from_bucket
    from tiering.tier1 import LedgerWriter

    produce(deps, "w", [entries("w", 3, 10)], open_tail=[b"x"])  # ledger 1 open
    produce(deps, "f", [entries("f", 3, 10)])
    offload_many(deps, deps.meta.list_ledgers("w", [S.SEALED]) + deps.meta.list_ledgers("f", [S.SEALED]))
    path = deps.tier1.path("f", 0)  # f's tier-1 copy replaced by another ledger's bytes
    path.unlink()
    with LedgerWriter(path) as other:
        other.append(b"not the offloaded ledger")
        other.seal()
    target = new_database()
    with LedgerWriter(deps.tier1.path("w", 1), open_existing=True):  # a producer still writes ledger 1 of w
        report = recover_from_bucket(target, deps.bucket, tier1=deps.tier1)
    assert len(report.errors) == 1 and "'w'" in report.errors[0] and "stop its producer" in report.errors[0]
    assert report.topics_created == ["f"]  # w: nothing committed, a rerun finishes it
    assert report.tier1_copies_recorded == [] and report.tier1_ignored == [
        ("f/0", "file holds 1 entries, 24 bytes; the offloaded copy 3, 30: left alone")]
    assert [(led.state, led.tier1_present) for led in MetadataStore(target).list_ledgers("f")] == [(S.OFFLOADED, False)]
    again = recover_from_bucket(target, deps.bucket, tier1=deps.tier1)  # the producer stopped
    assert again.ok and again.topics_created == ["w"] and again.tier1_sealed == [("w", 1)]
    assert MetadataStore(target).get_topic("w").next_ledger_id == 2


def test_recover_flags_refuse_bad_input_before_any_work(cli, db):
    assert "at most 256" in cli("recover-from-bucket", "--concurrency", "257").one_line_error(2)
    assert "contradict" in cli("recover-from-bucket", "--check-pages", "--skip-page-check").one_line_error(2)
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.topic")).scalar() == 0


def test_a_recovered_copy_is_checked_before_the_tier1_copy_it_would_replace_is_deleted(deps, new_database):
    """A flipped byte in a data object, then the database lost: recovery (pages not checked) records the
    copies with no ETags, so delete-lagged checks each copy whole before deleting the tier-1 file beside it:
    the corrupt one's tier-1 copy is kept (the only good one), the sound one's is deleted."""
    from dataclasses import replace

    from sqlalchemy import text

    from tests.integration.helpers import entries, produce
    from tiering.metadata.repository import MetadataStore
    from tiering.model import LedgerState as S, TopicPolicy
    from tiering.ops.delete_lagged import delete_lagged
    from tiering.ops.offload import offload_many
    from tiering.ops.recover import recover_from_bucket

    produce(deps, "c", [entries(f"c{i}", 3, 100) for i in range(2)],
            TopicPolicy(deletion_lag_seconds=0, rollover_entries=10**9, rollover_bytes=2**40))
    offload_many(deps, deps.meta.list_ledgers("c", [S.SEALED]))
    bad = deps.meta.get_chunk(deps.meta.get_ledger("c", 0))
    s3, name = deps.bucket.s3, deps.bucket.name
    body = bytearray(s3.get_object(Bucket=name, Key=bad.data_key)["Body"].read())
    body[bad.data_offset + 200] ^= 0x01
    s3.put_object(Bucket=name, Key=bad.data_key, Body=bytes(body))
    target = new_database()
    assert recover_from_bucket(target, deps.bucket, tier1=deps.tier1).ok
    meta = MetadataStore(target)
    assert all(meta.get_chunk(led).data_etag is None for led in meta.list_ledgers("c"))
    with target.begin() as conn:  # the recovered topic takes the default policy: no lag here
        conn.execute(text("UPDATE tiering.topic SET deletion_lag_seconds = 0"))
    report = delete_lagged(replace(deps, meta=meta), "c")
    assert report.deleted == [("c", 1)] and [(t, i) for t, i, _ in report.failed] == [("c", 0)]
    assert "fails its check" in report.failed[0][2]
    assert deps.tier1.exists("c", 0) and meta.get_ledger("c", 0).tier1_present
    assert meta.get_chunk(meta.get_ledger("c", 1)).data_etag is not None  # checked once, recorded


def test_recovery_brings_back_ledgers_metadata_has_as_sealed_whose_copy_is_in_the_bucket(deps, db):
    """Metadata restored from an export taken before ledgers 1 and 2 were offloaded and their tier-1 copies
    deleted: SEALED rows, no chunk rows, no files. Recovery makes them OFFLOADED with the bucket's copies
    (their tier-1 copies recorded as gone), reads give every entry, and a rerun changes nothing."""
    from sqlalchemy import text

    from tests.integration.helpers import entries, produce
    from tiering.model import LedgerState as S, TopicPolicy
    from tiering.ops.delete_lagged import delete_lagged
    from tiering.ops.offload import offload_many
    from tiering.ops.recover import recover_from_bucket
    from tiering.read import Entry, ReadHandle
    from tiering.tier2.reader import tier2_opener

    expected = produce(deps, "s", [entries(f"s{i}", 3, 100) for i in range(3)],
                       TopicPolicy(deletion_lag_seconds=0, rollover_entries=10**9, rollover_bytes=2**40))
    offload_many(deps, deps.meta.list_ledgers("s", [S.SEALED]))
    assert sorted(delete_lagged(deps, "s").deleted) == [("s", 0), ("s", 1), ("s", 2)]
    with db.begin() as conn:  # as the older export had them
        conn.execute(text("DELETE FROM tiering.chunk WHERE ledger_id IN (1, 2)"))
        conn.execute(text("UPDATE tiering.ledger SET state = 'SEALED', tier1_present = true, offload_uuid = NULL, "
                          "offloaded_at = NULL, tier1_deleted_at = NULL WHERE ledger_id IN (1, 2)"))
    report = recover_from_bucket(db, deps.bucket, tier1=deps.tier1)
    assert report.ok and sorted(report.ledgers_recovered) == [("s", 1), ("s", 2)]
    assert [(led.state, led.tier1_present) for led in deps.meta.list_ledgers("s")] == [(S.OFFLOADED, False)] * 3
    got = {(e.ledger_id, e.entry_id): e.data
           for e in ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket)).read("s") if isinstance(e, Entry)}
    assert got == expected
    again = recover_from_bucket(db, deps.bucket, tier1=deps.tier1)
    assert again.ok and again.ledgers_recovered == [] and len(again.already_known) == 3


def test_recovery_records_a_tier1_copy_metadata_still_claims_as_gone_only_on_the_right_root(deps, db, tmp_path):
    """Metadata from an export taken before delete-lagged removed ledger 0's tier-1 copy: OFFLOADED, its
    row says tier 1 holds a copy that is not there, so every delete-lagged run failed on it. Recovery with
    the root that holds the topic records the copy gone; from a root without the topic it records nothing."""
    from sqlalchemy import text

    from tests.integration.helpers import entries, produce
    from tiering.model import LedgerState as S, TopicPolicy
    from tiering.ops.delete_lagged import delete_lagged
    from tiering.ops.offload import offload_many
    from tiering.ops.recover import recover_from_bucket
    from tiering.tier1 import Tier1Store

    produce(deps, "g", [entries(f"g{i}", 3, 100) for i in range(2)],
            TopicPolicy(deletion_lag_seconds=0, rollover_entries=10**9, rollover_bytes=2**40))
    offload_many(deps, deps.meta.list_ledgers("g", [S.SEALED]))
    assert sorted(delete_lagged(deps, "g").deleted) == [("g", 0), ("g", 1)]
    with db.begin() as conn:  # as the older export had ledger 0
        conn.execute(text("UPDATE tiering.ledger SET tier1_present = true, tier1_deleted_at = NULL "
                          "WHERE ledger_id = 0"))
    assert [i for _, i, _ in delete_lagged(deps, "g").failed] == [0]
    elsewhere = tmp_path / "other-root"
    elsewhere.mkdir()
    wrong = recover_from_bucket(db, deps.bucket, tier1=Tier1Store(elsewhere))
    assert wrong.ok and wrong.tier1_copies_gone == [] and deps.meta.get_ledger("g", 0).tier1_present
    report = recover_from_bucket(db, deps.bucket, tier1=deps.tier1)
    assert report.ok and report.tier1_copies_gone == [("g", 0)]
    assert not deps.meta.get_ledger("g", 0).tier1_present
    assert delete_lagged(deps, "g").failed == []
    assert recover_from_bucket(db, deps.bucket, tier1=deps.tier1).tier1_copies_gone == []


def test_delete_lagged_dry_run_records_no_etags(deps, db):
    """A chunk row without ETags (as recovery writes it) is checked whole before its tier-1 copy goes, and
    the real run records the ETags it checked. `delete-lagged --dry-run` does the same check and writes
    nothing: the rows keep no ETags."""
    from tests.integration.helpers import entries, produce
    from tiering.model import LedgerState as S, TopicPolicy
    from tiering.ops.delete_lagged import preview
    from tiering.ops.offload import offload_many

    produce(deps, "dl", [entries(f"dl{i}", 3, 100) for i in range(2)],
            policy=TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40, deletion_lag_seconds=0))
    offload_many(deps, deps.meta.list_ledgers("dl", [S.SEALED]))
    with db.begin() as conn:
        conn.execute(text("UPDATE tiering.chunk SET data_etag = NULL, index_etag = NULL"))
    report = preview(deps, "dl")
    assert len(report.deleted) == 2 and report.failed == []
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.chunk WHERE data_etag IS NOT NULL "
                                 "OR index_etag IS NOT NULL")).scalar_one() == 0


def test_a_last_ledger_whose_copy_is_bad_keeps_its_id_and_is_reported_unknown(deps, new_database):  # noqa: F811
    """The newest ledgers' copies are corrupt (a flipped page, checked) or incomplete (the index gone), with
    no tier-1 copy: recovery cannot bring them back, but their keys name them. They are reported unknown,
    and the topic's next ledger id moves past them: a new ledger must not take the id (and positions) of one
    that existed, nor a topic whose every copy is bad vanish unsaid."""
    from tests.integration.helpers import entries, produce
    from tiering.model import LedgerState as S
    from tiering.ops.offload import offload_many
    from tiering.ops.recover import recover_from_bucket

    for topic in ("d", "e"):
        produce(deps, topic, [entries(f"{topic}{i}", 3, 100) for i in range(3)])
        offload_many(deps, deps.meta.list_ledgers(topic, [S.SEALED]))
        for led in deps.meta.list_ledgers(topic):
            deps.tier1.delete(topic, led.ledger_id)
    s3, name = deps.bucket.s3, deps.bucket.name
    flipped = [deps.meta.get_chunk(deps.meta.get_ledger(t, i)) for t, i in (("d", 1), ("e", 0), ("e", 1))]
    for ch in flipped:
        body = bytearray(s3.get_object(Bucket=name, Key=ch.data_key)["Body"].read())
        body[ch.data_offset + 150] ^= 0x01
        s3.put_object(Bucket=name, Key=ch.data_key, Body=bytes(body))
    for t in ("d", "e"):
        s3.delete_object(Bucket=name, Key=deps.meta.get_chunk(deps.meta.get_ledger(t, 2)).index_key)
    target = new_database()
    report = recover_from_bucket(target, deps.bucket, tier1=deps.tier1, check_pages=True)
    assert report.ok and report.ledgers_recovered == [("d", 0)]
    assert report.unknown == {"d": [(1, 2)], "e": [(0, 2)]}
    with target.connect() as conn:
        assert dict(conn.execute(text("SELECT name, next_ledger_id FROM tiering.topic")).all()) == {"d": 3, "e": 3}


def test_a_bad_page_in_a_shared_object_loses_only_its_own_ledger(deps, new_database):  # noqa: F811
    """Three small ledgers offloaded together into one object pair, no tier-1 copies, a flipped byte in the
    middle one's pages: a recovery that checks pages brings back the other two (their own pages check) and
    reports the middle one unknown."""
    import dataclasses

    from tests.integration.helpers import MIB, entries, produce
    from tiering.model import LedgerState as S
    from tiering.ops.offload import offload_many
    from tiering.ops.recover import recover_from_bucket

    batched = dataclasses.replace(deps, knobs=dataclasses.replace(deps.knobs, batch_small_bytes=8 * MIB))
    produce(deps, "f", [entries(f"f{i}", 3, 100) for i in range(3)])
    assert len(offload_many(batched, deps.meta.list_ledgers("f", [S.SEALED])).offloaded) == 3
    chunks = deps.meta.chunks("f")
    assert len({c.data_key for c in chunks.values()}) == 1
    for led in deps.meta.list_ledgers("f"):
        deps.tier1.delete("f", led.ledger_id)
    s3, name, mid = deps.bucket.s3, deps.bucket.name, chunks[1]
    body = bytearray(s3.get_object(Bucket=name, Key=mid.data_key)["Body"].read())
    body[mid.data_offset + 150] ^= 0x01
    s3.put_object(Bucket=name, Key=mid.data_key, Body=bytes(body))
    target = new_database()
    report = recover_from_bucket(target, deps.bucket, tier1=deps.tier1, check_pages=True)
    assert report.ok and sorted(report.ledgers_recovered) == [("f", 0), ("f", 2)]
    assert report.unknown == {"f": [(1, 1)]}
    assert [why for key, why in report.ignored if key == mid.index_key and why.startswith("ledger 1: invalid")]


def test_check_pages_reports_a_damaged_tier1_file_instead_of_adopting_it(cli, db, tier1_root):
    """A sealed tier-1 file with a damaged entry (its header and trailer intact) was adopted as a SEALED
    ledger, exit 0, with --check-pages too: every read, offload and verify of it then failed."""
    cli("topic", "create", "dm").ok()
    cli("produce", "dm", "--entries", "4", "--entry-size", "200", "--seal").ok()
    cli("produce", "dm", "--entries", "4", "--entry-size", "200", "--seal", "--seed", "b").ok()
    [path] = [p for p in tier1_root.rglob("*") if p.is_file() and p.name.startswith("0") and int(p.stem) == 1]
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x5A  # inside an entry's payload
    path.write_bytes(bytes(raw))
    lose_metadata(cli, db)
    preview = cli("recover-from-bucket", "--check-pages", "--dry-run", "--json").ok().json_lines[0]
    rec = cli("recover-from-bucket", "--check-pages", "--json").ok().json_lines[0]
    for report in (preview, rec):
        assert report["tier1_adopted_count"] == 1, report  # ledger 0 only
        [ignored] = report["tier1_ignored"]
        assert ignored.startswith("dm/1: corrupt"), ignored
    assert [r[0] for r in rows(cli("status", "dm", "--json"))] == [0]



def test_a_long_tier1_only_topic_comes_back_by_the_name_beside_its_ledgers(cli, db, tier1_root):
    """A long topic's directory name holds a cut of its name and a hash: tier 1 writes the whole name beside
    its ledgers, and a recovery reads it from there. A directory without it (made before tier 1 wrote one)
    is not recovered silently: the run exits 1 naming it and the way back (--topic NAME); once the topic is
    known to metadata, a plain run names the directory by it."""
    from tiering.tier1.paths import NAME_FILE, topic_dir

    long, other = "ä" * 300, "ö" * 300
    for name in (long, other):
        cli("topic", "create", "--", name).ok()
        cli("produce", "--entries", "2", "--entry-size", "5", "--seal", "--", name).ok()
        cli("produce", "--entries", "2", "--entry-size", "5", "--", name).ok()  # an open ledger too
    assert (topic_dir(tier1_root, long) / NAME_FILE).read_bytes() == long.encode()
    (topic_dir(tier1_root, other) / NAME_FILE).unlink()  # as a directory made before the name was written
    lose_metadata(cli, db)

    preview = cli("recover-from-bucket", "--dry-run", "--json").ok().json_lines[0]  # a preview: exit 0
    assert preview["unnamed_tier1_dirs"] == [topic_dir(tier1_root, other).name]
    failed = cli("recover-from-bucket", "--json")
    msg = failed.one_line_error(1)
    assert "1 tier-1 directory not recovered" in msg and "--topic NAME" in msg, msg
    assert failed.json_lines[0]["unnamed_tier1_dirs"] == [topic_dir(tier1_root, other).name]
    assert [t["topic"] for t in cli("topic", "list", "--json").ok().json["topics"]] == [long]  # by its file

    rec = cli("recover-from-bucket", "--topic", other, "--json").ok().json_lines[0]
    assert rec["tier1_adopted_count"] == 2 and rec["unnamed_tier1_dirs"] == []
    again = cli("recover-from-bucket", "--json").ok().json_lines[0]  # metadata names its directory now
    assert again["unnamed_tier1_dirs"] == [] and again["tier1_adopted_count"] == 0
    for name in (long, other):
        assert cli("produce", "--entries", "1", "--entry-size", "5", "--", name).ok().stdout == "2:0\n"
