"""The `tiering` Spark data source on a real local[2] Spark, RGW and PostgreSQL: a topic across
tier 1 only, tier 2 only and both, a trimmed head, an open tail and a batched object pair reads back
byte-exact against ReadHandle (what `tiering read` prints); pushed filters on ledger_id and sealed_at plan
only the matching ledgers; a large ledger is split along its page index; a flipped byte in tier 2 fails
the query naming the object. One Spark session and one world for the module (a session costs seconds)."""
from __future__ import annotations

import dataclasses
import pytest

from tests.conftest import empty_world
from tests.integration.helpers import MIB, entries, make_deps, produce
from tiering.config import Settings
from tiering.model import LedgerState as S, Position
from tiering.ops.offload import offload_ledger, offload_many
from tiering.ops.retention import truncate
from tiering.read import Entry, ReadHandle
from tiering.spark.filters import Pushed, push
from tiering.spark.plan import plan
from tiering.tier2.reader import tier2_opener

pyspark = pytest.importorskip("pyspark")
JDBC_JAR = "/usr/share/java/postgresql.jar"  # ad-hoc SQL joins the metadata tables over JDBC


@pytest.fixture(scope="module")
def world(engine, s3_client, run_bucket, s3_settings, database_url, tmp_path_factory):
    """mix: L0 trimmed, L1 tier 2 only, L2 both tiers, L3 tier 1 only, L4 open. pair: two ledgers in one
    batched object pair. big: one ledger of ~2 MiB in tier 2 only (split by the page index)."""
    empty_world(engine, s3_client, run_bucket)
    root = tmp_path_factory.mktemp("tier1")
    deps = make_deps(engine, s3_client, run_bucket, root, page_size=16 * 1024)
    produce(deps, "mix", [entries(f"m{i}", 20 + i, 700 + 13 * i) for i in range(4)],
            open_tail=entries("tail", 7, 300))
    l0, l1, l2, _l3 = deps.meta.list_ledgers("mix", [S.SEALED])
    for led in (l0, l1, l2):
        offload_ledger(deps, led)
    for lid in (0, 1):
        done = deps.meta.get_ledger("mix", lid)
        deps.tier1.delete("mix", lid)
        deps.meta.mark_tier1_deleted(done)
    truncate(deps, "mix", Position(1, 0))  # L0 trimmed: a gap, absent rows
    produce(deps, "pair", [entries(f"p{i}", 9, 500) for i in range(2)])
    batched = dataclasses.replace(deps, knobs=dataclasses.replace(deps.knobs, batch_small_bytes=8 * MIB))
    report = offload_many(batched, deps.meta.list_ledgers("pair", [S.SEALED]))
    assert len(report.offloaded) == 2
    chunks = deps.meta.chunks("pair")
    assert chunks[0].data_key == chunks[1].data_key  # one object pair for both
    produce(deps, "big", [entries("big", 2000, 1000)])
    big = offload_ledger(deps, deps.meta.list_ledgers("big", [S.SEALED])[0])
    deps.tier1.delete("big", big.ledger_id)
    deps.meta.mark_tier1_deleted(deps.meta.get_ledger("big", big.ledger_id))
    settings = Settings(database_url=database_url, bucket=run_bucket, tier1_root=root, prefix="t/",
                        s3_endpoint_url=s3_settings["endpoint_url"],
                        aws_access_key_id=s3_settings["aws_access_key_id"],
                        aws_secret_access_key=s3_settings["aws_secret_access_key"],
                        aws_region=s3_settings["region_name"])
    return deps, settings


@pytest.fixture(scope="module")
def spark(world):
    from pyspark.sql import SparkSession

    from tiering.spark import register

    session = (SparkSession.builder.master("local[2]").appName("test-spark-source")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.jars", JDBC_JAR).config("spark.driver.extraClassPath", JDBC_JAR).getOrCreate())
    register(session, world[1])
    yield session
    session.stop()


def read_handle(deps, topic):
    got, gaps = {}, []
    for item in ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket)).read(topic):
        if isinstance(item, Entry):
            got[(item.ledger_id, item.entry_id)] = item.data
        else:
            gaps.append(item)
    return got, gaps


