#!/usr/bin/env bash
# Source me: Airflow's environment for this repo (home under $TIERING_LOCAL/airflow, default .local), its
# database migrated, the pool of the tiering jobs and the connections in its metastore. Expects .local/env
# already exported (the Makefile does it).
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCAL="${TIERING_LOCAL:-$ROOT/.local}"
eval "$("$ROOT/.venv/bin/python" "$ROOT/.ci/airflow_env.py" "$LOCAL/airflow" "$LOCAL")"
mkdir -p "$AIRFLOW_HOME"
# The metastore: a PostgreSQL database of its own (.ci/airflow_env.py; its name derived from $LOCAL's path
# unless set), created when missing and then recorded under $LOCAL for `make clean`, migrated when new, when
# Airflow was upgraded or when it is another database than last time (.migrated names it).
created="$("$ROOT/.venv/bin/python" "$ROOT/.ci/airflow_env.py" --create-metastore "$LOCAL")" \
  || { echo "could not create Airflow's metastore (see above)" >&2; return 1 2>/dev/null || exit 1; }
# A new database (made now, or another one than last time) has none of the connections: import them again.
[ -n "$created" ] && rm -f "$AIRFLOW_HOME/.migrated" "$AIRFLOW_HOME/connections.json"
# Its rows must be readable with this checkout's Fernet key; when not, one line says why and what to do,
# before anything is written to it (Airflow would fail later with a bare InvalidToken in a log).
"$ROOT/.venv/bin/python" "$ROOT/.ci/airflow_env.py" --check-fernet-key || { return 1 2>/dev/null || exit 1; }
METASTORE_ID="$("$ROOT/.venv/bin/python" -c 'import sys; from sqlalchemy.engine import make_url; u = make_url(sys.argv[1]); print(f"{u.host}:{u.port}/{u.database}")' "$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")"
if [ "$(cat "$AIRFLOW_HOME/.migrated" 2>/dev/null)" != "$METASTORE_ID" ] || [ "$ROOT/requirements.txt" -nt "$AIRFLOW_HOME/.migrated" ]; then
  [ "$(cat "$AIRFLOW_HOME/.migrated" 2>/dev/null)" != "$METASTORE_ID" ] && rm -f "$AIRFLOW_HOME/connections.json"
  airflow db migrate >"$AIRFLOW_HOME/migrate.log" 2>&1 && echo "$METASTORE_ID" >"$AIRFLOW_HOME/.migrated" \
    || { echo "airflow db migrate failed; see $AIRFLOW_HOME/migrate.log" >&2; return 1 2>/dev/null || exit 1; }
fi
airflow pools set tiering_spark 2 "tiering Spark jobs" >/dev/null 2>&1
# The connections, from .local/env, into the metastore (Admin > Connections). Imported again only when
# .local/env changed since the last import, so edits made in the UI survive a second `make up`.
(
  umask 077
  "$ROOT/.venv/bin/python" "$ROOT/.ci/airflow_env.py" --connections "$AIRFLOW_HOME/connections.new.json"
  if ! cmp -s "$AIRFLOW_HOME/connections.new.json" "$AIRFLOW_HOME/connections.json"; then
    airflow connections import --overwrite "$AIRFLOW_HOME/connections.new.json" >"$AIRFLOW_HOME/connections.log" 2>&1 \
      || { echo "airflow connections import failed; see $AIRFLOW_HOME/connections.log" >&2; exit 1; }
    mv "$AIRFLOW_HOME/connections.new.json" "$AIRFLOW_HOME/connections.json"
  else
    rm -f "$AIRFLOW_HOME/connections.new.json"
  fi
)
