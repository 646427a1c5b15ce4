#!/usr/bin/env bash
# `make demo`: run the pipeline on a demo workload with the local defaults (services from .local/env).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n== %s\n' "$*"; }
DEMO="demo-$(date +%s)"

step "schema and services"
tiering db upgrade

step "topics ($DEMO-*)"
tiering topic create "$DEMO-small" --rollover-entries 200 --offload-after 0 --deletion-lag 0
tiering topic create "$DEMO-large" --rollover-bytes 8388608 --offload-threshold 10485760
tiering topic list | grep "$DEMO"

step "produce a workload"
tiering produce "$DEMO-small" --entries 1000 --entry-size 512 --seed "$DEMO" --seal
tiering produce "$DEMO-large" --entries 400 --entry-size 65536 --seed "$DEMO" --seal

step "status"
tiering status "$DEMO-small"
tiering status "$DEMO-large"

step "read back a range"
tiering read "$DEMO-small" --from 1:10 --to 1:12 --json | head -3

echo
echo "Next: inspect the metadata with SQL, e.g."
echo "  psql \"\$TIERING_DATABASE_URL\" -c 'select * from tiering.tier_usage'"
