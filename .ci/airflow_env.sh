#!/usr/bin/env bash
# Source me: Airflow's environment for this repo (home under .local/airflow), its database migrated and
# the pool of the tiering jobs created. Expects .local/env already exported (the Makefile does it).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
eval "$("$ROOT/.venv/bin/python" "$ROOT/.ci/airflow_env.py" "$ROOT/.local/airflow")"
mkdir -p "$AIRFLOW_HOME"
if [ ! -f "$AIRFLOW_HOME/.migrated" ] || [ "$ROOT/requirements.txt" -nt "$AIRFLOW_HOME/.migrated" ]; then
  airflow db migrate >"$AIRFLOW_HOME/migrate.log" 2>&1 && touch "$AIRFLOW_HOME/.migrated"
fi
airflow pools set tiering_spark 2 "tiering Spark jobs" >/dev/null 2>&1
