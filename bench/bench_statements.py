"""SQL statements per offloaded ledger: plan + offload of 19 small sealed ledgers the way the offload job
does it (plan_offload by age, then each item), then one catch-up read of the topic from tier 2. Counts every
statement the engine sends (SQLAlchemy's before_cursor_execute), BEGIN/COMMIT excluded.

    .venv/bin/python bench/bench_statements.py [--ledgers 19] [--private-moto]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sqlalchemy import event

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchkit import Env, endpoint, save  # noqa: E402
from tiering.jobs import offload as offload_job  # noqa: E402
from tiering.model import LedgerState  # noqa: E402
from tiering.ops import offload  # noqa: E402
from tiering.read import Entry, ReadHandle  # noqa: E402
from tiering.tier2.reader import tier2_opener  # noqa: E402


class Statements:
    def __init__(self, engine):
        self.n = 0
        self.kinds: dict[str, int] = {}
        event.listen(engine, "before_cursor_execute", self._on)

    def _on(self, conn, cursor, statement, *_a, **_kw):
        self.n += 1
        kind = statement.split(None, 1)[0].upper()
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def take(self) -> tuple[int, dict]:
        out = (self.n, dict(self.kinds))
        self.n, self.kinds = 0, {}
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ledgers", type=int, default=19)
    ap.add_argument("--private-moto", action="store_true")
    ap.add_argument("--no-batch", action="store_true", help="offload one ledger per attempt (no batching)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--name", default="statements")
    args = ap.parse_args()
    args.quick = False
    t0 = time.perf_counter()
    with endpoint(args.private_moto) as url:
        env = Env(url)
        try:
            topic, leds, _ = env.write_ledgers("stmt", args.ledgers, 16 * 1024, 1024, offload_after_seconds=0)
            time.sleep(1.1)  # sealed longer ago than offload-after
            count = Statements(env.engine)
            if args.no_batch:  # one ledger per attempt, as before batching
                for led in offload.plan_offload(env.deps, "age", topic):
                    offload.offload_ledger(env.deps, env.deps.meta.get_ledger(led.topic, led.ledger_id))
            else:  # the offload job: plan (small ledgers of a topic as one item), then work() per item
                ns = argparse.Namespace(prefix=None, by="age", topic=topic, position=None)
                for item in offload_job.plan(env.deps, ns):
                    offload_job.work(env.deps, item)
            n_off, kinds_off = count.take()
            done = env.deps.meta.list_ledgers(topic, [LedgerState.OFFLOADED])
            assert len(done) == args.ledgers, len(done)
            for led in done:
                env.deps.tier1.delete(topic, led.ledger_id)
                env.deps.meta.mark_tier1_deleted(led)
            count.take()
            handle = ReadHandle(env.deps.meta, env.deps.tier1, tier2_opener(env.deps.bucket))
            n = sum(1 for e in handle.read(topic) if isinstance(e, Entry))
            n_read, kinds_read = count.take()
            assert n == args.ledgers * 16
        finally:
            env.close()
    result = {"ledgers": args.ledgers, "offload_statements": n_off, "offload_per_ledger": round(n_off / args.ledgers, 2),
              "offload_kinds": kinds_off, "read_statements": n_read, "read_kinds": kinds_read,
              "seconds": round(time.perf_counter() - t0, 1)}
    mode = "one ledger per attempt" if args.no_batch else "the offload job's plan and work (small ledgers batched)"
    md = (f"# SQL statements per offloaded ledger ({args.ledgers} ledgers of 16 KiB; {mode})\n\n"
          f"| what | statements | per ledger |\n|---|---:|---:|\n"
          f"| plan + offload | {n_off} | {result['offload_per_ledger']} |\n"
          f"| catch-up read of the topic from tier 2 | {n_read} | {round(n_read / args.ledgers, 2)} |\n\n"
          f"By kind: offload {kinds_off}; read {kinds_read}.\n\n")
    save(args.out, args.name, result, md, "bench_statements.py", args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
