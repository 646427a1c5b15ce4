"""Airflow as a team runs it, started as `make up` starts it (the `up` fixture of
test_airflow_up.py: .ci/airflow_up.sh with a metastore database, a home and a port of its own):

- 40 REST triggers of tiering_offload_prefix, 16 at a time, half with a bad position: every bad one is
  refused with 400, every good one accepted with 200 and its run reaches a final state; no 5xx, and no
  "database is locked" anywhere in Airflow's logs (SQLite's failure under concurrent writers). The good runs
  target a topic with nothing before the position, so `plan` skips Spark: the test costs plan tasks only.
- `.ci/stop.sh` while scheduled runs are running, then `.ci/airflow_up.sh`: no run is left FAILED and no
  task failed for want of the API server ("Connection refused").
- the whole session killed (a crash) while an offload's Spark task runs, then `.ci/airflow_up.sh`: the
  task is reset by the new scheduler's first loop (not after Airflow's 300 s orphan check) and the run
  succeeds, each ledger offloaded once (a further retry, transient on a loaded machine, is reported).
- the scheduler alone killed: `.ci/airflow_up.sh` restarts Airflow instead of reporting it up.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import empty_world
from tests.e2e.test_airflow_up import _http, _token, _wait_dags, up  # noqa: F401 - `up` is the fixture
from tests.integration.helpers import bucket_keys, make_deps, produce
from tiering.model import TopicPolicy

pytestmark = pytest.mark.slow
BIG = dict(rollover_entries=10**9, rollover_bytes=2**40)
FINAL = ("success", "failed")


def _unpause(u, token, dag_ids):
    for dag_id in dag_ids:
        status, body = _http(f"{u.url}/api/v2/dags/{dag_id}", token=token, data={"is_paused": False},
                             method="PATCH")
        assert status == 200, body


def _runs(u, token, dag_id) -> list[dict]:
    # the triggers' timeout: on a slow machine the API server took over 30 s to list runs beside 20 Spark jobs
    status, body = _http(f"{u.url}/api/v2/dags/{dag_id}/dagRuns?limit=100", token=token, timeout=120)
    assert status == 200, body
    return body["dag_runs"]


def _trigger_prefix(u, token, topic: str, position: str) -> tuple[str, dict]:
    dag = "tiering_offload_prefix"
    _wait_dags(u, token, [dag])
    _unpause(u, token, [dag])
    status, run = _http(f"{u.url}/api/v2/dags/{dag}/dagRuns", token=token,
                        data={"logical_date": None, "conf": {"topic": topic, "position": position}})
    assert status == 200, run
    return dag, run


def _polled(url: str, token: str) -> dict | None:
    """One status poll's body, or None when the API server did not answer in time: on a loaded machine a
    poll can time out, and the loop polling asks again until its own deadline (what is under test)."""
    try:
        return _http(url, token=token)[1]
    except (TimeoutError, urllib.error.URLError):
        return None


def _final_state(u, token, dag_id: str, run: dict, seconds: float) -> str | None:
    deadline = time.monotonic() + seconds
    state = None
    while time.monotonic() < deadline:
        body = _polled(f"{u.url}/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}", token)
        state = body["state"] if body is not None else state
        if state in FINAL:
            break
        time.sleep(2)
    return state


def _attempts(u, dag_id: str, run: dict) -> str:
    """The tail of each task attempt's log of a run: what a failure or a retry is read from."""
    logs = sorted(u.home.glob(f"logs/dag_id={dag_id}/run_id={run['dag_run_id']}/task_id=*/attempt=*.log"))
    return " | ".join(f"{p.parent.name}/{p.name}: {p.read_text(errors='replace')[-1500:]}" for p in logs)


def _scheduler_pid(u) -> int:
    path = u.local / "airflow-pids" / "scheduler.pid"
    deadline = time.monotonic() + 120  # make up returns once the API server answers; the scheduler follows
    while not (path.exists() and path.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.5)  # (created empty, then written)
    return int(path.read_text())


def _logs(u) -> str:
    return "".join(p.read_text(errors="replace") for p in u.home.rglob("*.log"))


