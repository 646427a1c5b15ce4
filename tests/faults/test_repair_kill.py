"""`tiering repair` killed -9 at each of its steps, then rerun: no loss (every entry and every tier-2 copy reads
back byte-exact), no orphan once GC ran, no second repair of a ledger whose repair committed; and repair
racing GC, defrag and retention of the same ledgers loses cleanly (nothing lost, nothing leaked)."""
from __future__ import annotations

import pytest

from tests.faults.harness import check_invariants, gc_all, kill_at_point, settle, start_worker
from tests.integration.helpers import bucket_keys, entries, produce
from tiering.errors import TieringError
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.defrag import defrag
from tiering.ops.offload import offload_ledger
from tiering.ops.repair import plan_repair, repair, repair_ledger
from tiering.ops.retention import truncate

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
KIB = 1024


def broken_scene(deps) -> dict:
    """Three offloaded ledgers, tier-1 copies kept: ledger 0's data object has a flipped byte, ledger 1's
    index object is gone, ledger 2 is sound."""
    exp = produce(deps, "k", [entries(f"k{i}", 10, 10 * KIB) for i in range(3)], TopicPolicy(**BIG),
                  open_tail=[b"tail"])
    for led in deps.meta.list_ledgers("k", [S.SEALED]):
        offload_ledger(deps, led)
    chunks = deps.meta.chunks("k")
    s3, name = deps.bucket.s3, deps.bucket.name
    body = bytearray(s3.get_object(Bucket=name, Key=chunks[0].data_key)["Body"].read())
    body[chunks[0].data_offset + 1000] ^= 1
    s3.put_object(Bucket=name, Key=chunks[0].data_key, Body=bytes(body))
    s3.delete_object(Bucket=name, Key=chunks[1].index_key)
    return {"k": exp}


# point -> ledgers whose repair committed before the kill
POINTS = {
    "step:queued": [],                  # new keys queued, nothing written
    "step:index": [],                   # the new pair written, not checked
    "step:checked": [],                 # checked, not committed
    "commit-after-step:checked": [],    # inside the commit's transaction: rolled back by the kill
    "step:committed": [0],              # ledger 0 moved; ledger 1 not begun
    "step:queued:2": [0],               # ledger 1's keys queued
}


@pytest.mark.parametrize("point", list(POINTS))
def test_repair_killed_then_rerun(point, deps, worker_env):
    expected = broken_scene(deps)
    before = deps.meta.chunks("k")
    w = start_worker("repair", worker_env, ["k"], point)
    kill_at_point(w, deps.meta.engine)
    after_kill = deps.meta.chunks("k")
    done = POINTS[point]
    assert [i for i in (0, 1) if after_kill[i].data_key != before[i].data_key] == done
    settle(deps.meta.engine)
    rerun = repair(deps, "k")
    assert sorted(rerun.repaired) == [("k", i) for i in (0, 1) if i not in done]  # never twice
    assert rerun.lost == [] and rerun.failed == []
    assert repair(deps, "k").findings == []
    gc_all(deps)
    check_invariants(deps, deps.meta.engine, expected)


@pytest.mark.parametrize("point", ["step:marking-lost", "commit-after-step:marking-lost", "step:marked-lost"])
def test_marking_lost_killed_then_rerun(point, deps, worker_env):
    """No tier-1 copy and a deleted data object: the mark is one transaction, whole or not at all; the rerun
    marks what is not marked yet, once, and the ledger reads as its DATALOSS gap."""
    from tiering.read import DATALOSS, Entry, Gap, ReadHandle
    from tiering.tier2.reader import tier2_opener

    exp = produce(deps, "k", [entries(f"k{i}", 10, 10 * KIB) for i in range(2)], TopicPolicy(**BIG))
    for led in deps.meta.list_ledgers("k", [S.SEALED]):
        done = offload_ledger(deps, led)
        deps.tier1.delete("k", led.ledger_id)
        deps.meta.mark_tier1_deleted(done)
    deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=deps.meta.chunks("k")[0].data_key)
    version = deps.meta.get_ledger("k", 0).version
    w = start_worker("repair", worker_env, ["k"], point)
    kill_at_point(w, deps.meta.engine)
    marked = deps.meta.get_ledger("k", 0).lost
    assert marked == (point == "step:marked-lost")
    rerun = repair(deps, "k")
    assert rerun.lost == [("k", 0)] and rerun.failed == [] and rerun.checked == (1 if marked else 2)
    led = deps.meta.get_ledger("k", 0)
    assert led.lost and led.version == version + 1  # marked once
    items = list(ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket)).read("k"))
    assert [g for g in items if isinstance(g, Gap)] == [Gap(DATALOSS, Position(0, 0), Position(0, 9))]
    assert {(e.ledger_id, e.entry_id): e.data for e in items if isinstance(e, Entry)} == \
        {k: v for k, v in exp.items() if k[0] == 1}


