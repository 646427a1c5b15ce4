"""Recovery from the bucket killed -9 inside a topic's transaction, then rerun: the lost ledgers it records
(ids with no copy left) are recorded once, the topics end exactly as one uninterrupted recovery leaves them,
and reads name every lost ledger."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.faults.harness import kill_at_point, start_worker
from tests.integration.helpers import entries, produce
from tiering.model import LedgerState as S
from tiering.ops.offload import offload_many
from tiering.ops.recover import recover_from_bucket
from tiering.read import DATALOSS, Gap, ReadHandle
from tiering.tier2.reader import tier2_opener

TOPICS = ("ra", "rb")  # listed, so recovered, in this order (one transaction each)


def _scene(deps, engine) -> None:
    """Each topic: three offloaded ledgers without tier-1 copies, ledger 1's objects gone; then the
    metadata is lost."""
    for t in TOPICS:
        produce(deps, t, [entries(f"{t}{i}", 2, 40) for i in range(3)])
        offload_many(deps, deps.meta.list_ledgers(t, [S.SEALED]))
        mid = deps.meta.chunks(t)[1]
        for led in deps.meta.list_ledgers(t):
            deps.tier1.delete(t, led.ledger_id)
        for key in (mid.data_key, mid.index_key):
            deps.bucket.s3.delete_object(Bucket=deps.bucket.name, Key=key)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE tiering.topic, tiering.ledger, tiering.chunk, tiering.gc_task CASCADE"))


def _rows(engine) -> list[tuple]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT t.name, l.ledger_id, l.state::text, l.entry_count, l.lost_at IS NOT NULL, l.version, "
            "c.ledger_id IS NOT NULL FROM tiering.ledger l JOIN tiering.topic t USING (topic_id) "
            "LEFT JOIN tiering.chunk c USING (topic_id, ledger_id) ORDER BY t.name, l.ledger_id"))]


EXPECTED = [row for t in TOPICS for row in ((t, 0, "OFFLOADED", 2, False, 0, True), (t, 1, "OFFLOADED", 0, True, 0, False),
                                            (t, 2, "OFFLOADED", 2, False, 0, True))]


@pytest.mark.parametrize("point, committed", [("commit:1", ()), ("commit:2", ("ra",))])
def test_a_recovery_killed_inside_a_topic_is_rerun_and_records_each_lost_ledger_once(point, committed, deps, db,
                                                                                    worker_env):
    _scene(deps, db)
    w = start_worker("recover", worker_env, list(TOPICS), point)
    kill_at_point(w, db)
    # the topic whose transaction was open is not there at all; those before it are whole
    assert _rows(db) == [r for r in EXPECTED if r[0] in committed]

    rerun = recover_from_bucket(db, deps.bucket, tier1=deps.tier1)
    assert rerun.ok, rerun.errors
    # (topics are recovered concurrently: in any order)
    assert sorted(rerun.lost_recorded) == [(t, 1) for t in TOPICS if t not in committed]
    assert _rows(db) == EXPECTED
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    for t in TOPICS:
        gaps = [(g.kind, str(g.start), g.end_unknown) for g in handle.read(t) if isinstance(g, Gap)]
        assert gaps == [(DATALOSS, "1:0", True)], t
    again = recover_from_bucket(db, deps.bucket, tier1=deps.tier1)
    assert again.ok and again.lost_recorded == [] and _rows(db) == EXPECTED
