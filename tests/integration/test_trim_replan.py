"""A trim (retention, truncate, topic deletion) plans on ledger rows it has not locked yet: another writer
committing a change to a planned row in between (a repair moving its chunk, delete-lagged dropping the
tier-1 flag, an offload committing) makes the trim's compare-and-set lose. The trim then plans again and
does its work; one that keeps losing fails with nothing changed. Real PostgreSQL, S3 and tier-1 root."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tiering.errors import ConditionalUpdateFailed
from tiering.metadata import trim
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.offload import offload_ledger
from tiering.ops.retention import retention, truncate

TEN = dict(rollover_entries=10, rollover_bytes=2**40)


def scene(deps, **policy) -> None:
    produce(deps, "t", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN, **policy),
            open_tail=[b"x"])
    for led in deps.meta.list_ledgers("t", [S.SEALED]):
        offload_ledger(deps, led)


def bump(deps, ledger_id: int) -> None:
    """Another writer's change to a ledger row, committed on a connection of its own."""
    with deps.meta.engine.begin() as conn:
        conn.execute(text("UPDATE tiering.ledger SET version = version + 1 "
                          "WHERE ledger_id = :l AND topic_id = (SELECT topic_id FROM tiering.topic WHERE name = 't')"),
                     {"l": ledger_id})


def interleave(deps, monkeypatch, obj, name, times: int) -> list:
    """Commit a change to ledger 0 right after each of the first `times` calls of obj.name, before the trim
    locks its rows; returns the list of calls made."""
    real, calls = getattr(obj, name), []

    def planned(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) <= times:
            bump(deps, 0)
        return out
    monkeypatch.setattr(obj, name, planned)
    return calls


def test_retention_losing_to_delete_lagged_plans_again_and_deletes(deps, monkeypatch):
    scene(deps, retention_seconds=0)
    led0 = deps.meta.get_ledger("t", 0)
    real = deps.meta.planning.retention_plan
    locked = []

    def planned(*args, **kwargs):
        out = real(*args, **kwargs)
        if kwargs.get("conn") is not None:  # the plan in the trim's transaction, not the run's list
            locked.append(1)
            if len(locked) == 1:
                deps.tier1.delete("t", 0)
                deps.meta.mark_tier1_deleted(led0)
        return out
    monkeypatch.setattr(deps.meta.planning, "retention_plan", planned)
    report = retention(deps, "t")
    assert sorted(report.deleted) == [("t", 0), ("t", 1), ("t", 2)]
    assert len(locked) == 2  # the lost attempt and the one that held
    assert [led.state for led in deps.meta.list_ledgers("t")] == [S.DELETED] * 3 + [S.OPEN]


def test_truncate_losing_its_compare_and_set_plans_again(deps, monkeypatch):
    scene(deps)
    calls = interleave(deps, monkeypatch, deps.meta.planning, "truncate_before", times=2)
    report = truncate(deps, "t", Position(2, 0))
    assert sorted(report.deleted) == [("t", 0), ("t", 1)] and len(calls) == 3


def test_a_trim_that_keeps_losing_fails_and_changes_nothing(deps, monkeypatch):
    scene(deps, retention_seconds=0)
    before = [(led.state, led.version) for led in deps.meta.list_ledgers("t")]
    calls = interleave(deps, monkeypatch, deps.meta.planning, "retention_plan", times=10**6)
    with pytest.raises(ConditionalUpdateFailed):
        deps.meta.trims.retention("t", timedelta(0))
    assert len(calls) == trim.REPLANS
    after = deps.meta.list_ledgers("t")
    assert [led.state for led in after] == [s for s, _ in before]
    assert [led.version for led in after] == [v + trim.REPLANS * (i == 0) for i, (_, v) in enumerate(before)]
    assert deps.meta.chunks("t").keys() == {0, 1, 2}
