"""A run over every topic plans first and works topic by topic: a topic deleted in between (`topic delete`
from another session) has nothing due any more. The run goes on with the other topics and reports the
deleted one's work as not done by it, never as a failure or bad input. Real PostgreSQL, S3 and tier-1 root."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tiering.errors import TopicNotFound, TopicReplaced
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops import defrag as defrag_ops, delete_lagged as lagged_ops, retention as retention_ops
from tiering.ops.delete_lagged import delete_lagged
from tiering.ops.offload import offload_by_topic, offload_ledger, plan_offload
from tiering.ops.topics import delete_topic
from tiering.writer import ManagedLedgerWriter

SMALL = dict(rollover_entries=4, rollover_bytes=2**40, offload_after_seconds=0, deletion_lag_seconds=0)


def two_topics(deps, **policy) -> None:
    for name in ("a", "b"):
        produce(deps, name, [entries(f"{name}{i}", 4, 100) for i in range(3)], TopicPolicy(**SMALL, **policy))
        for led in deps.meta.list_ledgers(name, [S.SEALED]):
            offload_ledger(deps, led)


def delete_after(deps, monkeypatch, obj, name: str, topic: str = "a") -> None:
    """`topic` is deleted right after obj.name returns (the run's plan), before the run works on it."""
    real = getattr(obj, name)

    def planned(*args, **kwargs):
        out = real(*args, **kwargs)
        delete_topic(deps, topic, force=True)
        return out
    monkeypatch.setattr(obj, name, planned)


def test_retention_goes_on_when_a_planned_topic_is_deleted(deps, monkeypatch):
    two_topics(deps, retention_seconds=0)
    delete_after(deps, monkeypatch, retention_ops, "plan_retention")
    report = retention_ops.retention(deps)
    assert sorted({t for t, _ in report.deleted}) == ["b"]
    assert [led.state for led in deps.meta.list_ledgers("b")] == [S.DELETED] * 3
    assert [t.name for t in deps.meta.list_topics()] == ["b"]


def test_delete_lagged_goes_on_when_a_planned_topic_is_deleted(deps, monkeypatch):
    two_topics(deps)
    delete_after(deps, monkeypatch, lagged_ops, "plan_delete_lagged")
    report = delete_lagged(deps)
    assert report.failed == [], report.failed
    assert all(not led.tier1_present for led in deps.meta.list_ledgers("b"))


def test_defrag_goes_on_when_a_planned_topic_is_deleted(deps, monkeypatch):
    two_topics(deps)
    delete_after(deps, monkeypatch, defrag_ops, "plan_defrag")
    report = defrag_ops.merge_groups(deps, defrag_ops.plan_defrag(deps, small_bytes=2**20), small_bytes=2**20)
    assert report.errors == []
    chunks = deps.meta.chunks("b")
    assert len({c.data_key for c in chunks.values()}) == 1  # b's three objects merged into one


def test_offload_by_age_goes_on_when_a_planned_topic_is_deleted(deps):
    for name in ("a", "b"):
        produce(deps, name, [entries(f"{name}{i}", 4, 100) for i in range(3)], TopicPolicy(**SMALL))
    plan = plan_offload(deps, "age")
    assert sorted({led.topic for led in plan}) == ["a", "b"]
    delete_topic(deps, "a")
    report = offload_by_topic(deps, plan)
    assert report.failed == [] and sorted(report.skipped) == [("a", i) for i in range(3)]
    assert [led.state for led in deps.meta.list_ledgers("b")] == [S.OFFLOADED] * 3


def test_a_delete_that_loses_its_topic_to_another_leaves_the_topic_made_again_alone(deps, monkeypatch):
    # two deletes of one topic at once, and the name taken again by a new topic before the slower one
    # goes on: the slower one must not delete the new topic's ledgers, nor the new topic, nor move its marker
    from tiering.tier2.markers import read_trim_marker

    produce(deps, "a", [entries(f"old{i}", 4, 100) for i in range(2)], TopicPolicy(**SMALL))
    trims, real = deps.meta.trims, deps.meta.trims.begin_topic_delete
    calls = []

    def then_another_delete_and_a_new_topic(*args, **kwargs):
        out = real(*args, **kwargs)
        if not calls:
            calls.append(1)
            delete_topic(deps, "a")  # the faster delete finishes
            produce(deps, "a", [entries(f"new{i}", 4, 100) for i in range(2)], TopicPolicy(**SMALL),
                    open_tail=[b"tail"])
        return out
    monkeypatch.setattr(trims, "begin_topic_delete", then_another_delete_and_a_new_topic)
    report = delete_topic(deps, "a")
    # done, by the other run: this one says so and claims nothing it did not delete
    assert report.finished_elsewhere
    assert (report.ledgers_deleted, report.bytes, report.files_removed, report.subscriptions_deleted) == (0, 0, 0, [])
    assert [led.state for led in deps.meta.list_ledgers("a")] == [S.SEALED, S.SEALED, S.OPEN]  # not even sealed
    assert [led.ledger_id for led in deps.meta.list_ledgers("a")] == [2, 3, 4]
    assert read_trim_marker(deps.bucket, "a") == 2  # the old topic's marker, not past the new ledgers


def test_two_deletes_of_one_topic_take_turns_and_both_succeed(deps, monkeypatch):
    # the second delete passed its first step while the first one was deleting: it waits for the first one's
    # steps (the delete fence, which also keeps producers out), then finds the topic finished by it and
    # reports that, with nothing it did not delete, instead of "no topic"
    import threading

    produce(deps, "a", [entries(f"old{i}", 4, 100) for i in range(2)], TopicPolicy(**SMALL))
    deps.meta.subs.create("a", "reader", None)
    trims = deps.meta.trims
    real_steps, real_begin = trims.delete_all_ledgers, trims.begin_topic_delete
    second, began = {}, threading.Event()

    def begin(*args, **kwargs):
        out = real_begin(*args, **kwargs)
        if threading.current_thread() is second.get("thread"):
            began.set()  # its first step done: it goes on to the fence the first one holds
        return out

    def then_another_delete(*args, **kwargs):
        if "thread" not in second:
            second["thread"] = threading.Thread(
                target=lambda: second.update(report=delete_topic(deps, "a", force=True)), daemon=True)
            second["thread"].start()
            assert began.wait(30)
        return real_steps(*args, **kwargs)
    monkeypatch.setattr(trims, "begin_topic_delete", begin)
    monkeypatch.setattr(trims, "delete_all_ledgers", then_another_delete)
    first = delete_topic(deps, "a", force=True)
    second["thread"].join(60)
    later = second["report"]
    assert not first.finished_elsewhere and later.finished_elsewhere
    assert (first.ledgers_deleted, first.bytes, first.subscriptions_deleted, first.files_removed) == \
        (2, 800, ["reader"], 2)
    assert (later.ledgers_deleted, later.subscriptions_deleted, later.files_removed) == (0, [], 0)
    assert "a" not in [t.name for t in deps.meta.list_topics()]
    assert not deps.tier1.has_topic("a")


def test_topic_set_racing_a_delete_and_create_of_its_name_changes_nothing(deps, monkeypatch):
    # `topic set` reads the policy, then writes it back with the change: when the topic it read is deleted
    # and a new one of that name is made in between, the old topic's policy must not be written over the new
    # topic's (here: retain-unread lost, so retention would delete unread entries); the topic id guards it
    # even where the versions could match (a tombstone of before migration 0015 starts the new topic at 0)
    import pytest

    from tiering.errors import ConditionalUpdateFailed
    from tiering.ops.topics import set_policy

    deps.meta.create_topic("p", TopicPolicy(retention_seconds=3600))
    meta, real = deps.meta, deps.meta.set_policy

    def after_a_delete_and_create(*args, **kwargs):
        delete_topic(deps, "p")
        deps.meta.create_topic("p", TopicPolicy(retention_seconds=60, retain_unread=True))
        return real(*args, **kwargs)
    monkeypatch.setattr(meta, "set_policy", after_a_delete_and_create)
    with pytest.raises(ConditionalUpdateFailed):
        set_policy(deps, "p", {"deletion_lag_seconds": 10})
    now = deps.meta.get_topic("p")
    assert now.policy == TopicPolicy(retention_seconds=60, retain_unread=True) and now.version == 1


def test_a_topic_created_while_a_delete_of_its_name_commits_goes_on_after_the_old_ledger_ids(deps, db):
    # the delete's last transaction leaves the tombstone and removes the topic row; a create of the name
    # meanwhile waits for that row and then must see the tombstone, or the new topic starts at ledger 0
    # under the old topic's trim marker: a recovery from the bucket would take its ledgers for trimmed
    from tests.integration.helpers import race_paused_at
    from tiering.ops.offload import offload_many
    from tiering.tier2.markers import read_trim_marker

    produce(deps, "r", [entries(f"old{i}", 4, 100) for i in range(3)], TopicPolicy(**SMALL))
    # the delete paused once the topic row is gone and the tombstone written, neither committed yet
    deleted, created = race_paused_at(db, "after_cursor_execute",
                                      lambda statement: statement.startswith("DELETE FROM tiering.topic WHERE"),
                                      lambda: delete_topic(deps, "r"),
                                      lambda: deps.meta.create_topic("r", TopicPolicy(**SMALL)),
                                      "INSERT INTO tiering.topic ", timeout=30)
    assert deleted.next_ledger_id == 3, deleted
    assert created.next_ledger_id == 3, "the new topic reuses the deleted one's ledger ids"
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.topic_tombstone WHERE name = 'r'")).scalar() == 0
    produce_more = ManagedLedgerWriter(deps.meta, deps.tier1, "r")
    produce_more.append(b"new")
    produce_more.seal()
    produce_more.close()
    assert offload_many(deps, deps.meta.list_ledgers("r", [S.SEALED])).failed == {}
    (new,) = deps.meta.list_ledgers("r")
    assert new.ledger_id >= read_trim_marker(deps.bucket, "r"), "the new topic's ledger lies below its trim marker"


def test_a_writer_between_ledgers_does_not_write_into_the_topic_created_again_under_its_name(deps):
    """A producer idle between two ledgers while its topic is deleted and created again: its next entry
    was meant for the topic that is gone, so it is refused, and the new topic gets nothing."""
    produce(deps, "a", [entries("a", 4, 100)])
    writer = ManagedLedgerWriter(deps.meta, deps.tier1, "a")  # nothing OPEN: the next append opens a ledger
    delete_topic(deps, "a", force=True)
    deps.meta.create_topic("a", TopicPolicy(**SMALL))
    with pytest.raises(TopicReplaced):
        writer.append(b"meant for the old topic")
    assert deps.meta.list_ledgers("a") == []
    assert ManagedLedgerWriter(deps.meta, deps.tier1, "a").append(b"new").entry_id == 0  # the new topic's own


def test_opening_a_ledger_for_a_replaced_topic_is_refused_by_its_compare_and_set(deps):
    """The same race inside the writer's window (the topic read, then deleted and created again before
    the ledger's row is inserted): the row's compare-and-set names the topic by id."""
    produce(deps, "a", [entries("a", 4, 100)])
    old = deps.meta.get_topic("a")
    delete_topic(deps, "a", force=True)
    new = deps.meta.create_topic("a", TopicPolicy(**SMALL))
    with pytest.raises(TopicReplaced):
        deps.meta.open_ledger("a", new.next_ledger_id, old.topic_id)
    assert deps.meta.list_ledgers("a") == []
    assert deps.meta.open_ledger("a", new.next_ledger_id, new.topic_id).ledger_id == new.next_ledger_id


def test_offload_prefix_reports_the_ledgers_of_a_topic_deleted_meanwhile_skipped(deps):
    from tiering.ops.offload import offload_prefix, plan_offload_prefix
    from tiering.model import Position

    produce(deps, "a", [entries(f"a{i}", 4, 100) for i in range(3)], TopicPolicy(**SMALL))
    planned = plan_offload_prefix(deps, "a", Position(3, 0))
    delete_topic(deps, "a")  # after the plan, before any upload: not the caller's mistake (exit 2 before)
    report, first = offload_prefix(deps, "a", Position(3, 0), planned=planned)
    assert (report.offloaded, report.failed, sorted(report.skipped), first) == ([], {}, [0, 1, 2], None)


def test_a_read_of_a_topic_deleted_meanwhile_ends_as_a_failure_not_as_bad_input(deps):
    from tiering.errors import TopicGone
    from tiering.read import ReadHandle
    from tiering.tier2.reader import tier2_opener

    produce(deps, "a", [entries(f"a{i}", 4, 100) for i in range(3)], TopicPolicy(**SMALL))
    reading = iter(ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket)).read("a"))
    first = next(reading)  # the read has started
    assert (first.ledger_id, first.entry_id) == (0, 0)
    delete_topic(deps, "a")
    with pytest.raises(TopicGone, match="'a' was deleted while being read") as err:
        list(reading)
    assert err.value.exit_code == 1


