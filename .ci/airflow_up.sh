#!/usr/bin/env bash
# `make up`: Airflow (standalone: API server with the UI, scheduler, DAG processor, triggerer, LocalExecutor)
# on $TIERING_AIRFLOW_ADDRESS (host:port, default 127.0.0.1:8080) with this repo's DAGs and plugins, the
# secrets its processes share generated once under .local/airflow-secrets, the connections in its metastore.
# Idempotent: an Airflow whose process group is alive and answers on the address is reused. `make stop`
# stops the whole process group.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOCAL="${TIERING_LOCAL:-$ROOT/.local}"
PIDFILE="$LOCAL/airflow.pid"
source "$ROOT/.ci/airflow_env.sh"
URL="${AIRFLOW__API__BASE_URL%/}"
answers() { "$ROOT/.venv/bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/api/v2/version", timeout=2)' "$URL" 2>/dev/null; }
group_alive() { [ -f "$PIDFILE" ] && kill -0 -- "-$(cat "$PIDFILE")" 2>/dev/null; }
wait_up() {
  printf 'waiting for Airflow on %s' "$URL"
  for _ in $(seq 1 180); do answers && { echo; return 0; }; group_alive || break; printf '.'; sleep 1; done
  echo; return 1
}
if group_alive; then
  if answers || wait_up; then
    echo "Airflow is already up (process group $(cat "$PIDFILE"))"
  else
    echo "Airflow (process group $(cat "$PIDFILE")) runs but does not answer on $URL; see $AIRFLOW_HOME/standalone.log, or make stop" >&2
    exit 1
  fi
elif answers; then
  echo "Something that is not this checkout's Airflow answers on $URL; set TIERING_AIRFLOW_ADDRESS=host:port" >&2
  exit 1
else
  # setsid: its own process group, so `make stop` reaches the scheduler and API server too
  setsid airflow standalone >"$AIRFLOW_HOME/standalone.log" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  wait_up || { echo "Airflow did not come up on $URL; see $AIRFLOW_HOME/standalone.log" >&2; exit 1; }
fi
PW="$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin"])' "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" 2>/dev/null || echo '(see the generated passwords file)')"
cat <<MSG
Airflow UI:   $URL   (login: admin / $PW)
Dashboard:    $URL/tiering/   (also under Browse in the UI)
Stop:         make stop
MSG
