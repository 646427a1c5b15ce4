#!/usr/bin/env bash
# Ensure the local services exist and write the resolved settings to .local/env (sourced by every target
# and read by the tests). Idempotent: what runs already is reused. Starts only what is missing and records
# each PID under .local/ so `make stop` stops exactly that.
#   PostgreSQL: $TIERING_DATABASE_URL when reachable; else 127.0.0.1:5432 when it answers; else a private
#               cluster under .local/pg run as the `postgres` user on a free port.
#   S3:         $TIERING_S3_ENDPOINT_URL when set (with the AWS_* keys of the environment); else a private
#               Ceph RGW under .local/ceph (.ci/ceph.sh); with TIERING_LOCAL_S3=moto, moto_server instead
#               (machines without Debian's Ceph packages); with TIERING_LOCAL_S3=none, AWS S3 itself.
#               The bucket is created when missing.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOCAL="$ROOT/.local"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
mkdir -p "$LOCAL"
DB_NAME="${TIERING_DB_NAME:-tiering}"
BUCKET="${TIERING_BUCKET:-tiering-local}"

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
http_ok() { "$PY" -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$1" >/dev/null 2>&1; }
pg_ok() { psql "$1" -Atqc 'select 1' >/dev/null 2>&1; }

# ---- PostgreSQL ------------------------------------------------------------------------------------
DB_URL=""
if [ -n "${TIERING_DATABASE_URL:-}" ]; then
  psql_url="${TIERING_DATABASE_URL/postgresql+psycopg2:/postgresql:}"
  if pg_ok "$psql_url"; then DB_URL="$TIERING_DATABASE_URL"; else
    echo "services: TIERING_DATABASE_URL is set but not reachable; falling back to a local server" >&2; fi
fi
if [ -z "$DB_URL" ] && [ "${TIERING_PG_PRIVATE:-0}" != 1 ] && pg_ok "postgresql://postgres@127.0.0.1:5432/postgres"; then
  base="postgresql://postgres@127.0.0.1:5432"
  if [ "$(psql "$base/postgres" -Atqc "select 1 from pg_database where datname='$DB_NAME'")" != "1" ]; then
    psql "$base/postgres" -qc "create database \"$DB_NAME\"" >/dev/null
    # created here: its rows describe this checkout's tier 1 and bucket, so `make clean` drops it with them
    # (.ci/clean.sh); a database that was there before is never recorded, never dropped
    (umask 077; echo "$base/$DB_NAME" >"$LOCAL/tiering-database")
  fi
  DB_URL="$base/$DB_NAME"
fi
if [ -z "$DB_URL" ]; then
  PGBIN="$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n1)")"
  PGDATA="$LOCAL/pg/data"; SOCK="$LOCAL/pg/sock"
  mkdir -p "$LOCAL/pg" "$SOCK"
  AS_PG=(); if [ "$(id -u)" -eq 0 ]; then AS_PG=(runuser -u postgres --); chown -R postgres "$LOCAL/pg"; fi
  if [ ! -f "$PGDATA/PG_VERSION" ]; then
    "${AS_PG[@]}" "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth=trust >"$LOCAL/pg/initdb.log" 2>&1
  fi
  port="$(cat "$LOCAL/pg/port" 2>/dev/null || true)"
  if [ -z "$port" ] || ! pg_ok "postgresql://postgres@127.0.0.1:$port/postgres"; then
    port="$(free_port)"
    echo "$port" >"$LOCAL/pg/port"
    setsid "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$PGDATA" -l "$LOCAL/pg/server.log" \
      -o "-p $port -k $SOCK -c listen_addresses=127.0.0.1" -w start >/dev/null
    head -n1 "$PGDATA/postmaster.pid" >"$LOCAL/pg.pid"
  fi
  base="postgresql://postgres@127.0.0.1:$port"
  if [ "$(psql "$base/postgres" -Atqc "select 1 from pg_database where datname='$DB_NAME'")" != "1" ]; then
    psql "$base/postgres" -qc "create database \"$DB_NAME\"" >/dev/null
  fi
  DB_URL="$base/$DB_NAME"
