#!/usr/bin/env bash
# A private single-node Ceph cluster with a RADOS Gateway on loopback, the project's local S3 endpoint.
# Everything lives under .local/ceph: one monitor, one BlueStore OSD on a sparse file, radosgw (beast).
# Idempotent: a running cluster is reused, a stopped one restarts from its data, a half-built one (no
# `ready` marker: the first bootstrap was interrupted) is wiped and rebuilt. Every port is chosen free at
# first start and recorded in .local/ceph/ports, because several checkouts on one machine each run their
# own cluster; a recorded port taken by someone else meanwhile is replaced at restart. Each daemon runs in
# the foreground (-f) under setsid with its PID in .local/ceph/<name>.pid so `make stop` stops exactly it.
# Output: .local/ceph/s3.env with the endpoint and the generated S3 user's keys.
# `ceph.sh tls-rgw` starts a SECOND gateway on the running cluster (same users and buckets) with an https
# endpoint only, a self-signed CA generated under .local/ceph/tls/ and RGW's KMS `testing` backend (SSE-KMS
# and SSE-C; RGW refuses both over plain http); it writes .local/ceph/tls/env. `ceph.sh tls-rgw-stop`
# stops it. The first gateway is never restarted for it: its options apply to new starts only.
# Facts behind the settings: ../shared/ENVIRONMENT.md ("Ceph RGW runs here", "RGW gotchas").
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CEPH="$ROOT/.local/ceph"
PY="${PY:-$ROOT/.venv/bin/python}"
CONF="$CEPH/ceph.conf"
OSD_SIZE="${TIERING_CEPH_OSD_SIZE:-$((20 * 1024 * 1024 * 1024))}"  # sparse: only written blocks use disk
mkdir -p "$CEPH"

