#!/usr/bin/env bash
# Install the Debian packages the project needs when they are missing: a JDK (Spark), the PostgreSQL JDBC
# driver (Spark reads the metadata over JDBC), PostgreSQL (a private cluster when none is reachable), Ceph.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(default-jdk-headless)
[ -f /usr/share/java/postgresql.jar ] || need+=(libpostgresql-jdbc-java)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v psql >/dev/null 2>&1 || need+=(postgresql-client)
# the dashboard's browser test: headless Chromium from Debian (no browser downloads) and a font
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# the metrics test scrapes the dashboard with a real Prometheus server (started by the test, never a service)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
command -v pgrep >/dev/null 2>&1 || need+=(procps)  # make stop: pgrep/pkill -s (a session's processes)
command -v flock >/dev/null 2>&1 || need+=(util-linux)  # make up / make stop: one at a time
# the local S3 endpoint: Ceph's RADOS Gateway on a private single-node cluster (.ci/ceph.sh), unless the
# moto fallback is asked for or an external endpoint is configured
if [ "${TIERING_LOCAL_S3:-rgw}" = rgw ] && [ -z "${TIERING_S3_ENDPOINT_URL:-}" ]; then
  command -v ceph-mon >/dev/null 2>&1 || need+=(ceph-mon)
  command -v ceph-osd >/dev/null 2>&1 || need+=(ceph-osd)
  command -v radosgw >/dev/null 2>&1 || need+=(radosgw)
  command -v ceph >/dev/null 2>&1 && command -v ceph-authtool >/dev/null 2>&1 || need+=(ceph-common)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "sysdeps: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
