# Sourced by .ci/stop.sh and .ci/airflow_up.sh. Every process `make services` / `make up` starts runs under
# setsid, so its recorded PID is its session's id. Signals and liveness go by the whole session, not the
# leader's process group: Airflow puts each task process (and the spark-submit under it) in a process group
# of its own, which a group signal never reaches.
valid_pid() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }  # (pkill -s 0 would mean the caller's own session)
session_alive() { valid_pid "$1" && { pgrep -s "$1" >/dev/null 2>&1 || kill -0 -- "-$1" 2>/dev/null || kill -0 "$1" 2>/dev/null; }; }
signal_session() { pkill "-$1" -s "$2" 2>/dev/null; kill "-$1" -- "-$2" 2>/dev/null || kill "-$1" "$2" 2>/dev/null; true; }
in_session() { [ "$(ps -o sid= -p "$1" 2>/dev/null | tr -d ' ')" = "$2" ]; }  # pid sid: alive and in it