def test_a_producer_opens_no_ledger_while_its_topic_is_being_deleted(deps, monkeypatch):
    """A producer rolling over while `topic delete --force` ran opened its next ledger between the delete's
    steps: the delete had already deleted the subscriptions and ledgers, then failed ("still has 1 live
    ledger(s)"), and the producer went on writing. Its next ledger is now refused while the delete runs."""
    from tiering.errors import TopicBeingDeleted

    produce(deps, "pd", [entries("pd", 4, 100)], TopicPolicy(**SMALL))
    deps.meta.subs.create("pd", "s1", None)
    writer = ManagedLedgerWriter(deps.meta, deps.tier1, "pd")  # between ledgers: its next append opens one
    real, refused = deps.meta.trims.delete_all_ledgers, []

    def producer_rolls_over_now(*args, **kwargs):
        next_id = deps.meta.get_topic("pd").next_ledger_id
        with pytest.raises(TopicBeingDeleted, match="is being deleted") as exc:
            writer.append(b"written while the topic was being deleted")
        refused.append(exc.value)
        assert not deps.tier1.exists("pd", next_id)  # the file it made first, removed with its refusal
        return real(*args, **kwargs)
    monkeypatch.setattr(deps.meta.trims, "delete_all_ledgers", producer_rolls_over_now)
    report = delete_topic(deps, "pd", force=True)
    assert refused and report.ledgers_deleted == 1 and report.subscriptions_deleted == ["s1"]
    assert "pd" not in [t.name for t in deps.meta.list_topics()] and not deps.tier1.has_topic("pd")
    # the fence went with the delete: the name is usable again at once
    deps.meta.create_topic("pd", TopicPolicy(**SMALL))
    assert ManagedLedgerWriter(deps.meta, deps.tier1, "pd").append(b"new").entry_id == 0


