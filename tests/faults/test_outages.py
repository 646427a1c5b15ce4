"""Services failing under a running operation.

S3: a PRIVATE moto server is stopped mid-upload and started again. moto keeps everything in memory, so
after the restart the bucket is gone; the test recreates it. What must hold: the operation fails with a
one-line Tier2Error (operation and key, no credentials), metadata is left with the ledger SEALED (or an
OFFLOADING attempt a later run takes over) and the attempt's keys still queued for GC, no chunk row points
at objects the outage swallowed; after the restart a rerun offloads everything and GC leaves the bucket
holding exactly what metadata references.

PostgreSQL: the operation's backend connections are terminated (pg_terminate_backend) at a chosen point.
Inside a transaction that is a clean failure (the transaction rolls back; the error is SQLAlchemy's
OperationalError, which the CLI prints as one line) and a rerun succeeds; between transactions the
engine's pool_pre_ping makes it invisible.
"""
from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from tests.faults.harness import OFFLOAD_TIMEOUT, check_invariants, gc_all, settle
from tests.integration.helpers import bucket_keys, entries, make_deps, open_uploads, produce
from tests.support.processes import free_port
from tiering.cli.main import describe_failure
from tiering.errors import Tier2Error
from tiering.metadata import make_engine
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.gc import run_gc
from tiering.ops.offload import offload_ledger, offload_many
from tiering.ops.retention import truncate

ROOT = Path(__file__).resolve().parents[2]
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
KIB = 1024


# ------------------------------------------------------------------------------------------------ S3
class PrivateMoto:
    def __init__(self, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc = None

    def start(self) -> None:
        self.proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "moto_server"), "-H", "127.0.0.1", "-p",
                                      str(self.port)], stdout=self.log.open("ab"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"moto_server exited: {self.log.read_text()[-2000:]}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("moto_server did not start listening within 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # by its own pid: the server this test started, nothing else
            self.proc.wait(10)


@pytest.fixture
def moto(tmp_path):
    server = PrivateMoto(tmp_path / "moto.log")
    server.start()
    yield server
    server.stop()


def test_s3_endpoint_stopped_mid_upload_then_restarted(moto, db, tier1_root):
    s3 = boto3.client("s3", endpoint_url=moto.url, aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1",
                      config=Config(retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=2,
                                    read_timeout=20))
    s3.create_bucket(Bucket="outage")
    deps = make_deps(db, s3, "outage", tier1_root, offload_timeout=OFFLOAD_TIMEOUT, upload_concurrency=1)
    # ledger 0: ~6 MiB, two parts; ledger 1 small
    expected = produce(deps, "k", [entries("big", 60, 100 * KIB), entries("small", 10, 10 * KIB)],
                       TopicPolicy(**BIG), open_tail=[b"tail"])
    led0, led1 = deps.meta.list_ledgers("k", [S.SEALED])

    def stop_s3(step):
        if step == "part":  # part 1 stored, the multipart upload open: the endpoint dies
            moto.stop()

    with pytest.raises(Tier2Error) as failure:
        offload_ledger(deps, led0, stop_s3)
    msg = str(failure.value)
    assert "\n" not in msg and msg.startswith("S3 ") and "testing" not in msg, msg
    # the next run, endpoint still down: refused once, before any ledger's metadata changes
    with pytest.raises(Tier2Error, match="tier 2 is unreachable") as down:
        offload_many(deps, [led1])
    assert "\n" not in str(down.value) and "testing" not in str(down.value)
    assert deps.meta.get_ledger("k", led1.ledger_id) == led1, "no version bump, no attempt"

    # metadata: back to SEALED (or a stale OFFLOADING a later run takes over), no chunk; the attempts'
    # keys stay queued, since nobody could delete their objects
    for led in deps.meta.list_ledgers("k", [S.SEALED, S.OFFLOADING, S.OFFLOADED]):
        assert led.state in (S.SEALED, S.OFFLOADING) and deps.meta.get_chunk(led) is None
    with db.connect() as conn:
        queued = conn.execute(text("SELECT count(*) FROM tiering.gc_task")).scalar()
    assert queued == 2  # data + index key of the attempt the outage interrupted, nothing for the refused run

    moto.start()  # in-memory: the bucket and the open upload are gone
    s3.create_bucket(Bucket="outage")
    settle(db)
    report = offload_many(deps, deps.meta.list_ledgers("k", [S.SEALED]) + deps.meta.stale_offloads(OFFLOAD_TIMEOUT))
    assert sorted(report.offloaded) == [0, 1] and not report.failed
    gc_all(deps)
    check_invariants(deps, db, {"k": expected})
    assert len(bucket_keys(deps)) == 4 and open_uploads(deps) == []


def test_s3_down_mid_run_stops_the_run_instead_of_touching_every_ledger(moto, db, tier1_root):
    """Tier 2 dies during the first ledger of a run: that ledger fails, the others are not attempted (no
    version bump, no queued keys), instead of each failing the same way and queueing two keys."""
    s3 = boto3.client("s3", endpoint_url=moto.url, aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1", config=Config(retries={"max_attempts": 2, "mode": "standard"},
                                                             connect_timeout=2, read_timeout=20))
    s3.create_bucket(Bucket="outage")
    deps = make_deps(db, s3, "outage", tier1_root, offload_timeout=OFFLOAD_TIMEOUT, upload_concurrency=1)
    produce(deps, "k", [entries("big", 60, 100 * KIB)] + [entries(f"s{i}", 3, KIB) for i in range(4)], TopicPolicy(**BIG))
    ledgers = deps.meta.list_ledgers("k", [S.SEALED])

    def stop_s3(step):
        if step == "part":
            moto.stop()

    report = offload_many(deps, ledgers, stop_s3)
    assert report.offloaded == [] and sorted(report.failed) == [0, 1, 2, 3, 4]
    assert all("not attempted" in report.failed[i] for i in (1, 2, 3, 4)), report.failed
    assert [deps.meta.get_ledger("k", i) for i in (1, 2, 3, 4)] == ledgers[1:], "untouched: same versions"
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.gc_task")).scalar() == 2  # ledger 0's attempt only


