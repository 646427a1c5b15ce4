"""TieringHook resolves S3 credentials through the Amazon provider's AwsBaseHook: a session token
in the aws connection reaches the job's environment, a connection whose credentials cannot be resolved is
a ConfigError naming the connection and the exception type (no secret), and a connection without any
credentials leaves the environment's (boto3's default chain), as before. In a subprocess so Airflow's import
does not leak into other tests."""
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
for conn in json.loads(sys.argv[1]):
    os.environ["AIRFLOW_CONN_TIERING_S3"] = json.dumps(conn)
    try:
        env = TieringHook().get_settings().to_env()
        out.append({k: env.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")})
    except ConfigError as exc:
        out.append({"error": str(exc)})
print(json.dumps(out))
"""


def test_s3_credentials_through_the_aws_provider(tmp_path):
    home = tmp_path / "airflow-home"
    home.mkdir()
    run_env = {"AIRFLOW_CONN_TIERING_METADATA": json.dumps({"conn_type": "postgres", "host": "db"}),
               "AIRFLOW_HOME": str(home), "PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(REPO),
               "TIERING_TIER1_ROOT": str(tmp_path / "tier1"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR", "AWS_ACCESS_KEY_ID": "ENV-AK",
               "AWS_SECRET_ACCESS_KEY": "ENV-SK", "AWS_CONFIG_FILE": str(tmp_path / "none"),
               "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    conns = [
        {"conn_type": "aws", "login": "AK", "password": "SK-secret",
         "extra": {"bucket": "tiering", "aws_session_token": "TOKEN"}},
        {"conn_type": "aws", "extra": {"bucket": "tiering", "profile_name": "no-such-profile"}},
        {"conn_type": "aws", "extra": {"bucket": "tiering"}},
    ]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(conns)], env=run_env, capture_output=True,
                          text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    token, profile, none = json.loads(proc.stdout.strip().splitlines()[-1])
    assert token == {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK-secret", "AWS_SESSION_TOKEN": "TOKEN"}
    assert profile == {"error": "the Airflow connection 'tiering_s3' gives no usable S3 credentials "
                                "(ProfileNotFound)"}
    assert none == {"AWS_ACCESS_KEY_ID": "ENV-AK", "AWS_SECRET_ACCESS_KEY": "ENV-SK", "AWS_SESSION_TOKEN": None}
    assert "SK-secret" not in proc.stderr  # the provider logs nothing secret while resolving
