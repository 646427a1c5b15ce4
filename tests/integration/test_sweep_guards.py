"""The orphan sweep and recovery from the bucket never run beside each other, and the sweep refuses to
treat a lost database's whole bucket as orphans. PostgreSQL and RGW."""
from __future__ import annotations

from datetime import timedelta

import pytest

from tests.conftest import empty_tables
from tests.integration.helpers import bucket_keys, entries, produce
from tiering.errors import TieringError
from tiering.metadata import gc_sweep
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.gc import sweep_orphans
from tiering.ops.offload import offload_many
from tiering.ops.recover import recover_from_bucket

BIG = TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40)


@pytest.fixture
def offloaded(deps):
    produce(deps, "sg", [entries(f"sg{i}", 3, 100) for i in range(2)], BIG)
    assert offload_many(deps, deps.meta.list_ledgers("sg", [S.SEALED])).failed == {}
    keys = bucket_keys(deps)
    assert len(keys) == 4
    return keys


def test_the_sweep_refuses_a_database_that_references_nothing_and_deletes_nothing(deps, db, offloaded):
    empty_tables(db)  # the metadata lost: every object of the bucket now looks like an orphan
    with pytest.raises(TieringError, match="recover-from-bucket"):
        sweep_orphans(deps, orphan_grace=timedelta(0))
    assert bucket_keys(deps) == offloaded
    # recovery brings the references back, and the sweep then keeps every object
    report = recover_from_bucket(db, deps.bucket)
    assert report.ok and len(report.ledgers_recovered) == 2
    r = sweep_orphans(deps, orphan_grace=timedelta(0))
    assert r.orphans_deleted == [] and bucket_keys(deps) == offloaded


def test_recovery_refuses_to_start_while_a_sweep_runs(deps, db, offloaded):
    empty_tables(db)
    with gc_sweep.exclusive(db, deps.bucket.name, deps.bucket.prefix) as held:
        assert held
        with pytest.raises(TieringError, match="sweep .* is running"):
            recover_from_bucket(db, deps.bucket)
    assert deps.meta.list_topics() == []  # nothing recovered, nothing half-written


def test_a_sweep_started_during_recovery_fails_and_deletes_nothing(deps, db, offloaded):
    """Not "taken by another worker" (exit 0): no sweep did the work, so the run fails with the reason."""
    empty_tables(db)
    with gc_sweep.excluding_sweep(db, deps.bucket.name, deps.bucket.prefix):
        with pytest.raises(TieringError, match="recovery from the bucket is running"):
            sweep_orphans(deps, orphan_grace=timedelta(0))
    assert bucket_keys(deps) == offloaded
    # recovery over: the sweep runs (and, the metadata still empty, refuses to delete the store)
    with pytest.raises(TieringError, match="recover-from-bucket"):
        sweep_orphans(deps, orphan_grace=timedelta(0))
    assert bucket_keys(deps) == offloaded
