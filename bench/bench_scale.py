"""What every scheduled run costs at production size when NOTHING is due: 1,000 topics with
100,000 and then 1,000,000 ledgers (bench/scale_data.py: synthetic metadata, set-based load) and a bucket of
20,000 tiny objects (or --objects 100000). Each scheduled command runs in-process through the CLI
(`tiering.cli.main.main`, the environment pointing at this run's scratch database, bucket and tier-1 root),
counting every SQL statement any engine sends (SQLAlchemy `before_cursor_execute` on the Engine class),
every S3 request any boto3 client sends (botocore `before-send` on boto3's default session, so clients the
CLI builds count) and seconds; then the dashboard's queries (tiering.dashboard, read-only engine). Each
command's JSON output is checked for work done: a run that did something is flagged, not hidden.

Issue 30: the store also holds --subscriptions (10,000) subscriptions over its topics (scale_data.py: most near
each topic's tail, some without a position, some far behind; a third of the topics retain unread data, some
expire subscriptions and some of theirs are EXPIRED). Besides `retention` the bench runs `retention --dry-run`
and `subscription list --json`, and EXPLAINs (ANALYZE, BUFFERS) the statements of Planning.retention_plan and
Subscriptions.with_backlog, captured as the product sends them, for sequential scans on ledger or subscription.

    .venv/bin/python bench/bench_scale.py [--sizes 100000,1000000] [--objects 20000] [--subscriptions 10000]
                                          [--compare before.json]

Results: bench/results/scale.{json,md}. With --compare, a before/after table against an earlier JSON.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import boto3
from sqlalchemy import event
from sqlalchemy.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from benchkit import PREFIX, Env, endpoint, endpoint_kind, loadavg, machine, rnd, save  # noqa: E402
from scale_data import fill_bucket, load_metadata, write_tier1  # noqa: E402


class Counts:
    """SQL statements and S3 requests of every engine and boto3 client of the process, while active."""

    def __init__(self):
        self._lock = threading.Lock()
        self.active = False
        self.sql = 0
        self.s3: dict[str, int] = {}
        event.listen(Engine, "before_cursor_execute", self._on_sql)
        boto3.setup_default_session()  # clients made from now on (the CLI's) inherit this handler
        boto3.DEFAULT_SESSION.events.register("before-send.s3", self._on_send)

    def _on_sql(self, *_a, **_kw):
        if self.active:
            with self._lock:
                self.sql += 1

    def _on_send(self, event_name: str = "", **_kw):
        if self.active:
            op = event_name.rsplit(".", 1)[-1]
            with self._lock:
                self.s3[op] = self.s3.get(op, 0) + 1
        return None  # a non-None value would replace the HTTP response

    @contextlib.contextmanager
    def window(self):
        with self._lock:
            self.sql, self.s3 = 0, {}
        self.active = True
        t0 = time.perf_counter()
        out = {}
        try:
            yield out
        finally:
            out["seconds"] = round(time.perf_counter() - t0, 3)
            self.active = False
            out["sql"], out["s3_ops"] = self.sql, dict(self.s3)
            out["s3"] = sum(self.s3.values())


# (label, argv, JSON fields that say work was done)
COMMANDS = [
    ("offload-by-age", ["offload-by-age", "--json"], ("planned_count",)),
    ("offload-by-size", ["offload-by-size", "--json"], ("planned_count",)),
    ("delete-lagged", ["delete-lagged", "--json"], ("deleted", "failed")),
    ("retention", ["retention", "--json"], ("deleted", "files_removed_count")),
    ("retention --dry-run", ["retention", "--dry-run", "--json"], ("plan", "deleted")),
    ("subscription list", ["subscription", "list", "--json"], ()),
    ("topic stats", ["topic", "stats", "--json"], ()),
    ("defrag", ["defrag", "--json"], ("planned_group_count", "group_count")),
    ("gc", ["gc", "--json"], ("deleted_count", "uploads_aborted_count", "retried_count", "failed")),
]
SWEEP = ("gc --sweep", ["gc", "--sweep", "--json"], ("orphans_deleted_count", "failed"))
DASHBOARD = [  # (label, function name, kwargs)
    ("dashboard series 24 h", "series", {"hours": 24}),
    ("dashboard series 168 h", "series", {"hours": 168}),
    ("dashboard tier_usage", "tier_usage", {}),
    ("dashboard topics", "topics", {}),
    ("dashboard offload_backlog", "offload_backlog", {}),
    ("dashboard lagged_copies", "lagged_copies", {}),
    ("dashboard gc_queue", "gc_queue", {}),
]


def has_sweep_flag() -> bool:
    """Whether `tiering gc --sweep` exists in this tree."""
    from tiering.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "gc" in a.choices)
    return any("--sweep" in act.option_strings for act in sub.choices["gc"]._actions)


def run_cli(counts: Counts, job_env: dict, argv: list[str], work_fields) -> dict:
    from tiering.cli.main import main as cli_main

    saved = dict(os.environ)
    os.environ.update(job_env)
    out, err = io.StringIO(), io.StringIO()
    try:
        with counts.window() as res, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            res["exit"] = cli_main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    lines = out.getvalue().strip().splitlines()
    res["output_lines"] = len(lines)
    try:
        doc = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        doc = {}
    did = {f: doc[f] for f in work_fields if doc.get(f)}
    res["did"] = {k: (len(v) if isinstance(v, list) else v) for k, v in did.items()}
    if res["exit"] != 0 or err.getvalue().strip():
        res["error"] = err.getvalue().strip()[-500:]
    return res


def run_dashboard(counts: Counts, url: str) -> dict:
    from tiering import dashboard

    engine = dashboard.make_read_only_engine(url)
    out = {}
    try:
        with engine.connect() as conn:  # the first connection's set-up is not a query's cost
            conn.exec_driver_sql("SELECT 1")
        for label, fn, kw in DASHBOARD:
            func = getattr(dashboard, fn, None)
            if func is None:
                out[label] = {"error": f"tiering.dashboard.{fn} does not exist"}
                continue
            try:
                with counts.window() as res, engine.connect() as conn:
                    func(conn, **kw)
            except Exception as exc:  # a statement timeout is a result here, not a crash
                msg = str(getattr(exc, "orig", exc)).strip().splitlines()
                res["error"] = f"{type(getattr(exc, 'orig', exc)).__name__}: {msg[0] if msg else ''}"
            out[label] = res
    finally:
        engine.dispose()
    return out


# a sequential scan of these grows with the history or the readers; listing every subscription reads the
# whole subscription table by definition, so there only ledger is watched
WATCHED = ("ledger", "subscription")


def _walk(plan: dict, nodes: list[dict]) -> None:
    nodes.append(plan)
    for child in plan.get("Plans", []):
        _walk(child, nodes)


def explain(env: Env, label: str, call, marker: str, watched=WATCHED) -> dict:
    """Run `call()` (a product method), capture the statement containing `marker` and its parameters as
    sent, and EXPLAIN (ANALYZE, BUFFERS) it on the same engine (JIT off like every metadata engine):
    sequential scans by relation, indexes used, planning and execution ms, shared buffers touched."""
    sent: list[tuple[str, object]] = []

    def grab(_conn, _cursor, statement, parameters, _context, _executemany):
        sent.append((statement, parameters))

    event.listen(env.engine, "before_cursor_execute", grab)
    try:
        call()
    finally:
        event.remove(env.engine, "before_cursor_execute", grab)
    mine = [x for x in sent if marker in x[0]]
    if len(mine) != 1:
        return {"error": f"{label}: expected one statement with {marker!r}, {len(mine)} of {len(sent)} sent"}
    statement, params = mine[0]
    with env.engine.connect() as conn:
        doc = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params).scalar()
    top = doc[0] if isinstance(doc, list) else json.loads(doc)[0]
    nodes: list[dict] = []
    _walk(top["Plan"], nodes)
    seq = sorted({n.get("Relation Name", "?") for n in nodes if "Seq Scan" in n["Node Type"]})
    idx = sorted({n["Index Name"] for n in nodes if n.get("Index Name")})
    bad = [r for r in seq if r in watched]
    return {"seq_scans": seq, "indexes": idx, "verdict": "FAILS: seq scan on " + ", ".join(bad) if bad else "ok",
            "planning_ms": round(top.get("Planning Time", 0), 1), "execution_ms": round(top.get("Execution Time", 0), 1),
            "shared_buffers": top["Plan"].get("Shared Hit Blocks", 0) + top["Plan"].get("Shared Read Blocks", 0),
            "rows": top["Plan"].get("Actual Rows")}


def explains(env: Env, size: int) -> dict:
    from tiering.metadata.planning import Planning
    from tiering.metadata.subscriptions import Subscriptions

    out = {}
    one = "scale-00001"  # a retain-unread topic with a time limit, a ceiling, an expiry and an expired reader
    for label, call, marker, watched in [
            ("retention_plan", lambda: Planning(env.engine).retention_plan(), "WITH RECURSIVE lim", WATCHED),
            ("retention_plan hold=False", lambda: Planning(env.engine).retention_plan(hold=False),
             "WITH RECURSIVE lim", WATCHED),
            ("subscription backlog, all", lambda: Subscriptions(env.engine).with_backlog(), "oldest_unread_at",
             ("ledger",)),
            (f"subscription backlog, topic {one}", lambda: Subscriptions(env.engine).with_backlog(one),
             "oldest_unread_at", WATCHED)]:
        try:
            out[label] = explain(env, label, call, marker, watched)
        except Exception as exc:  # a result, not a crash
            out[label] = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"}
        r = out[label]
        print(f"[{size}] EXPLAIN {label}: {r.get('verdict', r.get('error'))}, seq scans {r.get('seq_scans')}, "
              f"{r.get('execution_ms')} ms, {r.get('shared_buffers')} buffers, indexes {r.get('indexes')}",
              file=sys.stderr, flush=True)
    return out


def measure(counts: Counts, env: Env, size: int, topics: int, sweep: bool, subscriptions: int = 0) -> dict:
    t0 = time.perf_counter()
    loaded = load_metadata(env.url, topics, size // topics, PREFIX, subscriptions)
    for p in env.tier1_root.iterdir():  # tier 1 matches the new rows
        shutil.rmtree(p)
    loaded["tier1_files"] = write_tier1(env.tier1_root, env.url)
    loaded["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"[{size}] loaded in {loaded['seconds']} s: {loaded['by_state']}, {loaded['subscriptions']}",
          file=sys.stderr, flush=True)
    load_at = loadavg()
    job_env = env.job_env()
    cmds = {}
    for label, argv, fields in COMMANDS + ([SWEEP] if sweep else []):
        if label == "retention":  # the synthetic store has no trim markers yet: a first run writes them
            cmds["retention (first run)"] = run_cli(counts, job_env, argv, fields)
        cmds[label] = run_cli(counts, job_env, argv, fields)
        r = cmds[label]
        print(f"[{size}] {label}: {r['sql']} SQL, {r['s3']} S3 {r['s3_ops']}, {r['seconds']} s"
              f"{' DID ' + str(r['did']) if r['did'] else ''}{' ERROR ' + r['error'] if r.get('error') else ''}",
              file=sys.stderr, flush=True)
    dash = run_dashboard(counts, env.url)
    for label, r in dash.items():
        print(f"[{size}] {label}: {r.get('seconds')} s{' ERROR ' + r['error'] if r.get('error') else ''}",
              file=sys.stderr, flush=True)
    plans = explains(env, size)
    return {"ledgers": size, "topics": topics, "load": loaded, "commands": cmds, "dashboard": dash,
            "explain": plans, "loadavg": [load_at, loadavg()]}


def offload_heads(counts: Counts, env: Env, topics: int) -> dict:
    """An offload run with work: `topics` new topics with one small sealed ledger each (written through the
    product's ManagedLedgerWriter), offload-by-age through the CLI; the bucket check should be one HEAD per
    run, not one per topic. Run after the measurements (it changes the store)."""
    for _ in range(topics):
        env.write_ledgers("due", 1, 16 * 1024, 1024, offload_after_seconds=0)
    time.sleep(1.1)  # sealed longer ago than offload-after 0 by the database's clock
    r = run_cli(counts, env.job_env(), ["offload-by-age", "--json"], ("planned", "offloaded"))
    r["topics"] = topics
    r["head_bucket"] = r["s3_ops"].get("HeadBucket", 0)
    print(f"offload-by-age with {topics} topics due: {r['sql']} SQL, {r['s3_ops']}, {r['seconds']} s",
          file=sys.stderr, flush=True)
    return r


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _cell(r: dict | None, what: str) -> str:
    if r is None:
        return "-"
    if what == "seconds" and r.get("error"):
        return f"{r.get('seconds', '?')} **fails** ({r['error'][:60]})"
    v = r.get(what, "-")
    if what == "s3" and r.get("s3_ops"):
        v = f"{v} ({', '.join(f'{k} {n}' for k, n in sorted(r['s3_ops'].items()))})"
    if what == "seconds" and r.get("did"):
        v = f"{v} (did work: {r['did']})"
    return str(v)


def _ratio(a: dict | None, b: dict | None, what: str = "seconds") -> str:
    if not a or not b or not a.get(what) or b.get(what) is None or a.get("error") or b.get("error"):
        return "-"
    return f"{b[what] / a[what]:.2f}"


def rows_of(sizes_res: list[dict]) -> list[tuple[str, list[dict | None]]]:
    labels = list(dict.fromkeys(k for s in sizes_res for k in s["commands"]))
    rows = [(k, [s["commands"].get(k) for s in sizes_res]) for k in labels]
    dlabels = list(dict.fromkeys(k for s in sizes_res for k in s["dashboard"]))
    return rows + [(k, [s["dashboard"].get(k) for s in sizes_res]) for k in dlabels]


def table(res: dict) -> str:
    sizes = res["sizes"]
    head = ["scheduled run, nothing due"]
    for s in sizes:
        n = _label(s["ledgers"])
        head += [f"SQL {n}", f"S3 {n}", f"s {n}"]
    if len(sizes) > 1:
        head.append(f"s {_label(sizes[-1]['ledgers'])}/{_label(sizes[0]['ledgers'])}")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" + "---:|" * (len(head) - 1)]
    for label, rs in rows_of(sizes):
        cells = [f"`{label}`"]
        for r in rs:
            cells += [_cell(r, "sql"), _cell(r, "s3"), _cell(r, "seconds")]
        if len(sizes) > 1:
            cells.append(_ratio(rs[0], rs[-1]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def compare_table(before: dict, after: dict) -> str:
    """Per command and size: before and after SQL, S3, seconds, and the time ratio before/after."""
    bsz = {s["ledgers"]: s for s in before["sizes"]}
    out = ["| run | size | SQL before | SQL after | S3 before | S3 after | s before | s after | before/after |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in after["sizes"]:
        b = bsz.get(s["ledgers"])
        if b is None:
            continue
        for label, (rb, ra) in [(k, rs) for k, rs in rows_of([b, s])]:
            out.append(f"| `{label}` | {_label(s['ledgers'])} | {_cell(rb, 'sql')} | {_cell(ra, 'sql')} | "
                       f"{_cell(rb, 's3')} | {_cell(ra, 's3')} | {_cell(rb, 'seconds')} | {_cell(ra, 'seconds')} | "
                       f"{_ratio(ra, rb)} |")
    return "\n".join(out) + "\n"


def offload_line(res: dict) -> str:
    r = res.get("offload_due")
    if not r:
        return ""
    return (f"\nAn offload run with work (after the above, on the {_label(res['sizes'][-1]['ledgers'])} store): "
            f"{r['topics']} topics with one small ledger due each, `offload-by-age`: {r['sql']} SQL, "
            f"{_cell(r, 's3')} S3, {r['seconds']} s; **{r['head_bucket']} HeadBucket** (the README says one per "
            f"run){'; ERROR ' + r['error'] if r.get('error') else ''}; did {r['did']}.\n")


def targets(res: dict) -> str:
    """Issue 19's 'done when' figures, checked against this run."""
    by = {s["ledgers"]: s for s in res["sizes"]}
    small, big = by.get(100_000), by.get(1_000_000)
    out = []
    if small:
        for label in ("offload-by-age", "offload-by-size", "delete-lagged", "retention", "defrag"):
            r = small["commands"].get(label, {})
            ok = r.get("sql", 99) <= 20 and r.get("s3", 99) <= 2 and not r.get("error")
            extra = ""
            if big and label in big["commands"]:
                ratio = big["commands"][label]["seconds"] / max(r.get("seconds", 1e-9), 1e-9)
                ok = ok and ratio <= 2
                extra = f", 1M/100k time {ratio:.2f}"
            out.append(f"- `{label}`: {r.get('sql')} SQL, {r.get('s3')} S3 at 100k{extra}: "
                       f"{'meets' if ok else 'MISSES'} (<= 20 SQL, <= 2 S3, time ratio <= 2)")
        g = small["commands"].get("gc", {})
        ok = g.get("s3", 99) <= 5 and g.get("sql", 99) <= 10 and not g.get("error")
        out.append(f"- `gc` (scheduled): {g.get('sql')} SQL, {g.get('s3')} S3 with {res['objects']} objects: "
                   f"{'meets' if ok else 'MISSES'} (<= 10 SQL, <= 5 S3)")
    for s, limit in ((small, 1), (big, 2)):
        if s:
            r = s["dashboard"].get("dashboard series 168 h", {})
            ok = not r.get("error") and r.get("seconds", 99) < limit
            out.append(f"- dashboard `series` 168 h at {_label(s['ledgers'])}: {r.get('seconds')} s"
                       f"{' (' + r['error'][:60] + ')' if r.get('error') else ''}: "
                       f"{'meets' if ok else 'MISSES'} (< {limit} s)")
    return "\n".join(out) + "\n"


def explain_table(res: dict) -> str:
    """Verdict: no sequential scan on ledger or subscription (on ledger only for the list of every
    subscription, which reads the whole subscription table by definition)."""
    lines = ["| statement | size | verdict | seq scans | indexes | execution ms | buffers | rows |",
             "|---|---|---|---|---|---:|---:|---:|"]
    for s in res["sizes"]:
        for label, r in s.get("explain", {}).items():
            if r.get("error"):
                lines.append(f"| `{label}` | {_label(s['ledgers'])} | **error** {r['error'][:80]} | | | | | |")
                continue
            lines.append(f"| `{label}` | {_label(s['ledgers'])} | {r['verdict']} | {', '.join(r['seq_scans']) or '-'} | "
                         f"{', '.join(r['indexes'])} | {r['execution_ms']} | {r['shared_buffers']} | {r['rows']} |")
    return "\n".join(lines) + "\n"


def targets30(res: dict) -> str:
    """Issue 30's 'cost stays what is due': idle retention with subscriptions, bounded statements, 1M within
    2x of 100k, no sequential scan on ledger or subscription."""
    by = {s["ledgers"]: s for s in res["sizes"]}
    small, big = by.get(100_000), by.get(1_000_000)
    out = []
    for label in ("retention", "retention --dry-run", "subscription list"):
        a = small["commands"].get(label) if small else None
        b = big["commands"].get(label) if big else None
        if not a and not b:
            continue
        parts = [f"{_label(s['ledgers'])}: {r['sql']} SQL, {r['s3']} S3, {r['seconds']} s"
                 for s, r in ((small, a), (big, b)) if r]
        verdict = ""
        if a and b and not a.get("error") and not b.get("error"):
            ratio = b["seconds"] / max(a["seconds"], 1e-9)
            same = a["sql"] == b["sql"]
            ok = ratio <= 2 and same and not a.get("did") and not b.get("did")
            if label == "subscription list":  # not a target of the issue: it reads every backlog
                verdict = (f"; 1M/100k time {ratio:.2f}; {a['sql']} statements for {res['topics']} topics "
                           f"(informational: its cost follows the backlogs, which grow with the history)")
            else:
                verdict = (f"; SQL {'the same' if same else 'DIFFERS'} at both sizes, 1M/100k time {ratio:.2f}: "
                           f"{'meets' if ok else 'MISSES'} (same statement count, ratio <= 2)")
        out.append(f"- `{label}`: " + "; ".join(parts) + verdict)
    if big:
        for label, r in big.get("explain", {}).items():
            out.append(f"- EXPLAIN `{label}` at 1M: {r.get('verdict', r.get('error'))}")
    return "\n".join(out) + "\n"


def run(counts: Counts, res: dict, args, sizes: list[int], sweep: bool, env: Env) -> None:
    try:
        res["endpoint"] = endpoint_kind(env, args.private_moto)
        res["bucket_fill_seconds"] = rnd(fill_bucket(env.s3, env.bucket, PREFIX, args.objects, args.topics))
        print(f"bucket: {args.objects} objects in {res['bucket_fill_seconds']} s", file=sys.stderr, flush=True)
        res["sizes"] = [measure(counts, env, n, args.topics, sweep, args.subscriptions) for n in sizes]
        if args.due_topics:
            res["offload_due"] = offload_heads(counts, env, args.due_topics)
    finally:
        env.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,1000000", help="ledger counts, comma-separated")
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--objects", type=int, default=20_000, help="objects in the bucket (e.g. 100000)")
    ap.add_argument("--subscriptions", type=int, default=10_000, help="subscriptions over the topics (0: none)")
    ap.add_argument("--due-topics", type=int, default=20,
                    help="topics with one due ledger for the HEAD-per-offload-run check (0: skip)")
    ap.add_argument("--compare", metavar="JSON", help="an earlier result of this bench: add a before/after table")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--name", default="scale")
    ap.add_argument("--quick", action="store_true", help="100k ledgers only")
    ap.add_argument("--private-moto", action="store_true", help="a moto server of the bench's own, not the RGW")
    args = ap.parse_args()
    sizes = [100_000] if args.quick else [int(x) for x in args.sizes.split(",")]
    counts = Counts()  # before any client exists
    t0 = time.perf_counter()
    sweep = has_sweep_flag()
    head = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h"], capture_output=True,
                          text=True).stdout.strip()
    res = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": head, "machine": machine(),
           "topics": args.topics, "objects": args.objects, "subscriptions": args.subscriptions, "gc_sweep_flag": sweep, "loadavg_start": loadavg()}
    with endpoint(args.private_moto) as url:
        run(counts, res, args, sizes, sweep, Env(url))
    res["seconds"] = rnd(time.perf_counter() - t0)
    res["loadavg_end"] = loadavg()
    loads = "; ".join(f"{_label(s['ledgers'])}: {s['load']['by_state']}, {s['load']['chunks']} chunks in "
                      f"{s['load']['data_objects']} data objects, {s['load']['tier1_files']} tier-1 files, "
                      f"recomputed {', '.join(s['load']['recomputed']) or 'nothing'}, loaded in "
                      f"{s['load']['seconds']} s, subscriptions {s['load'].get('subscriptions')}, load average "
                      f"{s['loadavg'][0]} -> {s['loadavg'][1]} while measured" for s in res["sizes"])
    md = (f"# Scheduled runs with nothing due, at scale ({res['date']}, `{head}`)\n\n"
          f"{args.topics} topics; a bucket of {args.objects} objects under the prefix (newer than GC's grace). "
          f"Each command in-process through `tiering.cli.main.main`, counted: SQL statements (every engine), "
          f"S3 requests (every boto3 client, by operation), wall seconds (one run each; `retention` after a "
          f"first run that writes the trim markers the synthetic store lacks). Endpoint: {res['endpoint']}.\n\n"
          + table(res) + offload_line(res) + "\n## Issue 19 targets\n\n" + targets(res)
          + f"\n## Issue 30: idle retention with {args.subscriptions} subscriptions\n\n" + targets30(res)
          + "\nEXPLAIN (ANALYZE, BUFFERS) of the statements as the product sends them (JIT off):\n\n"
          + explain_table(res)
          + f"\nStore: {loads}.\n\nLoad average {res['loadavg_start']} -> {res['loadavg_end']} on "
            f"{res['machine']['cpus']} cores (shared).\n\n")
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        md += (f"## Before / after\n\nBefore: {before['date']}, `{before.get('commit')}`. After: this run.\n\n"
               + compare_table(before, res) + "\n")
    save(args.out, args.name, res, md, "bench_scale.py", args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
