"""The tiering dashboard in a real browser, served by a real Airflow API server with this repo's airflow.cfg
and plugins: headless Chromium (driven over the DevTools protocol) logs in with an Airflow token, renders
/tiering/, and the charts it drew carry the numbers the metadata database holds. The page is also reached
the way users reach it: from Airflow's navigation (the plugin's external view), where a run link clicked inside
the UI's sandboxed frame lands on that DAG run in the UI.

Screenshots go to tests/artifacts/ (dashboard.png, dashboard_in_airflow.png, dashboard_run_link_in_airflow.png)."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

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


# ---------------------------------------------------------------------------------------------- helpers

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_group(proc: subprocess.Popen, grace: float = 10) -> None:
    """Stop a process started with start_new_session=True and everything it spawned (ENVIRONMENT.md)."""
    if proc.poll() is None or _group_alive(proc.pid):
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and (proc.poll() is None or _group_alive(proc.pid)):
                time.sleep(0.1)  # poll() reaps the leader: a zombie would still count as a group member
            if not _group_alive(proc.pid):
                break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _chromium() -> str:
    """The Chromium binary; installed with apt-get when missing (skip only if apt cannot install it)."""
    names = ("chromium", "chromium-browser", "google-chrome")
    found = next((shutil.which(n) for n in names if shutil.which(n)), None)
    if found:
        return found
    apt = shutil.which("apt-get")
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if apt and sudo is not None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in ([*sudo, apt, "update", "-qq"], [*sudo, apt, "install", "-y", "-qq", "chromium"]):
            if subprocess.run(cmd, env=env, capture_output=True, timeout=900).returncode != 0:
                break
    found = next((shutil.which(n) for n in names if shutil.which(n)), None)
    if not found:
        pytest.skip("Chromium is not installed and apt-get could not install it (Debian package `chromium`)")
    return found


def _http(url: str, *, token: str | None = None, data: dict | None = None, timeout: float = 10):
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = None
    if data is not None:
        body, headers["Content-Type"] = json.dumps(data).encode(), "application/json"
    req = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def format_bytes(n: float) -> str:
    """The page's formatBytes (dashboard.js), to check the labels it drew."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{int(n)} B" if i == 0 else f"{n:.1f} {units[i]}"


class CDP:
    """A minimal Chrome DevTools protocol client over one page's websocket."""

    def __init__(self, ws_url: str):
        from websockets.sync.client import connect  # websockets comes with uvicorn[standard] (Airflow)

        self.ws = connect(ws_url, max_size=None, open_timeout=10)
        self.next_id = 0
        self.events: list[dict] = []

    def call(self, method: str, timeout: float = 30, **params) -> dict:
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30, poll: float = 0.2):
        deadline = time.monotonic() + timeout
        last_error = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError as exc:  # e.g. evaluated while a navigation swaps the document
                value, last_error = None, exc
            if value:
                return value
            time.sleep(poll)
        raise AssertionError(f"timed out waiting for {expression!r} (last error: {last_error})")

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def screenshot(self, path: Path, width: int = 1280) -> None:
        height = int(self.call("Page.getLayoutMetrics")["cssContentSize"]["height"])
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=max(height, 600), deviceScaleFactor=1,
                  mobile=False)
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": width, "height": max(height, 600), "scale": 1})
        self.call("Emulation.clearDeviceMetricsOverride")
        import base64

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        self.ws.close()


# ---------------------------------------------------------------------------------------------- fixtures