def rows(df):
    return {(r.ledger_id, r.entry_id): bytes(r.payload) for r in df.collect()}


def test_a_topic_across_both_tiers_reads_back_byte_exact(world, spark):
    deps, _ = world
    expected, gaps = read_handle(deps, "mix")
    assert [g.kind for g in gaps] == ["TRIMMED"] and {lid for lid, _ in expected} == {1, 2, 3, 4}
    df = spark.read.format("tiering").option("topic", "mix").load()
    assert df.columns == ["topic", "ledger_id", "entry_id", "payload", "tier", "sealed_at", "offloaded_at"]
    assert rows(df) == expected
    tiers = {r.ledger_id: r.tier for r in df.select("ledger_id", "tier").distinct().collect()}
    assert tiers == {1: "tier2", 2: "tier1", 3: "tier1", 4: "tier1"}  # both tiers: tier 1 where it sees the root
    assert df.count() == len(expected)


def test_a_batched_object_pair_and_several_topics(world, spark):
    deps, _ = world
    expected = {("pair",) + k: v for k, v in read_handle(deps, "pair")[0].items()}
    expected.update({("mix",) + k: v for k, v in read_handle(deps, "mix")[0].items()})
    df = spark.read.format("tiering").option("topics", "pair,mix").load()
    assert {(r.topic, r.ledger_id, r.entry_id): bytes(r.payload) for r in df.collect()} == expected
    like = spark.read.format("tiering").option("topicPattern", "pa%").load()
    assert like.count() == 18


def test_a_large_ledger_splits_along_its_pages_and_reads_back(world, spark):
    deps, _ = world
    expected, _ = read_handle(deps, "big")
    df = spark.read.format("tiering").option("topic", "big").option("splitBytes", str(256 * 1024)) \
        .option("packBytes", "0").load()
    assert df.rdd.getNumPartitions() >= 7  # ~2 MiB in runs of at most 256 KiB of pages, not packed back
    assert rows(df) == expected


def planned(spark, topic, where):
    # one partition per ledger (no packing by the session's parallelism): the count says what was planned
    df = spark.read.format("tiering").option("topic", topic).option("packBytes", "0").load().where(where)
    return df, df.rdd.getNumPartitions()


def test_a_scan_is_packed_into_about_one_wave_of_the_sessions_cores(world, spark):
    deps, _ = world
    expected, _ = read_handle(deps, "mix")
    df = spark.read.format("tiering").option("topic", "mix").load()
    cores = spark.sparkContext.defaultParallelism
    readable = [led for led in deps.meta.list_ledgers("mix") if led.state != S.DELETED]  # one part each
    assert len(readable) > cores + 1
    assert df.rdd.getNumPartitions() <= cores + 1 and rows(df) == expected
    apart = spark.read.format("tiering").option("topic", "mix").option("packBytes", "0").load()
    assert apart.rdd.getNumPartitions() == len(readable) and rows(apart) == expected


