"""Airflow for the end-to-end tests: its REST API over plain HTTP (a bearer token from the simple auth
manager's generated admin password), and an API server (UI, REST API and this repo's plugins) started in a
home of its own and stopped with its whole process group."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.processes import kill_group

REPO = Path(__file__).resolve().parents[3]


def request(url: str, *, token: str | None = None, data: dict | None = None, method: str | None = None,
            timeout: float = 10) -> tuple[int, str]:
    """(status, body text) of one JSON request; an HTTP error is an answer, not an exception."""
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    body = None
    if data is not None:
        body, headers["Content-Type"] = json.dumps(data).encode(), "application/json"
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as res:
            return res.status, res.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def request_json(url: str, *, token: str | None = None, data: dict | None = None, method: str | None = None,
                 timeout: float = 30):
    """(status, decoded body) of one JSON request; a body that is not JSON comes back as text."""
    status, raw = request(url, token=token, data=data, method=method, timeout=timeout)
    try:
        return status, json.loads(raw or "null")
    except ValueError:
        return status, raw


def admin_token(url: str, home: Path) -> str:
    """A bearer token for `admin`, whose password the simple auth manager generated under AIRFLOW_HOME."""
    password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
    status, body = request(f"{url}/auth/token", data={"username": "admin", "password": password}, timeout=30)
    assert status in (200, 201), body
    return json.loads(body)["access_token"]


def airflow_env():
    """.ci/airflow_env.py's `airflow_env(settings, home)`: the environment `make up` gives Airflow."""
    spec = importlib.util.spec_from_file_location("airflow_env", REPO / ".ci" / "airflow_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.airflow_env


class AirflowServer:
    """A started API server: its URL, home and log; `wait_up` waits for its REST API."""

    def __init__(self, proc: subprocess.Popen, port: int, home: Path, log: Path):
        self.proc, self.port, self.home, self.log = proc, port, home, log
        self.url = f"http://127.0.0.1:{port}"
        self._token: str | None = None
        self.started = time.monotonic()
        self.up: float | None = None  # when wait_up saw it answer

    def wait_up(self, timeout: float = 150) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"Airflow exited ({self.proc.returncode}): {self.log.read_text()[-3000:]}", pytrace=False)
            try:
                if request(f"{self.url}/api/v2/version", timeout=2)[0] == 200:
                    self.up = time.monotonic()
                    return
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"Airflow's API server did not answer on :{self.port}: {self.log.read_text()[-3000:]}",
                    pytrace=False)

    def token(self) -> str:
        if self._token is None:
            self._token = admin_token(self.url, self.home)
        return self._token


@contextlib.contextmanager
def api_server(home: Path, port: int, env: dict[str, str]) -> Iterator[AirflowServer]:
    """`airflow db migrate`, `airflow dags reserialize` (the DAGs in the metastore, so that a test can create
    DAG runs over REST), then `airflow api-server` on 127.0.0.1:`port`, run in `home` with `env`. Yields at
    once: the caller prepares what it needs while Airflow starts, then calls `wait_up`."""
    airflow_bin = Path(sys.executable).parent / "airflow"
    script = (f'"{airflow_bin}" db migrate && "{airflow_bin}" dags reserialize && '
              f'exec "{airflow_bin}" api-server --port {port} --host 127.0.0.1 --workers 1 --apps core')
    log = home / "airflow.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", "-c", script], env=env, cwd=home, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield AirflowServer(proc, port, home, log)
    finally:
        kill_group(proc)
