#!/usr/bin/env bash
# `make up`: Airflow (standalone: api-server with the UI, scheduler, dag-processor, triggerer) on :8080
# with this repo's DAGs and plugins. Idempotent; `make stop` stops it by its recorded process group.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/.ci/airflow_env.sh"
PIDFILE="$ROOT/.local/airflow.pid"
up() { "$ROOT/.venv/bin/python" -c 'import sys, urllib.request; urllib.request.urlopen("http://127.0.0.1:8080/api/v2/version", timeout=2)' 2>/dev/null; }
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && up; then
  echo "Airflow is already up"
else
  setsid airflow standalone >"$AIRFLOW_HOME/standalone.log" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  printf 'starting Airflow'
  for _ in $(seq 1 120); do up && break; printf '.'; sleep 1; done
  echo
  up || { echo "Airflow did not come up; see $AIRFLOW_HOME/standalone.log" >&2; exit 1; }
fi
PW="$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin"])' "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" 2>/dev/null || echo '(see the generated passwords file)')"
cat <<MSG
Airflow UI:   http://127.0.0.1:8080   (login: admin / $PW)
Dashboard:    http://127.0.0.1:8080/tiering/   (also under Browse in the UI)
Stop:         make stop
MSG