fi

# ---- S3 -------------------------------------------------------------------------------------------------
S3_URL="${TIERING_S3_ENDPOINT_URL:-}"
S3_KIND=external
AK="${AWS_ACCESS_KEY_ID:-}"; SK="${AWS_SECRET_ACCESS_KEY:-}"
LOCAL_S3="${TIERING_LOCAL_S3:-rgw}"
case "$LOCAL_S3" in rgw|moto|none) ;; *)
  echo "services: TIERING_LOCAL_S3 must be rgw (default), moto or none (AWS S3), not '$LOCAL_S3'" >&2; exit 2;; esac
if [ -z "$S3_URL" ] && [ "$LOCAL_S3" = none ]; then
  S3_KIND="AWS S3"  # boto3's default endpoint; keys from the environment or boto3's chain (profile, role)
elif [ -z "$S3_URL" ] && [ "$LOCAL_S3" = moto ]; then
  S3_KIND=moto
  port="$(cat "$LOCAL/moto.port" 2>/dev/null || true)"
  if ! alive "$LOCAL/moto.pid" || ! http_ok "http://127.0.0.1:$port/"; then
    port="$(free_port)"
    echo "$port" >"$LOCAL/moto.port"
    setsid "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$LOCAL/moto.log" 2>&1 </dev/null &
    echo $! >"$LOCAL/moto.pid"
    for _ in $(seq 1 100); do http_ok "http://127.0.0.1:$port/" && break; sleep 0.1; done
  fi
  S3_URL="http://127.0.0.1:$port"
  # moto accepts any key; generated ones still let tests prove the secret never leaks
  [ -s "$LOCAL/moto.keys" ] || (umask 077; "$PY" -c 'import secrets; print("moto" + secrets.token_hex(8), secrets.token_urlsafe(30))' >"$LOCAL/moto.keys")
  read -r AK SK <"$LOCAL/moto.keys"
elif [ -z "$S3_URL" ]; then
  S3_KIND=rgw
  PY="$PY" bash "$ROOT/.ci/ceph.sh"
  # the generated user's keys win over any AWS_* of the environment: they are the only ones RGW knows
  S3_URL="$(sed -n 's/^S3_URL=//p' "$LOCAL/ceph/s3.env")"
  AK="$(sed -n 's/^AK=//p' "$LOCAL/ceph/s3.env")"; SK="$(sed -n 's/^SK=//p' "$LOCAL/ceph/s3.env")"
elif [ -z "$AK" ] || [ -z "$SK" ]; then
  echo "services: TIERING_S3_ENDPOINT_URL is set: also set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" >&2
  exit 2
fi

umask 077  # it holds the S3 keys
cat >"$LOCAL/env" <<ENV
# Written by .ci/services.sh; every make target and the tests read it. Variables already set win.
TIERING_DATABASE_URL=${DB_URL}
TIERING_S3_ENDPOINT_URL=${S3_URL}
TIERING_BUCKET=${BUCKET}
TIERING_PREFIX=${TIERING_PREFIX:-tiering/}
TIERING_TIER1_ROOT=${TIERING_TIER1_ROOT:-$LOCAL/tier1}
AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}
# S3: ${S3_KIND}
ENV
if [ -n "$AK" ] && [ -n "$SK" ]; then printf 'AWS_ACCESS_KEY_ID=%s\nAWS_SECRET_ACCESS_KEY=%s\n' "$AK" "$SK" >>"$LOCAL/env"; fi
set -a; . "$LOCAL/env"; set +a
"$PY" - <<'PYEOF'
import os, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["TIERING_S3_ENDPOINT_URL"] or None)
try:
    s3.head_bucket(Bucket=os.environ["TIERING_BUCKET"])
except Exception:
    s3.create_bucket(Bucket=os.environ["TIERING_BUCKET"])
PYEOF
echo "services: postgres $(echo "$DB_URL" | sed -E 's#://([^:/@]+):[^@]*@#://\1:***@#')  s3 ${S3_URL} (${S3_KIND})  bucket ${BUCKET}"
