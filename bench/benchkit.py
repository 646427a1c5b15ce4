"""What every benchmark here shares: a scratch database, bucket and tier-1 root per run (removed at the
end), the S3 client the product builds, a request counter, the endpoint server's memory (the local Ceph
RGW of `make services`, or a moto server), an optional private moto server, and small statistics helpers.
Not a benchmark itself.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import boto3
from botocore.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tiering.config import reuse_freed_buffers
from tiering.metadata import make_engine, upgrade
from tiering.metadata.repository import MetadataStore
from tiering.model import TopicPolicy
from tiering.ops.context import Deps, Knobs
from tiering.tier1 import Tier1Store
from tiering.tier2.objects import Bucket
from tiering.workload import payload
from tiering.writer import ManagedLedgerWriter

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
BLOCK_SIZE = 8 * MIB
CONCURRENCY = 4
PREFIX = "bench/"

def s3_client(endpoint: str | None):
    """The client tiering.config.Settings.s3_client builds (same pool, retries and checksum settings)."""
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        config=Config(max_pool_connections=32, retries={"max_attempts": 5, "mode": "standard"},
                      request_checksum_calculation="when_required", response_checksum_validation="when_required"))



class RequestCounter:
    """Counts requests the client sends (botocore `before-send`), per operation, and bytes asked for by
    ranged GETs (from the Range header)."""

    def __init__(self, s3):
        self._lock = threading.Lock()
        self.ops: dict[str, int] = {}
        self.range_bytes = 0
        s3.meta.events.register("before-send.s3", self._on_send)

    def _on_send(self, request=None, event_name: str = "", **_kw):
        op = event_name.rsplit(".", 1)[-1]
        n = 0
        rng = request.headers.get("Range") if request is not None else None
        if rng:
            rng = rng.decode() if isinstance(rng, bytes) else rng
            a, b = rng.split("=", 1)[1].split("-")
            n = int(b) - int(a) + 1
        with self._lock:
            self.ops[op] = self.ops.get(op, 0) + 1
            self.range_bytes += n
        return None  # a non-None value would replace the HTTP response

    def snapshot(self) -> tuple[int, int]:
        with self._lock:
            return sum(self.ops.values()), self.range_bytes


def empty_bucket(s3, bucket: str) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
        if keys:
            s3.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    while True:
        ups = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        if not ups:
            return
        for up in ups:
            s3.abort_multipart_upload(Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])


def start_private_moto() -> tuple[subprocess.Popen, str]:
    """A moto server of our own on a free loopback port: the run neither bloats a shared server (moto keeps
    freed memory) nor competes with other clients' requests inside it."""
    exe = Path(sys.executable).parent / "moto_server"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
            return proc, url
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"private moto server on {url} did not start")
            time.sleep(0.2)


@contextlib.contextmanager
def pinned(endpoint: str | None, enabled: bool):
    """With `enabled`: this checkout's Ceph daemons (radosgw, ceph-osd, ceph-mon: every thread) on CPU 0 and
    this process (and what it starts) on the other CPUs until exit, then both back on every CPU. On a shared
    2-core machine the server otherwise takes the CPU the client needs, so a ratio against a peer measures
    the machine; pinned, the client has a core of its own, as a client of a remote S3 does. Yields a
    sentence for the report (what was pinned, or why nothing was)."""
    if not enabled:
        yield "not pinned: the endpoint's server and the bench share every CPU"
        return
    cpus = sorted(os.sched_getaffinity(0))
    conf = str(ROOT / ".local" / "ceph" / "ceph.conf")
    daemons = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, conf)]
    if len(cpus) < 2 or not endpoint or not daemons:
        yield "not pinned: needs 2 CPUs and this checkout's Ceph as the endpoint"
        return
    server, client = {cpus[0]}, set(cpus[1:])
    _set_affinity(daemons, server)
    os.sched_setaffinity(0, client)
    try:
        yield f"pinned: the Ceph daemons on CPU {cpus[0]}, the bench on CPU {','.join(map(str, sorted(client)))}"
    finally:
        _set_affinity(daemons, set(cpus))
        os.sched_setaffinity(0, set(cpus))


def _cmdline_has(proc: Path, word: str) -> bool:
    try:
        args = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(args) and Path(args[0].decode(errors="replace")).name in ("radosgw", "ceph-osd", "ceph-mon") \
        and word.encode() in args


def _set_affinity(pids: list[int], cpus: set[int]) -> None:
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except OSError:
                pass  # a thread that ended meanwhile


def endpoint_pid(endpoint: str | None) -> tuple[int, str] | None:
    """(pid, name) of the server behind the endpoint if it runs on this machine: this checkout's radosgw
    (.ci/ceph.sh records its PID and ports) or a moto server. Read-only, for its RSS."""
    if not endpoint:
        return None
    port = endpoint.rstrip("/").rsplit(":", 1)[-1]
    ceph = ROOT / ".local" / "ceph"
    try:
        if (ceph / "ports").read_text().split()[4] == port:
            return int((ceph / "rgw.pid").read_text()), "radosgw"
    except (OSError, IndexError, ValueError):
        pass
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            args = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"moto_server" in a for a in args) and port.encode() in args:
            return int(p.name), "moto"
    return None


def proc_status(pid: int | str = "self") -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS", "VmHWM")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def mib(n: float) -> float:
    return n / MIB


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def rnd(x: float, nd: int = 1) -> float:
    return round(x, nd)


