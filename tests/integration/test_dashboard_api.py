"""The dashboard's JSON API (plugins/tiering_dashboard) against real PostgreSQL data made by the real
operations: produce, offload to the loopback S3, GC queue entries, job runs. Numbers are checked against
what was produced and what the bucket holds; the API only reads (GET routes, read-only transactions);
errors are 503 with one line and no secret; the default engine comes from the Airflow connection."""
from __future__ import annotations

import json
import os
import re
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from tests.conftest import empty_world
from tests.integration.helpers import entries, make_deps, produce
from tiering.dashboard import make_read_only_engine
from tiering.metadata.job_runs import JobOutcome, JobRuns
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops import subscriptions as subscription_ops
from tiering.ops.offload import offload_many
from tiering.ops.topics import set_policy
from tiering.policy import UnreadLoss

REPO = Path(__file__).resolve().parents[2]
if str(REPO / "plugins") not in sys.path:  # Airflow puts its plugins folder on sys.path; so do we
    sys.path.insert(0, str(REPO / "plugins"))

from tiering_dashboard.app import create_app, default_engine_factory, require_login  # noqa: E402

BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
# A topic name a page must show as text, never as markup.
ODD = '<b>odd</b> & "quoted" topic ✓'
SECRET = "s3cr3t-dashboard-pw"


@pytest.fixture(scope="module", autouse=True)
def airflow_home(tmp_path_factory):
    """Airflow (imported by the default engine factory and the login check) reads this repo's config
    from a scratch home, as tests/dags does."""
    os.environ.setdefault("AIRFLOW_HOME", str(tmp_path_factory.mktemp("airflow-dashboard")))
    os.environ.setdefault("AIRFLOW_CONFIG", str(REPO / "airflow.cfg"))
    os.environ.setdefault("TIERING_REPO", str(REPO))


@pytest.fixture(scope="module")
def ro_engine(database_url):
    engine = make_read_only_engine(database_url)
    yield engine
    engine.dispose()


def client_for(engine_factory, login_required=True, override_login=True):
    from fastapi.testclient import TestClient

    app = create_app(engine_factory, login_required=login_required)
    if override_login:  # the API server's auth manager is not here: a logged-in user is assumed
        app.dependency_overrides[require_login] = lambda: None
    return TestClient(app)


@pytest.fixture
def api(ro_engine):
    return client_for(lambda: ro_engine)


@pytest.fixture(scope="module")
def world(engine, s3_client, run_bucket, tmp_path_factory):
    """Three topics in known states:
    - orders: 3 sealed ledgers (10 x 1000 B, 20 x 500 B, 5 x 2000 B) + an open tail; ledgers 0 and 1
      offloaded (tier-1 copies kept for the default 4 h lag), ledger 2 in the backlog;
    - clicks: 2 sealed ledgers (4 x 300 B, 6 x 300 B), deletion lag 0; ledger 0 offloaded (its copy due);
    - ODD: 1 sealed ledger of 3 x 111 B, never offloaded;
    plus 5 GC tasks (3 due) and 2 job runs (one finished, one running). Subscriptions:
    - orders/audit from the earliest entry (nothing read); orders policy: retain unread, ceilings 30 d / 1 GiB;
    - clicks/fast acked 1:5 (all read); clicks/lagger at nothing read, then a loss recorded as a ceiling's
      would be (metadata only: 4 entries, 1200 B, moved to 0:3; the ledgers stay, the other figures too);
    - ODD/ODD (expiry 60 s on ODD), created an hour ago, never acked: EXPIRED."""
    # Built once for the module (the tests only read): the run's database and bucket, emptied first.
    empty_world(engine, s3_client, run_bucket)
    bucket, db = run_bucket, engine
    deps = make_deps(db, s3_client, bucket, tmp_path_factory.mktemp("dashboard-tier1"))
    produce(deps, "orders", [entries("o0", 10, 1000), entries("o1", 20, 500), entries("o2", 5, 2000)],
            TopicPolicy(**BIG), open_tail=[b"tail"])
    produce(deps, "clicks", [entries("c0", 4, 300), entries("c1", 6, 300)],
            TopicPolicy(deletion_lag_seconds=0, **BIG))
    produce(deps, ODD, [entries("x", 3, 111)], TopicPolicy(**BIG))
    orders = deps.meta.list_ledgers("orders")
    clicks = deps.meta.list_ledgers("clicks")
    runs = JobRuns(db)
    run_id = runs.start("offload_by_age")
    report = offload_many(deps, [orders[0], orders[1], clicks[0]])
    assert report.offloaded == [0, 1, 0] and report.first_error is None
    runs.finish(run_id, JobOutcome(items_done=3, bytes=report.bytes))
    runs.start("gc")  # still RUNNING
    deps.meta.enqueue_gc([f"t/gone/{i}" for i in range(3)], reason="retention")
    deps.meta.enqueue_gc(["t/later/a", "t/later/b"], reason="defrag: merged away", delay=timedelta(hours=1))
    set_policy(deps, "orders", {"retain_unread": True, "max_retention_seconds": 30 * 86400,
                                "max_retention_bytes": 2**30})
    set_policy(deps, ODD, {"subscription_expiry_seconds": 60})
    subscription_ops.create(deps, "orders", "audit", "earliest")
    subscription_ops.create(deps, "clicks", "fast", "earliest")
    subscription_ops.ack(deps, "clicks", "fast", Position(1, 5))
    lagger = subscription_ops.create(deps, "clicks", "lagger", "earliest")
    with db.begin() as conn:
        locked = deps.meta.subs.get("clicks", "lagger", conn, lock=True)
        assert locked.version == lagger.version
        deps.meta.subs.record_loss(conn, locked, UnreadLoss(4, 1200, Position(0, 0), Position(0, 3)), "ceiling-time")
    subscription_ops.create(deps, ODD, ODD, "earliest")
    with db.begin() as conn:
        conn.execute(text("UPDATE tiering.subscription SET created_at = now() - interval '1 hour' WHERE name = :n"),
                     {"n": ODD})
    stored = {}
    for topic in ("orders", "clicks"):
        for led in deps.meta.list_ledgers(topic, [S.OFFLOADED]):
            key = deps.meta.get_chunk(led).data_key
            stored[(topic, led.ledger_id)] = s3_client.head_object(Bucket=bucket, Key=key)["ContentLength"]
    return {"deps": deps, "stored": stored, "offloaded_bytes": report.bytes, "run_id": run_id}