def test_filters_prune_ledgers_before_reading(world, spark):
    deps, settings = world
    expected, _ = read_handle(deps, "mix")
    df, n = planned(spark, "mix", "ledger_id between 2 and 3")
    assert n == 2  # one partition per matching ledger, nothing planned for the others
    assert rows(df) == {k: v for k, v in expected.items() if 2 <= k[0] <= 3}
    sealed = {led.ledger_id: led.sealed_at for led in deps.meta.list_ledgers("mix")}
    df, n = planned(spark, "mix", f"sealed_at >= timestamp'{sealed[2].isoformat()}' and sealed_at is not null")
    assert n == 2  # L2 and L3 (L4 is open: sealed_at null)
    assert {k[0] for k in rows(df)} == {2, 3}
    df, n = planned(spark, "mix", "entry_id in (3, 5) and ledger_id = 1")
    assert n == 1 and sorted(rows(df)) == [(1, 3), (1, 5)]
    packed = spark.read.format("tiering").option("topic", "mix").option("packBytes", str(MIB)).load()
    assert packed.rdd.getNumPartitions() == 1 and rows(packed) == expected  # four small ledgers, one task
    df, n = planned(spark, "mix", "offloaded_at is null")
    assert {k[0] for k in rows(df)} == {3, 4}
    # the planner's own counts: the same filter pushed directly
    pushed = Pushed()
    # a Spark filter's shape: its class name, an attribute tuple, a value
    gt = type("GreaterThanOrEqual", (), {"attribute": ("ledger_id",), "value": 2})()
    lt = type("LessThanOrEqual", (), {"attribute": ("ledger_id",), "value": 3})()
    other = type("EqualTo", (), {"attribute": ("payload",), "value": b"x"})()
    assert push(pushed, [gt, lt, other]) == [other]
    parts, stats = plan(deps.meta, deps.tier1, ["mix"], pushed, sees_tier1=True)
    assert [p.led.ledger_id for p in parts] == [2, 3] and stats.ledgers_seen == 5 and stats.ledgers_kept == 2
    assert stats.bytes == sum(p.led.size_bytes for p in parts)


def test_count_without_payload_reads_no_bytes(world, spark):
    deps, _ = world
    expected, _ = read_handle(deps, "mix")
    df = spark.read.format("tiering").option("topic", "mix").option("payload", "false").load()
    assert df.count() == len(expected)
    assert df.where("payload is not null").count() == 0


def test_a_flipped_byte_in_tier2_fails_the_query_naming_the_object(world, spark):
    deps, _ = world
    ch = deps.meta.chunks("big")[0]
    b = deps.bucket
    original = b.s3.get_object(Bucket=b.name, Key=ch.data_key)["Body"].read()
    spot = ch.data_offset + ch.data_length // 2
    flipped = original[:spot] + bytes([original[spot] ^ 0x40]) + original[spot + 1:]
    b.s3.put_object(Bucket=b.name, Key=ch.data_key, Body=flipped)
    try:
        with pytest.raises(Exception) as err:
            spark.read.format("tiering").option("topic", "big").load().collect()
        text = str(err.value)
        assert "CorruptObjectError" in text and ch.data_key in text and "page" in text and "offset" in text
    finally:
        b.s3.put_object(Bucket=b.name, Key=ch.data_key, Body=original)


def test_permissive_mode_turns_each_finding_into_a_row_and_reads_on(world, spark):
    """mode PERMISSIVE: big's corrupt page ends its partition in one row naming the object, after the
    entries of the pages before it; mix's ledger 3 with no tier holding it is one DATALOSS row; every other
    ledger reads whole; the entry rows are what FAILFAST reads, with a null `error`."""
    deps, _ = world
    big, _ = read_handle(deps, "big")
    mix, _ = read_handle(deps, "mix")
    ch = deps.meta.chunks("big")[0]
    b = deps.bucket
    original = b.s3.get_object(Bucket=b.name, Key=ch.data_key)["Body"].read()
    spot = ch.data_offset + ch.data_length * 3 // 4  # past the scan's first group of pages (~1 MiB)
    b.s3.put_object(Bucket=b.name, Key=ch.data_key,
                    Body=original[:spot] + bytes([original[spot] ^ 1]) + original[spot + 1:])
    path = deps.tier1.path("mix", 3)
    saved = path.read_bytes()
    path.unlink()
    try:
        df = spark.read.format("tiering").option("topics", "big,mix").option("mode", "permissive") \
            .option("packBytes", "0").load()
        assert df.columns[-1] == "error" and len(df.columns) == 8
        got = df.collect()
    finally:
        b.s3.put_object(Bucket=b.name, Key=ch.data_key, Body=original)
        path.write_bytes(saved)
    errors = sorted((r.topic, r.ledger_id, r.entry_id, r.error) for r in got if r.error is not None)
    entries_ = {(r.topic, r.ledger_id, r.entry_id): bytes(r.payload) for r in got if r.error is None}
    assert [e[:2] for e in errors] == [("big", 0), ("mix", 3)], errors
    (_, _, at, corrupt), (_, _, lost_at, lost) = errors
    assert corrupt.startswith("CorruptObjectError: ") and ch.data_key in corrupt and "page" in corrupt
    assert lost.startswith("DataLossError: DATALOSS") and lost_at == 0
    read_big = sorted(k[2] for k in entries_ if k[0] == "big")
    assert 0 < at < 2000 and read_big == list(range(at))  # the entries before the corrupt page, then the row
    assert all(entries_[("big", 0, e)] == big[(0, e)] for e in read_big)
    assert {k[1:]: v for k, v in entries_.items() if k[0] == "mix"} == {k: v for k, v in mix.items() if k[0] != 3}
    assert all(r.payload is None and r.tier is None for r in got if r.error is not None)
    plain = spark.read.format("tiering").option("topic", "mix").option("mode", "FAILFAST").load()
    assert "error" not in plain.columns and rows(plain) == mix
    with pytest.raises(Exception, match="option mode is FAILFAST or PERMISSIVE"):
        spark.read.format("tiering").option("topic", "mix").option("mode", "lenient").load().count()


