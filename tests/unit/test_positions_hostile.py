"""Positions past a ledger's end and acks racing other writers, without services."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from tests.unit.test_policy import L, ids
from tiering import policy
from tiering.errors import BadInput, SubscriptionNotFound, TieringError
from tiering.model import LedgerState as S, Position, Subscription
from tiering.ops import subscriptions


def test_offload_prefix_refuses_past_the_open_ledgers_end():
    ledgers = [L(0), L(1, S.OFFLOADED), L(2, S.OPEN, entries=0)]
    for end in (0, 3, 4):
        assert ids(policy.offload_prefix(ledgers, Position(2, end), open_entries=4)) == [0]
    for beyond in (5, 999):
        with pytest.raises(BadInput, match=r"beyond the end of ledger 2 \(4 entries, open\)"):
            policy.offload_prefix(ledgers, Position(2, beyond), open_entries=4)
    assert ids(policy.offload_prefix(ledgers, policy.end_of_sealed(ledgers), open_entries=0)) == [0]
    with pytest.raises(BadInput, match="beyond the end of ledger 0"):
        policy.offload_prefix(ledgers, Position(0, 11), open_entries=4)


class FakeSubs:
    def __init__(self, sub):
        self.sub, self.sets = sub, []

    def get(self, topic, name):
        return self.sub

    def set_position(self, sub, position):
        self.sets.append(position)
        self.sub = replace(sub, position=position, version=sub.version + 1)
        return self.sub


def fake(position):
    fields = {f: None for f in Subscription.__dataclass_fields__}
    sub = Subscription(**{**fields, "topic": "t", "name": "rd", "position": position, "version": 1})
    subs = FakeSubs(sub)
    return SimpleNamespace(meta=SimpleNamespace(subs=subs, get_ledger=None), tier1=None), subs


def test_a_printed_ack_behind_the_subscription_leaves_it_there():
    deps, subs = fake(Position(44, 31))
    as_read = replace(subs.sub, position=Position(6, 0))  # the reader began at 6:1; retention moved it since
    got = subscriptions.ack(deps, "t", "rd", Position(6, 7), reader=as_read)
    assert got.position == Position(44, 31) and subs.sets == [Position(44, 31)]  # only the ack time moves
    with pytest.raises(BadInput, match="never moves backwards"):
        subscriptions.ack(deps, "t", "rd", Position(6, 7))


def test_a_printed_ack_leaves_a_reset_and_refuses_a_subscription_made_again():
    deps, subs = fake(Position(0, 0))
    as_read = replace(subs.sub, position=Position(3, 5), subscription_id=7)
    subs.sub = replace(subs.sub, subscription_id=7)  # reset to 0:0 while the reader printed 3:6..3:8
    assert subscriptions.ack(deps, "t", "rd", Position(3, 8), reader=as_read).position == Position(0, 0)
    assert subs.sets == []  # the replay asked for stays
    subs.sub = replace(subs.sub, subscription_id=8, position=None)  # deleted and created again
    with pytest.raises(TieringError, match="deleted and created again"):
        subscriptions.ack(deps, "t", "rd", Position(3, 8), reader=as_read)

    def gone(topic, name):
        raise SubscriptionNotFound(topic, name)
    subs.get = gone
    with pytest.raises(TieringError, match="was deleted while this read ran"):
        subscriptions.ack(deps, "t", "rd", Position(3, 8), reader=as_read)
    assert subs.sets == []
