"""`tiering topic delete` SIGKILLed at random points, then run again until it succeeds: every step is safe to
kill and to rerun. At the end the topic is gone, its tier-1 files are gone, every tier-2 object it had is in
the GC queue (so GC deletes exactly those, and the orphan sweep finds nothing), the trim marker covers every
old ledger, and the name is reusable with ledger ids after the old ones."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import text

from tests.faults.harness import impossible_states
from tests.integration.helpers import bucket_keys, entries, produce
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.gc import run_gc, sweep_orphans
from tiering.ops.offload import offload_many
from tiering.tier2.markers import read_trim_marker

ROOT = Path(__file__).resolve().parents[2]
LEDGERS = 24


def test_topic_delete_killed_anywhere_then_rerun(deps, db, worker_env):
    policy = TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40)
    produce(deps, "doomed", [entries(f"d{i}", 20, 2000) for i in range(LEDGERS)], policy, open_tail=[b"tail"])
    produce(deps, "kept", [entries("k", 5, 100)], policy)
    offload_many(deps, deps.meta.list_ledgers("doomed", [S.SEALED])[: LEDGERS // 2])
    keys = {k for c in deps.meta.chunks("doomed").values() for k in (c.data_key, c.index_key)}
    deps.meta.subs.create("doomed", "reader", None)
    env = {**os.environ, **worker_env, "PYTHONPATH": str(ROOT), "TIERING_GC_DELAY_SECONDS": "0"}
    cli = [sys.executable, "-m", "tiering"]
    # the kills land in the delete, not in the interpreter's start: the window begins near the time a
    # command that reads the same settings takes here (seconds on a loaded machine, well under one idle)
    started = time.monotonic()
    subprocess.run([*cli, "topic", "list"], env=env, capture_output=True, check=True)
    start_up = time.monotonic() - started
    rnd, kills, outcomes = random.Random(37), 0, []
    for attempt in range(41):
        proc = subprocess.Popen([*cli, "topic", "delete", "doomed", "--force"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:  # the last attempt runs to its end
            out, err = proc.communicate(timeout=0.8 * start_up + rnd.uniform(0, 1.2) if attempt < 40 else 600)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            kills += 1
            continue
        outcomes.append((proc.returncode, err.decode()))
        if proc.returncode == 0 or "does not exist" in err.decode():
            break
    assert outcomes and (outcomes[-1][0] == 0 or "does not exist" in outcomes[-1][1]), outcomes
    assert all(code in (0, 2) for code, _ in outcomes), outcomes  # never a failure reported as anything else

    assert [t.name for t in deps.meta.list_topics()] == ["kept"]
    assert not [p for p in Path(deps.tier1.root).rglob("*") if p.parent.name.startswith("doomed-")]
    with db.connect() as conn:
        tomb = conn.execute(text("SELECT next_ledger_id FROM tiering.topic_tombstone WHERE name = 'doomed'")).one()
        queued = set(conn.execute(text("SELECT key FROM tiering.gc_task")).scalars())
    assert tomb.next_ledger_id == LEDGERS + 1 and read_trim_marker(deps.bucket, "doomed") == LEDGERS + 1
    assert keys <= queued, "every tier-2 object of the deleted topic is in the GC queue"
    assert impossible_states(db) == [] or all("gc task due" in x for x in impossible_states(db))
    gc = run_gc(deps, orphan_grace=timedelta(0))
    assert keys <= set(gc.deleted) and gc.failed == 0
    assert not any("doomed" in k and not k.endswith("_trimmed") for k in bucket_keys(deps, markers=True))
    assert sweep_orphans(deps, orphan_grace=timedelta(0)).orphans_deleted == []
    # the name is free again, and its ledger ids go on after the old ones
    produce(deps, "doomed", [entries("n", 2, 10)], policy)
    assert [led.ledger_id for led in deps.meta.list_ledgers("doomed")] == [LEDGERS + 1]
    print(f"killed {kills} time(s) before the delete completed")


class _Killed(BaseException):
    """The process dying at that point: nothing after it runs."""


def test_a_delete_stopped_between_recording_a_copy_and_removing_its_file_leaves_no_file(deps, monkeypatch):
    """The kill the random ones above may miss: after a tier-1 copy's deletion is recorded, before its renamed
    file is removed. The rerun finishes the delete and removes that file (no later run lists the topic)."""
    from tiering.ops.topics import delete_topic

    policy = TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40)
    produce(deps, "stopped", [entries(f"s{i}", 3, 100) for i in range(2)], policy)

    def killed(_topic, _ledger_id):
        raise _Killed()

    monkeypatch.setattr(deps.tier1, "purge_retired", killed)
    try:
        delete_topic(deps, "stopped", force=True)
    except _Killed:
        pass
    else:
        raise AssertionError("the delete was not stopped")
    left = [p.name for p in Path(deps.tier1.root).rglob("*") if p.parent.name.startswith("stopped-")]
    assert f"{0:020d}.ledger.retired" in left, left  # stopped at the first ledger's copy
    monkeypatch.undo()
    delete_topic(deps, "stopped", force=True)
    assert "stopped" not in [t.name for t in deps.meta.list_topics()]
    assert not [p for p in Path(deps.tier1.root).rglob("*") if p.parent.name.startswith("stopped-")]
