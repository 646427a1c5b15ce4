"""The dashboard's series over a window that holds the whole store: 1M ledgers of 1,000 topics all sealed (and
most offloaded) within the last week. Ours (`dashboard.series`: whole-hour buckets read the maintained hourly
counters, migration 0010) against the peer, the range scans over `ledger` it replaced (`_SERIES_SQL`, whose
cost follows the ledgers inside the window), interleaved in one run on the same data, medians; both answers
must be equal. Goal: a week <= 0.5 s whatever the window holds.

    set -a; . .local/env; set +a
    .venv/bin/python bench/bench_series.py            # about 2 minutes (loading 1M rows is most of it)
"""
from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from benchkit import ROOT, loadavg, machine, median, rnd, save  # noqa: E402
from tiering import dashboard  # noqa: E402
from tiering.metadata import make_engine, upgrade  # noqa: E402

# Every ledger sealed in the last 7 days (minus an hour); 9 in 10 offloaded 10 minutes after their seal,
# 1 in 40 of those deleted a day later (when that is in the past), the newest two of a topic left in the
# backlog; tier-1 copies kept (irrelevant to the series).
_LOAD = """
INSERT INTO tiering.topic (topic_id, name) SELECT t, 'series-' || t FROM generate_series(1, :topics) t;
INSERT INTO tiering.ledger (topic_id, ledger_id, state, entry_count, size_bytes, created_at, sealed_at,
                            offload_uuid, offload_started_at, offloaded_at, deleted_at)
SELECT t, i, CASE WHEN i >= :per - 2 THEN 'SEALED' WHEN i % 40 = 0 AND s + interval '1 day' < now() THEN 'DELETED'
                  ELSE 'OFFLOADED' END::tiering.ledger_state,
       100, 1048576 + i, s - interval '5 minutes', s,
       CASE WHEN i < :per - 2 THEN gen_random_uuid() END, CASE WHEN i < :per - 2 THEN s END,
       CASE WHEN i < :per - 2 THEN s + interval '10 minutes' END,
       CASE WHEN i < :per - 2 AND i % 40 = 0 AND s + interval '1 day' < now() THEN s + interval '1 day' END
FROM generate_series(1, :topics) t, generate_series(0, :per - 1) i,
     LATERAL (SELECT now() - interval '167 hours' + (interval '166 hours') * i / :per
                     + make_interval(secs => t) AS s) x;
SELECT setval('tiering.topic_topic_id_seq', :topics);
"""


def load(engine, topics: int, per_topic: int) -> float:
    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))  # bulk: no per-row triggers
        for stmt in filter(str.strip, _LOAD.split(";")):
            conn.execute(text(stmt), {"topics": topics, "per": per_topic})
        conn.execute(text("SET LOCAL session_replication_role = origin"))
        conn.execute(text("SELECT tiering.recompute_topic_usage()"))
        conn.execute(text("SELECT tiering.recompute_ledger_hourly()"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE tiering.ledger"))
        conn.execute(text("VACUUM ANALYZE tiering.ledger_hourly"))
    return time.perf_counter() - t0


def peer(conn, hours: int, step_minutes: int) -> list[dict]:
    """The range-scan query of every step before the counters (still used for steps under an hour)."""
    step = step_minutes * 60
    now = conn.execute(text("SELECT now()")).scalar_one()
    return dashboard._rows(conn, dashboard._SERIES_SQL, **dashboard.series_window(now, step, -(-hours * 3600 // step)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--ledgers", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="100,000 ledgers")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    args.private_moto = False  # PostgreSQL only
    if args.quick:
        args.ledgers = 100_000
    started = time.perf_counter()

    server = make_url(os.environ["TIERING_DATABASE_URL"].replace("postgresql://", "postgresql+psycopg2://", 1))
    name = f"tiering_bench_series_{secrets.token_hex(3)}"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        engine = make_engine(url)
        upgrade(engine)
        per = -(-args.ledgers // args.topics)
        load_s = load(engine, args.topics, per)
        ro = dashboard.make_read_only_engine(url)
        cases = [(24, 60), (168, 60), (744, 1440)]
        out = []
        load_before = loadavg()
        for hours, step in cases:
            times = {"ours": [], "peer": []}
            for i in range(args.runs):
                for who in (("ours", "peer") if i % 2 == 0 else ("peer", "ours")):
                    with ro.connect() as conn:
                        t0 = time.perf_counter()
                        if who == "ours":
                            res = dashboard.series(conn, hours, step)["points"]
                        else:
                            res = peer(conn, hours, step)
                        times[who].append(time.perf_counter() - t0)
                        if who == "ours":
                            ours_res = res
                        else:
                            peer_res = res
                assert [dict(p) for p in ours_res] == [{k: dashboard._json_value(v) for k, v in p.items()}
                                                       for p in peer_res], (hours, step)
            o, p = median(times["ours"]), median(times["peer"])
            out.append({"hours": hours, "step_minutes": step, "ours_s": rnd(o, 3), "peer_s": rnd(p, 3),
                        "ours_runs": [rnd(x, 3) for x in times["ours"]], "peer_runs": [rnd(x, 3) for x in times["peer"]],
                        "speedup": rnd(p / o, 1)})
        with engine.connect() as conn:
            hourly_rows = conn.execute(text("SELECT count(*) FROM tiering.ledger_hourly")).scalar_one()
        ro.dispose()
        engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    result = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
              "ledgers": per * args.topics, "topics": args.topics, "hourly_rows": hourly_rows,
              "load_seconds": rnd(load_s, 1), "load_before": load_before, "load_after": loadavg(), "cases": out,
              "seconds": rnd(time.perf_counter() - started)}
    md = (f"# Dashboard series over a week holding every ledger ({result['when']}; {result['ledgers']:,} ledgers, "
          f"{hourly_rows:,} hourly rows; load {result['load_before']} -> {result['load_after']})\n\n"
          "| window, step | ours (hourly counters) s | peer (range scans) s | peer / ours |\n|---|---|---|---|\n" +
          "".join(f"| {c['hours']} h, {c['step_minutes']} min | {c['ours_s']} | {c['peer_s']} | {c['speedup']} |\n"
                  for c in out) + "\n")
    save(args.out, "series", result, md, "bench_series.py", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
