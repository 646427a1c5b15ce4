"""kill -9 of a table sync at each step (a round planned, its files written, the table committed but the
row not advanced), then a rerun: every entry is in the table exactly once, the row agrees with the table,
and the dead run's per-topic lock went with its connection."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.integration.helpers import entries, produce
from tiering.metadata.table_sync import TableRows
from tiering.ops.delete_lagged import delete_copy
from tiering.ops.offload import offload_ledger
from tiering.read import Entry, ReadHandle
from tiering.tables.catalog import catalog
from tiering.tables.files import local_writer
from tiering.tables.sync import TableSync, sync_tables
from tiering.tier2.reader import tier2_opener

ROOT = Path(__file__).resolve().parents[2]


def _killed_at(env: dict, point: str, engine) -> None:
    app = f"table-worker-{os.urandom(4).hex()}"
    url = env["TIERING_DATABASE_URL"]
    full = {**os.environ, **env, "FAULT_POINT": point, "PYTHONUNBUFFERED": "1",
            "TIERING_DATABASE_URL": url + ("&" if "?" in url else "?") + f"application_name={app}"}
    proc = subprocess.Popen([sys.executable, "-m", "tests.faults.table_worker"], cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith(("AT", "DONE")):
                assert line.split()[1] == point, line
                break
        else:
            raise AssertionError(f"the worker exited before {point}: {proc.stderr.read()[-2000:]}")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    deadline = time.monotonic() + 20
    with engine.connect() as conn:  # PostgreSQL noticed: the corpse's sessions (and its lock) are gone
        while conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"),
                           {"a": app}).scalar():
            assert time.monotonic() < deadline
            time.sleep(0.05)
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))


@pytest.mark.parametrize("point", ["planned", "written", "committed"])
def test_kill_at_each_step_then_rerun_gives_every_entry_once(point, deps, worker_env, settings):
    cat = catalog(settings)
    with deps.meta.engine.begin() as conn:
        conn.execute(text("DELETE FROM iceberg_tables"))
    produce(deps, "k", [entries("a", 20, 100), entries("b", 10, 50), [], entries("c", 5, 10)],
            open_tail=entries("d", 2, 10))
    delete_copy(deps, offload_ledger(deps, deps.meta.list_ledgers("k")[0]))
    rows = TableRows(deps.meta.engine)
    rows.set_policy("k", "ns.k", "keep")
    _killed_at(worker_env, point, deps.meta.engine)
    [r] = sync_tables(TableSync(deps.meta.engine, settings, cat), local_writer(deps, settings))
    assert r.status in ("synced", "up_to_date"), r.error
    assert r.reconciled == (point == "committed")
    t = cat.load_table("ns.k").scan().to_arrow()
    keys = list(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist()))
    assert len(keys) == len(set(keys)) == 35
    h = ReadHandle(deps.meta, deps.tier1, open_tier2=tier2_opener(deps.bucket))
    assert dict(zip(keys, t["payload"].to_pylist())) == {
        (e.ledger_id, e.entry_id): e.data for e in h.read("k") if isinstance(e, Entry) and e.ledger_id < 4}
    state = rows.get("k")
    assert (state.synced_through, state.ledgers_committed, state.entries_committed) == (3, 3, 35)
    assert state.metadata_location == cat.load_table("ns.k").metadata_location
