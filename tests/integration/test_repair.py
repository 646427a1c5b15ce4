"""`tiering repair` on the real S3 endpoint and PostgreSQL: tier-2 objects deleted behind the store's back,
truncated, or with a flipped byte, for single and batched ledgers, with and without a tier-1 copy. A broken
copy with a verified tier-1 copy is re-made (new object pair, chunk moved, old keys queued for GC); without
one the ledger is marked lost and reads give its DATALOSS gap with no tier-2 request; --dry-run writes
nothing. Kill -9 at each step is in tests/faults/test_repair_kill.py."""
from __future__ import annotations

import pytest
from sqlalchemy import select

from tests.integration.helpers import MIB, bucket_keys, entries, make_deps, produce
from tests.integration.test_cli import cli  # noqa: F401  (the `tiering` command on the run's services)
from tiering.cli.output import check_document
from tests.integration.test_encryption import enc_bucket, sse_c_key_file, tls_rgw  # noqa: F401  (the TLS gateway)
from tiering.metadata.tables import chunk as chunk_t, gc_task, ledger as ledger_t
from tiering.model import LedgerState as S, Position
from tiering.ops.gc import run_gc
from tiering.ops.offload import offload_many
from tiering.ops.repair import plan_repair, repair
from tiering.read import DATALOSS, Entry, Gap, ReadHandle
from tiering.tier2.reader import tier2_opener


def offloaded(deps, topic: str, n: int = 3, tier1: bool = True) -> dict:
    expected = produce(deps, topic, [entries(f"{topic}{i}", 20, 700) for i in range(n)])
    report = offload_many(deps, deps.meta.list_ledgers(topic, [S.SEALED]))
    assert len(report.offloaded) == n, report.failed
    if not tier1:
        for led in deps.meta.list_ledgers(topic):
            drop_tier1(deps, topic, led.ledger_id)
    return expected


def drop_tier1(deps, topic: str, ledger_id: int) -> None:
    led = deps.meta.get_ledger(topic, ledger_id)
    deps.tier1.delete(topic, ledger_id)
    deps.meta.mark_tier1_deleted(led)


def chunk_of(deps, topic: str, ledger_id: int):
    return deps.meta.get_chunk(deps.meta.get_ledger(topic, ledger_id))


def damage(deps, key: str, how: str, at: int = 0) -> None:
    """Behind the store's back: delete the object, cut it short at `at`, or flip the byte at `at`."""
    s3, name = deps.bucket.s3, deps.bucket.name
    if how == "delete":
        s3.delete_object(Bucket=name, Key=key)
        return
    body = bytearray(s3.get_object(Bucket=name, Key=key)["Body"].read())
    if how == "truncate":
        body = body[:at]
    else:
        body[at] ^= 0x5A
    s3.put_object(Bucket=name, Key=key, Body=bytes(body))


def read_all(deps, topic: str, tier2_only: bool = False) -> tuple[dict, list]:
    if tier2_only:
        for led in deps.meta.list_ledgers(topic, [S.OFFLOADED]):
            if led.tier1_present:
                drop_tier1(deps, topic, led.ledger_id)
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    got, gaps = {}, []
    for item in handle.read(topic):
        if isinstance(item, Entry):
            got[(item.ledger_id, item.entry_id)] = item.data
        else:
            gaps.append(item)
    return got, gaps