def test_tier_usage_is_bytes_and_ledgers_per_tier_per_topic(api, world):
    body = api.get("/api/tier-usage").json()
    by_topic = {r["topic"]: r for r in body["topics"]}
    assert sorted(by_topic) == sorted(["orders", "clicks", ODD])
    orders, clicks, odd = by_topic["orders"], by_topic["clicks"], by_topic[ODD]
    # tier 1: every sealed ledger (offloaded ones keep their copy until the lag; the open one has 0 B yet)
    assert (orders["tier1_ledgers"], orders["tier1_bytes"]) == (4, 10 * 1000 + 20 * 500 + 5 * 2000)
    assert (orders["tier2_ledgers"], orders["tier2_bytes"]) == (2, 10 * 1000 + 20 * 500)
    assert orders["tier2_stored_bytes"] == world["stored"][("orders", 0)] + world["stored"][("orders", 1)]
    assert (clicks["tier1_ledgers"], clicks["tier1_bytes"], clicks["tier2_ledgers"], clicks["tier2_bytes"]) == \
        (2, 10 * 300, 1, 4 * 300)
    assert clicks["tier2_stored_bytes"] == world["stored"][("clicks", 0)] > 4 * 300  # block header + framing
    assert (odd["tier1_ledgers"], odd["tier1_bytes"], odd["tier2_ledgers"], odd["tier2_bytes"]) == (1, 333, 0, 0)
    assert body["totals"] == {
        "topics": 3, "tier1_ledgers": 7, "tier1_bytes": 30_000 + 3000 + 333, "tier2_ledgers": 3,
        "tier2_bytes": 20_000 + 1200, "tier2_stored_bytes": sum(world["stored"].values()), "deleted_ledgers": 0}


def test_offload_backlog_and_lagged_copies(api, world):
    backlog = api.get("/api/offload-backlog").json()
    assert backlog["total"] == {"ledgers": 3, "bytes": 10_000 + 1800 + 333, "offloading": 0}
    assert {r["topic"]: (r["ledgers"], r["bytes"]) for r in backlog["by_topic"]} == \
        {"orders": (1, 10_000), "clicks": (1, 1800), ODD: (1, 333)}
    assert sorted((r["topic"], r["ledger_id"], r["state"], r["entry_count"]) for r in backlog["ledgers"]) == \
        sorted([("orders", 2, "SEALED", 5), ("clicks", 1, "SEALED", 6), (ODD, 0, "SEALED", 3)])
    assert all(r["sealed_for_seconds"] >= 0 for r in backlog["ledgers"])
    assert len(api.get("/api/offload-backlog?limit=1").json()["ledgers"]) == 1

    lagged = api.get("/api/lagged-copies").json()
    assert lagged["total"] == {"copies": 3, "bytes": 20_000 + 1200, "due": 1, "due_bytes": 1200}
    rows = {(r["topic"], r["ledger_id"]): r for r in lagged["ledgers"]}
    assert rows[("clicks", 0)]["due"] is True and rows[("orders", 0)]["due"] is False
    assert rows[("orders", 0)]["deletion_lag_seconds"] == 4 * 3600


