#!/usr/bin/env bash
# Stop only what `make services` / `make up` started, by the PIDs recorded under .local/.
# `stop.sh airflow` stops Airflow alone (the services keep running).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOCAL="${TIERING_LOCAL:-$ROOT/.local}"
source "$ROOT/.ci/session.sh"  # valid_pid, session_alive, signal_session
stop_group() {  # name pidfile: TERM the session (Airflow's children live in it), then KILL
  local name=$1 f=$2 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  valid_pid "$pid" || { rm -f "$f"; return 0; }
  # the session, not the leader: the supervisor may be gone while its scheduler, API server or tasks live on
  if session_alive "$pid"; then
    signal_session TERM "$pid"
    for _ in $(seq 1 100); do session_alive "$pid" || break; sleep 0.2; done
    signal_session KILL "$pid"
    for _ in $(seq 1 50); do session_alive "$pid" || break; sleep 0.2; done  # gone, not dying
    echo "stopped $name (pid $pid)"
  fi
  rm -f "$f"
}
stop_one() {  # component seconds: TERM one Airflow component and wait for it to exit, at most that long
  local f="$LOCAL/airflow-pids/$1.pid" pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -TERM "$pid" 2>/dev/null; then
    for _ in $(seq 1 $(($2 * 5))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && echo "airflow $1 (pid $pid) still running after $2 s: killed with the group" >&2
  fi
  rm -f "$f"
}
tasks_running() {  # a task left in the session: its process, or a LocalExecutor worker still holding it
  pgrep -s "$(cat "$LOCAL/airflow.pid")" -f '^airflow worker -- (LocalExecutor: )?[0-9a-f]{8}-' >/dev/null 2>&1
}
stop_scheduler() {  # seconds: TERM, wait for its tasks; TERM again once none runs (see below)
  local f="$LOCAL/airflow-pids/scheduler.pid" pid idle=0 resent=0
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  kill -TERM "$pid" 2>/dev/null || { rm -f "$f"; return 0; }
  for _ in $(seq 1 $(($1 * 5))); do
    kill -0 "$pid" 2>/dev/null || break
    if tasks_running; then idle=0; else idle=$((idle + 1)); fi
    # Seen: a scheduler that logged "Exiting gracefully" and then waited, no task left, until signalled
    # again (Airflow: "Signal again if you don't want to wait"). With no task running there is nothing to
    # lose: after 5 s idle, TERM it again.
    if [ "$idle" -ge 25 ] && [ "$resent" -lt 3 ]; then kill -TERM "$pid" 2>/dev/null; resent=$((resent + 1)); idle=0; fi
    sleep 0.2
  done
  kill -0 "$pid" 2>/dev/null && echo "airflow scheduler (pid $pid) still running after $1 s: killed with the group" >&2
  rm -f "$f"
}
stop_airflow() {
  rm -f "$LOCAL/airflow-pids/all-started"  # from here a missing component is this stop's doing (airflow_up.sh)
  [ -f "$LOCAL/airflow.pid" ] && session_alive "$(cat "$LOCAL/airflow.pid")" || { stop_group airflow "$LOCAL/airflow.pid"; return 0; }
  # Gracefully, in order. The scheduler first, alone: on SIGTERM it schedules nothing more and its
  # LocalExecutor waits for the running tasks to finish (queued ones are handed back and re-queued by the
  # next scheduler). They report their state through the API server, so it stops last. Past the bound
  # (TIERING_AIRFLOW_STOP_SECONDS, default 180) the session is killed, tasks included; the next `make up`
  # ends the killed scheduler's job so that its tasks are retried at once (airflow_up.sh).
  local bound="${TIERING_AIRFLOW_STOP_SECONDS:-180}" started=$SECONDS
  stop_scheduler "$bound"
  # A scheduler signalled again (above) exits without waiting for its workers: tasks still running report
  # through the API server, so it stays until they are done, within what is left of the same bound.
  while [ $((SECONDS - started)) -lt "$bound" ] && tasks_running; do sleep 0.2; done
  stop_one dag-processor 30
  stop_one triggerer 30
  stop_one api-server 30
  stop_group airflow "$LOCAL/airflow.pid"
}
# One start or stop of this checkout's Airflow at a time (.ci/airflow_up.sh takes the same lock, and holds it
# when it calls this script to restart a broken Airflow).
if [ -z "${TIERING_AIRFLOW_LOCK_HELD:-}" ] && [ -d "$LOCAL" ]; then
  exec 9>"$LOCAL/airflow.lock"
  flock 9
fi
stop_airflow
exec 9>&-
[ "${1:-}" = airflow ] && exit 0
stop_group moto "$LOCAL/moto.pid"
# Ceph: the gateway first, then the OSD, then the monitor (each its own session; TERM lets BlueStore close)
for n in rgw-tls rgw osd mon; do stop_group "ceph $n" "$LOCAL/ceph/$n.pid"; done
if [ -f "$LOCAL/pg.pid" ] && [ -f "$LOCAL/pg/data/PG_VERSION" ]; then
  PGBIN="$(dirname "$(ls /usr/lib/postgresql/*/bin/pg_ctl | sort -V | tail -n1)")"
  AS_PG=(); [ "$(id -u)" -eq 0 ] && AS_PG=(runuser -u postgres --)
  "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$LOCAL/pg/data" -m fast -w stop >/dev/null 2>&1 && echo "stopped postgres (private cluster)"
  rm -f "$LOCAL/pg.pid" "$LOCAL/pg/port"
fi
exit 0
