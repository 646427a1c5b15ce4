"""`tiering repair` recovering ledgers it marked lost, on the real S3 endpoint and PostgreSQL: the object put
back (a bucket restored from a backup) clears the mark; a tier-1 file put back (deleted after the deletion
lag, or a corrupt one replaced) re-makes the tier-2 copy from it and clears the mark; a ledger still with no
good copy stays lost (exit 1); --dry-run writes nothing; the lost metric drops. The re-check reads the marked
rows on the partial index. Kill -9 at each step is in tests/faults/test_repair_kill.py."""
from __future__ import annotations

import pytest
from sqlalchemy import select, text

from tests.integration.helpers import bucket_keys
from tests.integration.test_cli import cli  # noqa: F401  (the `tiering` command on the run's services)
from tests.integration.test_repair import batched  # noqa: F401  (deps offloading small ledgers batched)
from tests.integration.test_repair import chunk_of, damage, drop_tier1, offloaded, read_all
from tiering.cli.output import check_document
from tiering.metadata.tables import chunk as chunk_t, gc_task, ledger as ledger_t
from tiering.ops.repair import recover_lost, repair


def get(deps, key: str) -> bytes:
    return deps.bucket.s3.get_object(Bucket=deps.bucket.name, Key=key)["Body"].read()


def put(deps, key: str, body: bytes) -> None:
    deps.bucket.s3.put_object(Bucket=deps.bucket.name, Key=key, Body=body)


def lost_metric(deps) -> dict:
    from tiering import metrics

    with deps.meta.engine.connect() as c:
        fams = {f.name: f for f in metrics.families(metrics.read(c))}
    return {s.labels["topic"]: s.value for s in fams["tiering_ledgers_lost"].samples}


def world(deps) -> list:
    with deps.meta.engine.connect() as c:
        return [c.execute(select(t).order_by(*t.primary_key.columns)).all() for t in (ledger_t, chunk_t)] + \
            [sorted(c.execute(select(gc_task.c.key)).scalars()), sorted(bucket_keys(deps))]


def test_an_object_restored_from_a_backup_recovers_the_ledger(deps):
    expected = offloaded(deps, "t", tier1=False)
    ch = chunk_of(deps, "t", 1)
    backup = get(deps, ch.data_key)
    damage(deps, ch.data_key, "delete")
    assert repair(deps, "t").lost == [("t", 1)]
    marked = deps.meta.get_ledger("t", 1)
    assert marked.lost and lost_metric(deps) == {"t": 1}

    again = repair(deps, "t")  # still missing: stays lost, nothing written
    assert (again.lost, again.recovered, again.failed) == ([("t", 1)], [], [])
    assert deps.meta.get_ledger("t", 1) == marked

    put(deps, ch.data_key, backup)  # the operator restores the bucket
    before = world(deps)
    dry = repair(deps, "t", dry_run=True)
    assert (dry.recovered, dry.lost, dry.findings) == ([("t", 1)], [], [])
    assert world(deps) == before

    report = repair(deps, "t")
    assert (report.recovered, report.lost, report.repaired, report.failed) == ([("t", 1)], [], [], [])
    led = deps.meta.get_ledger("t", 1)
    assert not led.lost and led.version == marked.version + 1 and chunk_of(deps, "t", 1) == ch
    with deps.meta.engine.connect() as c:
        assert c.execute(select(ledger_t.c.lost_reason).where(ledger_t.c.ledger_id == 1)).scalar_one() is None
    assert read_all(deps, "t") == (expected, [])
    assert lost_metric(deps) == {"t": 0} and deps.meta.repairs.lost_count() == 0
    rerun = repair(deps, "t")  # a sound ledger again: checked as any other, not recovered twice
    assert (rerun.checked, rerun.recovered, rerun.findings) == (3, [], [])


