"""The tiering dashboard in a real browser, served by a real Airflow API server with this repo's airflow.cfg
and plugins: headless Chromium (driven over the DevTools protocol) logs in with an Airflow token, renders
/tiering/, and the charts it drew carry the numbers the metadata database holds. The page is also reached
the way users reach it: from Airflow's navigation (the plugin's external view), where a run link clicked inside
the UI's sandboxed frame lands on that DAG run in the UI.

One Airflow API server, one browser and one world serve the whole module (Airflow's start is most of its
time); the browser's steps build on each other through the fixtures (logged out, then logged in), and the
tests inside Airflow's UI each open the UI's page themselves.

Screenshots go to tests/artifacts/ (dashboard.png, dashboard_in_airflow.png, dashboard_run_link_in_airflow.png)."""
from __future__ import annotations

import json
import os
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.conftest import empty_world
from tests.e2e.support.airflow_server import airflow_env, api_server, request
from tests.e2e.support.browser import headless_chromium, svg
from tests.support.processes import free_port
from tests.integration.helpers import entries, make_deps, produce
from tiering.metadata.job_runs import JobOutcome, JobRuns, RunRef
from tiering.model import Position, TopicPolicy
from tiering.ops import subscriptions as subscription_ops
from tiering.ops.offload import offload_many

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
DB_PASSWORD = f"pw-{secrets.token_hex(6)}"
S3_SECRET = os.environ.get("AWS_SECRET_ACCESS_KEY") or f"s3cr3t-{secrets.token_hex(6)}"  # RGW checks keys
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
ODD = '<b>odd</b> & "quoted" topic ✓'
METRICS_TOKEN = f"metrics-{secrets.token_hex(16)}"
AIRFLOW_RUN = "manual__2026-11-22T10:00:00+00:00"  # created through the REST API: a manual id
RUN_PATH = f"/dags/tiering_offload_by_age/runs/{urllib.parse.quote(AIRFLOW_RUN, safe='')}"
LONG_ERROR = "bad input: topic 'nosuch' does not exist; create it with `tiering topics create nosuch` " + "x" * 200
UNSAFE_NAVIGATION = "Unsafe attempt to initiate navigation"  # Chromium's word for a frame's refused navigation