def test_a_read_acking_while_its_subscription_is_deleted_fails_it_is_not_bad_input(deps, monkeypatch):
    """`read --ack` racing `topic delete --force`: the subscription went between the reader's look at it and
    its ack, which then said the subscription does not exist, exit 2 (bad input), not exit 1."""
    from tiering.errors import BadInput, TieringError
    from tiering.model import Position
    from tiering.ops.subscriptions import ack

    produce(deps, "ra", [entries("ra", 4, 100), entries("rb", 4, 100)], TopicPolicy(**SMALL))
    reader = deps.meta.subs.create("ra", "s1", None)
    real = deps.meta.subs.set_position

    def deleted_first(sub, position):
        deps.meta.subs.delete("ra", "s1")
        return real(sub, position)
    monkeypatch.setattr(deps.meta.subs, "set_position", deleted_first)
    with pytest.raises(TieringError, match="was deleted while this read ran") as exc:
        ack(deps, "ra", "s1", Position(0, 3), reader=reader)
    assert not isinstance(exc.value, BadInput)


def test_a_delete_waits_for_a_refused_producer_to_let_go_of_its_empty_file(deps, monkeypatch):
    """A producer that made its next ledger's file and is being refused its row holds the file for a moment:
    the delete, which had already deleted the ledgers and subscriptions, failed on it ("being written by
    another writer") and released the fence, and the producer went on writing into the stripped topic."""
    import threading

    produce(deps, "pw", [entries("pw", 4, 100)], TopicPolicy(**SMALL))
    deps.meta.subs.create("pw", "s1", None)
    real = deps.meta.trims.delete_all_ledgers

    def a_producer_holds_its_next_file(*args, **kwargs):
        out = real(*args, **kwargs)
        next_id = deps.meta.get_topic("pw").next_ledger_id
        held = deps.tier1.create_ledger("pw", next_id)  # made, its row about to be refused
        def refused_then_gone():
            deps.tier1.delete("pw", next_id)
            held.close()
        threading.Timer(0.5, refused_then_gone).start()
        return out
    monkeypatch.setattr(deps.meta.trims, "delete_all_ledgers", a_producer_holds_its_next_file)
    report = delete_topic(deps, "pw", force=True)
    assert report.ledgers_deleted == 1 and report.subscriptions_deleted == ["s1"] and not report.finished_elsewhere
    assert "pw" not in [t.name for t in deps.meta.list_topics()] and not deps.tier1.has_topic("pw")


def test_a_delete_whose_seal_loses_to_the_producers_own_rollover_goes_on(deps, monkeypatch):
    """The producer sealed its ledger (a rollover) between the delete's look at the OPEN row and its own
    seal: the delete failed with the raw compare-and-set ("expected version 0 in OPEN, found version 1 in
    SEALED"), both sides exit 1. Under the fence the producer opens no other, so a second look goes on."""
    deps.meta.create_topic("ro", TopicPolicy(**SMALL))
    producer = ManagedLedgerWriter(deps.meta, deps.tier1, "ro")
    producer.append(b"one")  # its ledger 0, OPEN, its file held
    real, done = deps.tier1.open_writer, []

    def the_producer_rolls_over_first(topic, ledger_id, *args, **kwargs):
        if not done:
            done.append(1)
            producer.seal()  # file and row sealed, the file let go
        return real(topic, ledger_id, *args, **kwargs)
    monkeypatch.setattr(deps.tier1, "open_writer", the_producer_rolls_over_first)
    report = delete_topic(deps, "ro", force=True)
    assert done and report.ledgers_deleted == 1 and "ro" not in [t.name for t in deps.meta.list_topics()]
    with pytest.raises(TopicNotFound):
        producer.append(b"two")  # its next ledger: the topic is gone