def test_gc_queue_summary_and_due_count(api, world):
    gc = api.get("/api/gc-queue").json()
    assert (gc["total"], gc["pending"], gc["due"], gc["failed"]) == (5, 5, 3, 0)
    assert [(r["state"], r["reason"], r["tasks"], r["due"], r["referenced"]) for r in gc["summary"]] == [
        ("PENDING", "defrag: merged away", 2, 0, 0), ("PENDING", "retention", 3, 3, 0)]
    assert [t["key"] for t in gc["next"]][:3] == ["t/gone/0", "t/gone/1", "t/gone/2"]
    assert len(api.get("/api/gc-queue?limit=2").json()["next"]) == 2


def test_job_runs_newest_first_with_limit(api, world):
    runs = api.get("/api/job-runs?limit=50").json()["runs"]
    assert [(r["job"], r["status"]) for r in runs] == [("gc", "RUNNING"), ("offload_by_age", "SUCCEEDED")]
    # kind defaults to the job; no Airflow run for runs started by hand
    assert [(r["kind"], r["dag_id"], r["dag_run_id"], r["try_number"]) for r in runs] == [
        ("gc", None, None, None), ("offload_by_age", None, None, None)]
    done = runs[1]
    assert done["run_id"] == world["run_id"] and done["items_done"] == 3
    assert done["bytes"] == world["offloaded_bytes"] == 10_000 + 10_000 + 1200
    assert done["ended_at"] >= done["started_at"] and done["duration_seconds"] >= 0
    assert [r["job"] for r in api.get("/api/job-runs?limit=1").json()["runs"]] == ["gc"]
    assert api.get("/api/job-runs?limit=0").status_code == 422
    assert api.get("/api/job-runs?limit=100000").status_code == 422


def test_series_buckets_offloaded_bytes_and_backlog_over_time(api, world):
    body = api.get("/api/series").json()
    points = body["points"]
    assert body["step_seconds"] == 3600 and len(points) == 24
    starts = [p["bucket_start"] for p in points]
    assert starts == sorted(starts)
    assert sum(p["offloaded_bytes"] for p in points) == world["offloaded_bytes"]
    assert sum(p["offloaded_ledgers"] for p in points) == 3
    # the last bucket ends now: its backlog is the backlog view's
    assert (points[-1]["backlog_bytes"], points[-1]["backlog_ledgers"]) == (10_000 + 1800 + 333, 3)
    assert sum(p["job_runs"] for p in points) == 2 and sum(p["job_bytes"] for p in points) == world["offloaded_bytes"]
    fine = api.get("/api/series?hours=2&step_minutes=5").json()
    assert fine["step_seconds"] == 300 and len(fine["points"]) == 24
    assert sum(p["offloaded_bytes"] for p in fine["points"]) == world["offloaded_bytes"]
    assert api.get("/api/series?hours=744&step_minutes=1").status_code == 422


def test_topics_with_policy_and_ledger_states(api, world):
    topics = {t["topic"]: t for t in api.get("/api/topics").json()["topics"]}
    orders = topics["orders"]
    assert (orders["open_ledgers"], orders["sealed_ledgers"], orders["offloaded_ledgers"]) == (1, 1, 2)
    assert orders["entries"] == 10 + 20 + 5 and orders["size_bytes"] == 30_000
    assert topics["clicks"]["deletion_lag_seconds"] == 0 and topics[ODD]["offload_after_seconds"] == -1
    # the subscription policy (migration 0006): -1 is off
    assert {k: orders[k] for k in ("retain_unread", "max_retention_seconds", "max_retention_bytes",
                                   "subscription_expiry_seconds", "subscriptions")} == \
        {"retain_unread": True, "max_retention_seconds": 30 * 86400, "max_retention_bytes": 2**30,
         "subscription_expiry_seconds": -1, "subscriptions": 1}
    assert (topics[ODD]["retain_unread"], topics[ODD]["max_retention_seconds"], topics[ODD]["subscription_expiry_seconds"],
            topics[ODD]["subscriptions"], topics["clicks"]["subscriptions"]) == (False, -1, 60, 1, 2)


