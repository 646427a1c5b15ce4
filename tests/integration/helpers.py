"""Helpers shared by integration tests: build deps on the run's services, produce known payloads."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

from sqlalchemy import text

from tiering.metadata.repository import MetadataStore
from tiering.model import MIB, TopicPolicy
from tiering.ops.context import Deps, Knobs
from tiering.tier1 import Tier1Store
from tiering.tier2.objects import Bucket
from tiering.workload import payload
from tiering.writer import ManagedLedgerWriter


def make_deps(engine, s3, bucket, tier1_root, **knobs) -> Deps:
    # batch_small_bytes 0: one object pair per ledger, the layout most tests reason about; the batch path
    # (the product's default) is tested where asked for (test_offload_batch.py, faults' batch cases)
    defaults = dict(block_size=5 * MIB, upload_concurrency=3, offload_timeout=timedelta(hours=1),
                    gc_delay=timedelta(0), batch_small_bytes=0)
    defaults.update(knobs)
    return Deps(MetadataStore(engine), Tier1Store(tier1_root), Bucket(s3, bucket, "t/"), Knobs(**defaults))


def produce(deps: Deps, topic: str, ledgers: list[list[bytes]], policy: TopicPolicy | None = None,
            open_tail: list[bytes] | None = None) -> dict:
    """Create `topic` and write one sealed ledger per list of payloads (plus an open tail); returns
    {(ledger, entry): payload}."""
    deps.meta.create_topic(topic, policy or TopicPolicy(rollover_entries=10**9, rollover_bytes=2**40))
    writer = ManagedLedgerWriter(deps.meta, deps.tier1, topic)
    expected = {}
    for entries in ledgers:
        for data in entries:
            pos = writer.append(data)
            expected[(pos.ledger_id, pos.entry_id)] = data
        if entries:
            writer.seal()
        else:  # an empty sealed ledger
            led = deps.meta.open_ledger(topic)
            deps.tier1.create_ledger(topic, led.ledger_id).seal()
            deps.meta.seal_ledger(led, 0, 0)
    for data in open_tail or []:
        pos = writer.append(data)
        expected[(pos.ledger_id, pos.entry_id)] = data
    writer.close()
    return expected


def entries(seed: str, n: int, size: int) -> list[bytes]:
    return [payload(seed, i, size) for i in range(n)]


def bucket_keys(deps: Deps, markers: bool = False) -> set[str]:
    """Every object in the bucket; retention's per-topic trim markers only when asked for."""
    from tiering.format.keys import is_trim_marker

    b = deps.bucket
    keys = set()
    for page in b.s3.get_paginator("list_objects_v2").paginate(Bucket=b.name):
        keys.update(o["Key"] for o in page.get("Contents", []))
    return keys if markers else {k for k in keys if not is_trim_marker(b.prefix, k)}


def open_uploads(deps: Deps) -> list:
    return deps.bucket.s3.list_multipart_uploads(Bucket=deps.bucket.name).get("Uploads", [])


def waiting_on_lock(engine, marker: str) -> bool:
    """Whether a session of this database whose statement holds `marker` waits for a lock now."""
    with engine.connect() as conn:
        return bool(conn.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE :m"),
            {"m": f"%{marker}%"}).scalar())


def wait_until_waiting_on_lock(engine, marker: str, alive, timeout: float = 30) -> None:
    """Poll until a statement holding `marker` waits for a lock, `alive()` turns false, or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not waiting_on_lock(engine, marker) and alive() and time.monotonic() < deadline:
        time.sleep(0.05)


def race_paused_at(engine, hook: str, pause_at, first, second, lock_marker: str, timeout: float = 60) -> tuple:
    """Run `first()` in a thread until a statement of its own for which `pause_at(statement)` is true (at
    SQLAlchemy's `hook`: "before_cursor_execute" or "after_cursor_execute"), hold it there, run `second()` in
    another thread until it waits for a lock (a statement holding `lock_marker`), then let both go on.
    Returns (first's, second's) outcome: its result, or "Type: message" of what it raised."""
    from sqlalchemy import event

    paused, go, owner, outcome = threading.Event(), threading.Event(), [], [None, None]

    def pause(conn, cursor, statement, *_a, **_kw):
        if threading.get_ident() in owner and not paused.is_set() and pause_at(statement):
            paused.set()
            go.wait(timeout)

    def run(i, work, mine=False):
        if mine:
            owner.append(threading.get_ident())
        try:
            outcome[i] = work()
        except Exception as exc:  # noqa: BLE001 - the caller asserts on what each side did
            outcome[i] = f"{type(exc).__name__}: {exc}"

    event.listen(engine, hook, pause)
    a = threading.Thread(target=run, args=(0, first, True))
    b = threading.Thread(target=run, args=(1, second))
    try:
        a.start()
        assert paused.wait(timeout)
        b.start()
        wait_until_waiting_on_lock(engine, lock_marker, b.is_alive)
        go.set()
        a.join(timeout)
        b.join(timeout)
    finally:
        go.set()
        event.remove(engine, hook, pause)
    return tuple(outcome)
