#!/usr/bin/env bash
# `make demo`: the whole pipeline on a demo workload with the local defaults. Every DAG runs once through
# Airflow (`airflow dags test`, Spark local[2]); SQL views show the before and after.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
sql() { psql "$TIERING_DATABASE_URL" -P pager=off -c "$1"; }
RUN="$(date +%H%M%S)"
T_SMALL="orders-$RUN"; T_LARGE="clicks-$RUN"; T_RET="audit-$RUN"; T_MAN="archive-$RUN"

step "1/6 schema, Airflow home, topics"
tiering db upgrade
source .ci/airflow_env.sh
tiering topic create "$T_SMALL" --rollover-entries 100 --offload-after 0 --deletion-lag 0
tiering topic create "$T_LARGE" --rollover-bytes 6291456 --offload-threshold 8388608 --deletion-lag 0
tiering topic create "$T_RET" --rollover-entries 50 --retention-size 100000 --offload-after 0 --retain-unread
tiering subscription create "$T_RET" billing   # a reader: retention keeps what it has not read
tiering topic create "$T_MAN" --rollover-entries 200

step "2/6 produce: many small ledgers, a few large ones"
tiering produce "$T_SMALL" --entries 1500 --entry-size 512 --seed "$T_SMALL"
tiering produce "$T_LARGE" --entries 360 --entry-size 65536 --seed "$T_LARGE"
tiering produce "$T_RET" --entries 600 --entry-size 1024 --seed "$T_RET"
tiering produce "$T_MAN" --entries 1000 --entry-size 256 --seed "$T_MAN"
echo; echo "before:"
sql "select * from tiering.tier_usage where topic like '%-$RUN' order by topic"

run_dag() {  # dag_id [conf]
  local t0=$SECONDS
  printf '  %-28s ' "$1"
  if airflow dags test "$1" ${2:+-c "$2"} >"$AIRFLOW_HOME/demo-$1.log" 2>&1; then
    echo "ok ($((SECONDS - t0)) s)"
  else
    echo "FAILED ($((SECONDS - t0)) s): see $AIRFLOW_HOME/demo-$1.log"; return 1
  fi
}

step "3/6 run every DAG once through Airflow (each a Spark job on local[2])"
run_dag tiering_offload_by_age
run_dag tiering_offload_by_size
run_dag tiering_offload_prefix "{\"topic\": \"$T_MAN\", \"position\": \"3:0\"}"
run_dag tiering_delete_lagged
sql "select topic, tier1_ledgers, tier1_bytes, tier2_ledgers, tier2_bytes from tiering.tier_usage where topic like '%-$RUN' order by topic"
REFS_SQL="select count(distinct data_key) + count(distinct index_key) from tiering.chunk"
REF_BEFORE=$(psql "$TIERING_DATABASE_URL" -Atc "$REFS_SQL")
run_dag tiering_defrag
echo "  the reader 'billing' reads 300 of $T_RET's 600 entries; what retention would do now:"
tiering read "$T_RET" --subscription billing --max-entries 300 --ack >/dev/null
tiering retention --dry-run --topic "$T_RET" | sed 's/^/    /'
run_dag tiering_retention
tiering subscription list "$T_RET" | sed 's/^/    /'
run_dag tiering_gc
run_dag tiering_gc_sweep
REF_AFTER=$(psql "$TIERING_DATABASE_URL" -Atc "$REFS_SQL")
run_dag tiering_metadata_export
run_dag tiering_scrub "{\"topic\": \"$T_SMALL\"}"

step "4/6 after"
sql "select * from tiering.tier_usage where topic like '%-$RUN' order by topic"
echo "tier-2 objects referenced by metadata: $REF_BEFORE before defrag, $REF_AFTER after; the merged-away ones"
echo "stay in the GC queue for their delay (10 min) so readers holding old metadata finish, then GC deletes them:"
sql "select job, status, items_done, items_failed, bytes, ended_at - started_at as took from tiering.job_run order by run_id desc limit 10"
sql "select reason, count(*), min(not_before) as first_due from tiering.gc_queue group by reason"

step "5/6 read ranges across tiers and verify byte for byte"
python .ci/demo_verify.py "$T_SMALL" "$T_SMALL" 512 100 0:0 14:99
python .ci/demo_verify.py "$T_LARGE" "$T_LARGE" 65536 96 0:0 3:71
# the first two lines: tiering exits 141 when head stops reading before its end (as any writer SIGPIPE ends)
{ tiering read "$T_RET" --to 4:0 --json || [ $? -eq 141 ]; } | head -2

step "6/6 where to look next"
cat <<MSG
  make up                   Airflow UI on http://127.0.0.1:8080 (DAG runs, the tiering dashboard)
  tiering status $T_SMALL   every ledger: state, entries, bytes, tiers
  psql "\$TIERING_DATABASE_URL" -c 'select * from tiering.ledger_layout'   (source .local/env first)
  tiering read $T_MAN --from 0:0 --to 0:5
MSG