def payload_bytes(payloads) -> int:
    """Bytes of an Arrow `binary` array's payloads from its first and last offsets: O(1) per batch, as the raw
    GET's consumer pays len() per chunk (two compute kernels per batch cost ~7% of a 64 MiB scan's CPU)."""
    import numpy as np

    offsets = np.frombuffer(payloads.buffers()[1], np.int32)
    return int(offsets[payloads.offset + len(payloads)] - offsets[payloads.offset])


class Env:
    """Scratch database, bucket and tier-1 root for the run."""

    def __init__(self, endpoint: str | None, block_size: int = BLOCK_SIZE, concurrency: int = CONCURRENCY):
        self.endpoint = endpoint
        server = make_url(os.environ["TIERING_DATABASE_URL"].replace("postgresql://", "postgresql+psycopg2://", 1))
        self.db_name = f"tiering_bench_{secrets.token_hex(3)}"
        self.admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
        with self.admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{self.db_name}"'))
        self.url = server.set(database=self.db_name).render_as_string(hide_password=False)
        self.engine = make_engine(self.url)
        upgrade(self.engine)
        self.s3 = s3_client(endpoint)
        self.counter = RequestCounter(self.s3)
        self.bucket = f"tiering-bench-{secrets.token_hex(4)}"
        self.s3.create_bucket(Bucket=self.bucket)
        self.tier1_root = Path(tempfile.mkdtemp(prefix="tiering-bench-tier1-"))
        reuse_freed_buffers()  # as every product process that builds a bucket (tiering.clients.bucket)
        self.deps = Deps(MetadataStore(self.engine), Tier1Store(self.tier1_root), Bucket(self.s3, self.bucket, PREFIX),
                         Knobs(block_size=block_size, upload_concurrency=concurrency,
                               offload_timeout=timedelta(hours=1), gc_delay=timedelta(0)))
        self.server_pid, self.server_name = endpoint_pid(endpoint) or (None, None)
        self._topics = 0

    def server_rss(self) -> float | None:
        """RSS of the endpoint's server process in MiB (radosgw or moto), None when it is not local."""
        if self.server_pid is None:
            return None
        return rnd(mib(proc_status(self.server_pid).get("VmRSS", 0)))

    def new_topic(self, tag: str, **policy) -> str:
        self._topics += 1
        name = f"bench/{tag}-{self._topics}"
        self.deps.meta.create_topic(name, TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40, **policy))
        return name

    def write_ledgers(self, tag: str, count: int, size: int, entry_size: int, **policy):
        """`count` sealed ledgers of `size` payload bytes each (entries of `entry_size`); returns the Ledger
        rows and their tier-1 paths."""
        topic = self.new_topic(tag, **policy)
        w = ManagedLedgerWriter(self.deps.meta, self.deps.tier1, topic)
        per = max(1, size // entry_size)
        leds = []
        for _ in range(count):
            for i in range(per):
                w.append(payload(topic, i, entry_size))
            leds.append(w.seal())
        w.close()
        return topic, leds, [self.deps.tier1.path(topic, led.ledger_id) for led in leds]

    def job_env(self) -> dict[str, str]:
        """Environment for a `tiering` command or a spark-submit against this run's database and bucket."""
        knobs = self.deps.knobs
        return {**os.environ, "TIERING_DATABASE_URL": self.url, "TIERING_BUCKET": self.bucket,
                "TIERING_PREFIX": PREFIX, "TIERING_TIER1_ROOT": str(self.tier1_root),
                "TIERING_S3_ENDPOINT_URL": self.endpoint or "", "TIERING_BLOCK_SIZE": str(knobs.block_size),
                "TIERING_UPLOAD_CONCURRENCY": str(knobs.upload_concurrency)}

    def reset(self) -> None:
        empty_bucket(self.s3, self.bucket)

    def close(self) -> None:
        try:
            self.reset()
            self.s3.delete_bucket(Bucket=self.bucket)
        finally:
            shutil.rmtree(self.tier1_root, ignore_errors=True)
            self.engine.dispose()
            with self.admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)'))




@contextlib.contextmanager
def endpoint(private: bool):
    """The S3 endpoint to measure against: TIERING_S3_ENDPOINT_URL (`make services`: the local Ceph RGW), or
    with `private` a moto server of the bench's own (to compare with the old figures)."""
    if not private:
        yield os.environ.get("TIERING_S3_ENDPOINT_URL") or None
        return
    moto, url = start_private_moto()
    try:
        yield url
    finally:
        moto.terminate()
        try:
            moto.wait(10)
        except subprocess.TimeoutExpired:
            moto.kill()


def machine() -> dict:
    import s3transfer

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "boto3": boto3.__version__, "s3transfer": s3transfer.__version__}


def endpoint_kind(env: Env, private: bool) -> str:
    if env.server_name == "moto":
        return f"moto server on loopback ({'started by the bench' if private else 'shared'})"
    if env.server_name == "radosgw":
        try:
            version = subprocess.run(["radosgw", "--version"], capture_output=True, text=True).stdout.split()[2]
        except (OSError, IndexError):
            version = "?"
        return (f"Ceph RGW {version} on loopback (.ci/ceph.sh: beast frontend, one BlueStore OSD on a sparse "
                f"file, shared with this machine's other work)")
    return env.endpoint or "AWS S3"


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def save(out_dir: str, name: str, result: dict, md: str, script: str, args) -> None:
    """Write `name`.json and `name`.md (with the run time and the command that reproduces it), print the md."""
    md += (f"Run time: {result['seconds']} s. Command: `.venv/bin/python bench/{script}"
           f"{' --quick' if args.quick else ''}{' --private-moto' if args.private_moto else ''}`.\n")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{name}.md").write_text(md)
    print()
    print(md)