log() { echo "ceph: $*" >&2; }
alive() { [ -f "$CEPH/$1.pid" ] && kill -0 "$(cat "$CEPH/$1.pid")" 2>/dev/null; }
cephc() { timeout 30 ceph -c "$CONF" --connect-timeout 10 "$@"; }
rgw_ok() { "$PY" -c 'import sys,urllib.request,urllib.error
try: urllib.request.urlopen(sys.argv[1], timeout=2)
except urllib.error.HTTPError: pass' "http://127.0.0.1:$RGW_PORT/" >/dev/null 2>&1; }
wait_for() {  # what seconds command...: poll until the command succeeds
  local what=$1 secs=$2; shift 2
  for _ in $(seq 1 $((secs * 5))); do "$@" && return 0; sleep 0.2; done
  log "$what did not come up within ${secs}s; see $CEPH/log/"; return 1
}
# Ports below the kernel's ephemeral range (32768+) so outgoing connections never take them between runs.
free_ports() {  # count: print the first port of `count` consecutive ports free on 127.0.0.1
  "$PY" - "$1" <<'PY'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(500):
    base = random.randrange(20000, 32000 - n)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket(); socks.append(s)
            # SO_REUSEADDR as the daemons set it: a port in TIME_WAIT is free, a listening one is not
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        for s in socks: s.close()
    print(base); break
else:
    sys.exit("no free port range found")
PY
}
port_free() { "$PY" -c 'import socket,sys; s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null; }
range_free() { local p; for p in $(seq "$1" "$2"); do port_free "$p" || return 1; done; }

start() {  # name pidfile-name command...: start a daemon in its own session, record its PID
  local name=$1; shift
  setsid "$@" -f -c "$CONF" >>"$CEPH/log/$name.out" 2>&1 </dev/null 8>&- 9>&- &
  echo $! >"$CEPH/$name.pid"
}
stop_recorded() {
  local n pid
  for n in rgw-tls rgw osd mon; do
    if alive "$n"; then pid=$(cat "$CEPH/$n.pid"); kill -TERM "$pid"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -KILL "$pid" 2>/dev/null || true; fi
    rm -f "$CEPH/$n.pid"
  done
}

write_conf() {
  cat >"$CONF" <<CONF
# Written by .ci/ceph.sh: a throwaway single-node cluster for tests, demo and benchmarks (loopback only).
[global]
fsid = $FSID
mon host = [v2:127.0.0.1:$MON2_PORT,v1:127.0.0.1:$MON1_PORT]
public network = 127.0.0.0/8
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
# nothing under /var: several clusters share this machine
run dir = $CEPH/run
log file = $CEPH/log/\$name.log
crash dir = $CEPH/crash
mon cluster log file = $CEPH/log/cluster.log
# one OSD holds every replica
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon max pg per osd = 1000
# the disk is shared with the rest of the machine: warn late
mon data avail warn = 2
mon data avail crit = 1
debug ms = 0
# every client here is current: no legacy global_id reclaim (and no health warning about it)
auth allow insecure global id reclaim = false

[mon.a]
mon data = $CEPH/mon

[osd.0]
osd data = $CEPH/osd
osd objectstore = bluestore
bluestore block create = true
bluestore block size = $OSD_SIZE
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind port min = $OSD_PORT_MIN
ms bind port max = $OSD_PORT_MAX
# a test cluster, not a storage server: small caches
osd memory target = 939524096
bluestore cache autotune = true

[client.admin]
keyring = $CEPH/admin.keyring

[client.rgw.a]
keyring = $CEPH/rgw.keyring
rgw data = $CEPH/rgw
# tcp_nodelay: without it a GET on a kept-alive connection waits 40-50 ms (Nagle vs delayed ACK)
rgw frontends = beast endpoint=127.0.0.1:$RGW_PORT tcp_nodelay=1
rgw thread pool size = 64
# deleted objects' space returns through RGW's GC; the defaults (2 h wait, hourly pass) fill a small OSD
rgw gc obj min wait = 60
rgw gc processor period = 60
rgw enable usage log = false
debug rgw = 0
# No SSE here: RGW refuses SSE-KMS and SSE-C over plain http (rgw crypt require ssl = true, kept); the
# https gateway of "ceph.sh tls-rgw" has the KMS backend
CONF
}

kms_key() {  # the KMS `testing` backend's key (base64 of 32 random bytes), generated once per checkout
  [ -s "$CEPH/kms-testkey" ] || (umask 077; "$PY" -c 'import base64,os; print(base64.b64encode(os.urandom(32)).decode())' >"$CEPH/kms-testkey")
  cat "$CEPH/kms-testkey"
}

# ---- the TLS gateway (`ceph.sh tls-rgw`) ------------------------------------------------------------
TLS="$CEPH/tls"
tls_certs() {  # a CA and a server certificate for 127.0.0.1/localhost signed by it, generated once
  [ -s "$TLS/server.pem" ] && return 0
  mkdir -p "$TLS"; chmod 755 "$TLS"
  (umask 077
   openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=tiering test CA" \
     -keyout "$TLS/ca.key" -out "$TLS/ca.pem" 2>/dev/null
   openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$TLS/server.key" \
     -out "$TLS/server.csr" 2>/dev/null
   printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$TLS/ext.cnf"
   openssl x509 -req -in "$TLS/server.csr" -CA "$TLS/ca.pem" -CAkey "$TLS/ca.key" -CAcreateserial -days 3650 \
     -extfile "$TLS/ext.cnf" -out "$TLS/server.pem" 2>/dev/null
   rm -f "$TLS/server.csr" "$TLS/ext.cnf")
  chmod 644 "$TLS/ca.pem" "$TLS/server.pem"
}
tls_rgw_ok() { "$PY" -c 'import ssl,sys,urllib.request,urllib.error
try: urllib.request.urlopen(sys.argv[1], timeout=2, context=ssl.create_default_context(cafile=sys.argv[2]))
except urllib.error.HTTPError: pass' "https://127.0.0.1:$1/" "$TLS/ca.pem" >/dev/null 2>&1; }
tls_rgw() {
  [ -f "$CEPH/ready" ] && alive mon && alive osd || { log "the cluster is not running: run make services first"; exit 1; }
  if alive rgw-tls && [ -f "$TLS/port" ] && tls_rgw_ok "$(cat "$TLS/port")"; then return 0; fi
  tls_certs
  [ -s "$CEPH/rgw-tls.keyring" ] || cephc auth get-or-create client.rgw.tls mon 'allow rw' osd 'allow rwx' \
    -o "$CEPH/rgw-tls.keyring" >/dev/null
  mkdir -p "$CEPH/rgw-tls"
  exec 9>/tmp/tiering-ceph-ports.lock; flock 9
  local port; port=$(free_ports 1)
  # options on the command line, not in ceph.conf: the conf stays the first gateway's
  setsid radosgw -f -c "$CONF" -n client.rgw.tls --keyring "$CEPH/rgw-tls.keyring" --rgw-data "$CEPH/rgw-tls" \
    --rgw-frontends "beast ssl_endpoint=127.0.0.1:$port ssl_certificate=$TLS/server.pem ssl_private_key=$TLS/server.key tcp_nodelay=1" \
    --rgw-thread-pool-size 32 --rgw-crypt-s3-kms-backend testing \
    --rgw-crypt-s3-kms-encryption-keys "testkey-1=$(kms_key)" --rgw-enable-usage-log false \
    >>"$CEPH/log/rgw-tls.out" 2>&1 </dev/null 8>&- 9>&- &
  echo $! >"$CEPH/rgw-tls.pid"
  flock -u 9
  echo "$port" >"$TLS/port"
  wait_for "radosgw (tls)" 60 tls_rgw_ok "$port"
  cat >"$TLS/env" <<ENV
S3_URL=https://127.0.0.1:$port
CA_BUNDLE=$TLS/ca.pem
KMS_KEY_ID=testkey-1
ENV
  log "radosgw (tls, KMS testing backend) up on https://127.0.0.1:$port"
}
tls_rgw_stop() {
  local pid
  if alive rgw-tls; then pid=$(cat "$CEPH/rgw-tls.pid"); kill -TERM "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$CEPH/rgw-tls.pid" "$TLS/env" "$TLS/port"
}
case "${1:-}" in
  tls-rgw) tls_rgw; exit 0;;
  tls-rgw-stop) tls_rgw_stop; exit 0;;
  "") ;;
  *) log "usage: ceph.sh [tls-rgw | tls-rgw-stop]"; exit 2;;
