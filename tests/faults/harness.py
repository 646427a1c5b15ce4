"""Shared machinery of the fault tests: start a worker process and wait for its announced point, and the
invariants every scenario ends with."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import text

from tests.integration.helpers import bucket_keys, open_uploads
from tiering.format.keys import encode_topic
from tiering.model import LedgerState as S
from tiering.read import TRIMMED, Entry, Gap, ReadHandle
from tiering.tier2.reader import tier2_opener

ROOT = Path(__file__).resolve().parents[2]
OFFLOAD_TIMEOUT = timedelta(seconds=1)
WAIT = 60  # seconds a worker may take to reach its point (moto and PostgreSQL are shared with other tests)


class Worker:
    """`python -m tests.faults.worker OP` as a child process, its stdout read line by line."""

    def __init__(self, op: str, env: dict, topics: list[str], point: str | None = None, **extra: str):
        full = dict(os.environ)
        full.update(env)
        full.update(FAULT_TOPICS=json.dumps(topics), FAULT_OFFLOAD_TIMEOUT=str(OFFLOAD_TIMEOUT.total_seconds()),
                    FAULT_GC_DELAY="0", PYTHONUNBUFFERED="1")
        full.pop("FAULT_POINT", None)
        if point:
            full["FAULT_POINT"] = point
        full.update(extra)
        # tag the worker's PostgreSQL sessions, so the test can wait for them to be gone after a kill
        self.app_name = f"fault-worker-{os.urandom(4).hex()}"
        url = full["TIERING_DATABASE_URL"]
        full["TIERING_DATABASE_URL"] = url + ("&" if "?" in url else "?") + f"application_name={self.app_name}"
        self.op, self.point = op, point
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.faults.worker", op], cwd=ROOT, env=full,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: queue.Queue = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.stderr.append, False), daemon=True).start()

    @staticmethod
    def _pump(stream, sink, mark_end: bool) -> None:
        for line in stream:
            sink(line.rstrip("\n"))
        if mark_end:
            sink(None)  # end of stdout: the worker exited

    def expect(self, prefix: str, timeout: float = WAIT) -> str:
        """The next stdout line, which must start with `prefix` (READY, AT, DONE)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise AssertionError(f"worker {self.op} did not say {prefix!r} within {timeout}s; "
                                     f"stderr: {self._err()}") from None
            if line is None:
                self.proc.wait(10)
                raise AssertionError(f"worker {self.op} exited ({self.proc.returncode}) before saying {prefix!r}; "
                                     f"stderr: {self._err()}")
            if line.startswith(prefix):
                return line[len(prefix):].strip()
            if line.startswith(("AT ", "DONE")):
                self.kill()
                raise AssertionError(f"worker {self.op} said {line!r}, expected {prefix!r}")

    def _err(self) -> str:
        time.sleep(0.1)
        return "\n".join(self.stderr)[-3000:]

    def kill(self) -> None:
        """SIGKILL: no cleanup code of the worker runs."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def done(self, timeout: float = WAIT) -> dict:
        report = json.loads(self.expect("DONE", timeout))
        self.proc.wait(10)
        assert self.proc.returncode == 0, self._err()
        return report


def start_worker(op: str, env: dict, topics: list[str], point: str | None = None, **extra: str) -> "Worker":
    """A worker that builds its clients, says READY and waits for `go()`: its start-up (imports,
    connections) overlaps with the test setting the scene."""
    gate = Path(env["TIERING_TIER1_ROOT"]).parent / f"go-{os.urandom(4).hex()}"
    w = Worker(op, env, topics, point, FAULT_GO_FILE=str(gate), **extra)
    w.gate = gate
    return w


def go(w: "Worker") -> None:
    w.expect("READY")
    w.gate.touch()


def kill_at_point(w: "Worker", engine) -> None:
    """Let the worker run, wait for it to announce its point, SIGKILL it there, then wait until
    PostgreSQL noticed: the dead worker's sessions are gone and an open transaction of it rolled back
    (else a rerun could, say, skip GC rows still locked by the corpse)."""
    try:
        go(w)
        reached = w.expect("AT")
        assert reached == w.point
    finally:
        w.kill()
    assert w.proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 20
    with engine.connect() as conn:
        while True:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))
            if not conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"),
                                {"a": w.app_name}).scalar():
                return
            assert time.monotonic() < deadline, "the killed worker's PostgreSQL sessions outlived it by 20 s"
            time.sleep(0.02)


# --------------------------------------------------------------------------------------------- invariants
def referenced_keys(engine) -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT data_key, index_key FROM tiering.chunk")).all()
    return {k for r in rows for k in r}


def impossible_states(engine) -> list[str]:
    """Rows no completed operation may leave; each query returns a description per offending row."""
    checks = {
        "OFFLOADING left after the rerun": "SELECT topic_id, ledger_id FROM tiering.ledger WHERE state = 'OFFLOADING'",
        "OFFLOADED ledger without chunk":
            "SELECT l.topic_id, l.ledger_id FROM tiering.ledger l LEFT JOIN tiering.chunk c USING (topic_id, ledger_id) "
            "WHERE l.state = 'OFFLOADED' AND c.ledger_id IS NULL",
        "chunk of a ledger not OFFLOADED":
            "SELECT c.topic_id, c.ledger_id FROM tiering.chunk c JOIN tiering.ledger l USING (topic_id, ledger_id) "
            "WHERE l.state <> 'OFFLOADED'",
        "chunk whose entry range is not the ledger's":
            "SELECT c.topic_id, c.ledger_id FROM tiering.chunk c JOIN tiering.ledger l USING (topic_id, ledger_id) "
            "WHERE c.first_entry_id <> 0 OR c.last_entry_id <> l.entry_count - 1",
        "DELETED ledger still claiming a tier-1 copy":
            "SELECT topic_id, ledger_id FROM tiering.ledger WHERE state = 'DELETED' AND tier1_present",
        "OFFLOADED ledger without attempt uuid":
            "SELECT topic_id, ledger_id FROM tiering.ledger WHERE state = 'OFFLOADED' AND offload_uuid IS NULL",
        "gc task due and not done": "SELECT task_id, key FROM tiering.gc_task WHERE state = 'PENDING' AND not_before <= now()",
        "gc task FAILED": "SELECT task_id, key FROM tiering.gc_task WHERE state = 'FAILED'",
    }
    found = []
    with engine.connect() as conn:
        for what, sql in checks.items():
            found += [f"{what}: {tuple(r)}" for r in conn.execute(text(sql))]
    return found


def read_everything(deps, topic: str) -> tuple[dict, list[Gap]]:
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket), raise_on_dataloss=True)
    entries, gaps = {}, []
    for item in handle.read(topic):
        if isinstance(item, Entry):
            entries[(item.ledger_id, item.entry_id)] = item.data
        else:
            gaps.append(item)
    return entries, gaps


def check_invariants(deps, engine, expected: dict[str, dict], trimmed: dict[str, set[int]] | None = None) -> dict:
    """Everything a crash-safe pipeline promises once the operation was rerun and GC ran:

    - every entry reads back byte-exact (ReadHandle), and every offloaded ledger's tier-2 copy too;
    - ranges removed by retention read as TRIMMED gaps, never DATALOSS;
    - the bucket holds exactly the objects chunk rows reference, and no multipart upload is left;
    - no impossible metadata row; gc_task holds nothing due;
    - tier-1 files exist exactly for the ledgers metadata says have a copy.
    Returns figures for the caller (objects, uploads)."""
    trimmed = trimmed or {}
    opener = tier2_opener(deps.bucket)
    for topic, want in expected.items():
        gone = trimmed.get(topic, set())
        got, gaps = read_everything(deps, topic)
        assert got == {k: v for k, v in want.items() if k[0] not in gone}, f"{topic!r}: read-back differs"
        assert all(g.kind == TRIMMED for g in gaps)
        assert {lid for g in gaps for lid in range(g.start.ledger_id, g.end.ledger_id + 1)} == gone
        ledgers = deps.meta.list_ledgers(topic)
        chunks = deps.meta.chunks(topic)
        for led in ledgers:
            if led.state == S.OFFLOADED:  # the tier-2 copy itself, even while tier 1 still has one
                data = dict(opener(led, chunks[led.ledger_id]).iter_entries(0, led.entry_count - 1))
                assert data == {e: v for (lid, e), v in want.items() if lid == led.ledger_id}, \
                    f"tier-2 copy of {topic!r}/{led.ledger_id} differs"
                prefix = f"{deps.bucket.prefix}{encode_topic(topic)}/"
                assert chunks[led.ledger_id].data_key.startswith(prefix)
        files = set(deps.tier1.ledger_ids(topic))
        assert files == {led.ledger_id for led in ledgers if led.tier1_present}, \
            f"{topic!r}: tier-1 files {sorted(files)} vs metadata"
    keys, refs, uploads = bucket_keys(deps), referenced_keys(engine), open_uploads(deps)
    assert keys == refs, f"leaked: {sorted(keys - refs)}; missing: {sorted(refs - keys)}"
    assert uploads == [], f"multipart uploads left: {uploads}"
    assert impossible_states(engine) == []
    return {"objects": len(keys), "leaked": len(keys - refs), "uploads": len(uploads)}


def settle(engine) -> float:
    """Sleep until every dead attempt is stale: OFFLOADING rows older than the offload timeout and the gc
    keys an attempt queued due (not_before = its start + the timeout). Returns the seconds slept."""
    with engine.connect() as conn:
        wait = conn.execute(text(
            "SELECT extract(epoch FROM greatest("
            "  (SELECT max(not_before) FROM tiering.gc_task WHERE state = 'PENDING'),"
            "  (SELECT max(offload_started_at) + make_interval(secs => :t) FROM tiering.ledger"
            "   WHERE state = 'OFFLOADING')) - now())"), {"t": OFFLOAD_TIMEOUT.total_seconds()}).scalar()
    wait = max(0.0, float(wait or 0.0)) + 0.05
    time.sleep(wait)
    return wait


def gc_all(deps):
    """The queue's due rows and stale uploads (run_gc), then one whole pass of the orphan sweep (from the
    start of the prefix to its end), all with grace 0. Returns the run's report with `orphans_deleted`."""
    from tiering.ops.gc import sweep_orphans, run_gc

    report = run_gc(deps, orphan_grace=timedelta(0))
    assert report.failed == 0 and report.retried == 0, report
    orphans, started = [], None
    while True:  # a pass that resumed mid-prefix is finished first, then a whole one is run
        sweep = sweep_orphans(deps, orphan_grace=timedelta(0))
        assert not sweep.taken and not sweep.failed, sweep
        orphans += sweep.orphans_deleted
        started = sweep.started_from if started is None else started
        if sweep.pass_complete and started == "":
            break
        started = None if sweep.pass_complete else started
    report.orphans_deleted = orphans
    return report
