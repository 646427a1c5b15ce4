"""Metadata benchmarks: the offload-candidate selection query at 10 k, 100 k and 1 M ledger rows (EXPLAIN
shows the partial index; median time reported) and conditional updates per second, single process and
from several processes. Runs in a scratch database of its own; writes bench/results/metadata.{md,json}.

    make bench            # or: .venv/bin/python bench/bench_metadata.py [--sizes 10000,100000,1000000]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import secrets
import statistics
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tiering.metadata import make_engine, upgrade  # noqa: E402
from tiering.metadata.repository import MetadataStore  # noqa: E402

TOPICS = 100


def populate(engine, rows: int) -> None:
    """`rows` ledgers over 100 topics: 98% OFFLOADED or DELETED history, 2% SEALED backlog, one OPEN each."""
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE tiering.topic, tiering.ledger, tiering.chunk RESTART IDENTITY CASCADE"))
        conn.execute(text(
            "INSERT INTO tiering.topic (name, offload_after_seconds) "
            "SELECT 'topic-' || g, CASE WHEN g % 2 = 0 THEN 3600 ELSE -1 END FROM generate_series(1, :n) g"),
            {"n": TOPICS})
        conn.execute(text("ALTER TABLE tiering.ledger DISABLE TRIGGER ledger_chunk_consistent"))
        per = rows // TOPICS
        conn.execute(text("""
            INSERT INTO tiering.ledger (topic_id, ledger_id, state, entry_count, size_bytes, created_at, sealed_at,
                                        tier1_present, tier1_deleted_at, offload_uuid, offloaded_at, deleted_at)
            SELECT t, l,
                   (CASE WHEN l = :per - 1 THEN 'OPEN' WHEN l >= :per * 0.98 THEN 'SEALED'
                         WHEN l < :per * 0.3 THEN 'DELETED' ELSE 'OFFLOADED' END)::tiering.ledger_state,
                   1000, 1048576, now() - make_interval(secs => (:per - l) * 360000.0 / :per),
                   CASE WHEN l = :per - 1 THEN NULL ELSE now() - make_interval(secs => (:per - l) * 360000.0 / :per) END,
                   l >= :per * 0.98, CASE WHEN l >= :per * 0.98 THEN NULL ELSE now() END,
                   CASE WHEN l >= :per * 0.3 AND l < :per * 0.98 THEN gen_random_uuid() END,
                   CASE WHEN l >= :per * 0.3 AND l < :per * 0.98 THEN now() END,
                   CASE WHEN l < :per * 0.3 THEN now() END
            FROM generate_series(1, :topics) t, generate_series(0, :per - 1) l"""),
            {"per": per, "topics": TOPICS})
        conn.execute(text("ALTER TABLE tiering.ledger ENABLE TRIGGER ledger_chunk_consistent"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE tiering.ledger"))
        conn.execute(text("ANALYZE tiering.topic"))


def time_selection(meta: MetadataStore, repeats: int = 15) -> tuple[float, int]:
    times, found = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        found = len(meta.offload_candidates_by_age(limit=10_000))
        times.append(time.perf_counter() - t0)
    return statistics.median(times), found


def explain(engine) -> str:
    from sqlalchemy.dialects import postgresql

    # Compile the same statement the repository runs, with literal values, and EXPLAIN it.
    meta = MetadataStore(engine)
    captured = {}

    class Capture:
        def __init__(self, conn):
            self.conn = conn

        def execute(self, stmt, *a, **k):
            captured["sql"] = str(stmt.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
            return self.conn.execute(stmt, *a, **k)

    with engine.connect() as conn:
        meta.offload_candidates_by_age(limit=10_000, conn=Capture(conn))
        plan = conn.execute(text("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + captured["sql"])).scalars().all()
    return "\n".join(plan)


def _cas_worker(url: str, topic_ids: list[int], seconds: float, barrier) -> int:
    engine = make_engine(url)
    barrier.wait()
    done, deadline = 0, time.perf_counter() + seconds
    with engine.connect() as conn:
        while time.perf_counter() < deadline:
            for tid in topic_ids:
                # The repository's transition shape: compare version, bump it, one transaction.
                with conn.begin():
                    v = conn.execute(text("SELECT version FROM tiering.topic WHERE topic_id = :t"), {"t": tid}).scalar()
                    n = conn.execute(text("UPDATE tiering.topic SET version = version + 1 "
                                          "WHERE topic_id = :t AND version = :v"), {"t": tid, "v": v}).rowcount
                done += n
    engine.dispose()
    return done


def cas_rate(url: str, processes: int, seconds: float = 3.0) -> float:
    ctx = mp.get_context("spawn")
    barrier = ctx.Manager().Barrier(processes)
    with ctx.Pool(processes) as pool:
        ids = [list(range(1 + p * 10, 11 + p * 10)) for p in range(processes)]
        results = [pool.apply_async(_cas_worker, (url, ids[p], seconds, barrier)) for p in range(processes)]
        return sum(r.get() for r in results) / seconds


def transition_rate(meta: MetadataStore, seconds: float = 3.0) -> float:
    """Ledger state changes per second through the product's own transactions: a sealed ledger claimed for
    an offload (SEALED -> OFFLOADING, its keys queued) and the attempt undone (back, keys dequeued), over
    and over; each is one conditional update of a ledger row and so fires the counters' triggers."""
    from datetime import datetime, timedelta, timezone

    name = f"transitions-{secrets.token_hex(3)}"
    meta.create_topic(name)
    led = meta.open_ledger(name)
    led = meta.seal_ledger(led, 10, 10_000, datetime.now(timezone.utc))
    n, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        attempt = str(uuid.uuid4())
        [led] = meta.begin_offload_batch([led], attempt, [f"{attempt}-data", f"{attempt}-index"],
                                         gc_delay=timedelta(hours=1))
        meta.abort_offload_batch([led], attempt, objects_deleted=True)
        led = meta.get_ledger(name, led.ledger_id)
        n += 2
    return n / seconds


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    server = make_url(os.environ["TIERING_DATABASE_URL"].replace("postgresql://", "postgresql+psycopg2://", 1))
    name = f"tiering_bench_{secrets.token_hex(3)}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform()}, "selection": [], "cas": {}}
    try:
        upgrade(engine)
        meta = MetadataStore(engine)
        for size in [int(s) for s in args.sizes.split(",")]:
            t0 = time.perf_counter()
            populate(engine, size)
            load = time.perf_counter() - t0
            median, found = time_selection(meta)
            plan = explain(engine)
            uses_index = "ledger_offload_candidates" in plan
            result["selection"].append({"rows": size, "candidates": found, "median_ms": round(median * 1000, 2),
                                        "uses_partial_index": uses_index, "load_s": round(load, 1), "plan": plan})
            print(f"selection over {size:>9,} ledger rows: {median * 1000:7.2f} ms median, {found} candidates, "
                  f"partial index used: {uses_index}")
        for procs in (1, 4):
            rate = cas_rate(url, procs)
            result["cas"][f"{procs}_process"] = round(rate)
            print(f"conditional updates/s, {procs} process(es): {rate:,.0f}")
        result["ledger_transitions_per_second"] = round(transition_rate(meta))
        print(f"ledger state changes/s (offload claimed and undone, counters' triggers included), one process: "
              f"{result['ledger_transitions_per_second']:,}")
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").write_text(json.dumps(result, indent=2))
    lines = ["| ledger rows | selection median (ms) | candidates | partial index |", "|---:|---:|---:|---|"]
    lines += [f"| {s['rows']:,} | {s['median_ms']} | {s['candidates']} | {s['uses_partial_index']} |"
              for s in result["selection"]]
    lines += ["", f"Conditional updates per second: {result['cas']}", "",
              f"Ledger state changes per second (a claim and its undo, triggers included): "
              f"{result['ledger_transitions_per_second']}", "", "Plan at the largest size:", "```",
              result["selection"][-1]["plan"], "```"]
    (out / "metadata.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
