"""Processes of the subscription race test (top level so `spawn` can import them). Each builds its own
clients from the environment, as the CLI does, and reports what it saw."""
from __future__ import annotations

import os
import time


def init(env: dict) -> None:
    """Pool initializer: the settings of the run's services, in this process's environment only."""
    os.environ.update(env)


def _deps():
    from tiering.cli.context import Context

    return Context().deps


def acker(topic: str, name: str, ends: list, step: int, until: float) -> dict:
    """Acks every `step`-th entry of the topic in order (`ends`: [(ledger id, entry count)]), then the end.
    A refusal is what a bug looks like: retention trimming what this reader had not read makes the next ack
    land 'before the head'."""
    from tiering.errors import TieringError
    from tiering.model import Position
    from tiering.ops.subscriptions import ack

    deps, refused, acked = _deps(), [], 0
    for lid, count in ends:
        for e in list(range(step - 1, count, step)) + [count - 1]:
            try:
                ack(deps, topic, name, Position(lid, e))
                acked += 1
            except TieringError as exc:
                refused.append(f"{lid}:{e}: {exc}")
            time.sleep(0.005)
    while time.time() < until:
        time.sleep(0.05)
    return {"acked": acked, "refused": refused}


def retention_loop(topic: str, until: float) -> dict:
    from tiering.ops.retention import retention

    deps, deleted, errors = _deps(), 0, []
    while time.time() < until:
        try:
            deleted += len(retention(deps, topic).deleted)
        except Exception as exc:  # noqa: BLE001 - reported, the test fails on it
            errors.append(f"{type(exc).__name__}: {exc}")
    return {"deleted": deleted, "errors": errors}


def come_and_go(topic: str, until: float) -> dict:
    """Creates a subscription at the head, reads a few entries through the read path, acks them, deletes it."""
    from tiering.errors import TieringError
    from tiering.ops import subscriptions as subs
    from tiering.read import Entry, ReadHandle

    deps, refused, rounds = _deps(), [], 0
    while time.time() < until:
        name = f"visitor-{rounds}"
        try:
            sub = subs.create(deps, topic, name)
            read = ReadHandle(deps.meta, deps.tier1).read(topic, subs.read_from(sub))
            last = None
            for item in read:
                if isinstance(item, Entry):
                    last = item.position
                    if last.entry_id >= 2:
                        break
            if last is not None:
                subs.ack(deps, topic, name, last)
            subs.delete(deps, topic, name)
        except TieringError as exc:
            refused.append(f"{name}: {exc}")
        rounds += 1
    return {"rounds": rounds, "refused": refused}
