"""The offload timeout and GC delay as settings of the `tiering_s3` connection's extra (issue 13): what every
DAG task resolves with TieringHook().get_settings(), validated like the environment (ASCII digits, bounds).
Run in a subprocess so Airflow's import does not leak into other tests."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, sys
from tiering.jobs.hook import TieringHook
from tiering.errors import ConfigError
out = []
for extra, env in json.loads(sys.argv[1]):
    os.environ["AIRFLOW_CONN_TIERING_S3"] = json.dumps({"conn_type": "aws", "login": "AK", "password": "SK",
                                                        "extra": {"bucket": "tiering", **extra}})
    try:
        s = TieringHook().get_settings({**os.environ, **env})
        out.append({"offload_timeout": s.offload_timeout_seconds, "gc_delay": s.gc_delay_seconds,
                    "env": {k: v for k, v in s.to_env().items() if k.endswith("_SECONDS")}})
    except ConfigError as exc:
        out.append({"error": str(exc)})
print(json.dumps(out))
"""

CASES = {
    "defaults": ({}, {}, {"offload_timeout": 3600, "gc_delay": 600}),
    "extra": ({"offload_timeout_seconds": 60, "gc_delay_seconds": "0"}, {}, {"offload_timeout": 60, "gc_delay": 0}),
    "environment": ({}, {"TIERING_OFFLOAD_TIMEOUT_SECONDS": "120"}, {"offload_timeout": 120, "gc_delay": 600}),
    "extra-wins": ({"offload_timeout_seconds": "30"}, {"TIERING_OFFLOAD_TIMEOUT_SECONDS": "120"},
                   {"offload_timeout": 30, "gc_delay": 600}),
    "arabic-digits": ({"offload_timeout_seconds": "\u0666\u0660"}, {},
                      "TIERING_OFFLOAD_TIMEOUT_SECONDS must be an integer in ASCII"),
    "huge": ({"gc_delay_seconds": 10**40}, {}, "TIERING_GC_DELAY_SECONDS must be from 0 to"),
    "zero": ({"offload_timeout_seconds": 0}, {}, "TIERING_OFFLOAD_TIMEOUT_SECONDS must be from 1 to"),
}


def test_timeouts_from_the_s3_connection_extra(tmp_path):
    home = tmp_path / "airflow-home"
    home.mkdir()
    run_env = {"AIRFLOW_CONN_TIERING_METADATA": json.dumps({"conn_type": "postgres", "host": "db", "login": "u",
                                                            "password": "pw", "schema": "tiering", "port": 5432}),
               "AIRFLOW_HOME": str(home), "PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(REPO),
               "TIERING_TIER1_ROOT": str(tmp_path / "tier1"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR"}
    cases = [[extra, env] for extra, env, _ in CASES.values()]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], env=run_env, capture_output=True,
                          text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for (name, (_, _, want)), got in zip(CASES.items(), results):
        if isinstance(want, str):
            assert want in got.get("error", ""), (name, got)
            continue
        assert {k: got[k] for k in want} == want, (name, got)
        # what spark-submit's environment gets
        assert got["env"] == {"TIERING_OFFLOAD_TIMEOUT_SECONDS": str(want["offload_timeout"]),
                              "TIERING_GC_DELAY_SECONDS": str(want["gc_delay"])}, (name, got)
