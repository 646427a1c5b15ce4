"""Readers racing retention, in separate processes: two subscriptions ack their way through a topic that
retains unread data while retention runs in a loop, visitors create, read, ack and delete subscriptions at the
head, and `tiering retention` processes are killed with SIGKILL mid-run. No entry after the slowest ACTIVE
position may ever be deleted: an ack never lands before the head, no loss is recorded, retention still
trims everything both readers finished, and the killed runs leave nothing half done."""
from __future__ import annotations

import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

from tests.faults import subscription_workers as w
from tests.faults.harness import impossible_states
from tests.integration.helpers import entries, produce
from tiering.model import LedgerState as S, Position, TopicPolicy

ROOT = Path(__file__).resolve().parents[2]
LEDGERS, PER_LEDGER = 12, 10


def test_readers_racing_retention_never_lose_an_unread_entry(deps, db, worker_env):
    policy = TopicPolicy(retention_seconds=0, retain_unread=True, rollover_entries=PER_LEDGER, rollover_bytes=2**40)
    produce(deps, "r", [entries(f"e{i}", PER_LEDGER, 200) for i in range(LEDGERS)], policy, open_tail=[b"t"])
    for name in ("fast", "slow"):
        deps.meta.subs.create("r", name, None)
    ends = [(i, PER_LEDGER) for i in range(LEDGERS)]
    env = {**os.environ, **worker_env, "PYTHONPATH": str(ROOT)}
    until = time.time() + 8
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4, initializer=w.init, initargs=(worker_env,)) as pool:  # clients from the environment, as the CLI
        fast = pool.apply_async(w.acker, ("r", "fast", ends, 3, until))
        slow = pool.apply_async(w.acker, ("r", "slow", ends, 7, until))
        loop = pool.apply_async(w.retention_loop, ("r", until))
        visits = pool.apply_async(w.come_and_go, ("r", until))
        kills = 0
        rnd = random.Random(30)
        while time.time() < until - 2:  # retention runs by the CLI, killed at random points
            proc = subprocess.Popen([sys.executable, "-m", "tiering", "retention", "--topic", "r"], env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rnd.uniform(0.2, 1.2))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
            proc.wait()
        results = {k: r.get(timeout=120) for k, r in
                   {"fast": fast, "slow": slow, "loop": loop, "visits": visits}.items()}

    assert results["fast"]["refused"] == [] and results["slow"]["refused"] == [], results
    assert results["visits"]["refused"] == [] and results["visits"]["rounds"] > 0, results["visits"]
    assert results["loop"]["errors"] == [], results["loop"]
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.subscription_loss")).scalar() == 0
        assert conn.execute(text("SELECT sum(entries_deleted_unread) FROM tiering.subscription")).scalar() == 0
    # both readers finished: one more run trims every sealed ledger, and nothing half done is left
    subprocess.run([sys.executable, "-m", "tiering", "retention", "--topic", "r"], env=env, check=True,
                   capture_output=True, timeout=120)
    ledgers = deps.meta.list_ledgers("r")
    assert [led.state for led in ledgers] == [S.DELETED] * LEDGERS + [S.OPEN]
    assert not any(led.tier1_present for led in ledgers[:LEDGERS])
    assert impossible_states(db) == []
    positions = {s.name: s.position for s in deps.meta.subs.of_topics(["r"])["r"]}
    assert positions == {"fast": Position(LEDGERS - 1, PER_LEDGER - 1), "slow": Position(LEDGERS - 1, PER_LEDGER - 1)}
    assert results["loop"]["deleted"] + kills > 0