# ------------------------------------------------------------------------------------------------ PostgreSQL
def terminate_others(db) -> int:
    """pg_terminate_backend every other connection of this database, and wait until they are gone."""
    with db.connect() as conn:
        pids = conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )).scalars().all()
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            conn.execute(text("SELECT pg_stat_clear_snapshot()"))  # else the view is frozen for the transaction
            if not conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(:p)"), {"p": pids}).scalar():
                break
            time.sleep(0.02)
        else:
            raise AssertionError(f"backends {pids} still alive 10 s after pg_terminate_backend")
    return len(pids)


@pytest.fixture
def own_engine(database_url):
    """The operation's engine, apart from the test's: its connections are the ones terminated."""
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def own_s3(s3_settings):
    """An S3 client of this test alone (the session's client must not get this test's event handlers)."""
    return boto3.client("s3", **s3_settings)


def _one_line_db_error(exc: BaseException) -> None:
    assert isinstance(exc, OperationalError), repr(exc)
    line = describe_failure(exc)  # what `tiering` prints
    assert "\n" not in line and line.startswith("metadata database unavailable"), line


def test_pg_connections_dropped_at_offload_commit(own_engine, own_s3, db, bucket, tier1_root):
    deps = make_deps(own_engine, own_s3, bucket, tier1_root, offload_timeout=OFFLOAD_TIMEOUT)
    expected = produce(deps, "k", [entries("a", 10, 10 * KIB), entries("b", 10, 10 * KIB)], TopicPolicy(**BIG))
    armed, killed = [False], []

    def hook(step):
        armed[0] = armed[0] or step == "index"

    @event.listens_for(own_engine, "commit")
    def _commit(_conn):  # complete_offload's COMMIT: the transaction is open, its backend dies now
        if armed[0] and not killed:
            killed.append(terminate_others(db))

    led0, led1 = deps.meta.list_ledgers("k", [S.SEALED])
    with pytest.raises(OperationalError) as failure:
        offload_ledger(deps, led0, hook)
    assert killed and killed[0] >= 1
    _one_line_db_error(failure.value)
    event.remove(own_engine, "commit", _commit)
    after = deps.meta.get_ledger("k", 0)  # pool_pre_ping: the engine reconnects by itself
    assert after.state in (S.SEALED, S.OFFLOADING) and deps.meta.get_chunk(after) is None
    settle(db)
    report = offload_many(deps, deps.meta.list_ledgers("k", [S.SEALED]) + deps.meta.stale_offloads(OFFLOAD_TIMEOUT))
    assert sorted(report.offloaded) == [0, 1] and not report.failed
    gc_all(deps)
    check_invariants(deps, db, {"k": expected})


def test_pg_connections_dropped_between_transactions_are_invisible(own_engine, own_s3, db, bucket, tier1_root):
    deps = make_deps(own_engine, own_s3, bucket, tier1_root, offload_timeout=OFFLOAD_TIMEOUT)
    expected = produce(deps, "k", [entries("a", 10, 10 * KIB)], TopicPolicy(**BIG))
    killed = []

    def hook(step):
        if step == "completed":  # between begin_offload's and complete_offload's transactions
            killed.append(terminate_others(db))

    [led] = deps.meta.list_ledgers("k", [S.SEALED])
    assert offload_ledger(deps, led, hook).state == S.OFFLOADED
    assert killed and killed[0] >= 1
    gc_all(deps)
    check_invariants(deps, db, {"k": expected})


def test_pg_connections_dropped_mid_gc_batch(own_engine, own_s3, db, bucket, tier1_root):
    deps = make_deps(own_engine, own_s3, bucket, tier1_root, offload_timeout=OFFLOAD_TIMEOUT)
    expected = produce(deps, "k", [entries(f"g{i}", 5, 10 * KIB) for i in range(3)], TopicPolicy(**BIG),
                       open_tail=[b"tail"])
    offload_many(deps, deps.meta.list_ledgers("k", [S.SEALED]))
    truncate(deps, "k", Position(3, 0))  # 6 keys due now
    killed = []

    def on_delete(**_kwargs):  # GC holds its claimed rows locked while it deletes: the backend dies now
        if not killed:
            killed.append(terminate_others(db))

    own_s3.meta.events.register("before-call.s3.DeleteObjects", on_delete)
    with pytest.raises(OperationalError) as failure:
        run_gc(deps, batch=2, orphan_grace=OFFLOAD_TIMEOUT)
    assert killed and killed[0] >= 1
    _one_line_db_error(failure.value)
    own_s3.meta.events.unregister("before-call.s3.DeleteObjects", on_delete)
    with db.connect() as conn:  # the batch rolled back: its tasks are pending again
        assert conn.execute(text("SELECT count(*) FROM tiering.gc_task WHERE state = 'PENDING'")).scalar() == 6
    report = gc_all(deps)
    assert len(report.deleted) == 6  # two of them already gone from S3: deleting them again is fine
    check_invariants(deps, db, {"k": expected}, {"k": {0, 1, 2}})
    assert bucket_keys(deps) == set()
