"""The selection rules, with time pinned."""
from datetime import datetime, timedelta, timezone

import pytest

from tiering import policy
from tiering.errors import BadInput
from tiering.model import Chunk, Ledger, LedgerState as S, Position, TopicPolicy

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
MIN = timedelta(minutes=1)


def L(lid, state=S.SEALED, size=100, entries=10, sealed_ago=60, offloaded_ago=None, tier1=True):
    sealed = None if state == S.OPEN else NOW - sealed_ago * MIN
    off = NOW - offloaded_ago * MIN if offloaded_ago is not None else (NOW if state == S.OFFLOADED else None)
    return Ledger(1, "t", lid, state, entries, size, NOW, sealed, tier1, "u" if off else None, None, off, None, 0)


def C(lid, size, key=None):
    return Chunk(key or f"d{lid}", 0, size, f"i{lid}", 0, 10, 0, 9)


def ids(ls):
    return [x.ledger_id for x in ls]


def test_by_age():
    ledgers = [L(0, sealed_ago=120), L(1, sealed_ago=30), L(2, S.OFFLOADED), L(3, entries=0, sealed_ago=999),
               L(4, S.OPEN)]
    assert ids(policy.offload_by_age(ledgers, TopicPolicy(offload_after_seconds=3600), NOW)) == [0]
    assert ids(policy.offload_by_age(ledgers, TopicPolicy(offload_after_seconds=0), NOW)) == [0, 1]
    assert policy.offload_by_age(ledgers, TopicPolicy(offload_after_seconds=-1), NOW) == []


def test_by_size_is_pulsars_newest_to_oldest_walk():
    # sizes newest->oldest: open 50, 4:100 offloaded, 3:100, 2:100, 1:100, 0:100; threshold 250
    ledgers = [L(i) for i in range(4)] + [L(4, S.OFFLOADED), L(5, S.OPEN, size=0)]
    chosen = policy.offload_by_size(ledgers, TopicPolicy(offload_threshold_bytes=250), open_sizes={5: 50})
    # sums: 50, 150 (4 offloaded), 250 (3: not over), 350 (2), 450 (1), 550 (0)
    assert ids(chosen) == [0, 1, 2]
    assert policy.offload_by_size(ledgers, TopicPolicy(offload_threshold_bytes=-1)) == []
    assert ids(policy.offload_by_size(ledgers, TopicPolicy(offload_threshold_bytes=0))) == [0, 1, 2, 3]


def test_offload_prefix_semantics():
    ledgers = [L(0), L(1, S.OFFLOADED), L(2, entries=0), L(3), L(4, S.OPEN)]
    assert ids(policy.offload_prefix(ledgers, Position(4, 0))) == [0, 3]
    assert ids(policy.offload_prefix(ledgers, Position(3, 5))) == [0]
    with pytest.raises(BadInput, match="beyond the end"):
        policy.offload_prefix(ledgers, Position(9, 0))
    with pytest.raises(BadInput, match="beyond the end of ledger 3"):
        policy.offload_prefix(ledgers, Position(3, 11))
    with pytest.raises(BadInput, match="before the first ledger"):
        policy.offload_prefix([L(5), L(6, S.OPEN)], Position(2, 0))


def test_offload_prefix_reaches_the_end_of_a_sealed_topic():
    ledgers = [L(0), L(1, S.OFFLOADED), L(2, entries=10)]  # sealed: no open ledger
    assert ids(policy.offload_prefix(ledgers, Position(2, 9))) == [0]
    assert ids(policy.offload_prefix(ledgers, Position(2, 10))) == [0, 2]  # one past its last entry
    assert ids(policy.offload_prefix(ledgers, Position(3, 0))) == [0, 2]  # the next ledger's first position
    assert policy.end_of_sealed(ledgers) == Position(2, 10)
    assert ids(policy.offload_prefix(ledgers, policy.end_of_sealed(ledgers))) == [0, 2]
    for beyond in (Position(3, 1), Position(4, 0), Position(2, 11)):
        with pytest.raises(BadInput, match="beyond the end"):
            policy.offload_prefix(ledgers, beyond)
    with_open = ledgers + [L(3, S.OPEN)]
    assert policy.end_of_sealed(with_open) == Position(3, 0)
    assert ids(policy.offload_prefix(with_open, Position(3, 0))) == [0, 2]
    with pytest.raises(BadInput, match="beyond the end"):
        policy.offload_prefix(with_open, Position(4, 0))