def batched_scene(deps) -> dict:
    """Three ledgers in one batched object pair, tier-1 copies kept; ledger 1's bytes in it flipped."""
    import dataclasses

    from tiering.ops.offload import offload_many

    exp = produce(deps, "k", [entries(f"b{i}", 10, 10 * KIB) for i in range(3)], TopicPolicy(**BIG),
                  open_tail=[b"tail"])
    batched = dataclasses.replace(deps, knobs=dataclasses.replace(deps.knobs, batch_small_bytes=8 * 1024 * 1024))
    assert len(offload_many(batched, deps.meta.list_ledgers("k", [S.SEALED])).offloaded) == 3
    chunks = deps.meta.chunks("k")
    assert len({c.data_key for c in chunks.values()}) == 1
    s3, name = deps.bucket.s3, deps.bucket.name
    body = bytearray(s3.get_object(Bucket=name, Key=chunks[1].data_key)["Body"].read())
    body[chunks[1].data_offset + 2000] ^= 1
    s3.put_object(Bucket=name, Key=chunks[1].data_key, Body=bytes(body))
    return {"k": exp}


@pytest.mark.parametrize("point", ["step:index", "commit-after-step:checked", "step:committed"])
def test_batched_repair_killed_then_rerun(point, deps, worker_env):
    """Ledger 1 of a batched pair is repaired alone; the shared pair stays for ledgers 0 and 2 through GC."""
    expected = batched_scene(deps)
    shared = deps.meta.chunks("k")[0].data_key
    w = start_worker("repair", worker_env, ["k"], point)
    kill_at_point(w, deps.meta.engine)
    settle(deps.meta.engine)
    rerun = repair(deps, "k")
    assert rerun.repaired == ([] if point == "step:committed" else [("k", 1)]) and rerun.failed == []
    gc_all(deps)
    chunks = deps.meta.chunks("k")
    assert chunks[0].data_key == chunks[2].data_key == shared != chunks[1].data_key
    check_invariants(deps, deps.meta.engine, expected)


def test_repair_loses_to_defrag_and_retention_and_gc_keeps_its_objects(deps):
    broken_scene(deps)
    findings = {f.led.ledger_id: f for f in plan_repair(deps, "k")}
    # retention deleted ledger 0 after the check: its repair changes nothing and discards its new pair
    truncate(deps, "k", Position(1, 0))
    keys = bucket_keys(deps)
    assert repair_ledger(deps, findings[0]) == "skipped"
    assert bucket_keys(deps) == keys and deps.meta.get_ledger("k", 0).state == S.DELETED
    # a chunk row moved since the check (as defrag moves them): the stale finding is skipped
    stale = findings[1]
    assert repair_ledger(deps, stale) == "repaired"
    assert repair_ledger(deps, stale) == "skipped"
    # defrag merges the (sound) remaining ledgers; repair then finds nothing; GC leaves every live object
    defrag(deps, "k", small_bytes=8 * 1024 * 1024)
    settle(deps.meta.engine)
    gc_all(deps)
    assert plan_repair(deps, "k") == []
    live = {k for c in deps.meta.chunks("k").values() for k in (c.data_key, c.index_key)}
    assert bucket_keys(deps) == live


