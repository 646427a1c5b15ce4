"""A trim (retention, truncate, topic deletion) makes its first plan on ledger rows it has not locked: another
writer committing a change to a planned row in between (a repair moving its chunk, delete-lagged dropping
the tier-1 flag, an offload claiming or committing) would make its compare-and-set lose. So the trim locks
the rows its plan names and plans again under those locks: a writer changing a planned row after every plan
(an offload running through the topic) waits for the trim instead of failing it. A trim whose
compare-and-set still loses plans again, and one that keeps losing fails with nothing changed. Real
PostgreSQL, S3 and tier-1 root."""
from __future__ import annotations

import threading
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tests.integration.test_cli import cli  # noqa: F401 - the fixture
from tiering.errors import ConditionalUpdateFailed
from tiering.metadata import trim
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.offload import offload_ledger
from tiering.ops.retention import retention, truncate
from tiering.ops.topics import delete_topic

TEN = dict(rollover_entries=10, rollover_bytes=2**40)


def scene(deps, **policy) -> None:
    produce(deps, "t", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN, **policy),
            open_tail=[b"x"])
    for led in deps.meta.list_ledgers("t", [S.SEALED]):
        offload_ledger(deps, led)


def bump(deps, ledger_id: int) -> None:
    """Another writer's change to a ledger row, committed on a connection of its own; it gives up after
    0.3 s waiting for the row (the trim's lock: waiting in this thread would wait for ever)."""
    with deps.meta.engine.connect() as conn:
        try:
            with conn.begin():
                conn.execute(text("SET LOCAL lock_timeout = '300ms'"))
                conn.execute(text("UPDATE tiering.ledger SET version = version + 1 WHERE ledger_id = :l AND "
                                  "topic_id = (SELECT topic_id FROM tiering.topic WHERE name = 't')"),
                             {"l": ledger_id})
        except Exception as exc:  # noqa: BLE001 - only the lock's timeout is expected
            assert "lock timeout" in str(exc), exc


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


def test_truncate_plans_again_under_the_row_locks(deps, monkeypatch):
    scene(deps)
    calls = interleave(deps, monkeypatch, deps.meta.planning, "truncate_before", times=2)
    report = truncate(deps, "t", Position(2, 0))
    # the first plan, then the one under the locks (the change tried after it waited for them, gave up)
    assert sorted(report.deleted) == [("t", 0), ("t", 1)] and len(calls) == 2
    assert deps.meta.get_ledger("t", 0).state == S.DELETED


def test_a_trim_that_keeps_losing_fails_and_changes_nothing(deps, monkeypatch):
    """The bound on planning again, with the plan under row locks taken away (so every compare-and-set
    loses to the change committed after its plan)."""
    scene(deps, retention_seconds=0)
    before = [(led.state, led.version) for led in deps.meta.list_ledgers("t")]
    monkeypatch.setattr(trim, "_under_row_locks", lambda store, conn, plan, ledgers_of=None: plan())
    calls = interleave(deps, monkeypatch, deps.meta.planning, "retention_plan", times=10**6)
    with pytest.raises(ConditionalUpdateFailed):
        deps.meta.trims.retention("t", timedelta(0))
    assert len(calls) == trim.REPLANS
    after = deps.meta.list_ledgers("t")
    assert [led.state for led in after] == [s for s, _ in before]
    assert [led.version for led in after] == [v + trim.REPLANS * (i == 0) for i, (_, v) in enumerate(before)]
    assert deps.meta.chunks("t").keys() == {0, 1, 2}


# ---------------------------------------------------------------- an offload claiming ledgers meanwhile

def claim_after_each_plan(deps, monkeypatch, obj, name: str, in_trim) -> list[threading.Thread]:
    """After each plan the trim makes in its transaction (`in_trim(kwargs)`), an offload's claim of the
    next SEALED ledger (SEALED -> OFFLOADING, as an `offload-prefix` running through the topic makes every
    few milliseconds) from a thread of its own, given 0.5 s to land: it lands at once unless the trim holds
    the row, and then waits for the trim. Returns the threads (joined by the caller)."""
    real, threads, next_id = getattr(obj, name), [], [0]

    def claim(led) -> None:
        try:
            deps.meta.begin_offload(led, str(uuid.uuid4()), [], timedelta(hours=1))
        except ConditionalUpdateFailed:
            pass  # the trim took the ledger first: the offload skips it

    def planned(*args, **kwargs):
        out = real(*args, **kwargs)
        if in_trim(kwargs):
            led = deps.meta.get_ledger("t", next_id[0])
            next_id[0] += 1
            th = threading.Thread(target=claim, args=(led,), daemon=True)
            th.start()
            th.join(0.5)
            threads.append(th)
        return out
    monkeypatch.setattr(obj, name, planned)
    return threads


