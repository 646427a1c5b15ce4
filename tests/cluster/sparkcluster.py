"""A Spark standalone cluster on loopback from the pyspark distribution in the venv: one master and N
workers, each its own JVM under its own session (process group), on free ports, with an event-log
directory. Idempotent: `start(state_dir)` reuses a cluster whose recorded PIDs are alive and whose master
answers; `stop(state_dir)` kills the recorded process groups. Also `python -m tests.cluster.sparkcluster
start|stop DIR` for use by hand.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import free_port

STATE = "cluster.json"


@dataclass
class Cluster:
    master_url: str  # spark://127.0.0.1:PORT
    ui_url: str  # http://127.0.0.1:PORT (the master's /json/)
    event_dir: Path
    conf_dir: Path  # SPARK_CONF_DIR with spark-defaults.conf turning the event log on
    pids: list[int]

    def status(self) -> dict:
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as r:
            return json.load(r)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _spark_class() -> str:
    return str(Path(sys.executable).parent / "spark-class")


def load(state_dir: Path) -> Cluster | None:
    try:
        d = json.loads((state_dir / STATE).read_text())
    except FileNotFoundError:
        return None
    c = Cluster(d["master_url"], d["ui_url"], Path(d["event_dir"]), Path(d["conf_dir"]), d["pids"])
    if not all(_alive(p) for p in c.pids):
        return None
    try:
        c.status()
    except OSError:
        return None
    return c


def start(state_dir: Path, workers: int = 1, cores: int = 1, memory: str = "1g", timeout: float = 90) -> Cluster:
    state_dir = Path(state_dir)
    existing = load(state_dir)
    if existing is not None:
        return existing
    stop(state_dir)  # a half-dead earlier cluster
    state_dir.mkdir(parents=True, exist_ok=True)
    events, conf = state_dir / "events", state_dir / "conf"
    events.mkdir(exist_ok=True)
    conf.mkdir(exist_ok=True)
    # one plain JSON file per application (Spark 4 defaults to rolling, zstd-compressed logs)
    (conf / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir file://{events}\nspark.eventLog.compress false\n"
        f"spark.eventLog.rolling.enabled false\n")
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_CONF_DIR": str(conf),
           "SPARK_DAEMON_MEMORY": "256m", "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    pids = []

    def launch(name: str, args: list[str], extra_env: dict | None = None) -> None:
        log = open(state_dir / f"{name}.log", "ab")
        proc = subprocess.Popen([_spark_class(), *args], env={**env, **(extra_env or {})}, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        pids.append(proc.pid)
        _save(state_dir, master, f"http://127.0.0.1:{ui}", events, conf, pids)

    master = f"spark://127.0.0.1:{port}"
    launch("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                      "--webui-port", str(ui)])
    for i in range(workers):
        wdir = state_dir / f"worker{i}"
        wdir.mkdir(exist_ok=True)
        launch(f"worker{i}", ["org.apache.spark.deploy.worker.Worker", master, "--host", "127.0.0.1",
                              "--cores", str(cores), "--memory", memory, "--webui-port", str(free_port()),
                              "--work-dir", str(wdir)])
    cluster = Cluster(master, f"http://127.0.0.1:{ui}", events, conf, pids)
    try:
        return _wait_up(cluster, state_dir, workers, pids, timeout)
    except BaseException:
        stop(state_dir)  # whatever went wrong, no master or worker outlives the failed start
        raise


def _wait_up(cluster: Cluster, state_dir: Path, workers: int, pids: list[int], timeout: float) -> Cluster:
    deadline = time.monotonic() + timeout
    while True:
        try:
            alive = [w for w in cluster.status().get("workers", []) if w.get("state") == "ALIVE"]
            if len(alive) >= workers:
                return cluster
        except (OSError, ValueError):  # not answering yet, or (while its UI starts) a page instead of JSON
            pass
        if time.monotonic() > deadline or not all(_alive(p) for p in pids):
            logs = "".join((state_dir / f).read_text(errors="replace")[-1500:] for f in ("master.log", "worker0.log")
                           if (state_dir / f).exists())
            stop(state_dir)
            raise RuntimeError(f"Spark standalone cluster did not come up in {timeout:.0f} s:\n{logs}")
        time.sleep(0.5)


def _save(state_dir: Path, master: str, ui: str, events: Path, conf: Path, pids: list[int]) -> None:
    tmp = state_dir / (STATE + ".tmp")
    tmp.write_text(json.dumps({"master_url": master, "ui_url": ui, "event_dir": str(events),
                               "conf_dir": str(conf), "pids": pids}))
    tmp.replace(state_dir / STATE)


def stop(state_dir: Path) -> None:
    """Kill the recorded process groups (TERM, then KILL after 10 s); forget the cluster."""
    state_dir = Path(state_dir)
    try:
        pids = json.loads((state_dir / STATE).read_text())["pids"]
    except (FileNotFoundError, ValueError, KeyError):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.killpg(pid, sig)  # each daemon leads its own session: its JVM children go too
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
            for p in pids:
                try:
                    os.waitpid(p, os.WNOHANG)  # reap our own children so they stop counting as alive
                except ChildProcessError:
                    pass
        if not any(_alive(p) for p in pids):
            break
    (state_dir / STATE).unlink(missing_ok=True)


def executor_tasks(event_log: Path) -> list[str]:
    """Executor id of every finished task recorded in one application's event log."""
    ids = []
    for line in event_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("Event") == "SparkListenerTaskEnd":
            ids.append(event["Task Info"]["Executor ID"])
    return ids


if __name__ == "__main__":
    cmd, where = sys.argv[1], Path(sys.argv[2])
    if cmd == "start":
        c = start(where)
        print(json.dumps({"master_url": c.master_url, "ui_url": c.ui_url, "pids": c.pids}))
    else:
        stop(where)
