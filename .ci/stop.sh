#!/usr/bin/env bash
# Stop only what `make services` / `make up` started, by the PIDs recorded under .local/.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOCAL="${TIERING_LOCAL:-$ROOT/.local}"
stop_group() {  # name pidfile: TERM the process group (Airflow's children live in it), then KILL
  local name=$1 f=$2 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  # the group, not the leader: `airflow standalone` may be gone while its scheduler or API server live on
  if kill -0 -- "-$pid" 2>/dev/null || kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 -- "-$pid" 2>/dev/null || kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 0.2; done  # gone, not dying
    echo "stopped $name (pid $pid)"
  fi
  rm -f "$f"
}
stop_group airflow "$LOCAL/airflow.pid"
stop_group moto "$LOCAL/moto.pid"
# Ceph: the gateway first, then the OSD, then the monitor (each its own session; TERM lets BlueStore close)
for n in rgw osd mon; do stop_group "ceph $n" "$LOCAL/ceph/$n.pid"; done
if [ -f "$LOCAL/pg.pid" ] && [ -f "$LOCAL/pg/data/PG_VERSION" ]; then
  PGBIN="$(dirname "$(ls /usr/lib/postgresql/*/bin/pg_ctl | sort -V | tail -n1)")"
  AS_PG=(); [ "$(id -u)" -eq 0 ] && AS_PG=(runuser -u postgres --)
  "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$LOCAL/pg/data" -m fast -w stop >/dev/null 2>&1 && echo "stopped postgres (private cluster)"
  rm -f "$LOCAL/pg.pid" "$LOCAL/pg/port"
fi
exit 0