def test_dataloss_fails_unless_skipped(world, spark):
    deps, _ = world
    led = deps.meta.get_ledger("mix", 3)  # tier 1 only: remove its file behind the metadata's back
    path = deps.tier1.path("mix", 3)
    saved = path.read_bytes()
    path.unlink()
    try:
        with pytest.raises(Exception) as err:
            spark.read.format("tiering").option("topic", "mix").load().where("ledger_id = 3").collect()
        assert "DATALOSS" in str(err.value)
        df = spark.read.format("tiering").option("topic", "mix").option("skipDataLoss", "true").load()
        assert 3 not in {r.ledger_id for r in df.select("ledger_id").distinct().collect()}
        # skipped is not a finding: in mode PERMISSIVE too, no error row for it
        both = spark.read.format("tiering").option("topic", "mix").option("skipDataLoss", "true") \
            .option("mode", "PERMISSIVE").load()
        got = {(r.ledger_id, r.error) for r in both.select("ledger_id", "error").distinct().collect()}
        assert got and all(error is None and ledger != 3 for ledger, error in got), got
    finally:
        path.write_bytes(saved)
    assert led.state == S.SEALED


def test_bad_options_are_refused(world, spark):
    with pytest.raises(Exception, match="exactly one of the options"):
        spark.read.format("tiering").load().count()
    with pytest.raises(Exception, match="skipDataLoss is true or false"):
        spark.read.format("tiering").option("topic", "mix").option("skipDataLoss", "yes").load().count()



def _scrub_row(deps):
    from sqlalchemy import text

    with deps.meta.engine.connect() as conn:
        return dict(conn.execute(text("SELECT * FROM tiering.job_run WHERE kind = 'scrub' "
                                      "ORDER BY run_id DESC LIMIT 1")).one()._mapping)


