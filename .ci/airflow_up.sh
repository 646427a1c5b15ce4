#!/usr/bin/env bash
# `make up`: Airflow (API server with the UI, then scheduler and DAG processor; LocalExecutor; metastore in
# PostgreSQL, .ci/airflow_env.sh) on $TIERING_AIRFLOW_ADDRESS (host:port, default 127.0.0.1:8080) with this
# repo's DAGs and plugins, the secrets its processes share generated once under .local/airflow-secrets, the
# connections in its metastore. The API server starts first and the scheduler only once it answers its
# health check: a task started earlier could not reach the execution API ("Connection refused") and failed.
# Idempotent: an Airflow whose session is alive and answers on the address is reused (restarted whole when
# one of its components died). `make stop`
# (.ci/stop.sh) stops it gracefully: scheduler first (its running tasks finish), API server last.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOCAL="${TIERING_LOCAL:-$ROOT/.local}"
PIDFILE="$LOCAL/airflow.pid"
PIDS="$LOCAL/airflow-pids"  # one file per component, for .ci/stop.sh's order
if [ "${1:-}" = --supervise ]; then
  # The session's leader (run under setsid below; the environment is already exported).
  URL="${AIRFLOW__API__BASE_URL%/}"
  healthy() { "$ROOT/.venv/bin/python" -c 'import json, sys, urllib.request
h = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v2/monitor/health", timeout=2))
sys.exit(h["metadatabase"]["status"] != "healthy")' "$URL" 2>/dev/null; }
  # appended: the logs of earlier starts stay (a restart must not hide what happened before it)
  start() { local name=$1; shift; "$@" >>"$AIRFLOW_HOME/$name.log" 2>&1 </dev/null & echo $! >"$PIDS/$name.pid"; }
  mkdir -p "$PIDS"; rm -f "$PIDS"/*.pid "$PIDS/all-started"
  start api-server airflow api-server
  for _ in $(seq 1 300); do healthy && break; kill -0 "$(cat "$PIDS/api-server.pid")" 2>/dev/null || exit 1; sleep 1; done
  healthy || exit 1
  # A scheduler killed (not stopped) left its job "running": end it, so the new one resets its tasks at once
  # instead of at its orphan check 300 s later (.ci/airflow_env.py, end_dead_schedulers). Not fatal: that
  # check still resets them, only later.
  "$ROOT/.venv/bin/python" "$ROOT/.ci/airflow_env.py" --end-dead-schedulers \
    || echo "$(date -u +%FT%TZ) could not end the scheduler jobs a killed scheduler left (see above)"
  echo "$(date -u +%FT%TZ) API server healthy: starting the scheduler and the DAG processor"
  start scheduler airflow scheduler
  start dag-processor airflow dag-processor
  touch "$PIDS/all-started"  # from here a component without a live process has died (see `missing` below)
  # no triggerer: no tiering task defers (add `airflow triggerer` here for deferrable operators)
  wait
  exit 0
fi
# One start or stop of this checkout's Airflow at a time (.ci/stop.sh takes the same lock): two at once would
# each start a supervisor, or one would stop what the other just started. The supervisor does not inherit it.
mkdir -p "$LOCAL"
exec 9>"$LOCAL/airflow.lock"
flock 9
source "$ROOT/.ci/airflow_env.sh"
URL="${AIRFLOW__API__BASE_URL%/}"
answers() { "$ROOT/.venv/bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/api/v2/version", timeout=2)' "$URL" 2>/dev/null; }
source "$ROOT/.ci/session.sh"  # session_alive, in_session
airflow_session_alive() { [ -f "$PIDFILE" ] && session_alive "$(cat "$PIDFILE")"; }
started() { answers && [ -f "$PIDS/all-started" ]; }
# Up means the scheduler runs too: the supervisor starts it only after the API server's health check and the
# end of a killed scheduler's jobs (which may watch a heartbeat for up to 15 s), and a `make up` that returned
# before would leave a run triggered at once queued with no scheduler, and its log without this start's line.
wait_up() {
  printf 'waiting for Airflow on %s' "$URL"
  for _ in $(seq 1 180); do started && { echo; return 0; }; airflow_session_alive || break; printf '.'; sleep 1; done
  echo; return 1
}
missing() {  # the first component of a live session whose process is gone (killed, OOM), if any
  local name pid
  [ -f "$PIDS/all-started" ] || return 0  # still starting
  for name in api-server scheduler dag-processor; do
    pid="$(cat "$PIDS/$name.pid" 2>/dev/null)" || { echo "$name"; return; }
    # alive and in this Airflow's session (a dead component's PID may have been reused since)
    in_session "$pid" "$(cat "$PIDFILE")" || { echo "$name"; return; }
  done
}
if airflow_session_alive && [ -d "$PIDS" ] && gone="$(missing)" && [ -n "$gone" ]; then
  # A group that answers but runs no scheduler would say "already up" and never run a task: stop what is
  # left of it (gracefully, as make stop) and start it whole.
  echo "Airflow's $gone is not running (session $(cat "$PIDFILE")): restarting Airflow"
  TIERING_AIRFLOW_LOCK_HELD=1 bash "$ROOT/.ci/stop.sh" airflow  # (this script holds the lock)
fi
if airflow_session_alive; then
  if started || wait_up; then
    echo "Airflow is already up (session $(cat "$PIDFILE"))"
  else
    echo "Airflow (session $(cat "$PIDFILE")) runs but does not answer on $URL; see $AIRFLOW_HOME/api-server.log, or make stop" >&2
    exit 1
  fi
elif answers; then
  echo "Something that is not this checkout's Airflow answers on $URL; set TIERING_AIRFLOW_ADDRESS=host:port" >&2
  exit 1
else
  # setsid: a session of its own, so `make stop` reaches every component and task process (.ci/session.sh)
  rm -f "$PIDS"/*.pid "$PIDS/all-started"  # a dead group's files: not this start's
  setsid bash "$ROOT/.ci/airflow_up.sh" --supervise >>"$AIRFLOW_HOME/standalone.log" 2>&1 </dev/null 9>&- &
  echo $! >"$PIDFILE"
  wait_up || { echo "Airflow did not come up on $URL; see $AIRFLOW_HOME/api-server.log and standalone.log" >&2; exit 1; }
fi
PW="$(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["admin"])' "$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated" 2>/dev/null || echo '(see the generated passwords file)')"
cat <<MSG
Airflow UI:   $URL   (login: admin / $PW)
Dashboard:    $URL/tiering/   (also under Browse in the UI)
Stop:         make stop
MSG