def test_a_copy_retention_was_deleting_while_repair_checked_it_is_a_lost_race_not_a_failure(deps):
    """Retention renamed ledger 0's tier-1 file for deletion, not yet recorded, when repair checked it (so
    repair does not see a copy metadata records); retention then finishes: the repair is skipped, not failed."""
    broken_scene(deps)
    deps.tier1.retire("k", 0)  # retention's first step on the copy
    [finding] = [f for f in plan_repair(deps, "k") if f.led.ledger_id == 0]
    assert finding.tier1_unseen
    truncate(deps, "k", Position(1, 0))
    assert repair_ledger(deps, finding) == "skipped"
    assert deps.meta.get_ledger("k", 0).state == S.DELETED


def test_a_finding_read_as_retention_deleted_its_chunk_row_is_a_lost_race_not_a_failure(deps):
    """The check read ledger 0's row (OFFLOADED) before retention's transaction and its chunk row after it
    (gone): a finding with no chunk row. Found by the race of two repairs and retention on a loaded machine."""
    import dataclasses

    broken_scene(deps)
    [finding] = [f for f in plan_repair(deps, "k") if f.led.ledger_id == 0]
    truncate(deps, "k", Position(1, 0))
    stale = dataclasses.replace(finding, chunk=None)  # what the check saw between the two transactions
    assert repair_ledger(deps, stale) == "skipped"
    # the same finding while the row has not moved on is a real inconsistency, and says so
    [live] = [f for f in plan_repair(deps, "k") if f.led.ledger_id == 1]
    with pytest.raises(TieringError, match="OFFLOADED with no chunk row"):
        repair_ledger(deps, dataclasses.replace(live, chunk=None))


def test_retention_committing_between_the_checks_two_reads_leaves_a_consistent_finding(deps, monkeypatch):
    """Retention deletes ledger 0 right after the check read the topic's OFFLOADED ledgers, before it read
    their chunk rows: both reads are one moment, so the finding still has its chunk, and the repair that
    follows is a lost race (skipped), not a failure."""
    broken_scene(deps)
    real = deps.meta.chunks

    def retention_first(topic_name, conn=None):
        monkeypatch.setattr(deps.meta, "chunks", real)  # once
        truncate(deps, "k", Position(1, 0))  # commits on a connection of its own
        return real(topic_name, conn)
    monkeypatch.setattr(deps.meta, "chunks", retention_first)
    findings = {f.led.ledger_id: f for f in plan_repair(deps, "k")}
    assert deps.meta.get_ledger("k", 0).state == S.DELETED
    assert findings[0].chunk is not None
    assert repair_ledger(deps, findings[0]) == "skipped"


def test_gc_leaves_a_slow_repair_s_objects_while_it_lives(deps):
    """A repair slower than the offload timeout: its queued new objects are due, but GC leaves them while the
    repair's worker holds its attempt's lock, and the repair commits them (one whose objects were collected
    all the same fails, not "skipped": tests/integration/test_defrag_gc.py)."""
    import dataclasses
    from datetime import timedelta

    from tiering.ops.gc import run_gc

    broken_scene(deps)
    hasty = dataclasses.replace(deps, knobs=dataclasses.replace(deps.knobs, offload_timeout=timedelta(0)))
    [f0, _] = plan_repair(hasty, "k")
    old = deps.meta.chunks("k")[0]

    def gc_at(step):
        if step == "checked":
            assert run_gc(hasty, orphan_grace=timedelta(0)).deleted == []  # the live repair's pair is left
    assert repair_ledger(hasty, f0, gc_at) == "repaired"
    assert deps.meta.chunks("k")[0] != old
    assert repair(deps, "k").repaired == [("k", 1)]