esac

read_ports() { read -r MON2_PORT MON1_PORT OSD_PORT_MIN OSD_PORT_MAX RGW_PORT <"$CEPH/ports"; }
save_ports() { echo "$MON2_PORT $MON1_PORT $OSD_PORT_MIN $OSD_PORT_MAX $RGW_PORT" >"$CEPH/ports"; }

# One bootstrap at a time per checkout; and one port choice at a time per machine (two checkouts starting
# together could otherwise pick the same free ports before either binds them).
exec 8>"$CEPH/.lock"; flock 8
exec 9>/tmp/tiering-ceph-ports.lock; flock 9

if [ -f "$CEPH/ready" ]; then
  read_ports
  if alive mon && alive osd && alive rgw && rgw_ok; then
    exit 0
  fi
fi

t0=$(date +%s%N)
if [ ! -f "$CEPH/ready" ]; then
  # ---- first start (or a rebuild after an interrupted one) ---------------------------------------------
  stop_recorded
  find "$CEPH" -mindepth 1 -maxdepth 1 ! -name .lock -exec rm -rf {} +
  mkdir -p "$CEPH/run" "$CEPH/log" "$CEPH/crash" "$CEPH/mon" "$CEPH/osd" "$CEPH/rgw"
  log "creating a single-node cluster under $CEPH (first time: ~25 s)"
  base=$(free_ports 13)
  MON2_PORT=$base; MON1_PORT=$((base + 1)); RGW_PORT=$((base + 2))
  OSD_PORT_MIN=$((base + 3)); OSD_PORT_MAX=$((base + 12))  # an OSD binds 8: public/cluster/2 heartbeats x v1/v2
  save_ports
  FSID=$("$PY" -c 'import uuid; print(uuid.uuid4())')
  write_conf
  ceph-authtool --create-keyring "$CEPH/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$CEPH/admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$CEPH/mon.keyring" --import-keyring "$CEPH/admin.keyring" >/dev/null
  monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON2_PORT,v1:127.0.0.1:$MON1_PORT]" \
    "$CEPH/monmap" >/dev/null
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$CEPH/monmap" --keyring "$CEPH/mon.keyring" \
    >>"$CEPH/log/mkfs.out" 2>&1
  start mon ceph-mon -i a
  wait_for monitor 30 cephc mon stat >/dev/null 2>&1
  OSD_UUID=$("$PY" -c 'import uuid; print(uuid.uuid4())')
  OSD_KEY=$(ceph-authtool --gen-print-key)
  echo "{\"cephx_secret\": \"$OSD_KEY\"}" >"$CEPH/osd-secret.json"
  cephc osd new "$OSD_UUID" -i "$CEPH/osd-secret.json" >/dev/null
  rm -f "$CEPH/osd-secret.json"
  ceph-authtool --create-keyring "$CEPH/osd/keyring" --name osd.0 --add-key "$OSD_KEY" >/dev/null
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$OSD_UUID" >>"$CEPH/log/mkfs.out" 2>&1
  cephc auth get-or-create client.rgw.a mon 'allow rw' osd 'allow rwx' -o "$CEPH/rgw.keyring" >/dev/null