def test_offload_prefix_of_a_topic_with_nothing_live_is_an_empty_plan_at_its_end():
    # nothing written yet: the end is 0:0 (what --all-sealed names), nothing before it, no error
    assert policy.end_of_sealed([]) == Position(0, 0)
    assert policy.offload_prefix([], Position(0, 0)) == []
    with pytest.raises(BadInput, match="beyond the end"):
        policy.offload_prefix([], Position(0, 1))
    # a topic made again under a deleted one's name starts after its ledger ids: its end is that ledger's N:0
    assert policy.end_of_sealed([], first_ledger=3) == Position(3, 0)
    assert policy.offload_prefix([], Position(3, 0), first_ledger=3) == []
    for other, where in ((Position(0, 0), "before the first ledger 3"), (Position(2, 9), "before the first ledger 3"),
                         (Position(3, 1), "beyond the end"), (Position(4, 0), "beyond the end")):
        with pytest.raises(BadInput, match=f"{where} of the topic .nothing written yet: its end is 3:0."):
            policy.offload_prefix([], other, first_ledger=3)
    # every ledger trimmed: only the end of the topic is a position
    trimmed = [L(0, S.DELETED), L(1, S.DELETED, entries=10)]
    assert policy.offload_prefix(trimmed, policy.end_of_sealed(trimmed)) == []
    assert policy.offload_prefix(trimmed, Position(2, 0)) == []
    for other in (Position(0, 3), Position(1, 2), Position(3, 0)):
        with pytest.raises(BadInput, match="not the end of the topic"):
            policy.offload_prefix(trimmed, other)


def test_lagged_copies():
    ledgers = [L(0, S.OFFLOADED, offloaded_ago=300), L(1, S.OFFLOADED, offloaded_ago=10),
               L(2, S.OFFLOADED, offloaded_ago=999, tier1=False), L(3)]
    assert ids(policy.lagged_copies(ledgers, TopicPolicy(deletion_lag_seconds=3600), NOW)) == [0]
    assert ids(policy.lagged_copies(ledgers, TopicPolicy(deletion_lag_seconds=0), NOW)) == [0, 1]


def test_retention_by_time_is_a_head_prefix():
    ledgers = [L(0, sealed_ago=100), L(1, sealed_ago=5), L(2, sealed_ago=100), L(3, S.OPEN)]
    assert ids(policy.retention(ledgers, TopicPolicy(retention_seconds=3600), NOW)) == [0]  # 2 kept: 1 stops


def test_retention_by_size_keeps_at_least_the_quota():
    ledgers = [L(i, S.OFFLOADED if i < 2 else S.SEALED) for i in range(5)] + [L(5, S.OPEN, size=0)]
    assert ids(policy.retention(ledgers, TopicPolicy(retention_bytes=250), NOW)) == [0, 1]
    assert ids(policy.retention(ledgers, TopicPolicy(retention_bytes=0), NOW)) == [0, 1, 2, 3, 4]
    assert policy.retention(ledgers, TopicPolicy(), NOW) == []


def test_retention_never_passes_the_open_ledger_and_takes_an_offload_in_flight_as_truncate_does():
    assert ids(policy.retention([L(0), L(1, S.OFFLOADING), L(2)], TopicPolicy(retention_seconds=0), NOW)) == [0, 1, 2]
    assert policy.retention([L(0, S.OPEN)], TopicPolicy(retention_seconds=0), NOW) == []


def test_truncate_before():
    ledgers = [L(0, S.DELETED), L(1, S.OFFLOADED), L(2), L(3, S.OPEN)]
    assert ids(policy.truncate_before(ledgers, Position(3, 0))) == [1, 2]
    # an offload in flight is no hole in the trimmed head: it goes with the rest
    ledgers = [L(0, S.OFFLOADING), L(1), L(2, S.OPEN)]
    assert ids(policy.truncate_before(ledgers, Position(2, 0))) == [0, 1]
    with pytest.raises(BadInput):
        policy.truncate_before(ledgers, Position(7, 0))


def test_defrag_groups_runs_of_small_objects():
    ledgers = [L(i, S.OFFLOADED) for i in range(8)] + [L(8)]
    chunks = {0: C(0, 10), 1: C(1, 10), 2: C(2, 500), 3: C(3, 10), 4: C(4, 10), 5: C(5, 10), 6: C(6, 10),
              7: C(7, 10)}
    groups = policy.defrag_groups(ledgers, chunks, small_bytes=100, max_merged_bytes=30)
    assert [ids(g.ledgers) for g in groups] == [[0, 1], [3, 4, 5], [6, 7]]
    assert groups[1].data_bytes == 30