def test_scrub_records_every_topic_then_names_a_corrupt_one(world, spark, monkeypatch):
    from tiering.jobs import scrub

    deps, settings = world
    for key, value in settings.to_env().items():
        monkeypatch.setenv(key, value)
    assert scrub.main([]) == 0
    row = _scrub_row(deps)
    expected = sum(len(read_handle(deps, t)[0]) for t in ("big", "mix", "pair"))
    assert row["status"] == "SUCCEEDED" and row["items_done"] == 3 and row["details"]["entries"] == expected
    assert (row["details"]["queries"], row["details"]["findings"]) == (1, 0)
    # nothing broken: the repair's check found nothing (no listing: it read the chunk rows' objects only)
    assert (row["details"]["repairable"], row["details"]["unrepairable"], row["details"]["repair"]) == (0, 0, False)
    ch = deps.meta.chunks("big")[0]
    b = deps.bucket
    original = b.s3.get_object(Bucket=b.name, Key=ch.data_key)["Body"].read()
    spot = ch.data_offset + 100
    b.s3.put_object(Bucket=b.name, Key=ch.data_key,
                    Body=original[:spot] + bytes([original[spot] ^ 1]) + original[spot + 1:])
    try:
        assert scrub.main([]) == 1
    finally:
        b.s3.put_object(Bucket=b.name, Key=ch.data_key, Body=original)
    row = _scrub_row(deps)
    assert row["status"] == "FAILED" and row["items_failed"] == 1 and row["details"]["failed_topics"] == ["big"]
    assert ch.data_key in row["error"] and "big: ledger 0 from entry 0: CorruptObjectError" in row["error"]
    # one query named the finding (PERMISSIVE): no query per topic; the two sound topics counted whole
    assert (row["details"]["queries"], row["details"]["findings"], row["items_done"]) == (1, 1, 2)
    # big has no tier-1 copy: its broken copy is not repairable (checked only: nothing marked)
    assert (row["details"]["repairable"], row["details"]["unrepairable"], row["details"]["lost"]) == (0, 1, 0)
    assert not deps.meta.get_ledger("big", 0).lost


def test_scrub_repairs_a_broken_copy_it_read_from_tier1(world, spark, monkeypatch):
    """mix's ledger 2 is read from its tier-1 copy: the Spark scrub passes, the repair's check of its tier-2
    copy finds the flipped byte and, with --repair, re-makes the copy."""
    from tiering.jobs import scrub

    deps, settings = world
    for key, value in settings.to_env().items():
        monkeypatch.setenv(key, value)
    ch = deps.meta.chunks("mix")[2]
    b = deps.bucket
    original = b.s3.get_object(Bucket=b.name, Key=ch.data_key)["Body"].read()
    spot = ch.data_offset + 150
    b.s3.put_object(Bucket=b.name, Key=ch.data_key,
                    Body=original[:spot] + bytes([original[spot] ^ 1]) + original[spot + 1:])
    assert scrub.main(["--topic", "mix"]) == 1  # found, reported, not repaired
    row = _scrub_row(deps)
    assert (row["details"]["repairable"], row["details"]["repaired"]) == (1, 0) and "repairable" in row["error"]
    assert deps.meta.chunks("mix")[2] == ch
    assert scrub.main(["--topic", "mix", "--repair"]) == 0
    row = _scrub_row(deps)
    assert (row["status"], row["details"]["repairable"], row["details"]["repaired"]) == ("SUCCEEDED", 1, 1)
    assert deps.meta.chunks("mix")[2].data_key != ch.data_key
    assert scrub.main(["--topic", "mix"]) == 0 and _scrub_row(deps)["details"]["repairable"] == 0


def test_a_corrupt_tier1_copy_of_an_offloaded_ledger_is_read_from_tier2_and_the_scrub_names_it(world, spark,
                                                                                                 monkeypatch, capsys):
    """mix's ledger 2 is offloaded with its tier-1 copy kept: a flipped byte in that copy is read around
    through the checked tier-2 copy by default, fails the query with strictTier1, and the scrub (strict)
    reports it, repairable (the repair deletes the tier-1 copy: tests/integration/test_tier1_corrupt.py)."""
    from tiering.jobs import scrub

    deps, settings = world
    for key, value in settings.to_env().items():
        monkeypatch.setenv(key, value)
    expected, _ = read_handle(deps, "mix")
    path = deps.tier1.path("mix", 2)
    original = path.read_bytes()
    spot = len(original) // 2
    path.write_bytes(original[:spot] + bytes([original[spot] ^ 1]) + original[spot + 1:])
    try:
        df = spark.read.format("tiering").option("topic", "mix").load()
        assert rows(df) == expected
        tiers = {r.tier for r in df.where("ledger_id = 2").select("tier").distinct().collect()}
        assert tiers == {"tier1", "tier2"}  # tier 1 up to the break, tier 2 from the entry it could not give
        with pytest.raises(Exception) as err:
            spark.read.format("tiering").option("topic", "mix").option("strictTier1", "true").load().collect()
        assert "CorruptObjectError" in str(err.value) and str(path) in str(err.value)
        assert scrub.main(["--topic", "mix"]) == 1
        row = _scrub_row(deps)
        assert (row["status"], row["details"]["repairable"], row["details"]["unrepairable"]) == ("FAILED", 1, 0)
        assert str(path) in row["error"]
        said = capsys.readouterr().err
        assert "scrub: error: mix: ledger 2: tier-1 copy: corrupt tier-1 ledger entry" in said and \
            "(repairable)" in said, said
    finally:
        path.write_bytes(original)
    assert deps.meta.get_ledger("mix", 2).tier1_present