@pytest.mark.parametrize("how", ["delete", "truncate", "flip"])
def test_a_broken_copy_is_remade_from_tier1(deps, how):
    expected = offloaded(deps, "t")
    old = chunk_of(deps, "t", 1)
    damage(deps, old.data_key, how, at=old.data_length // 2)
    [finding] = plan_repair(deps, "t")
    assert finding.led.ledger_id == 1 and finding.repairable

    report = repair(deps, "t")
    assert report.repaired == [("t", 1)] and report.lost == [] and report.failed == []
    new = chunk_of(deps, "t", 1)
    assert new.data_key != old.data_key and new.version == old.version + 1
    assert deps.meta.get_ledger("t", 1).offload_uuid in new.data_key
    with deps.meta.engine.connect() as c:  # the old keys queued for GC, the new ones not any more
        queued = set(c.execute(select(gc_task.c.key)).scalars())
    assert {old.data_key, old.index_key} <= queued and not {new.data_key, new.index_key} & queued
    # read from tier 2 alone: every entry, byte-exact
    got, gaps = read_all(deps, "t", tier2_only=True)
    assert got == expected and gaps == []
    # a rerun finds nothing to do (no second repair of a repaired ledger)
    again = repair(deps, "t")
    assert again.checked == 3 and again.findings == [] and again.repaired == []
    run_gc(deps)
    assert bucket_keys(deps) == {k for i in range(3) for ch in [chunk_of(deps, "t", i)]
                                 for k in (ch.data_key, ch.index_key)}


def test_a_truncated_object_is_corrupt_wherever_a_read_of_it_begins(deps):
    """A read from the ledger's start said "corrupt ... shorter than metadata says" (exit 1); one from an
    entry past the cut said its range was data loss, a DATALOSS gap (exit 0): the same object, two verdicts."""
    from tiering.errors import CorruptObjectError
    from tiering.model import Position
    from tiering.read import ReadHandle
    from tiering.tier2.reader import tier2_opener

    produce(deps, "t", [entries("t", 40, 100 * 1024)])  # 4 MB: a read from its end asks a range
    assert len(offload_many(deps, deps.meta.list_ledgers("t", [S.SEALED])).offloaded) == 1
    drop_tier1(deps, "t", 0)
    ch = chunk_of(deps, "t", 0)
    damage(deps, ch.data_key, "truncate", at=ch.data_length // 4)
    for start in (Position(0, 0), Position(0, 39)):
        handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
        with pytest.raises(CorruptObjectError, match="shorter than metadata says"):
            list(handle.read("t", start))


def test_a_lost_index_object_is_remade_too(deps):
    expected = offloaded(deps, "t", n=1)
    damage(deps, chunk_of(deps, "t", 0).index_key, "delete")
    assert repair(deps, "t").repaired == [("t", 0)]
    assert read_all(deps, "t", tier2_only=True) == (expected, [])


def test_no_good_copy_marks_the_ledger_lost_and_reads_gap_at_once(deps):
    expected = offloaded(deps, "t", tier1=False)
    damage(deps, chunk_of(deps, "t", 1).data_key, "delete")
    before = {led.ledger_id: led for led in deps.meta.list_ledgers("t")}
    report = repair(deps, "t")
    assert report.lost == [("t", 1)] and report.repaired == [] and report.failed == []
    lost = deps.meta.get_ledger("t", 1)
    assert lost.lost and lost.state == S.OFFLOADED and lost.version == before[1].version + 1
    # nothing else about the topic changed
    assert [led for led in deps.meta.list_ledgers("t") if led.ledger_id != 1] == \
        [before[0], before[2]]
    assert deps.meta.repairs.lost_count("t") == 1 and deps.meta.repairs.lost_count() == 1

    def never(led, ch):  # the lost ledger's gap comes without a tier-2 request
        if led.ledger_id == 1:
            raise AssertionError("a lost ledger was read from tier 2")
        return opener(led, ch)
    opener = tier2_opener(deps.bucket)
    handle = ReadHandle(deps.meta, deps.tier1, never)
    items = list(handle.read("t"))
    gaps = [g for g in items if isinstance(g, Gap)]
    assert gaps == [Gap(DATALOSS, Position(1, 0), Position(1, 19))]
    assert {(e.ledger_id, e.entry_id): e.data for e in items if isinstance(e, Entry)} == \
        {k: v for k, v in expected.items() if k[0] != 1}
    # a rerun: still lost, not checked again, nothing written
    again = repair(deps, "t")
    assert again.lost == [("t", 1)] and again.checked == 2 and again.findings == []


def test_a_corrupt_tier1_copy_is_no_source(deps):
    offloaded(deps, "t", n=1)
    damage(deps, chunk_of(deps, "t", 0).data_key, "flip", at=300)
    path = deps.tier1.path("t", 0)
    raw = bytearray(path.read_bytes())
    raw[200] ^= 0xFF  # inside the first entry's payload: its CRC fails
    path.write_bytes(bytes(raw))
    [finding] = plan_repair(deps, "t")
    assert not finding.repairable and "tier-1" in finding.tier1_problem
    assert repair(deps, "t").lost == [("t", 0)]


def test_dry_run_writes_nothing(deps):
    offloaded(deps, "t")
    damage(deps, chunk_of(deps, "t", 0).data_key, "flip", at=400)
    drop_tier1(deps, "t", 2)
    damage(deps, chunk_of(deps, "t", 2).data_key, "delete")

    def world():
        with deps.meta.engine.connect() as c:
            return [c.execute(select(t).order_by(*t.primary_key.columns)).all() for t in (ledger_t, chunk_t)] + \
                [sorted(c.execute(select(gc_task.c.key)).scalars()), sorted(bucket_keys(deps))]
    before = world()
    report = repair(deps, "t", dry_run=True)
    assert [(f.led.ledger_id, f.repairable) for f in report.findings] == [(0, True), (2, False)]
    assert report.repaired == report.lost == report.failed == []
    assert world() == before


@pytest.fixture
def batched(db, s3_client, bucket, tier1_root):
    return make_deps(db, s3_client, bucket, tier1_root, batch_small_bytes=8 * MIB)


def test_a_batched_ledger_is_repaired_alone(batched):
    deps = batched
    expected = offloaded(deps, "t", n=4)
    shared = chunk_of(deps, "t", 0).data_key
    assert {chunk_of(deps, "t", i).data_key for i in range(4)} == {shared}
    two = chunk_of(deps, "t", 2)
    damage(deps, shared, "flip", at=two.data_offset + 300)
    report = repair(deps, "t")
    assert report.repaired == [("t", 2)]
    moved = chunk_of(deps, "t", 2)
    assert moved.data_key != shared and moved.data_offset == 0 and moved.index_offset == 0
    assert {chunk_of(deps, "t", i).data_key for i in (0, 1, 3)} == {shared}  # the others untouched
    run_gc(deps)  # the shared object is still referenced: kept
    assert shared in bucket_keys(deps)
    assert read_all(deps, "t", tier2_only=True) == (expected, [])


def test_a_batched_object_lost_whole_without_tier1(batched):
    deps = batched
    offloaded(deps, "t", n=3)
    drop_tier1(deps, "t", 1)
    damage(deps, chunk_of(deps, "t", 0).data_key, "delete")
    report = repair(deps, "t")
    assert sorted(report.repaired) == [("t", 0), ("t", 2)] and report.lost == [("t", 1)]
    got, gaps = read_all(deps, "t", tier2_only=True)
    assert gaps == [Gap(DATALOSS, Position(1, 0), Position(1, 19))] and len(got) == 40


def test_lost_ledgers_in_metrics_and_dashboard(deps, database_url):
    from tests.integration.test_dashboard_api import client_for
    from tiering import metrics
    from tiering.dashboard import make_read_only_engine
    from tiering.metadata.job_runs import JobOutcome, JobRuns, RunRef

    offloaded(deps, "t", n=2, tier1=False)
    produce(deps, "u", [entries("u", 3, 10)])
    damage(deps, chunk_of(deps, "t", 0).index_key, "delete")
    assert repair(deps).lost == [("t", 0)]
    JobRuns(deps.meta.engine).record("scrub", None, RunRef("scrub"), JobOutcome(
        items_done=2, details={"repairable": 3, "unrepairable": 1, "repaired": 0}))
    with deps.meta.engine.connect() as c:
        fams = {f.name: f for f in metrics.families(metrics.read(c))}
    assert {s.labels["topic"]: s.value for s in fams["tiering_ledgers_lost"].samples} == {"t": 1, "u": 0}
    ro = make_read_only_engine(database_url)
    try:
        got = client_for(lambda: ro).get("/api/integrity").json()
    finally:
        ro.dispose()
    assert got["lost"] == 1 and got["by_topic"] == [{"topic": "t", "lost": 1}]
    assert [(r["topic"], r["ledger_id"]) for r in got["ledgers"]] == [("t", 0)] and "missing" in got["ledgers"][0]["lost_reason"]
    assert (got["last_scrub"]["repairable"], got["last_scrub"]["unrepairable"]) == (3, 1)


def test_cli_repair_and_verify(deps, cli):
    offloaded(deps, "t", n=2)
    drop_tier1(deps, "t", 1)
    damage(deps, chunk_of(deps, "t", 0).data_key, "flip", at=500)
    damage(deps, chunk_of(deps, "t", 1).data_key, "delete")
    before = [chunk_of(deps, "t", i) for i in (0, 1)]

    verify = cli("verify", "t", "--json")
    verify.one_line_error(1)
    assert verify.json["repairable"] == [{"topic": "t", "ledger": 0}] and verify.json["unrepairable_count"] == 1
    assert check_document(verify.json) == []
    assert "(repairable" in verify.json["problems"][0] and "(not repairable" in verify.json["problems"][1]

    dry = cli("repair", "--topic", "t", "--dry-run", "--json")
    assert "would be lost" in dry.one_line_error(1)
    assert (dry.json["problem_count"], dry.json["repairable_count"], dry.json["repaired_count"]) == (2, 1, 0)
    assert [chunk_of(deps, "t", i) for i in (0, 1)] == before and not deps.meta.get_ledger("t", 1).lost
    # its text says the run would mark one lost (it said "lost 0 (after this run)" beside "1 would be lost")
    assert "lost 0, would mark 1 lost," in cli("repair", "--topic", "t", "--dry-run").stdout

    run = cli("repair", "--topic", "t", "--json")
    assert "1 ledger(s) lost" in run.one_line_error(1)
    j = run.json
    assert (j["command"], j["topic"], j["dry_run"], j["checked_count"]) == ("repair", "t", False, 2)
    assert j["repaired"] == [{"topic": "t", "ledger": 0}] and j["lost"] == [{"topic": "t", "ledger": 1}]
    assert (j["repaired_count"], j["lost_count"], j["failed"], j["failed_count"]) == (1, 1, [], 0)
    assert check_document(j) == [] and check_document(dry.json) == []

    again = cli("repair", "--json")  # every topic; the lost ledger is still reported, nothing re-made
    again.one_line_error(1)
    assert (again.json["topic"], again.json["checked_count"], again.json["repaired_count"]) == (None, 1, 0)
    status = {r["ledger"]: r for r in cli("status", "t", "--json").ok().json["ledgers"]}
    assert (status[1]["lost"], status[1]["tiers"], status[0]["lost"]) == (True, [], False)
    assert "LOST" in cli("status", "t").ok().stdout
    gap = [r for r in cli("read", "t", "--json").ok().json_lines if "gap" in r]
    assert gap == [{"gap": "DATALOSS", "from": "1:0", "to": "1:19"}]
    assert cli("repair", "--topic", "nosuch").one_line_error(2)


def test_repair_with_sse_c(db, database_url, tls_rgw, enc_bucket, s3_settings, tmp_path, sse_c_key_file):
    """On the TLS gateway with an SSE-C key: the broken copy is read (with the key) and re-made encrypted
    with it; the check of the new pair and the reads need the key too."""
    import base64
    import hashlib

    from tests.integration.test_encryption import _empty, settings_for
    from tiering.tier2.client import make_client
    from tiering.tier2.objects import Bucket

    tier1 = tmp_path / "tier1"
    settings = settings_for(database_url, tls_rgw, s3_settings, enc_bucket, tier1, s3_sse_c_key_file=sse_c_key_file)
    client = make_client(settings)
    _empty(Bucket(client, enc_bucket, "t/"))
    deps = make_deps(db, client, enc_bucket, tier1)
    expected = offloaded(deps, "t", n=2)
    old = chunk_of(deps, "t", 1)
    damage(deps, old.data_key, "flip", at=old.data_length // 3)
    damage(deps, chunk_of(deps, "t", 0).index_key, "delete")
    report = repair(deps, "t")
    assert sorted(report.repaired) == [("t", 0), ("t", 1)] and report.failed == []
    md5 = base64.b64encode(hashlib.md5(settings.s3_sse_c_key).digest()).decode()
    for i in (0, 1):
        ch = chunk_of(deps, "t", i)
        for key in (ch.data_key, ch.index_key):
            head = client.head_object(Bucket=enc_bucket, Key=key)
            assert (head.get("SSECustomerAlgorithm"), head.get("SSECustomerKeyMD5")) == ("AES256", md5), key
    assert read_all(deps, "t", tier2_only=True) == (expected, [])


def test_the_check_lists_nothing_and_costs_nothing_when_nothing_is_due(batched, s3_settings):
    from tests.integration.test_offload_batch import counting

    deps, ops = counting(batched, s3_settings)
    offloaded(deps, "t", n=4)  # one batched object pair
    ops.clear()
    assert plan_repair(deps, "t") == []
    # the shared objects HEADed once each; the index ranges and the pages read; nothing listed
    assert ops.get("HeadObject") == 2 and not any(op.startswith("List") for op in ops), ops
    for i in range(4):
        drop_tier1(deps, "t", i)
    ops.clear()
    assert plan_repair(deps, "t", keep=lambda led: led.tier1_present) == []  # the scrub's healthy case
    assert ops == {}


def test_a_tier1_copy_deleted_by_delete_lagged_during_the_repair(deps):
    """delete-lagged records the copy deleted after the repair read it: the ledger's version moved, its bytes
    did not; the commit goes through from the current row."""
    expected = offloaded(deps, "t", n=1)
    damage(deps, chunk_of(deps, "t", 0).data_key, "flip", at=900)
    [finding] = plan_repair(deps, "t")

    def meanwhile(step):
        if step == "checked":
            drop_tier1(deps, "t", 0)
    from tiering.ops.repair import repair_ledger
    assert repair_ledger(deps, finding, meanwhile) == "repaired"
    assert read_all(deps, "t") == (expected, [])


def test_defrag_leaves_a_lost_ledger_alone(deps):
    offloaded(deps, "t", n=4, tier1=False)
    damage(deps, chunk_of(deps, "t", 1).data_key, "delete")
    assert repair(deps, "t").lost == [("t", 1)]
    from tiering.ops.defrag import defrag
    report = defrag(deps, "t", small_bytes=8 * MIB)  # runs 0 and 2..3: ledger 0 alone is no group
    assert report.errors == [] and report.ledgers == 2
    assert chunk_of(deps, "t", 2).data_key == chunk_of(deps, "t", 3).data_key != chunk_of(deps, "t", 1).data_key


def test_a_tier1_copy_this_process_does_not_see_is_no_proof_of_loss(deps, tmp_path):
    """Metadata records a tier-1 copy, the repair runs where the tier-1 root is not mounted: the ledger fails
    (exit 1), it is not marked lost; where the root is, it is repaired."""
    import dataclasses

    from tiering.tier1 import Tier1Store

    expected = offloaded(deps, "t", n=1)
    damage(deps, chunk_of(deps, "t", 0).data_key, "delete")
    elsewhere = dataclasses.replace(deps, tier1=Tier1Store(tmp_path / "not-mounted"))
    report = repair(elsewhere, "t")
    assert report.lost == [] and [f["ledger"] for f in report.failed] == [0]
    assert "not marked lost" in report.failed[0]["error"] and not deps.meta.get_ledger("t", 0).lost
    assert repair(deps, "t").repaired == [("t", 0)]
    assert read_all(deps, "t", tier2_only=True) == (expected, [])
