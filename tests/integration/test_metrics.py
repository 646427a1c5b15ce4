"""The Prometheus endpoint /tiering/metrics (tiering/metrics.py behind plugins/tiering_dashboard) on data the
real operations made (produce, offload to the loopback S3, GC queue, job runs): its figures equal SQL on the
views; the bearer token of TIERING_METRICS_TOKEN_FILE lets Prometheus in and nothing else does; and a real
Prometheus server (Debian's `prometheus`, started here on a free loopback port, scraping every second)
reports the target up and returns the backlog series through its query API with the views' values. The
subscription families (backlog, age, state, entries deleted unread) on subscriptions made by the real
operations (create, ack, a forced truncate that records a loss) equal what `subscription list` reads."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from tests.integration.helpers import entries, make_deps, produce
from tests.support.processes import free_port
from tiering.dashboard import make_read_only_engine
from tiering.metadata.job_runs import JobOutcome, JobRuns, RunRef
from tiering.model import Position, TopicPolicy
from tiering.ops import subscriptions as subscription_ops
from tiering.ops.offload import offload_many
from tiering.ops.retention import truncate

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "plugins") not in sys.path:  # Airflow puts its plugins folder on sys.path; so do we
    sys.path.insert(0, str(REPO / "plugins"))

from tiering_dashboard.app import create_app  # noqa: E402

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
TOKEN = "metrics-token-0123456789abcdef"


@pytest.fixture
def ro_engine(database_url):
    engine = make_read_only_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "metrics.token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture
def world(db, s3_client, bucket, tier1_root):
    """orders: 3 sealed ledgers (10 x 1000 B, 20 x 500 B, 5 x 2000 B), 0 and 1 offloaded (copies kept 4 h);
    clicks: 2 sealed ledgers (4 x 300 B, 6 x 300 B), lag 0, ledger 0 offloaded (its copy due); idle: none.
    GC: 3 due tasks. Runs: an offload_by_age run that succeeded, then a failed one; a gc run running.
    Subscription orders/audit: created at the earliest entry, nothing read."""
    deps = make_deps(db, s3_client, bucket, tier1_root)
    produce(deps, "orders", [entries("o0", 10, 1000), entries("o1", 20, 500), entries("o2", 5, 2000)],
            TopicPolicy(**BIG), open_tail=[b"tail"])
    produce(deps, "clicks", [entries("c0", 4, 300), entries("c1", 6, 300)], TopicPolicy(deletion_lag_seconds=0, **BIG))
    deps.meta.create_topic("idle", TopicPolicy(**BIG))
    runs = JobRuns(db)
    first = runs.start("offload", None, RunRef("offload_by_age", "tiering_offload_by_age", "r1", 1))
    orders, clicks = deps.meta.list_ledgers("orders"), deps.meta.list_ledgers("clicks")
    report = offload_many(deps, [orders[0], orders[1], clicks[0]])
    assert report.first_error is None
    runs.finish(first, JobOutcome(items_done=3, bytes=report.bytes))
    second = runs.start("offload", None, RunRef("offload_by_age", "tiering_offload_by_age", "r2", 1))
    runs.finish(second, JobOutcome(items_failed=1, errors=["boom"]))
    runs.start("gc")
    deps.meta.enqueue_gc([f"t/gone/{i}" for i in range(3)], reason="retention")
    subscription_ops.create(deps, "orders", "audit", "earliest")
    return {"offloaded_bytes": report.bytes}


def scrape(client, **headers) -> dict:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(response.text) for s in fam.samples}


def by_label(samples: dict, name: str, label: str) -> dict:
    return {dict(k[1])[label]: v for k, v in samples.items() if k[0] == name}


def test_metrics_equal_the_views(world, ro_engine, token_file, db):
    from fastapi.testclient import TestClient

    client = TestClient(create_app(lambda: ro_engine, login_required=False, metrics_token_file=str(token_file)))
    m = scrape(client, Authorization=f"Bearer {TOKEN}")
    with db.connect() as conn:
        usage = {r.topic: r for r in conn.execute(text("SELECT * FROM tiering.tier_usage"))}
        backlog = {r.topic: r for r in conn.execute(text(
            "SELECT topic, count(*) AS n, sum(size_bytes) AS b FROM tiering.offload_backlog GROUP BY topic"))}
        lagged = {r.topic: r for r in conn.execute(text(
            "SELECT topic, count(*) AS n, sum(size_bytes) AS b, count(*) FILTER (WHERE due) AS due "
            "FROM tiering.lagged_copies GROUP BY topic"))}
    assert m[("tiering_topics", ())] == 3
    tier_bytes = {(dict(k[1])["topic"], dict(k[1])["tier"]): v for k, v in m.items() if k[0] == "tiering_tier_bytes"}
    assert tier_bytes == {(t, tier): getattr(r, f"tier{tier}_bytes") for t, r in usage.items() for tier in "12"}
    assert tier_bytes[("orders", "1")] == 30_000 and tier_bytes[("orders", "2")] == 20_000
    assert tier_bytes[("clicks", "2")] == 1200 and tier_bytes[("idle", "1")] == 0

    # the backlog: every topic has its series, 0 where nothing waits
    assert by_label(m, "tiering_offload_backlog_ledgers", "topic") == \
        {"orders": backlog["orders"].n, "clicks": backlog["clicks"].n, "idle": 0} == {"orders": 1, "clicks": 1, "idle": 0}
    assert by_label(m, "tiering_offload_backlog_bytes", "topic") == {"orders": 10_000, "clicks": 1800, "idle": 0}
    ages = by_label(m, "tiering_offload_backlog_oldest_age_seconds", "topic")
    assert ages["orders"] > 0 and ages["clicks"] > 0 and ages["idle"] == 0
    assert by_label(m, "tiering_lagged_copies", "topic") == {"orders": lagged["orders"].n, "clicks": 1, "idle": 0} \
        == {"orders": 2, "clicks": 1, "idle": 0}
    assert by_label(m, "tiering_lagged_copies_due", "topic") == {"orders": 0, "clicks": 1, "idle": 0}
    assert by_label(m, "tiering_lagged_copies_due_bytes", "topic") == {"orders": 0, "clicks": 1200, "idle": 0}
    assert by_label(m, "tiering_gc_tasks", "state") == {"PENDING": 3, "FAILED": 0}
    assert m[("tiering_gc_tasks_due", ())] == 3
    assert by_label({k: v for k, v in m.items() if dict(k[1]).get("topic") == "orders"}, "tiering_ledgers", "state") \
        == {"OPEN": 1, "SEALED": 1, "OFFLOADING": 0, "OFFLOADED": 2, "DELETED": 0}

    # per kind, the LAST run: the failed one, not the earlier success
    status = {(dict(k[1])["kind"], dict(k[1])["status"]): v for k, v in m.items() if k[0] == "tiering_job_last_run_status"}
    assert status == {("offload_by_age", "RUNNING"): 0, ("offload_by_age", "SUCCEEDED"): 0,
                      ("offload_by_age", "FAILED"): 1,
                      ("gc", "RUNNING"): 1, ("gc", "SUCCEEDED"): 0, ("gc", "FAILED"): 0}
    assert by_label(m, "tiering_job_last_run_items_failed", "kind") == {"offload_by_age": 1, "gc": 0}
    assert by_label(m, "tiering_job_last_run_bytes", "kind") == {"offload_by_age": 0, "gc": 0}
    assert all(v >= 0 for v in by_label(m, "tiering_job_last_run_duration_seconds", "kind").values())
    assert m[("tiering_metrics_scrape_statements", ())] == 7
    # the subscription: every sealed entry of orders unread (the open tail is not counted: tier-1 is not here)
    audit = (("subscription", "audit"), ("topic", "orders"))
    assert m[("tiering_subscription_backlog_entries", audit)] == 35
    assert m[("tiering_subscription_backlog_bytes", audit)] == 30_000
    assert m[("tiering_subscription_oldest_unread_age_seconds", audit)] > 0
    assert m[("tiering_subscription_expired", audit)] == 0
    assert m[("tiering_subscription_entries_deleted_unread_total", audit)] == 0
    # no S3 request counters: the jobs do not record them
    assert not [k for k in m if "s3" in k[0]]


def test_subscription_metrics_follow_positions_losses_and_expiry(db, s3_client, bucket, tier1_root, ro_engine,
                                                                  token_file):
    """subs: 3 sealed ledgers (10 x 100 B, 10 x 200 B, 10 x 300 B) and an open tail of 2 entries.
    reader: from the earliest entry, never acks; mid: acked 1:4; done: from the latest (all read); then a
    forced truncate before ledger 1 deletes ledger 0, which reader had not read (the loss is recorded).
    lapsed (expiry 60 s): its only subscription, old, had no ack for an hour: EXPIRED."""
    from fastapi.testclient import TestClient

    deps = make_deps(db, s3_client, bucket, tier1_root)
    produce(deps, "subs", [entries("a", 10, 100), entries("b", 10, 200), entries("c", 10, 300)],
            TopicPolicy(**BIG), open_tail=[b"t1", b"t2"])
    produce(deps, "lapsed", [entries("d", 4, 50)], TopicPolicy(subscription_expiry_seconds=60, **BIG))
    for name, start in (("reader", "earliest"), ("mid", "earliest"), ("done", "latest")):
        subscription_ops.create(deps, "subs", name, start)
    subscription_ops.ack(deps, "subs", "mid", Position(1, 4))
    subscription_ops.create(deps, "lapsed", "old", "earliest")
    with db.begin() as conn:  # an hour without an ack (the clock, not the position, makes it EXPIRED)
        conn.execute(text("UPDATE tiering.subscription SET created_at = now() - interval '1 hour' "
                          "WHERE name = 'old'"))
    truncate(deps, "subs", Position(1, 0), force=True)

    client = TestClient(create_app(lambda: ro_engine, login_required=False, metrics_token_file=str(token_file)))
    m = scrape(client, Authorization=f"Bearer {TOKEN}")

    def family(name):
        return {(dict(k[1])["topic"], dict(k[1])["subscription"]): v for k, v in m.items() if k[0] == name}

    subs = [("lapsed", "old"), ("subs", "done"), ("subs", "mid"), ("subs", "reader")]
    # sealed ledgers only: reader has ledgers 1 and 2 unread, mid half of 1 (bytes prorated) and 2; done none
    assert family("tiering_subscription_backlog_entries") == \
        {("subs", "reader"): 20, ("subs", "mid"): 15, ("subs", "done"): 0, ("lapsed", "old"): 4}
    assert family("tiering_subscription_backlog_bytes") == \
        {("subs", "reader"): 5000, ("subs", "mid"): 1000 + 3000, ("subs", "done"): 0, ("lapsed", "old"): 200}
    # the same figures `tiering subscription list` reads for the sealed ledgers
    listed = {(s.topic, s.name): b for s, b in deps.meta.subs.with_backlog()}
    assert sorted(listed) == subs
    assert family("tiering_subscription_backlog_entries") == {k: b.entries for k, b in listed.items()}
    assert family("tiering_subscription_backlog_bytes") == {k: b.bytes for k, b in listed.items()}
    ages = family("tiering_subscription_oldest_unread_age_seconds")
    assert ages[("subs", "done")] == 0 and all(ages[k] > 0 for k in subs if k != ("subs", "done"))
    assert family("tiering_subscription_expired") == {k: (1 if k == ("lapsed", "old") else 0) for k in subs}
    # the loss: ledger 0's 10 entries (1000 B) were deleted before reader read them; a counter
    assert family("tiering_subscription_entries_deleted_unread_total") == \
        {k: (10 if k == ("subs", "reader") else 0) for k in subs}
    assert family("tiering_subscription_bytes_deleted_unread_total") == \
        {k: (1000 if k == ("subs", "reader") else 0) for k in subs}
    created = family("tiering_subscription_entries_deleted_unread_created")
    assert sorted(created) == subs and all(v > 0 for v in created.values())
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    types = dict(line.split()[2:4] for line in response.text.splitlines() if line.startswith("# TYPE"))
    assert types["tiering_subscription_entries_deleted_unread_total"] == "counter"
    assert types["tiering_subscription_backlog_entries"] == "gauge"
    helps = [line for line in response.text.splitlines() if line.startswith("# HELP tiering_subscription_backlog")]
    assert len(helps) == 2 and all("Sealed ledgers only" in line for line in helps)

    # deleted, a subscription's series go (no stale figures)
    deps.meta.subs.delete("subs", "mid")
    m = scrape(client, Authorization=f"Bearer {TOKEN}")
    assert sorted(family("tiering_subscription_backlog_entries")) == [k for k in subs if k != ("subs", "mid")]


def test_the_token_file_lets_prometheus_in_and_nothing_else(ro_engine, token_file, db):
    from fastapi.testclient import TestClient

    client = TestClient(create_app(lambda: ro_engine, login_required=False, metrics_token_file=str(token_file)))
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN[:-1]}"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    token_file.write_text("rotated-token")  # read on each scrape: a rotation needs no restart
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer rotated-token"}).status_code == 200
    token_file.write_text("")  # an empty file matches nothing, not the empty token
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 401


def test_an_unreachable_database_fails_the_scrape(token_file):
    from fastapi.testclient import TestClient

    dead = make_read_only_engine("postgresql://nobody:pw@127.0.0.1:1/none")
    client = TestClient(create_app(lambda: dead, login_required=False, metrics_token_file=str(token_file)))
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 503 and "unreachable" in response.json()["detail"]
    assert "pw" not in response.text


# ---------------------------------------------------------------------------------------------- Prometheus

def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture
def dashboard_server(ro_engine, token_file):
    """The plugin app served by uvicorn (the ASGI server Airflow's API server runs) on a free loopback port."""
    import uvicorn

    port = free_port()
    app = create_app(lambda: ro_engine, login_required=False, metrics_token_file=str(token_file))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield port
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def prometheus(tmp_path, dashboard_server, token_file):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("Debian's `prometheus` is not installed (.ci/sysdeps.sh installs it)", pytrace=False)
    port = free_port()
    config = tmp_path / "prometheus.yml"
    # The scrape config README documents: bearer token from a file, the path under the plugin's prefix (here
    # the app is served alone, at the root).
    config.write_text(f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: tiering
    metrics_path: /metrics
    authorization:
      type: Bearer
      credentials_file: {token_file}
    static_configs:
      - targets: ["127.0.0.1:{dashboard_server}"]
""")
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}", proc, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _wait(what: str, probe, proc, log, timeout: float = 60):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"prometheus exited: {log.read_text()[-2000:]}"
        try:
            last = probe()
            if last:
                return last
        except OSError as exc:
            last = exc
        time.sleep(0.5)
    pytest.fail(f"{what}: last {last!r}; log: {log.read_text()[-2000:]}", pytrace=False)


def test_a_real_prometheus_scrapes_the_backlog(world, prometheus, db):
    url, proc, log = prometheus

    def target_up():
        targets = _get_json(f"{url}/api/v1/targets")["data"]["activeTargets"]
        return [t for t in targets if t["labels"]["job"] == "tiering" and t["health"] == "up"]

    [target] = _wait("the tiering target up", target_up, proc, log)
    assert target["lastError"] == ""

    def query(expr):
        q = urllib.parse.urlencode({"query": expr})
        result = _get_json(f"{url}/api/v1/query?{q}")["data"]["result"]
        return {r["metric"].get("topic"): float(r["value"][1]) for r in result}

    ledgers = _wait("the backlog series", lambda: query("tiering_offload_backlog_ledgers"), proc, log)
    nbytes = query("tiering_offload_backlog_bytes")
    with db.connect() as conn:
        rows = {r.topic: (r.n, r.b) for r in conn.execute(text(
            "SELECT topic, count(*) AS n, sum(size_bytes) AS b FROM tiering.offload_backlog GROUP BY topic"))}
    assert ledgers == {t: float(rows.get(t, (0, 0))[0]) for t in ("orders", "clicks", "idle")}
    assert nbytes == {t: float(rows.get(t, (0, 0))[1]) for t in ("orders", "clicks", "idle")}
    assert nbytes == {"orders": 10_000.0, "clicks": 1800.0, "idle": 0.0}
    assert query("sum(tiering_offload_backlog_bytes)") == {None: 11_800.0}
    assert query('tiering_job_last_run_status{kind="offload_by_age",status="FAILED"}') == {None: 1.0}
    assert query('tiering_subscription_backlog_bytes{subscription="audit"}') == {"orders": 30_000.0}
    assert query('tiering_subscription_entries_deleted_unread_total{subscription="audit"}') == {"orders": 0.0}