@pytest.mark.parametrize("how", ["deleted", "corrupt"])
def test_a_tier1_file_put_back_remakes_the_copy(deps, how):
    """The file deleted after the deletion lag (metadata records no copy) or corrupt (the repair could not
    use it): put back, it verifies, the tier-2 copy is re-made from it and the mark cleared."""
    expected = offloaded(deps, "t", n=2)
    path = deps.tier1.path("t", 1)
    original = path.read_bytes()
    old = chunk_of(deps, "t", 1)
    damage(deps, old.data_key, "flip", at=old.data_length // 2)
    if how == "deleted":
        drop_tier1(deps, "t", 1)
    else:
        raw = bytearray(original)
        raw[200] ^= 0xFF
        path.write_bytes(bytes(raw))
    assert repair(deps, "t").lost == [("t", 1)]
    marked = deps.meta.get_ledger("t", 1)

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(original)  # the operator puts the file back
    before = world(deps)
    assert repair(deps, "t", dry_run=True).recovered == [("t", 1)] and world(deps) == before

    report = repair(deps, "t")
    assert (report.recovered, report.lost, report.failed) == ([("t", 1)], [], [])
    assert report.bytes == marked.size_bytes
    led = deps.meta.get_ledger("t", 1)
    assert not led.lost and led.tier1_present and led.version == marked.version + 1
    new = chunk_of(deps, "t", 1)
    assert new.data_key != old.data_key and led.offload_uuid in new.data_key
    with deps.meta.engine.connect() as c:  # the broken object queued for GC, the new pair not
        queued = set(c.execute(select(gc_task.c.key)).scalars())
    assert old.data_key in queued and not {new.data_key, new.index_key} & queued
    # from tier 2 alone: every entry equal to what was produced
    assert read_all(deps, "t", tier2_only=True) == (expected, [])
    assert repair(deps, "t").findings == [] and deps.meta.repairs.lost_count() == 0


def test_only_the_ledgers_with_a_good_copy_back_are_recovered(deps, cli):
    expected = offloaded(deps, "t", n=3, tier1=False)
    chunks = [chunk_of(deps, "t", i) for i in range(3)]
    backup = get(deps, chunks[0].index_key)
    damage(deps, chunks[0].index_key, "delete")
    damage(deps, chunks[2].data_key, "delete")
    assert sorted(repair(deps).lost) == [("t", 0), ("t", 2)]
    put(deps, chunks[0].index_key, backup)

    before = world(deps)
    dry = cli("repair", "--dry-run", "--json")
    assert "1 ledger(s) lost" in dry.one_line_error(1)
    assert (dry.json["recovered"], dry.json["recovered_count"], dry.json["lost_count"]) == \
        ([{"topic": "t", "ledger": 0}], 1, 1)
    assert check_document(dry.json) == [] and world(deps) == before
    assert "would recover 1 lost" in cli("repair", "--dry-run").stdout

    run = cli("repair", "--topic", "t", "--json")
    assert "1 ledger(s) lost" in run.one_line_error(1)  # ledger 2 still has no good copy
    j = run.json
    assert (j["recovered"], j["recovered_count"], j["lost"], j["lost_count"]) == \
        ([{"topic": "t", "ledger": 0}], 1, [{"topic": "t", "ledger": 2}], 1)
    assert check_document(j) == []
    text_run = cli("repair", "--topic", "t")
    text_run.one_line_error(1)
    assert "recovered 0 lost, lost 1" in text_run.stdout
    assert lost_metric(deps) == {"t": 1}
    got, gaps = read_all(deps, "t")
    assert got == {k: v for k, v in expected.items() if k[0] != 2} and [g.start.ledger_id for g in gaps] == [2]


def test_nothing_marked_lost_costs_no_tier2_request(batched, s3_settings):
    from tests.integration.test_offload_batch import counting

    deps, ops = counting(batched, s3_settings)
    offloaded(deps, "t", n=2)
    ops.clear()
    assert recover_lost(deps).recovered == [] and ops == {}


def test_the_lost_ledgers_are_read_on_the_partial_index(deps):
    """The query recover_lost runs can use `ledger_lost` (seq scans off: the planner takes the index when it
    applies; on a small table it may prefer a scan, which is no cost there)."""
    from sqlalchemy.dialects import postgresql

    offloaded(deps, "t", n=1)
    for q in (deps.meta.repairs.lost_select(), deps.meta.repairs.lost_select("t")):
        sql = str(q.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
        with deps.meta.engine.connect() as c:
            c.execute(text("SET LOCAL enable_seqscan = off"))
            plan = "\n".join(r[0] for r in c.execute(text("EXPLAIN " + sql)))
        assert "ledger_lost" in plan, plan


def test_the_scrub_s_repair_step_reports_then_recovers(deps, settings):
    """The scrub's repair step (a lost ledger fails its topic's Spark read, so every ledger is checked): the
    scheduled run names the ledger recoverable and writes nothing; with --repair it is recovered."""
    from tiering.jobs.scrub import repair_broken

    expected = offloaded(deps, "t", n=2, tier1=False)
    key = chunk_of(deps, "t", 0).data_key
    backup = get(deps, key)
    damage(deps, key, "delete")
    assert repair(deps, "t").lost == [("t", 0)]
    put(deps, key, backup)

    errors: list[str] = []
    counts = repair_broken(settings, ["t"], {"t"}, False, errors)
    assert (counts["recovered"], counts["lost"]) == (1, 0) and deps.meta.get_ledger("t", 0).lost
    assert errors == ["t: ledger 0 is marked lost and its good copy is back (recoverable)"]
    errors.clear()
    counts = repair_broken(settings, ["t"], {"t"}, True, errors)
    assert (counts["recovered"], counts["lost"], errors) == (1, 0, [])
    assert read_all(deps, "t") == (expected, [])


def test_a_recovery_losing_to_retention_changes_nothing(deps):
    """Retention deletes the lost ledger after the re-check read it: clearing the mark loses its
    compare-and-set (`skipped`), the ledger stays DELETED and nothing is reported recovered."""
    from tiering.model import LedgerState as S, Position
    from tiering.ops.retention import truncate

    offloaded(deps, "t", n=2, tier1=False)
    key = chunk_of(deps, "t", 0).data_key
    backup = get(deps, key)
    damage(deps, key, "delete")
    assert repair(deps, "t").lost == [("t", 0)]
    put(deps, key, backup)

    def meanwhile(step):
        if step == "recovering":
            truncate(deps, "t", Position(1, 0))
    report = recover_lost(deps, "t", hook=meanwhile)
    assert (report.recovered, report.skipped, report.failed) == ([], [("t", 0)], [])
    led = deps.meta.get_ledger("t", 0)
    assert led.state == S.DELETED and led.lost


def test_a_ledger_marked_lost_on_a_corrupt_copy_moves_to_a_sound_one_by_a_checked_recovery(deps):
    """A recovery that did not check pages chose a newer copy with a damaged page; repair marked the ledger
    lost on it though the bucket held a sound copy, and `recover-from-bucket --check-pages` left it lost
    (it moved only chunks whose objects were gone): no command brought the ledger back."""
    import uuid

    from tiering.format.keys import data_key, index_key
    from tiering.ops.recover import recover_from_bucket

    expected = offloaded(deps, "t", tier1=False)
    ch = chunk_of(deps, "t", 1)
    other = str(uuid.uuid4())  # a sound copy under another attempt's keys (an older offload's, a backup's)
    put(deps, data_key(deps.bucket.prefix, "t", other, 1), get(deps, ch.data_key))
    put(deps, index_key(deps.bucket.prefix, "t", other, 1), get(deps, ch.index_key))
    damage(deps, ch.data_key, "flip", at=ch.data_offset + 300)
    assert repair(deps, "t").lost == [("t", 1)]
    unchecked = recover_from_bucket(deps.meta.engine, deps.bucket, "t")
    assert unchecked.chunks_moved == [] and deps.meta.get_ledger("t", 1).lost  # its pages were not read
    dry = recover_from_bucket(deps.meta.engine, deps.bucket, "t", check_pages=True, dry_run=True)
    assert dry.chunks_moved == [("t", 1)] and deps.meta.get_ledger("t", 1).lost
    report = recover_from_bucket(deps.meta.engine, deps.bucket, "t", check_pages=True)
    assert report.chunks_moved == [("t", 1)], report
    assert not deps.meta.get_ledger("t", 1).lost and chunk_of(deps, "t", 1).data_key != ch.data_key
    assert read_all(deps, "t") == (expected, [])
    again = repair(deps, "t")
    assert (again.lost, again.findings, again.failed) == ([], [], [])
