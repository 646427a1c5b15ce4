#!/usr/bin/env bash
# `make clean`: stop what this checkout started, drop the Airflow metastores it created (recorded in
# .local/airflow-metastore by .ci/airflow_env.sh), then delete .local. The metastore goes first because its
# connections are encrypted with the Fernet key under .local: left behind, no later key could read them.
# Only what is recorded is dropped: an operator's own metastore (TIERING_AIRFLOW_DATABASE naming one that
# existed) never is.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOCAL="${TIERING_LOCAL:-$ROOT/.local}"
bash "$ROOT/.ci/stop.sh" airflow
if [ -s "$LOCAL/airflow-metastore" ]; then
  # before stop.sh below: a private PostgreSQL under .local/pg must still answer
  if [ -x "$ROOT/.venv/bin/python" ]; then
    "$ROOT/.venv/bin/python" "$ROOT/.ci/airflow_env.py" --drop-metastore "$LOCAL"
  else
    # the URL may hold a password: not printed
    echo "clean: no .venv to drop Airflow's metastore with; drop it by hand:" \
      "$(sed -E 's#.*/([^/?]+)([?].*)?$#\1#' "$LOCAL/airflow-metastore" | tr '\n' ' ')" >&2
  fi
fi
# The metadata database services.sh created on the machine's server (recorded then): its topics and ledgers
# describe the tier-1 files and the bucket deleted below, so a later `make demo` would find ledgers whose
# files are gone. A private cluster under .local goes with .local.
if [ -s "$LOCAL/tiering-database" ]; then
  url="$(cat "$LOCAL/tiering-database")"
  name="${url##*/}"
  if psql "${url%/*}/postgres" -qc "drop database if exists \"$name\" with (force)" >/dev/null 2>&1; then
    echo "clean: dropped the metadata database \"$name\" this checkout created"
  else
    echo "clean: could not drop the metadata database \"$name\" (server down?); drop it by hand" >&2
  fi
fi
bash "$ROOT/.ci/stop.sh"
rm -rf "$LOCAL"