else
  # ---- restart from existing data: replace any recorded port someone else took meanwhile -------------
  FSID=$(sed -n 's/^fsid = //p' "$CONF")
  changed=0
  if ! alive mon && { ! port_free "$MON2_PORT" || ! port_free "$MON1_PORT"; }; then
    base=$(free_ports 2); MON2_PORT=$base; MON1_PORT=$((base + 1)); changed=1
    log "monitor ports taken; moving the monitor to $MON2_PORT/$MON1_PORT"
    monmaptool --create --fsid "$FSID" --addv a "[v2:127.0.0.1:$MON2_PORT,v1:127.0.0.1:$MON1_PORT]" \
      --clobber "$CEPH/monmap" >/dev/null
    ceph-mon -c "$CONF" -i a --inject-monmap "$CEPH/monmap" >>"$CEPH/log/mkfs.out" 2>&1
  fi
  if ! alive osd && ! range_free "$OSD_PORT_MIN" "$OSD_PORT_MAX"; then
    base=$(free_ports 10); OSD_PORT_MIN=$base; OSD_PORT_MAX=$((base + 9)); changed=1
  fi
  if ! alive rgw && ! port_free "$RGW_PORT"; then RGW_PORT=$(free_ports 1); changed=1; fi
  if [ $changed = 1 ]; then save_ports; write_conf; fi
  log "restarting the cluster under $CEPH"
fi

alive mon || { start mon ceph-mon -i a; }
wait_for monitor 30 cephc mon stat >/dev/null 2>&1
alive osd || start osd ceph-osd -i 0
osd_up() { [ "$(cephc osd stat -f json 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["num_up_osds"])')" = 1 ]; }
wait_for OSD 60 osd_up
alive rgw || start rgw radosgw -n client.rgw.a
flock -u 9  # every port is bound now
wait_for radosgw 120 rgw_ok

if [ ! -f "$CEPH/ready" ]; then
  # the S3 user, with keys generated here (radosgw-admin would print them in JSON otherwise)
  read -r AK SK < <("$PY" -c 'import secrets,string
a = string.ascii_uppercase + string.digits
print("".join(secrets.choice(a) for _ in range(20)), secrets.token_urlsafe(30))')
  timeout 60 radosgw-admin -c "$CONF" user create --uid=tiering --display-name=tiering \
    --access-key="$AK" --secret-key="$SK" >/dev/null
  umask 077
  cat >"$CEPH/s3.env" <<ENV
S3_URL=http://127.0.0.1:$RGW_PORT
AK=$AK
SK=$SK
ENV
  touch "$CEPH/ready"
else
  sed -i "s#^S3_URL=.*#S3_URL=http://127.0.0.1:$RGW_PORT#" "$CEPH/s3.env"
fi
log "radosgw up on 127.0.0.1:$RGW_PORT in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