def test_subscriptions_with_backlog_state_and_losses(api, world):
    body = api.get("/api/subscriptions").json()
    assert body["total"] == {"subscriptions": 4, "expired": 1, "backlog_entries": 35 + 0 + 6 + 3,
                             "backlog_bytes": 30_000 + 1800 + 333, "entries_deleted_unread": 4,
                             "bytes_deleted_unread": 1200, "with_losses": 1}
    subs = body["subscriptions"]
    # largest backlog first
    assert [(r["topic"], r["name"]) for r in subs] == [("orders", "audit"), ("clicks", "lagger"), (ODD, ODD),
                                                       ("clicks", "fast")]
    by = {(r["topic"], r["name"]): r for r in subs}
    keys = ("position", "state", "backlog_entries", "backlog_bytes", "entries_deleted_unread", "bytes_deleted_unread",
            "last_loss_reason")
    assert {k: tuple(r[k] for k in keys) for k, r in by.items()} == {
        # sealed ledgers only: orders' open tail is not counted (its length is in the tier-1 file)
        ("orders", "audit"): (None, "ACTIVE", 35, 30_000, 0, 0, None),
        ("clicks", "lagger"): ("0:3", "ACTIVE", 6, 1800, 4, 1200, "ceiling-time"),
        (ODD, ODD): (None, "EXPIRED", 3, 333, 0, 0, None),
        ("clicks", "fast"): ("1:5", "ACTIVE", 0, 0, 0, 0, None)}
    assert by[("clicks", "lagger")]["last_loss_at"] is not None and by[("clicks", "fast")]["last_ack_at"] is not None
    assert by[("clicks", "fast")]["oldest_unread_age_seconds"] is None
    assert all(by[k]["oldest_unread_age_seconds"] > 0 for k in (("orders", "audit"), ("clicks", "lagger"), (ODD, ODD)))
    orders_open = world["deps"].meta.list_ledgers("orders", [S.OPEN])[0].ledger_id
    assert by[("orders", "audit")]["open_ledger_id"] == orders_open and by[(ODD, ODD)]["open_ledger_id"] is None
    # the same backlog `tiering subscription list` reads for the sealed ledgers
    listed = {(s.topic, s.name): (b.entries, b.bytes, s.state) for s, b in world["deps"].meta.subs.with_backlog()}
    assert listed == {k: (r["backlog_entries"], r["backlog_bytes"], r["state"]) for k, r in by.items()}
    # the limit cuts the rows, not the totals
    one = api.get("/api/subscriptions?limit=1").json()
    assert [r["name"] for r in one["subscriptions"]] == ["audit"] and one["total"] == body["total"]
    assert api.get("/api/subscriptions?limit=0").status_code == 422


def test_the_page_is_self_contained(api, world):
    page = api.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="/static/dashboard.js"' in page.text and "<svg" not in page.text  # drawn by the script
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "http" not in csp and "frame-ancestors 'self'" in csp
    for asset, kind in (("/static/dashboard.js", "text/javascript"), ("/static/dashboard.css", "text/css")):
        res = api.get(asset)
        assert res.status_code == 200 and res.headers["content-type"].startswith(kind)
        # no URL but the SVG namespace: nothing is fetched from elsewhere
        assert set(re.findall(r"https?://[^\s\"'`)]+", res.text)) <= {"http://www.w3.org/2000/svg"}
    # served under the plugin's prefix, the page points at its own assets
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    root = FastAPI()
    root.mount("/tiering", api.app)
    mounted = TestClient(root).get("/tiering/")
    assert 'src="/tiering/static/dashboard.js"' in mounted.text and 'content="/tiering/"' in mounted.text


def test_only_get_routes_and_writes_are_refused(api, ro_engine, engine, world):
    from fastapi.routing import APIRoute

    methods = {m for r in api.app.routes if isinstance(r, APIRoute) for m in r.methods}
    assert methods == {"GET"}
    for method in ("post", "put", "patch", "delete"):
        assert getattr(api, method)("/api/topics").status_code == 405
    # the dashboard's engine cannot write, even when asked to
    with pytest.raises(DBAPIError, match="read-only transaction"):
        with ro_engine.begin() as conn:
            conn.execute(text("INSERT INTO tiering.topic (name) VALUES ('intruder')"))
    with ro_engine.connect() as conn:
        assert conn.execute(text("SHOW default_transaction_read_only")).scalar() == "on"
        assert conn.execute(text("SHOW transaction_read_only")).scalar() == "on"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.topic WHERE name = 'intruder'")).scalar() == 0