def sealed_scene(deps, **policy) -> None:
    produce(deps, "t", [entries(f"l{i}", 10, 100) for i in range(trim.REPLANS + 2)],
            TopicPolicy(**TEN, **policy))


@pytest.mark.parametrize("trim_kind", ["retention", "truncate", "topic delete"])
def test_an_offload_claiming_a_ledger_after_every_plan_does_not_fail_the_trim(deps, monkeypatch, trim_kind):
    """Planning again after a lost compare-and-set lost every time here: each plan was followed by a claim."""
    sealed_scene(deps, retention_seconds=0)
    every = sorted(led.ledger_id for led in deps.meta.list_ledgers("t"))
    with_conn = lambda kw: kw.get("conn") is not None  # noqa: E731 - the plan in the trim's transaction
    if trim_kind == "retention":
        threads = claim_after_each_plan(deps, monkeypatch, deps.meta.planning, "retention_plan", with_conn)
        deleted = sorted(i for _, i in retention(deps, "t").deleted)
    elif trim_kind == "truncate":
        threads = claim_after_each_plan(deps, monkeypatch, deps.meta.planning, "truncate_before", with_conn)
        deleted = sorted(i for _, i in truncate(deps, "t", Position(every[-1] + 1, 0)).deleted)
    else:
        threads = claim_after_each_plan(deps, monkeypatch, deps.meta, "list_ledgers", with_conn)
        deleted = list(range(delete_topic(deps, "t", force=True).ledgers_deleted))
    for th in threads:
        th.join(10)
        assert not th.is_alive()
    assert deleted == every
    # one claim landed before the locks (its OFFLOADING ledger deleted all the same), one waited for them
    assert len(threads) == 2
    if trim_kind != "topic delete":
        assert [led.state for led in deps.meta.list_ledgers("t")] == [S.DELETED] * len(every)


def test_a_trim_that_deletes_nothing_does_not_say_objects_are_queued(cli, deps):  # noqa: F811
    scene(deps)
    assert cli("retention", "--topic", "t").ok().stdout.strip() == \
        "retention: deleted 0 ledger(s) (0 bytes), removed 0 tier-1 file(s)"
    assert cli("truncate", "t", "1:0", "--dry-run").ok().stdout.strip() == (
        "[dry run] truncate 't' before 1:0 would delete 1 ledger(s) (1000 bytes) and remove 1 tier-1 file(s); their "
        "tier-2 objects would be queued for gc")
    said = cli("truncate", "t", "1:0").ok().stdout
    assert "deleted 1 ledger(s)" in said and "their tier-2 objects are queued for gc" in said
    # ledgers never offloaded have no object to queue
    produce(deps, "u", [entries("u", 10, 100), entries("v", 10, 100)], TopicPolicy(**TEN))
    for args in (("truncate", "u", "1:0"), ("topic", "delete", "u")):
        said = cli(*args).ok().stdout
        assert "deleted" in said and "gc" not in said, said


def test_a_truncate_past_a_subscription_names_its_unread_entries_as_would_or_did(cli, deps):  # noqa: F811
    produce(deps, "w", [entries("w", 10, 100), entries("x", 10, 100)], TopicPolicy(**TEN))
    cli("subscription", "create", "w", "rd").ok()
    preview = cli("truncate", "w", "1:0", "--force", "--dry-run").ok().stdout.strip()
    assert preview.endswith("; unread: 'rd' of 'w' 10 entries (truncate before 1:0 --force)"), preview
    said = cli("truncate", "w", "1:0", "--force").ok().stdout.strip()
    assert said.endswith("; deleted unread: 'rd' of 'w' 10 entries (truncate before 1:0 --force)"), said