def format_bytes(n: float) -> str:
    """The page's formatBytes (dashboard.js), to check the labels it drew."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{int(n)} B" if i == 0 else f"{n:.1f} {units[i]}"


# ---------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def airflow_server(tmp_path_factory, database_url, run_bucket, s3_settings):
    """`airflow api-server` (UI, REST API and plugins) in a home of its own, on a free loopback port, its
    `tiering_metadata` connection pointing at the run's database. Started here, waited for by `server` (so
    the world and the browser are made meanwhile)."""
    home = tmp_path_factory.mktemp("airflow-dashboard-home")
    port = free_port()
    url = make_url(database_url).set(password=DB_PASSWORD).render_as_string(hide_password=False)
    settings_env = {"TIERING_DATABASE_URL": url, "TIERING_BUCKET": run_bucket, "TIERING_PREFIX": "t/",
                    "TIERING_TIER1_ROOT": str(home / "tier1"), "TIERING_S3_ENDPOINT_URL": s3_settings["endpoint_url"],
                    "AWS_ACCESS_KEY_ID": s3_settings["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                    "AWS_DEFAULT_REGION": s3_settings["region_name"], "PATH": os.environ["PATH"],
                    "TIERING_AIRFLOW_ADDRESS": f"127.0.0.1:{port}"}  # host, port and base_url
    (home / "metrics.token").write_text(METRICS_TOKEN + "\n")
    env = {**os.environ, **airflow_env()(settings_env, home), "AIRFLOW__API__WORKERS": "1",
           "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(48),
           "TIERING_METRICS_TOKEN_FILE": str(home / "metrics.token")}
    # The dashboard must find its database through the connection, not through variables it inherits.
    for name in ("TIERING_DATABASE_URL", "TIERING_BUCKET", "TIERING_S3_ENDPOINT_URL", "AWS_SECRET_ACCESS_KEY",
                 "AWS_ACCESS_KEY_ID", "TIERING_PREFIX"):
        env.pop(name, None)
    with api_server(home, port, env) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with headless_chromium(tmp_path_factory.mktemp("browser")) as cdp:
        yield cdp


@pytest.fixture(scope="module")
def world(engine, s3_client, run_bucket, tmp_path_factory):
    """orders: 3 sealed ledgers (10 x 1000 B, 20 x 500 B, 5 x 2000 B), ledgers 0 and 1 offloaded;
    clicks: 2 sealed ledgers (4 x 300 B, 6 x 300 B), ledger 0 offloaded; ODD: one ledger of 3 x 111 B.
    Plus a finished offload run, a running GC run and 3 due GC tasks; subscription orders/audit acked 0:9."""
    empty_world(engine, s3_client, run_bucket)
    deps = make_deps(engine, s3_client, run_bucket, tmp_path_factory.mktemp("tier1"))
    produce(deps, "orders", [entries("o0", 10, 1000), entries("o1", 20, 500), entries("o2", 5, 2000)],
            TopicPolicy(**BIG), open_tail=[b"tail"])
    produce(deps, "clicks", [entries("c0", 4, 300), entries("c1", 6, 300)], TopicPolicy(deletion_lag_seconds=0, **BIG))
    produce(deps, ODD, [entries("x", 3, 111)], TopicPolicy(**BIG))
    runs = JobRuns(engine)
    failed = runs.start("offload", "nosuch", RunRef("offload_prefix", "tiering_offload_prefix", "manual__x", 1))
    runs.finish(failed, JobOutcome(items_failed=1, errors=[LONG_ERROR]))
    run_id = runs.start("offload", None, RunRef("offload_by_age", "tiering_offload_by_age", AIRFLOW_RUN, 2))
    orders, clicks = deps.meta.list_ledgers("orders"), deps.meta.list_ledgers("clicks")
    report = offload_many(deps, [orders[0], orders[1], clicks[0]])
    assert report.first_error is None
    runs.finish(run_id, JobOutcome(items_done=3, bytes=report.bytes))
    runs.start("gc")
    deps.meta.enqueue_gc([f"t/gone/{i}" for i in range(3)], reason="retention")
    subscription_ops.create(deps, "orders", "audit", "earliest")
    subscription_ops.ack(deps, "orders", "audit", Position(0, 9))
    return {"offloaded_bytes": report.bytes}


@pytest.fixture(scope="module")
def server(airflow_server, world, browser):
    """The API server, answering; the world and the browser were made while it started."""
    ready = time.monotonic()
    airflow_server.wait_up()
    print(f"data and browser ready {ready - airflow_server.started:.1f} s after Airflow's start; Airflow up after "
          f"{airflow_server.up - airflow_server.started:.1f} s")
    return airflow_server


@pytest.fixture(scope="module")
def base(server) -> str:
    return f"{server.url}/tiering/"


@pytest.fixture(scope="module")
def usage(engine, world) -> dict:
    """tiering.tier_usage by topic: what the page and the API must show."""
    with engine.connect() as conn:
        return {r.topic: r for r in conn.execute(text("SELECT * FROM tiering.tier_usage"))}


@pytest.fixture(scope="module")
def plugin(server) -> dict:
    status, body = request(f"{server.url}/api/v2/plugins", token=server.token())
    assert status == 200, body
    [found] = [p for p in json.loads(body)["plugins"] if p["name"] == "tiering"]
    return found


@pytest.fixture(scope="module")
def logged_out(server, base, browser) -> SimpleNamespace:
    """The page opened before any login (the browser has no Airflow cookie yet)."""
    browser.navigate(base)
    assert browser.wait_for("document.body && document.body.dataset.state === 'error'")
    return SimpleNamespace(error=browser.evaluate("document.getElementById('error').textContent"),
                           login=browser.evaluate("document.querySelector('#error a').href"))


@pytest.fixture(scope="module")
def dashboard(server, base, browser, logged_out) -> SimpleNamespace:
    """The page logged in (Airflow's session cookie), once it drew everything: its HTML, what its tables,
    cards and error cell show, the run link, and every DevTools event since the browser started (the
    logged-out page's too)."""
    browser.call("Network.setCookie", name="_token", value=server.token(), url=f"{server.url}/", path="/")
    browser.navigate(base)
    browser.wait_for("document.body && document.body.dataset.state === 'ready'")
    dom = browser.evaluate("document.documentElement.outerHTML")
    browser.screenshot(ARTIFACTS / "dashboard.png")
    print(f"dashboard rendered {time.monotonic() - server.up:.1f} s after Airflow was up")
    tables = json.loads(browser.evaluate("""JSON.stringify(Object.fromEntries(['gc-table', 'runs-table',
                                                                     'backlog-table', 'subscriptions-table']
        .map(id => [id, [...document.querySelectorAll('#' + id + ' tbody tr')]
            .map(tr => [...tr.cells].map(td => td.textContent))])))"""))
    error_cell = json.loads(browser.evaluate("""(() => { const td = document.querySelector(
        '#runs-table tbody tr:nth-child(3) td.error-text'); return JSON.stringify(
        {text: td.textContent, title: td.title, cut: td.scrollWidth > td.clientWidth}); })()"""))
    cards = json.loads(browser.evaluate("""JSON.stringify(Object.fromEntries([...document.querySelectorAll('.card')]
        .map(c => [c.dataset.card, c.querySelector('.card-value').textContent])))"""))
    return SimpleNamespace(
        dom=dom, tables=tables, error_cell=error_cell, cards=cards,
        run_link=browser.evaluate("document.querySelector('#runs-table tbody tr:nth-child(2) a').href"),
        markup=browser.evaluate("document.querySelector('b') !== null"), events=list(browser.events))


def open_in_airflow(server, browser, plugin) -> str:
    """Airflow's UI at the route of the plugin's nav link, once the dashboard in its frame is ready; the
    frame's src."""
    [view] = plugin["external_views"]
    browser.navigate(f"{server.url}/plugin/{view['url_route']}")
    return browser.wait_for("""(() => { const f = document.querySelector('iframe');
        return f && f.contentDocument && f.contentDocument.body && f.contentDocument.body.dataset.state === 'ready'
            && f.getAttribute('src'); })()""", timeout=40)


def unsafe_navigations(events: list[dict]) -> list[dict]:
    return [e for e in events if e["method"] == "Log.entryAdded"
            and UNSAFE_NAVIGATION in e["params"]["entry"].get("text", "")]


# ---------------------------------------------------------------------------------------------- the tests

def test_airflow_lists_the_plugins_app_and_nav_link(plugin):
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/tiering"]
    [view] = plugin["external_views"]
    assert (view["name"], view["href"], view["destination"], view["category"]) == \
        ("Tiering dashboard", "/tiering/", "nav", "browse")


def test_api_wants_a_login_reads_the_database_through_the_connection_and_refuses_writes(server, base, usage):
    assert request(f"{base}api/tier-usage")[0] == 401
    status, body = request(f"{base}api/tier-usage", token=server.token())
    assert status == 200, body
    assert {r["topic"]: r["tier1_bytes"] for r in json.loads(body)["topics"]} == \
        {t: r.tier1_bytes for t, r in usage.items()} == {"orders": 30_000, "clicks": 3000, ODD: 333}
    assert {t: r.tier2_bytes for t, r in usage.items()} == {"orders": 20_000, "clicks": 1200, ODD: 0}
    req = urllib.request.Request(f"{base}api/topics", method="POST", data=b"{}",
                                 headers={"Authorization": f"Bearer {server.token()}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 405


def test_metrics_take_their_bearer_token_or_an_airflow_login_nothing_else(server, base, world):
    assert request(f"{base}metrics")[0] in (401, 403)  # what Airflow's login check answers
    assert request(f"{base}metrics", token="not-the-token")[0] in (401, 403)
    for token in (METRICS_TOKEN, server.token()):
        status, metrics = request(f"{base}metrics", token=token)
        assert status == 200, metrics
        assert 'tiering_offload_backlog_bytes{topic="orders"} 10000.0' in metrics.splitlines()
        assert 'tiering_tier_bytes{tier="1",topic="clicks"} 3000.0' in metrics.splitlines()


def test_logged_out_the_page_links_to_airflows_login_and_back_to_itself(server, base, logged_out):
    assert "Log in to Airflow" in logged_out.error
    # logging in comes back to this page, not to Airflow's home page
    assert logged_out.login == f"{server.url}/api/v2/auth/login?next={urllib.parse.quote(base, safe='')}", \
        logged_out.login


def test_bars_carry_each_topics_bytes_per_tier(dashboard, usage):
    """One stacked bar per topic, a segment per tier carrying its bytes, labelled with topic and bytes."""
    bars = svg(dashboard.dom, "tier-chart")
    for topic, row in usage.items():
        [bar] = [g for g in bars.iter("g") if g.get("data-topic") == topic]
        label = next(t for t in bar.iter("text") if "bar-label" in t.get("class", ""))
        assert label.find("title").text == topic and label.text.startswith(topic[:10])
        segments = {int(r.get("data-tier")): r for r in bar.iter("rect")}
        for tier, (nbytes, ledgers) in {1: (row.tier1_bytes, row.tier1_ledgers),
                                        2: (row.tier2_bytes, row.tier2_ledgers)}.items():
            seg = segments[tier]
            assert int(seg.get("data-bytes")) == nbytes and int(seg.get("data-ledgers")) == ledgers
            assert seg.find("title").text.startswith(
                f"{topic} — tier {tier}: {nbytes:,} bytes ({format_bytes(nbytes)}) in {ledgers:,} ledgers")
        value = next(t for t in bar.iter("text") if "bar-value" in t.get("class", ""))
        assert value.text == f"T1 {format_bytes(row.tier1_bytes)} · T2 {format_bytes(row.tier2_bytes)}"
    widths = {(g.get("data-topic"), int(r.get("data-tier"))): float(r.get("width"))
              for g in bars.iter("g") if g.get("data-topic") for r in g.iter("rect")}
    assert widths[("orders", 1)] > widths[("orders", 2)] > widths[("clicks", 1)] > widths[("clicks", 2)] > 0
    assert widths[("orders", 1)] / widths[("orders", 2)] == pytest.approx(30_000 / 20_000, rel=1e-3)
    assert widths[(ODD, 2)] == 0


def test_lines_sum_to_what_was_offloaded_and_end_at_the_backlog(dashboard, world):
    series = svg(dashboard.dom, "series-chart")
    dots = {name: [c for c in series.iter("circle") if c.get("data-series") == name]
            for name in ("backlog", "offloaded")}
    assert len(dots["backlog"]) == len(dots["offloaded"]) == 24
    assert sum(int(c.get("data-bytes")) for c in dots["offloaded"]) == world["offloaded_bytes"] == 21_200
    assert int(dots["backlog"][-1].get("data-bytes")) == 10_000 + 1800 + 333
    assert {p.get("data-series") for p in series.iter("path")} == {"backlog", "offloaded"}


def test_tables_and_cards_show_the_same_numbers(dashboard, server):
    tables = dashboard.tables
    assert tables["gc-table"] == [["PENDING", "retention", "3", "3", "0", "0", tables["gc-table"][0][6]]]
    # kind, the Airflow run (linked) or "by hand", status, bytes
    assert [(r[1], r[2], r[4]) for r in tables["runs-table"]] == [
        ("gc", "by hand", "RUNNING"), ("offload by age", f"{AIRFLOW_RUN} (try 2)", "SUCCEEDED"),
        ("offload prefix", "manual__x", "FAILED")]
    # an error cell is cut by the layout; its tooltip holds the whole text
    assert dashboard.error_cell == {"text": LONG_ERROR, "title": LONG_ERROR, "cut": True}
    assert tables["runs-table"][1][9] == format_bytes(21_200)
    assert dashboard.run_link == f"{server.url}{RUN_PATH}"
    assert sorted(r[0] for r in tables["backlog-table"]) == sorted(["clicks", "orders", ODD])
    # the subscription: ledgers 1 and 2 unread (25 entries, 20,000 B), nothing lost
    [sub] = tables["subscriptions-table"]
    assert sub[:6] == ["orders", "audit", "0:9", "ACTIVE", "25", format_bytes(20_000)]
    assert sub[8:] == ["0", "0 B", "none"]
    cards = dashboard.cards
    assert cards["Tier 1"] == format_bytes(33_333) and cards["Tier 2"] == format_bytes(21_200)
    assert cards["GC queue"] == "3 pending" and cards["Topics"] == "3"
    assert cards["Integrity"] == "0 lost"  # nothing marked lost; no scrub has checked copies yet


def test_a_topic_name_is_text_never_markup(dashboard):
    assert not dashboard.markup
    assert "&lt;b&gt;odd&lt;/b&gt; &amp; \"quoted\" topic ✓" in dashboard.dom


def test_nothing_failed_in_the_page_and_it_fetched_only_its_own_server(dashboard, server):
    errors = [e for e in dashboard.events if e["method"] == "Runtime.exceptionThrown"
              or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
                  and "401" not in e["params"]["entry"].get("text", ""))]
    assert errors == []
    urls = {e["params"]["request"]["url"] for e in dashboard.events if e["method"] == "Network.requestWillBeSent"}
    assert urls and all(u.startswith(f"{server.url}/") or u == "about:blank" for u in urls), urls


def test_in_airflows_frame_a_run_link_lands_on_that_run_in_the_ui(server, browser, plugin, dashboard):
    """The nav link's route shows the dashboard inside the UI; inside the UI's sandboxed frame (no
    allow-top-navigation), a run link lands on that run in the UI."""
    src = open_in_airflow(server, browser, plugin)
    assert src.rstrip("/").endswith("/tiering")
    browser.screenshot(ARTIFACTS / "dashboard_in_airflow.png")
    status, created = request(f"{server.url}/api/v2/dags/tiering_offload_by_age/dagRuns", token=server.token(),
                              data={"dag_run_id": AIRFLOW_RUN, "logical_date": "2026-11-22T10:00:00Z"}, timeout=30)
    assert status == 200, created
    assert browser.evaluate("document.querySelector('iframe').getAttribute('sandbox')") == \
        "allow-scripts allow-same-origin allow-forms allow-downloads"
    events_before = len(browser.events)
    browser.evaluate("""document.querySelector('iframe').contentDocument
        .querySelector('#runs-table tbody tr:nth-child(2) a').click()""")
    landed = browser.wait_for(f"""(() => {{ const p = decodeURIComponent(location.pathname);
        return p === {json.dumps(urllib.parse.unquote(RUN_PATH))} && !document.querySelector('iframe')
            && document.body.innerText.includes({json.dumps(AIRFLOW_RUN)}) && location.href; }})()""", timeout=40)
    print(f"the run link landed on {landed}")
    browser.screenshot(ARTIFACTS / "dashboard_run_link_in_airflow.png")
    assert unsafe_navigations(browser.events[events_before:]) == []


def test_in_airflows_frame_the_login_link_opens_airflows_login_back_to_the_page(server, browser, plugin, dashboard):
    """The frame's API answering 401 (stubbed in the frame, the UI keeps its login), the link shown in the
    frame navigates the UI's window to Airflow's login, back to this page."""
    open_in_airflow(server, browser, plugin)
    top_frame = browser.call("Page.getFrameTree")["frameTree"]["frame"]["id"]
    here = browser.evaluate("location.href")
    events_before = len(browser.events)
    browser.evaluate("""(() => { const w = document.querySelector('iframe').contentWindow;
        w.fetch = () => Promise.resolve(new w.Response('{"detail": "Not authenticated"}', {status: 401}));
        w.document.getElementById('refresh').click(); })()""")
    browser.wait_for("""(() => { const a = document.querySelector('iframe').contentDocument.querySelector('#error a');
        return a && a.click() === undefined; })()""", timeout=20)
    login = f"{server.url}/api/v2/auth/login?next={urllib.parse.quote(here, safe='')}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(
            e["method"] == "Network.requestWillBeSent" and e["params"].get("frameId") == top_frame
            and e["params"].get("type") == "Document" and e["params"]["request"]["url"] == login
            for e in browser.events[events_before:]):
        browser.evaluate("1")  # reads the events that arrived meanwhile
        time.sleep(0.2)
    assert any(e["method"] == "Network.requestWillBeSent" and e["params"].get("frameId") == top_frame
               and e["params"]["request"]["url"] == login for e in browser.events[events_before:]), login
    assert not unsafe_navigations(browser.events[events_before:])


def test_no_secret_reached_the_page_the_api_or_the_servers_log(server, base, dashboard):
    status, body = request(f"{base}api/tier-usage", token=server.token())
    assert status == 200, body
    for blob in (dashboard.dom, body, server.log.read_text(errors="replace")):
        assert DB_PASSWORD not in blob and S3_SECRET not in blob

