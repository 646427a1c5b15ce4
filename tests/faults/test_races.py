"""Two pipeline processes racing over the same topics: each runs offload_many over the same sealed ledgers
and then delete-lagged, started at the same instant. Every ledger must be offloaded exactly once (one
winner per ledger, one chunk, no extra object even before GC), nothing lost."""
from __future__ import annotations

import pytest

from tests.faults.harness import check_invariants, gc_all, start_worker
from tests.integration.helpers import bucket_keys, entries, produce
from tiering.model import LedgerState as S, TopicPolicy

TOPICS = ["race-a", "race-b"]
N = 4  # ledgers per topic


@pytest.mark.parametrize("batch", [False, True], ids=["per-ledger", "batches"])
@pytest.mark.parametrize("order", ["same-order", "opposite-order"])
def test_two_pipelines_offload_each_ledger_exactly_once(order, batch, deps, db, worker_env):
    # the production offload timeout (1 h): neither pipeline takes over the other's live attempt
    env = dict(worker_env, FAULT_BATCH_BYTES=str(8 * 2**20 if batch else 0))
    workers = [start_worker("offload+delete-lagged", env, TOPICS, FAULT_OFFLOAD_TIMEOUT="3600"),
               start_worker("offload+delete-lagged", env, TOPICS, FAULT_OFFLOAD_TIMEOUT="3600",
                            FAULT_REVERSE="1" if order == "opposite-order" else "0")]
    try:
        policy = TopicPolicy(deletion_lag_seconds=0, rollover_entries=10**9, rollover_bytes=2**40)
        expected = {t: produce(deps, t, [entries(f"{t}{i}", 8, 4096) for i in range(N)], policy, open_tail=[b"o"])
                    for t in TOPICS}
        for w in workers:  # both READY, then both released together
            w.expect("READY")
        for w in workers:
            w.gate.touch()
        reports = [w.done() for w in workers]
    finally:
        for w in workers:
            w.kill()

    wins = [tuple(x) for r in reports for x in r["offloaded"]]
    everything = {(t, i) for t in TOPICS for i in range(N)}
    assert sorted(wins) == sorted(everything), "each ledger offloaded by exactly one pipeline"
    assert all(not r["failed"] for r in reports), reports
    deleted = [tuple(x) for r in reports for x in r["deleted"]]
    assert sorted(deleted) == sorted(everything), "each tier-1 copy deleted (and recorded) exactly once"
    # the loser of a ledger (or batch) lost at begin, before uploading anything: no object to collect
    assert len(bucket_keys(deps)) == (2 * len(TOPICS) if batch else 2 * len(everything))
    for t in TOPICS:
        assert [led.state for led in deps.meta.list_ledgers(t)] == [S.OFFLOADED] * N + [S.OPEN]
        assert len(deps.meta.chunks(t)) == N
        assert len({c.data_key for c in deps.meta.chunks(t).values()}) == (1 if batch else N)
    gc = gc_all(deps)
    assert gc.deleted == [] and gc.orphans_deleted == []
    check_invariants(deps, db, expected)