def test_forty_concurrent_triggers_half_bad(up, engine, s3_client, run_bucket):
    assert up.first.returncode == 0, up.first.stdout[-2000:] + up.first.stderr[-3000:]
    token = _token(up)
    deps = make_deps(engine, s3_client, run_bucket, up.local / "tier1")
    empty_world(engine, s3_client, run_bucket)
    produce(deps, "quiet", [[b"a"]], TopicPolicy(**BIG), open_tail=[b"b"])  # nothing before 0:0
    dag = "tiering_offload_prefix"
    _wait_dags(up, token, [dag])
    _unpause(up, token, [dag])

    def trigger(i):
        conf = {"topic": "quiet", "position": "0:0" if i % 2 else f"ledger-{i}"}
        status, body = _http(f"{up.url}/api/v2/dags/{dag}/dagRuns", token=token,
                             data={"logical_date": None, "conf": conf}, timeout=120)
        return i % 2 == 1, status, body

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(trigger, range(40)))
    statuses = [(good, status) for good, status, _ in results]
    assert not [r for r in results if r[1] >= 500], [r for r in results if r[1] >= 500][:3]
    assert all(status == 400 for good, status in statuses if not good), statuses
    assert all(status == 200 for good, status in statuses if good), statuses
    bad = next(body for good, status, body in results if not good)
    assert "two whole numbers joined by a colon" in str(bad), bad  # the rule, in the refusal

    run_ids = {body["dag_run_id"] for good, _, body in results if good}
    assert len(run_ids) == 20
    deadline = time.monotonic() + 900  # max_active_runs=1: the 20 plan tasks run one after the other
    states = {}
    while time.monotonic() < deadline:
        states = {r["dag_run_id"]: r["state"] for r in _runs(up, token, dag) if r["dag_run_id"] in run_ids}
        if len(states) == 20 and all(s in FINAL for s in states.values()):
            break
        time.sleep(5)
    assert sorted(states.values()) == ["success"] * 20, states
    logs = _logs(up)
    assert "database is locked" not in logs
    assert "nothing to do, Spark not started" in logs and "Topic 'quiet', Position '0:0'" in logs


def test_stop_during_scheduled_runs_then_up_loses_nothing(up, engine, s3_client, run_bucket):
    assert up.first.returncode == 0, up.first.stdout[-2000:] + up.first.stderr[-3000:]
    token = _token(up)
    dags = ["tiering_offload_by_age", "tiering_delete_lagged", "tiering_defrag", "tiering_gc"]
    _wait_dags(up, token, dags)
    _unpause(up, token, dags)  # each gets its scheduled run for the last interval at once
    deadline = time.monotonic() + 180
    running = []
    while not running and time.monotonic() < deadline:
        for dag_id in dags:
            for run in _runs(up, token, dag_id):
                if run["run_type"] == "scheduled" and run["state"] == "running":
                    _, tis = _http(f"{up.url}/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances",
                                   token=token)
                    if any(t["state"] in ("running", "queued") for t in tis["task_instances"]):
                        running.append((dag_id, run["dag_run_id"]))
        time.sleep(0.5)
    assert running, "no scheduled run had a task running or queued"

    session = (up.local / "airflow.pid").read_text().strip()
    stop = up.script("stop.sh", timeout=400)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    left = subprocess.run(["pgrep", "-a", "-s", session], capture_output=True, text=True).stdout
    assert not left, left  # nothing of that Airflow lives on: tasks run in process groups of their own
    again = up.script("airflow_up.sh")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    token = _token(up)

    deadline = time.monotonic() + 600
    scheduled = {}
    while time.monotonic() < deadline:
        scheduled = {(d, r["dag_run_id"]): r["state"] for d in dags for r in _runs(up, token, d)
                     if r["run_type"] == "scheduled"}
        if all(s in FINAL for s in scheduled.values()):
            break
        time.sleep(5)
    if not all(scheduled.get(key) == "success" for key in running):
        tis = {key: [(t["task_id"], t["state"], t["try_number"]) for t in _http(
            f"{up.url}/api/v2/dags/{key[0]}/dagRuns/{key[1]}/taskInstances", token=token)[1]["task_instances"]]
            for key in running}
        pytest.fail(f"left unfinished: {scheduled}; their tasks: {tis}; stop: {stop.stdout + stop.stderr}; "
                    f"scheduler log: {(up.home / 'scheduler.log').read_text(errors='replace')[-6000:]}")
    assert "failed" not in scheduled.values(), scheduled
    logs = _logs(up)
    assert "Connection refused" not in logs
    # the API server answered before the scheduler started, after the restart too
    assert (up.home / "standalone.log").read_text().count("API server healthy") == 2