def test_two_repairs_and_retention_racing_over_the_same_ledgers(deps, worker_env):
    """Two repair processes and a retention process released at the same instant over four broken ledgers
    (retention removes the first two): each ledger is repaired at most once (the two kept exactly once),
    nothing fails, and after GC the bucket holds exactly what the chunk rows name."""
    from tests.faults.harness import gc_all

    exp = produce(deps, "k", [entries(f"r{i}", 10, 10_000) for i in range(4)],
                  TopicPolicy(retention_bytes=200_000, **BIG), open_tail=[b"tail"])
    for led in deps.meta.list_ledgers("k", [S.SEALED]):
        offload_ledger(deps, led)
    s3, name = deps.bucket.s3, deps.bucket.name
    for ch in deps.meta.chunks("k").values():
        body = bytearray(s3.get_object(Bucket=name, Key=ch.data_key)["Body"].read())
        body[ch.data_offset + 700] ^= 1
        s3.put_object(Bucket=name, Key=ch.data_key, Body=bytes(body))
    workers = [start_worker("repair", worker_env, ["k"]), start_worker("repair", worker_env, ["k"]),
               start_worker("retention", worker_env, ["k"])]
    try:
        for w in workers:
            w.expect("READY")
        for w in workers:
            w.gate.touch()
        reports = [w.done() for w in workers]
    finally:
        for w in workers:
            w.kill()
    repaired = [tuple(x) for r in reports[:2] for x in r["repaired"]]
    assert len(repaired) == len(set(repaired)), f"a ledger repaired twice: {reports}"
    assert {("k", 2), ("k", 3)} <= set(repaired), reports
    assert [r["failed"] for r in reports[:2]] == [[], []], reports  # the failures themselves, in full
    assert sorted(tuple(x) for x in reports[2]["deleted"]) == [("k", 0), ("k", 1)]
    assert [led.state for led in deps.meta.list_ledgers("k")] == [S.DELETED] * 2 + [S.OFFLOADED] * 2 + [S.OPEN]
    settle(deps.meta.engine)
    gc_all(deps)
    check_invariants(deps, deps.meta.engine, {"k": exp}, {"k": {0, 1}})
    assert repair(deps, "k").findings == []


def lost_scene(deps, tier1_back: bool) -> tuple[dict, int]:
    """Two offloaded ledgers, tier-1 copies deleted after the lag; ledger 0's data object lost, the ledger
    marked lost by a repair; then its good copy put back: the object itself, or (`tier1_back`) the tier-1
    file, its object staying corrupt. Returns what was produced and the marked row's version."""
    exp = produce(deps, "k", [entries(f"l{i}", 10, 10 * KIB) for i in range(2)], TopicPolicy(**BIG))
    files = {}
    for led in deps.meta.list_ledgers("k", [S.SEALED]):
        done = offload_ledger(deps, led)
        files[led.ledger_id] = deps.tier1.path("k", led.ledger_id).read_bytes()
        deps.tier1.delete("k", led.ledger_id)
        deps.meta.mark_tier1_deleted(done)
    s3, name, key = deps.bucket.s3, deps.bucket.name, deps.meta.chunks("k")[0].data_key
    body = s3.get_object(Bucket=name, Key=key)["Body"].read()
    s3.put_object(Bucket=name, Key=key, Body=body[:100])
    assert repair(deps, "k").lost == [("k", 0)]
    if tier1_back:
        path = deps.tier1.path("k", 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[0])
    else:
        s3.put_object(Bucket=name, Key=key, Body=body)
    return {"k": exp}, deps.meta.get_ledger("k", 0).version


# point -> whether the recovery committed before the kill
RECOVER_POINTS = {
    (False, "step:recovering"): False, (False, "commit-after-step:recovering"): False,
    (False, "step:recovered"): True,
    (True, "step:queued"): False, (True, "step:index"): False, (True, "step:checked"): False,
    (True, "commit-after-step:checked"): False, (True, "step:committed"): True,
}


@pytest.mark.parametrize("tier1_back,point", list(RECOVER_POINTS))
def test_recovering_a_lost_ledger_killed_then_rerun(tier1_back, point, deps, worker_env):
    """The mark cleared (or the copy re-made and the mark cleared) in one transaction: killed anywhere, the
    ledger is still lost or recovered; the rerun recovers it once; every entry reads back byte-exact."""
    expected, version = lost_scene(deps, tier1_back)
    w = start_worker("repair", worker_env, ["k"], point)
    kill_at_point(w, deps.meta.engine)
    done = RECOVER_POINTS[(tier1_back, point)]
    assert deps.meta.get_ledger("k", 0).lost == (not done)
    settle(deps.meta.engine)
    rerun = repair(deps, "k")
    assert rerun.recovered == ([] if done else [("k", 0)]) and rerun.lost == [] and rerun.failed == []
    led = deps.meta.get_ledger("k", 0)
    assert not led.lost and led.version == version + 1 and led.tier1_present == tier1_back  # recovered once
    assert repair(deps, "k").findings == []
    gc_all(deps)
    check_invariants(deps, deps.meta.engine, expected)
