"""Environment for running this repo's DAGs locally: AIRFLOW_HOME, this airflow.cfg, and the connections
`tiering_metadata`, `tiering_s3` and `spark_default` as AIRFLOW_CONN_* built from the tiering settings.

    eval "$(python .ci/airflow_env.py HOME_DIR)"     # prints export lines (used by make up / demo)
Tests import `airflow_env()` directly.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

REPO = Path(__file__).resolve().parents[1]


def airflow_env(env: dict[str, str], home: Path, spark_master: str = "local[2]") -> dict[str, str]:
    db = urlsplit(env["TIERING_DATABASE_URL"].replace("postgresql+psycopg2://", "postgresql://"))
    pg = {"conn_type": "postgres", "host": db.hostname, "port": db.port or 5432,
          "login": unquote(db.username or ""), "password": unquote(db.password or ""),
          "schema": db.path.lstrip("/")}
    extra = {"region_name": env.get("AWS_DEFAULT_REGION", "us-east-1"), "bucket": env["TIERING_BUCKET"],
             "prefix": env.get("TIERING_PREFIX", "tiering/")}
    if env.get("TIERING_S3_ENDPOINT_URL"):
        extra["endpoint_url"] = env["TIERING_S3_ENDPOINT_URL"]
    aws = {"conn_type": "aws", "login": env.get("AWS_ACCESS_KEY_ID", ""),
           "password": env.get("AWS_SECRET_ACCESS_KEY", ""), "extra": extra}
    venv_bin = str(Path(sys.executable).parent)
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW_CONFIG": str(REPO / "airflow.cfg"),
        "TIERING_REPO": str(REPO),
        "AIRFLOW_CONN_TIERING_METADATA": json.dumps(pg),
        "AIRFLOW_CONN_TIERING_S3": json.dumps(aws),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": spark_master}),
        "PATH": f"{venv_bin}:{env.get('PATH', os.environ.get('PATH', ''))}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "TIERING_TIER1_ROOT": env["TIERING_TIER1_ROOT"],
        "PYSPARK_PYTHON": sys.executable,
    }


if __name__ == "__main__":
    home = Path(sys.argv[1] if len(sys.argv) > 1 else REPO / ".local" / "airflow")
    for key, value in airflow_env(dict(os.environ), home).items():
        print(f"export {key}={shlex.quote(value)}")