def _load_airflow_env():
    spec = importlib.util.spec_from_file_location("airflow_env", REPO / ".ci" / "airflow_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.airflow_env


class AirflowServer:
    def __init__(self, proc: subprocess.Popen, port: int, home: Path, log: Path):
        self.proc, self.port, self.home, self.log = proc, port, home, log
        self.url = f"http://127.0.0.1:{port}"
        self._token: str | None = None
        self.started = time.monotonic()

    def wait_up(self, timeout: float = 150) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"Airflow exited ({self.proc.returncode}): {self.log.read_text()[-3000:]}", pytrace=False)
            try:
                if _http(f"{self.url}/api/v2/version", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"Airflow's API server did not answer on :{self.port}: {self.log.read_text()[-3000:]}",
                    pytrace=False)

    def token(self) -> str:
        if self._token is None:
            passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
            status, body = _http(f"{self.url}/auth/token", data={"username": "admin", "password": passwords["admin"]})
            assert status in (200, 201), body
            self._token = json.loads(body)["access_token"]
        return self._token


@pytest.fixture(scope="module")
def airflow_server(tmp_path_factory, database_url, run_bucket, s3_settings):
    """`airflow db migrate` then `airflow api-server` (UI, REST API and plugins) in a home of its own, on a
    free loopback port, its `tiering_metadata` connection pointing at the run's database. Started here,
    waited for by the test (so the test's data and browser start meanwhile); stopped by process group."""
    home = tmp_path_factory.mktemp("airflow-dashboard-home")
    port = _free_port()
    url = make_url(database_url).set(password=DB_PASSWORD).render_as_string(hide_password=False)
    settings_env = {"TIERING_DATABASE_URL": url, "TIERING_BUCKET": run_bucket, "TIERING_PREFIX": "t/",
                    "TIERING_TIER1_ROOT": str(home / "tier1"), "TIERING_S3_ENDPOINT_URL": s3_settings["endpoint_url"],
                    "AWS_ACCESS_KEY_ID": s3_settings["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                    "AWS_DEFAULT_REGION": s3_settings["region_name"], "PATH": os.environ["PATH"],
                    "TIERING_AIRFLOW_ADDRESS": f"127.0.0.1:{port}"}  # host, port and base_url
    (home / "metrics.token").write_text(METRICS_TOKEN + "\n")
    env = {**os.environ, **_load_airflow_env()(settings_env, home), "AIRFLOW__API__WORKERS": "1",
           "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(48),
           "TIERING_METRICS_TOKEN_FILE": str(home / "metrics.token")}
    # The dashboard must find its database through the connection, not through variables it inherits.
    for name in ("TIERING_DATABASE_URL", "TIERING_BUCKET", "TIERING_S3_ENDPOINT_URL", "AWS_SECRET_ACCESS_KEY",
                 "AWS_ACCESS_KEY_ID", "TIERING_PREFIX"):
        env.pop(name, None)
    airflow_bin = Path(sys.executable).parent / "airflow"
    # reserialize: the DAGs in the metastore, so the test can create the DAG run the dashboard links to
    script = (f'"{airflow_bin}" db migrate && "{airflow_bin}" dags reserialize && '
              f'exec "{airflow_bin}" api-server --port {port} --host 127.0.0.1 --workers 1 --apps core')
    log = home / "airflow.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", "-c", script], env=env, cwd=home, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = AirflowServer(proc, port, home, log)
    try:
        yield server
    finally:
        _kill_group(proc)


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium with a DevTools endpoint; a CDP client on its first page."""
    profile = Path(tempfile.mkdtemp(prefix="chromium-", dir=tmp_path))
    args = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}",
            "--remote-debugging-port=0", "--window-size=1280,900", "about:blank"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    cdp = None
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
            assert proc.poll() is None, "Chromium exited at start"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        pages = [t for t in json.loads(_http(f"http://127.0.0.1:{port}/json/list")[1]) if t["type"] == "page"]
        cdp = CDP(pages[0]["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            cdp.call(f"{domain}.enable")
        yield cdp
    finally:
        if cdp is not None:
            cdp.close()
        _kill_group(proc, grace=5)


@pytest.fixture
def world(db, s3_client, bucket, tier1_root):
    """orders: 3 sealed ledgers (10 x 1000 B, 20 x 500 B, 5 x 2000 B), ledgers 0 and 1 offloaded;
    clicks: 2 sealed ledgers (4 x 300 B, 6 x 300 B), ledger 0 offloaded; ODD: one ledger of 3 x 111 B.
    Plus a finished offload run, a running GC run and 3 due GC tasks; subscription orders/audit acked 0:9."""
    deps = make_deps(db, s3_client, bucket, tier1_root)
    produce(deps, "orders", [entries("o0", 10, 1000), entries("o1", 20, 500), entries("o2", 5, 2000)],
            TopicPolicy(**BIG), open_tail=[b"tail"])
    produce(deps, "clicks", [entries("c0", 4, 300), entries("c1", 6, 300)], TopicPolicy(deletion_lag_seconds=0, **BIG))
    produce(deps, ODD, [entries("x", 3, 111)], TopicPolicy(**BIG))
    runs = JobRuns(db)
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


AIRFLOW_RUN = "manual__2026-11-22T10:00:00+00:00"  # created through the REST API: a manual id
LONG_ERROR = "bad input: topic 'nosuch' does not exist; create it with `tiering topics create nosuch` " + "x" * 200


# ---------------------------------------------------------------------------------------------- the test

def test_dashboard_renders_the_databases_numbers_in_a_browser(airflow_server, world, browser, db):
    server = airflow_server
    ready = time.monotonic()
    server.wait_up()
    up = time.monotonic()
    print(f"data and browser ready {ready - server.started:.1f} s after Airflow's start; Airflow up after "
          f"{up - server.started:.1f} s")
    base = f"{server.url}/tiering/"

    # Airflow lists the plugin: its app under /tiering and the nav link to the dashboard.
    status, body = _http(f"{server.url}/api/v2/plugins", token=server.token())
    assert status == 200, body
    [plugin] = [p for p in json.loads(body)["plugins"] if p["name"] == "tiering"]
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/tiering"]
    [view] = plugin["external_views"]
    assert (view["name"], view["href"], view["destination"], view["category"]) == \
        ("Tiering dashboard", "/tiering/", "nav", "browse")

    # The API wants an Airflow login, reads the run's database through the connection, refuses writes.
    assert _http(f"{base}api/tier-usage")[0] == 401
    status, body = _http(f"{base}api/tier-usage", token=server.token())
    assert status == 200, body
    with db.connect() as conn:
        usage = {r.topic: r for r in conn.execute(text("SELECT * FROM tiering.tier_usage"))}
    assert {r["topic"]: r["tier1_bytes"] for r in json.loads(body)["topics"]} == \
        {t: r.tier1_bytes for t, r in usage.items()} == {"orders": 30_000, "clicks": 3000, ODD: 333}
    assert {t: r.tier2_bytes for t, r in usage.items()} == {"orders": 20_000, "clicks": 1200, ODD: 0}
    req = urllib.request.Request(f"{base}api/topics", method="POST", data=b"{}",
                                 headers={"Authorization": f"Bearer {server.token()}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 405

    # Prometheus' endpoint: its bearer token (TIERING_METRICS_TOKEN_FILE) or an Airflow login, nothing else.
    assert _http(f"{base}metrics")[0] in (401, 403)  # what Airflow's login check answers
    assert _http(f"{base}metrics", token="not-the-token")[0] in (401, 403)
    for token in (METRICS_TOKEN, server.token()):
        status, metrics = _http(f"{base}metrics", token=token)
        assert status == 200, metrics
        assert 'tiering_offload_backlog_bytes{topic="orders"} 10000.0' in metrics.splitlines()
        assert 'tiering_tier_bytes{tier="1",topic="clicks"} 3000.0' in metrics.splitlines()

    # Logged out, the page says so and links to Airflow.
    browser.navigate(base)
    assert browser.wait_for("document.body && document.body.dataset.state === 'error'")
    assert "Log in to Airflow" in browser.evaluate("document.getElementById('error').textContent")
    # ... and logging in comes back to this page, not to Airflow's home page
    login = browser.evaluate("document.querySelector('#error a').href")
    assert login == f"{server.url}/api/v2/auth/login?next={urllib.parse.quote(base, safe='')}", login

    # Logged in (Airflow's session cookie), it draws the charts.
    browser.call("Network.setCookie", name="_token", value=server.token(), url=f"{server.url}/", path="/")
    browser.navigate(base)
    browser.wait_for("document.body && document.body.dataset.state === 'ready'")
    dom = browser.evaluate("document.documentElement.outerHTML")
    browser.screenshot(ARTIFACTS / "dashboard.png")
    print(f"dashboard rendered {time.monotonic() - up:.1f} s after Airflow was up")

    # Stacked bars: one per topic, a segment per tier carrying its bytes, labelled with topic and bytes.
    bars = _svg(dom, "tier-chart")
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

    # Lines: offloaded bytes over the day sum to what was offloaded; the last backlog point is the backlog.
    series = _svg(dom, "series-chart")
    dots = {name: [c for c in series.iter("circle") if c.get("data-series") == name] for name in ("backlog", "offloaded")}
    assert len(dots["backlog"]) == len(dots["offloaded"]) == 24
    assert sum(int(c.get("data-bytes")) for c in dots["offloaded"]) == world["offloaded_bytes"] == 21_200
    assert int(dots["backlog"][-1].get("data-bytes")) == 10_000 + 1800 + 333
    assert {p.get("data-series") for p in series.iter("path")} == {"backlog", "offloaded"}

    # Tables and cards, from the same numbers.
    tables = browser.evaluate("""JSON.stringify(Object.fromEntries(['gc-table', 'runs-table', 'backlog-table',
                                                                     'subscriptions-table']
        .map(id => [id, [...document.querySelectorAll('#' + id + ' tbody tr')]
            .map(tr => [...tr.cells].map(td => td.textContent))])))""")
    tables = json.loads(tables)
    assert tables["gc-table"] == [["PENDING", "retention", "3", "3", "0", "0", tables["gc-table"][0][6]]]
    # kind, the Airflow run (linked) or "by hand", status, bytes
    assert [(r[1], r[2], r[4]) for r in tables["runs-table"]] == [
        ("gc", "by hand", "RUNNING"), ("offload by age", f"{AIRFLOW_RUN} (try 2)", "SUCCEEDED"),
        ("offload prefix", "manual__x", "FAILED")]
    # an error cell is cut by the layout; its tooltip holds the whole text
    error_cell = json.loads(browser.evaluate("""(() => { const td = document.querySelector(
        '#runs-table tbody tr:nth-child(3) td.error-text'); return JSON.stringify(
        {text: td.textContent, title: td.title, cut: td.scrollWidth > td.clientWidth}); })()"""))
    assert error_cell == {"text": LONG_ERROR, "title": LONG_ERROR, "cut": True}
    assert tables["runs-table"][1][9] == format_bytes(21_200)
    link = browser.evaluate("document.querySelector('#runs-table tbody tr:nth-child(2) a').href")
    assert link == f"{server.url}/dags/tiering_offload_by_age/runs/{urllib.parse.quote(AIRFLOW_RUN, safe='')}"
    assert sorted(r[0] for r in tables["backlog-table"]) == sorted(["clicks", "orders", ODD])
    # the subscription: ledgers 1 and 2 unread (25 entries, 20,000 B), nothing lost
    [sub] = tables["subscriptions-table"]
    assert sub[:6] == ["orders", "audit", "0:9", "ACTIVE", "25", format_bytes(20_000)]
    assert sub[8:] == ["0", "0 B", "none"]
    cards = json.loads(browser.evaluate("""JSON.stringify(Object.fromEntries([...document.querySelectorAll('.card')]
        .map(c => [c.dataset.card, c.querySelector('.card-value').textContent])))"""))
    assert cards["Tier 1"] == format_bytes(33_333) and cards["Tier 2"] == format_bytes(21_200)
    assert cards["GC queue"] == "3 pending" and cards["Topics"] == "3"

    # A topic name is text, never markup.
    assert browser.evaluate("document.querySelector('b') === null")
    assert "&lt;b&gt;odd&lt;/b&gt; &amp; \"quoted\" topic ✓" in dom

    # Nothing failed in the page, and it fetched nothing but its own server.
    errors = [e for e in browser.events if e["method"] == "Runtime.exceptionThrown"
              or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
                  and "401" not in e["params"]["entry"].get("text", ""))]
    assert errors == []
    urls = {e["params"]["request"]["url"] for e in browser.events if e["method"] == "Network.requestWillBeSent"}
    assert urls and all(u.startswith(f"{server.url}/") or u == "about:blank" for u in urls), urls

    # In Airflow's UI, the nav link's route shows the dashboard inside the UI.
    browser.navigate(f"{server.url}/plugin/{view['url_route']}")
    src = browser.wait_for("""(() => { const f = document.querySelector('iframe');
        return f && f.contentDocument && f.contentDocument.body && f.contentDocument.body.dataset.state === 'ready'
            && f.getAttribute('src'); })()""", timeout=40)
    assert src.rstrip("/").endswith("/tiering")
    browser.screenshot(ARTIFACTS / "dashboard_in_airflow.png")

    # Inside the UI's sandboxed frame (no allow-top-navigation), a run link lands on that run in the UI.
    status, created = _http(f"{server.url}/api/v2/dags/tiering_offload_by_age/dagRuns", token=server.token(),
                            data={"dag_run_id": AIRFLOW_RUN, "logical_date": "2026-11-22T10:00:00Z"}, timeout=30)
    assert status == 200, created
    assert browser.evaluate("document.querySelector('iframe').getAttribute('sandbox')") == \
        "allow-scripts allow-same-origin allow-forms allow-downloads"
    events_before = len(browser.events)
    browser.evaluate("""document.querySelector('iframe').contentDocument
        .querySelector('#runs-table tbody tr:nth-child(2) a').click()""")
    run_path = f"/dags/tiering_offload_by_age/runs/{urllib.parse.quote(AIRFLOW_RUN, safe='')}"
    landed = browser.wait_for(f"""(() => {{ const p = decodeURIComponent(location.pathname);
        return p === {json.dumps(urllib.parse.unquote(run_path))} && !document.querySelector('iframe')
            && document.body.innerText.includes({json.dumps(AIRFLOW_RUN)}) && location.href; }})()""", timeout=40)
    print(f"the run link landed on {landed}")
    browser.screenshot(ARTIFACTS / "dashboard_run_link_in_airflow.png")
    refused = [e for e in browser.events[events_before:] if e["method"] == "Log.entryAdded"
               and "Unsafe attempt to initiate navigation" in e["params"]["entry"].get("text", "")]
    assert refused == []

    # ... and so does the log-in link: the frame's API answering 401 (stubbed in the frame, the UI keeps its
    # login), the link shown in the frame navigates the UI's window to Airflow's login, back to this page.
    browser.navigate(f"{server.url}/plugin/{view['url_route']}")
    browser.wait_for("""(() => { const f = document.querySelector('iframe');
        return f && f.contentDocument && f.contentDocument.body && f.contentDocument.body.dataset.state === 'ready'; })()""",
                     timeout=40)
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
    assert not [e for e in browser.events[events_before:] if e["method"] == "Log.entryAdded"
                and "Unsafe attempt to initiate navigation" in e["params"]["entry"].get("text", "")]

    # No secret reached the page, the API or the server's log.
    for blob in (dom, body, server.log.read_text(errors="replace")):
        assert DB_PASSWORD not in blob and S3_SECRET not in blob


def _svg(dom: str, cls: str) -> ET.Element:
    match = re.search(rf'<svg[^>]*class="{cls}".*?</svg>', dom, re.S)
    assert match, f"no <svg class={cls!r}> in the page"
    root = ET.fromstring(match.group(0))
    for node in root.iter():  # plain tag names whether or not the serializer wrote the SVG namespace
        node.tag = node.tag.rsplit("}", 1)[-1]
    return root