def test_killed_with_a_spark_task_running_then_up_offloads_once(up, engine, s3_client, run_bucket):
    """The whole session killed (a crash, not `make stop`) while the offload's Spark task runs: the
    next `make up` ends the dead scheduler's job, so the task is reset and run again in the first loop, not
    after Airflow's orphan check (300 s); the new attempt takes over the dead one's ledgers and the run
    succeeds with every ledger before the position offloaded once."""
    token = _token(up)
    deps = make_deps(engine, s3_client, run_bucket, up.local / "tier1")
    empty_world(engine, s3_client, run_bucket)
    produce(deps, "crash", [[b"a" * 100] * 20, [b"b" * 100] * 20, [b"c"]], TopicPolicy(**BIG), open_tail=[b"d"])
    dag, run = _trigger_prefix(up, token, "crash", "2:0")
    tis_url = f"{up.url}/api/v2/dags/{dag}/dagRuns/{run['dag_run_id']}/taskInstances"
    deadline = time.monotonic() + 300
    states = {}
    while time.monotonic() < deadline:
        body = _polled(tis_url, token)
        states = {t["task_id"]: t["state"] for t in body["task_instances"]} if body is not None else states
        if states.get("offload") == "running":
            killed_try = next(t["try_number"] for t in body["task_instances"] if t["task_id"] == "offload")
            break
        assert "failed" not in states.values(), states
        time.sleep(0.5)
    else:
        pytest.fail(f"the offload task never ran: {states}")

    # the whole session, as a crash would: the task process and its spark-submit run in groups of their own
    session = (up.local / "airflow.pid").read_text().strip()
    subprocess.run(["pkill", "-KILL", "-s", session], check=False)
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-s", session], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "a process of the killed Airflow lives on"
        time.sleep(0.2)
    log_at = len((up.home / "standalone.log").read_text())
    scheduler_at = len((up.home / "scheduler.log").read_text(errors="replace"))
    again = up.script("airflow_up.sh")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    token = _token(up)
    # the reset is what is timed: the killed try handed back and a new one queued well inside the 300 s of
    # Airflow's own orphan check; the run then has the time its retries take (each waits the DAGs' 60 s
    # retry delay, and a Spark start on a loaded machine can take minutes)
    deadline = time.monotonic() + 240
    offload = None
    while time.monotonic() < deadline:
        body = _polled(tis_url, token)
        found = [t for t in (body or {}).get("task_instances", []) if t["task_id"] == "offload"]
        offload = (found[0]["state"], found[0]["try_number"]) if found else offload
        if offload and offload[1] > killed_try:
            break
        time.sleep(1)
    else:
        pytest.fail(f"the killed offload try {killed_try} was not reset within 240 s: {offload}")
    state = _final_state(up, token, dag, run, 900)
    tis = [(t["task_id"], t["state"], t["try_number"]) for t in _http(tis_url, token=token)[1]["task_instances"]]
    assert state == "success", (state, tis, (up.home / "standalone.log").read_text()[-3000:], _attempts(up, dag, run))
    tries = [n for task, st, n in tis if task == "offload" and st == "success"]
    assert tries and tries[0] > killed_try, tis  # the killed try, then at least one more
    # reset by the new scheduler's first loop (what ending the dead scheduler's job buys), not its orphan check
    restarted = (up.home / "scheduler.log").read_text(errors="replace")[scheduler_at:]
    assert "Reset the following 1 orphaned TaskInstances" in restarted, restarted[-3000:]
    if tries[0] > killed_try + 1:
        # a retry after the reset: transient under load (a Spark start on a busy machine), which is what the
        # DAGs' retries are for; its log is kept in the report so a failure that is not transient is seen
        warnings.warn(f"the offload succeeded at try {tries[0]}; the tries' log tails: {_attempts(up, dag, run)}")
    assert "ended 1 scheduler job(s) a killed scheduler left running" in \
        (up.home / "standalone.log").read_text()[log_at:]  # this restart's, not an earlier one's
    ledgers = deps.meta.list_ledgers("crash")  # (a killed try's open multipart upload is GC's to abort)
    assert [led.state.value for led in ledgers] == ["OFFLOADED", "OFFLOADED", "SEALED", "OPEN"], ledgers
    # offloaded once: the bucket holds the objects the chunk rows name and nothing else (no second attempt's)
    named = {key for led in ledgers[:2] for ch in [deps.meta.get_chunk(led)] for key in (ch.data_key, ch.index_key)}
    assert bucket_keys(deps) == named, (bucket_keys(deps), named)


def test_a_dead_scheduler_is_started_again_by_make_up(up, engine, s3_client, run_bucket):
    """The scheduler alone killed (an OOM kill): the API server still answers, so `make up` used to say
    "already up" with nothing running tasks. It now finds the dead component, stops the rest gracefully and
    starts Airflow whole; a run triggered afterwards succeeds."""
    old = _scheduler_pid(up)
    os.kill(old, signal.SIGKILL)
    again = up.script("airflow_up.sh")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "Airflow's scheduler is not running" in again.stdout and "already up" not in again.stdout, again.stdout
    new = _scheduler_pid(up)
    assert new != old
    os.kill(new, 0)  # alive
    token = _token(up)
    deps = make_deps(engine, s3_client, run_bucket, up.local / "tier1")
    empty_world(engine, s3_client, run_bucket)
    produce(deps, "after", [[b"a"]], TopicPolicy(**BIG), open_tail=[b"b"])
    dag, run = _trigger_prefix(up, token, "after", "0:0")
    assert _final_state(up, token, dag, run, 300) == "success"