def test_defrag_skips_already_merged_objects_and_single_leftovers():
    ledgers = [L(i, S.OFFLOADED) for i in range(4)]
    chunks = {0: C(0, 10, "m"), 1: C(1, 10, "m"), 2: C(2, 10), 3: C(3, 500)}
    assert policy.defrag_groups(ledgers, chunks, 100, 1000) == []


def test_defrag_runs_cut_where_the_previous_kept_ledger_was_not_a_candidate_and_at_the_size_limit():
    """defrag_runs is what the set-based planner feeds: (ledger, chunk, joins_previous) triples."""
    from tiering.policy import defrag_runs

    now = datetime.now(timezone.utc)

    def led(i):
        return Ledger(1, "t", i, S.OFFLOADED, 1, 10, now, now, False, "u", None, now, None, 0)

    def ch(i, n):
        return Chunk(f"k{i}", 0, n, f"x{i}", 0, 5, 0, 0)

    triples = [(led(0), ch(0, 10), False), (led(1), ch(1, 10), True), (led(2), ch(2, 10), False),
               (led(3), ch(3, 10), True), (led(4), ch(4, 25), True), (led(5), ch(5, 1), True)]
    groups = defrag_runs(triples, max_merged_bytes=30)
    assert [[g.ledger_id for g in grp.ledgers] for grp in groups] == [[0, 1], [2, 3], [4, 5]]
    assert defrag_runs(triples, max_merged_bytes=30, min_group=3) == []


def test_retention_waits_for_every_active_reader_unless_past_a_ceiling():
    ledgers = [L(i, sealed_ago=100) for i in range(4)] + [L(4, S.OPEN, size=0, entries=0)]
    keep = TopicPolicy(retention_seconds=60, retain_unread=True)
    # a reader inside ledger 1 holds 1 and what follows; nothing read holds everything
    assert policy.retention_plan(ledgers, keep, NOW, [Position(1, 3), Position(2, 9)]) == [(ledgers[0], "time")]
    assert policy.retention_plan(ledgers, keep, NOW, [None]) == []
    assert ids(policy.retention(ledgers, keep, NOW, [Position(1, 9)])) == [0, 1]  # the last entry read: all of 1
    # without retain-unread, readers do not count
    assert ids(policy.retention(ledgers, TopicPolicy(retention_seconds=60), NOW, [None])) == [0, 1, 2, 3]
    # past a ceiling, unread ledgers go, with their reason
    capped = TopicPolicy(retention_seconds=60, max_retention_seconds=90, retain_unread=True)
    assert [why for _, why in policy.retention_plan(ledgers, capped, NOW, [None])] == ["ceiling-time"] * 4
    sized = TopicPolicy(retention_bytes=0, max_retention_bytes=150, retain_unread=True)
    assert policy.retention_plan(ledgers, sized, NOW, [Position(0, 9)]) == [(ledgers[0], "size"),
                                                                            (ledgers[1], "ceiling-size")]


def test_unread_loss_and_backlog():
    ledgers = [L(0, entries=10, size=1000), L(1, entries=0, size=0), L(2, entries=4, size=400)]
    loss = policy.unread_loss(Position(0, 4), ledgers)
    assert (loss.entries, loss.bytes, loss.first, loss.new_position) == (9, 900, Position(0, 5), Position(2, 3))
    assert policy.unread_loss(Position(2, 3), ledgers).entries == 0
    assert policy.unread_loss(None, ledgers).entries == 14
    assert policy.backlog(Position(0, 9), ledgers + [L(3, S.DELETED, entries=5)]) == (4, 400)


@pytest.mark.parametrize("field, value", [("subscription_expiry_seconds", 0), ("max_retention_seconds", -2),
                                          ("retain_unread", 1)])
def test_subscription_policy_fields_are_checked(field, value):
    with pytest.raises(BadInput):
        TopicPolicy(**{field: value})


def test_a_ceiling_below_the_retention_it_caps_is_refused():
    with pytest.raises(BadInput, match="max-retention-time .* below the retention-time"):
        TopicPolicy(retention_seconds=100, max_retention_seconds=50)
    with pytest.raises(BadInput, match="max-retention-size"):
        TopicPolicy(retention_bytes=100, max_retention_bytes=50)
    TopicPolicy(retention_seconds=-1, max_retention_seconds=50)  # caps unlimited retention: fine