def test_ad_hoc_sql_joins_entries_with_the_metadata_tables(world, spark):
    from tiering.spark.sql import views

    deps, settings = world
    views(spark, settings, "mix,pair")
    got = {(r.topic, r.ledger_id): (r.state, r.n) for r in spark.sql(
        "SELECT e.topic, e.ledger_id, l.state, count(*) AS n FROM entries e "
        "JOIN topic t ON t.name = e.topic JOIN ledger l ON l.topic_id = t.topic_id AND l.ledger_id = e.ledger_id "
        "GROUP BY e.topic, e.ledger_id, l.state").collect()}
    expected = {}
    for topic in ("mix", "pair"):
        for (lid, _e) in read_handle(deps, topic)[0]:
            state = deps.meta.get_ledger(topic, lid).state.value
            n = expected.get((topic, lid), (state, 0))[1]
            expected[(topic, lid)] = (state, n + 1)
    assert got == expected
    # find an entry by its content
    data = read_handle(deps, "mix")[0][(2, 7)]
    hits = spark.sql(f"SELECT ledger_id, entry_id FROM entries WHERE payload = X'{data.hex()}'").collect()
    assert [(r.ledger_id, r.entry_id) for r in hits] == [(2, 7)]


def test_a_lost_ledger_of_unknown_size_is_its_dataloss_gap(world, spark):
    """A ledger recovery recorded lost with no index object saying how many entries it held: the source
    fails on it naming DATALOSS, and with skipDataLoss reads the ledgers around it as `tiering read` does."""
    from sqlalchemy import text

    deps, _ = world
    produce(deps, "unk", [entries(f"u{i}", 5, 200) for i in range(3)])
    for led in deps.meta.list_ledgers("unk", [S.SEALED]):
        offload_ledger(deps, led)
    with deps.meta.engine.begin() as conn:  # as recovery records it (metadata/recovery.lost_ledger)
        topic_id = conn.execute(text("SELECT topic_id FROM tiering.topic WHERE name = 'unk'")).scalar_one()
        conn.execute(text("DELETE FROM tiering.chunk WHERE topic_id = :t AND ledger_id = 1"), {"t": topic_id})
        conn.execute(text("UPDATE tiering.ledger SET lost_at = now(), lost_reason = 'recovery: no copy', "
                          "entry_count = 0, size_bytes = 0, tier1_present = false, tier1_deleted_at = now() "
                          "WHERE topic_id = :t AND ledger_id = 1"), {"t": topic_id})
    assert deps.meta.get_ledger("unk", 1).entries_unknown
    with pytest.raises(Exception) as err:
        spark.read.format("tiering").option("topic", "unk").load().collect()
    assert "DATALOSS" in str(err.value)
    got = rows(spark.read.format("tiering").option("topic", "unk").option("skipDataLoss", "true").load())
    expected, gaps = read_handle(deps, "unk")
    assert got == expected and {lid for lid, _ in got} == {0, 2} and len(got) == 10
    assert [(g.kind, g.start, g.end_unknown) for g in gaps] == [("DATALOSS", Position(1, 0), True)]
