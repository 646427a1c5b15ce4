#!/usr/bin/env bash
# One-shot initialisation for docker/docker-compose.yml (service airflow-init), safe to run again:
#   1. Airflow's own metadata database (`airflow` on the postgres service): airflow db migrate
#   2. the pool every tiering DAG runs in: tiering_spark
#   3. the simple auth manager's password file: the users of AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS get
#      AIRFLOW_ADMIN_PASSWORD (the api-server reads the file from the shared airflow-auth volume)
#   4. the tiering schema in the `tiering` database: tiering db upgrade (idempotent, under an advisory lock)
# Secrets come from the environment and are never printed.
set -euo pipefail

echo "airflow-init: migrating Airflow's database"
airflow db migrate

echo "airflow-init: pool tiering_spark (${TIERING_SPARK_POOL_SLOTS:-2} slots)"
airflow pools set tiering_spark "${TIERING_SPARK_POOL_SLOTS:-2}" "tiering Spark jobs"

echo "airflow-init: simple auth manager users"
python - <<'PY'
import json
import os
from pathlib import Path

path = Path(os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
users = [u.split(":")[0] for u in os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"].split(",") if u.strip()]
password = os.environ["AIRFLOW_ADMIN_PASSWORD"]
if not password:
    raise SystemExit("airflow-init: AIRFLOW_ADMIN_PASSWORD is empty")
path.parent.mkdir(parents=True, exist_ok=True)
tmp = path.with_suffix(".tmp")
tmp.write_text(json.dumps({u.strip(): password for u in users}))
tmp.chmod(0o600)
tmp.replace(path)
print(f"airflow-init: users {', '.join(u.strip() for u in users)} in {path}")
PY

echo "airflow-init: tiering schema"
tiering db upgrade
echo "airflow-init: done"