def test_the_api_requires_an_airflow_login(ro_engine, world):
    api = client_for(lambda: ro_engine, override_login=False)
    for path in ("/api/tier-usage", "/api/job-runs", "/api/series", "/api/subscriptions"):
        assert api.get(path).status_code == 401
    assert api.get("/").status_code == 200  # the page holds no data; its script shows a login link


def test_engine_is_built_lazily_once_and_a_failed_build_is_retried(ro_engine, world):
    calls = []

    def factory():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError(f"boom with {SECRET}")
        return ro_engine

    api = client_for(factory)
    assert calls == []  # nothing at creation
    first = api.get("/api/topics")
    assert first.status_code == 503 and SECRET not in first.text
    assert first.json() == {"detail": "cannot build the metadata database engine (RuntimeError)"}
    assert api.get("/api/topics").status_code == 200 and api.get("/api/gc-queue").status_code == 200
    assert len(calls) == 2


def test_unreachable_database_is_a_503_without_secrets(database_url):
    url = make_url(database_url).set(host="127.0.0.1", port=1, password=SECRET)
    engine = make_read_only_engine(url.render_as_string(hide_password=False))
    api = client_for(lambda: engine)
    for path in ("/api/tier-usage", "/api/series", "/api/job-runs?limit=5"):
        res = api.get(path)
        assert res.status_code == 503, path
        detail = res.json()["detail"]
        assert detail == "the metadata database is unreachable (OperationalError)"
        assert SECRET not in res.text and "\n" not in detail
    engine.dispose()


def test_database_without_the_schema_is_a_503_naming_the_fix(database_url):
    engine = make_read_only_engine(make_url(database_url).set(database="postgres").render_as_string(hide_password=False))
    res = client_for(lambda: engine).get("/api/tier-usage")
    assert res.status_code == 503 and "tiering db upgrade" in res.json()["detail"]
    engine.dispose()


def test_default_engine_comes_from_the_tiering_metadata_connection(database_url, world, monkeypatch):
    url = make_url(database_url)
    # PostgreSQL here trusts local connections: the password is accepted and ignored, and must not leak.
    conn = {"conn_type": "postgres", "host": url.host, "port": url.port or 5432, "login": url.username or "",
            "password": SECRET, "schema": url.database}
    monkeypatch.setenv("AIRFLOW_CONN_TIERING_METADATA", json.dumps(conn))
    engine = default_engine_factory()
    try:
        assert (engine.url.host, engine.url.port, engine.url.database) == (url.host, url.port or 5432, url.database)
        assert engine.url.password == SECRET and SECRET not in repr(engine.url)
        with engine.connect() as c:
            assert c.execute(text("SHOW transaction_read_only")).scalar() == "on"
    finally:
        engine.dispose()
    api = client_for(None)  # create_app() as the plugin does
    usage = {r["topic"]: r["tier2_bytes"] for r in api.get("/api/tier-usage").json()["topics"]}
    assert usage == {"orders": 20_000, "clicks": 1200, ODD: 0}
    api.app.state.engine.dispose()

    monkeypatch.delenv("AIRFLOW_CONN_TIERING_METADATA")
    res = client_for(None).get("/api/topics")
    assert res.status_code == 503
    assert res.json()["detail"] == ("the Airflow connection 'tiering_metadata' is not defined or cannot be read "
                                    "(AirflowNotFoundException)")


def test_plugin_registers_the_app_and_the_nav_link():
    import tiering_plugin

    plugin = tiering_plugin.TieringPlugin
    [app] = plugin.fastapi_apps
    assert app["url_prefix"] == "/tiering" and app["name"] == "Tiering" and app["app"] is tiering_plugin.app
    [view] = plugin.external_views
    assert view["name"] == "Tiering dashboard" and view["href"] == "/tiering/" and view["destination"] == "nav"
    assert view["category"] == "browse" and view["url_route"] == "tiering-dashboard"
    # validated as the API server will serve it in /api/v2/plugins
    from airflow.api_fastapi.core_api.datamodels.plugins import ExternalViewResponse

    assert ExternalViewResponse.model_validate(view).href == "/tiering/"
