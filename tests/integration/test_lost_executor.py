"""An executor lost mid-offload on a real local Spark: its Python workers are killed -9 while
they hold offload attempts; Spark retries the tasks (local[2,4]: up to 4 tries). The run must end with every
planned ledger OFFLOADED (the retries took the dead attempts over at once: the attempts' locks died with
their workers) or FAILED naming the ledgers left behind, never SUCCEEDED with one still OFFLOADING; and the
next run, with an offload timeout of an hour, finishes whatever is left without waiting for it."""
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
from tiering.config import Settings
from tiering.model import LedgerState as S, TopicPolicy

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
KIB = 1024


def _submit(settings: Settings, *args: str) -> subprocess.Popen:
    bindir = Path(sys.executable).parent
    env = {**os.environ, **settings.to_env(), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "PATH": f"{bindir}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT),
           # slow enough to be caught mid-attempt: 8 x 256 KiB at 256 KiB/s for the job
           "TIERING_OFFLOAD_MAX_BYTES_PER_SECOND": str(256 * KIB), "TIERING_OFFLOAD_BATCH_BYTES": "0",
           "TIERING_OFFLOAD_TIMEOUT_SECONDS": "3600"}
    cmd = [str(bindir / "spark-submit"), "--master", "local[2,4]", "--conf", "spark.ui.enabled=false",
           str(ROOT / "tiering" / "jobs" / "offload.py"), *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _python_workers(pid: int) -> list[int]:
    """The job's PySpark daemon and the workers it forked (what dies with a lost executor's node)."""
    found = []
    for p in _descendants(pid):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd:
            found.append(p)
    return found


def _offloading(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM tiering.ledger WHERE state = 'OFFLOADING'")).scalar()


def _last_run(engine) -> tuple[str, int, str | None]:
    with engine.connect() as conn:
        return tuple(conn.execute(text("SELECT status, items_failed, error FROM tiering.job_run "
                                       "WHERE job = 'offload' ORDER BY run_id DESC LIMIT 1")).one())


def test_python_workers_killed_mid_offload_are_never_a_green_run_and_the_next_run_finishes(
        deps, engine, settings):
    produce(deps, "lost", [entries(f"l{i}", 4, 64 * KIB) for i in range(8)],
            TopicPolicy(offload_after_seconds=0, rollover_entries=10**9, rollover_bytes=2**40), open_tail=[b"o"])
    job = _submit(settings, "--by=age", "--topic=lost")
    try:
        deadline = time.monotonic() + 180
        while _offloading(engine) == 0:  # attempts in flight: kill their workers now
            assert job.poll() is None, job.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no offload attempt started within 180 s"
            time.sleep(0.05)
        killed = _python_workers(job.pid)
        assert killed, "no PySpark worker process found under the job"
        for p in killed:
            os.kill(p, signal.SIGKILL)
        out, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    states = [led.state for led in deps.meta.list_ledgers("lost")]
    status, failed, error = _last_run(engine)
    if job.returncode == 0:
        assert status == "SUCCEEDED" and states == [S.OFFLOADED] * 8 + [S.OPEN], (states, err[-2000:])
    else:
        left = [led.ledger_id for led in deps.meta.list_ledgers("lost") if led.state != S.OFFLOADED][:-1]
        assert status == "FAILED" and failed >= 1 and left, (status, failed, states)
        assert any(f"lost/{i}" in err for i in left), err[-3000:]  # the lost ledgers are named

    rerun = _submit(settings, "--by=age", "--topic=lost")
    out, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-3000:]
    assert [led.state for led in deps.meta.list_ledgers("lost")] == [S.OFFLOADED] * 8 + [S.OPEN]
