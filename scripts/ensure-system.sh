#!/usr/bin/env bash
# Installs the system packages the project needs and starts the local services it tests
# against (PostgreSQL, MariaDB, Redis). Idempotent: does nothing for what is already there.
# Usage: scripts/ensure-system.sh [--no-services] [--services-only]
set -euo pipefail

want_packages=1
want_services=1
for arg in "$@"; do
  case "$arg" in
    --no-services) want_services=0 ;;
    --services-only) want_packages=0 ;;
    -h|--help) sed -n '2,4p' "$0"; exit 0 ;;
    *) echo "unknown option: $arg" >&2; exit 2 ;;
  esac
done

log() { echo "[ensure-system] $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# Debian packages: JDBC drivers for the Spark reconciliation, Java for Spark itself, the
# database and cache servers for the integration tests, a C compiler and libdeflate for the
# store's compiled record packer (broker/store/_recordpack.c; zlib when libdeflate is absent),
# a headless browser with its driver for the console's browser tests (tests/e2e/console),
# Maven for Apache RocketMQ's jars (the interop tests),
# and RabbitMQ and NATS, the peers the bench measures beside us.
packages=(libpostgresql-jdbc-java libxerial-sqlite-jdbc-java libmariadb-java libdeflate-dev
          chromium chromium-driver)
command -v gcc >/dev/null 2>&1 || packages+=(gcc)
command -v java >/dev/null 2>&1 || packages+=(openjdk-17-jre-headless)
# Maven resolves Apache RocketMQ's jars for the interop tests (apache_rocketmq/pom.xml)
command -v mvn >/dev/null 2>&1 || packages+=(maven)
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
command -v pg_ctlcluster >/dev/null 2>&1 || packages+=(postgresql)
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || packages+=(mariadb-server)
# etcd: the coordinator of automatic failover (docs/ha.md); its tests and bench start their own
command -v etcd >/dev/null 2>&1 || packages+=(etcd-server)
# the bench's peers, measured beside us in the same run (bench/peers.py starts them itself)
command -v rabbitmq-server >/dev/null 2>&1 || packages+=(rabbitmq-server)
command -v nats-server >/dev/null 2>&1 || packages+=(nats-server)

if [ "$want_packages" = 1 ] && command -v dpkg >/dev/null 2>&1; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing: ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

[ "$want_services" = 1 ] || exit 0

wait_port() { # host port name
  for _ in $(seq 1 60); do
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null && return 0
    sleep 0.5
  done
  log "$3 did not come up on $1:$2"; return 1
}
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

if ! port_open 127.0.0.1 6379; then
  log "starting redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_port 127.0.0.1 6379 redis
fi

if ! port_open 127.0.0.1 5432; then
  log "starting postgresql"
  ver=$(ls /etc/postgresql | sort -V | tail -n 1)
  if [ -z "$ver" ] || [ ! -d "/etc/postgresql/$ver/main" ]; then
    ver=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    as_root pg_createcluster "$ver" main >/dev/null
  fi
  as_root pg_ctlcluster --skip-systemctl-redirect "$ver" main start
  wait_port 127.0.0.1 5432 postgresql
fi
# The tests connect as user postgres, no password, over TCP to 127.0.0.1 (and ::1), to database
# `test`. A fresh Debian cluster asks for a password on loopback, so trust is put first in
# pg_hba.conf for that user alone, and the server reloaded.
if command -v psql >/dev/null 2>&1; then
  if ! psql -h 127.0.0.1 -U postgres -d postgres -w -c 'select 1' >/dev/null 2>&1; then
    hba=$(as_root su postgres -c "psql -tAc 'show hba_file'")
    if ! grep -q '^host all postgres 127.0.0.1/32 trust' "$hba"; then
      log "trusting user postgres on loopback in $hba"
      { printf 'host all postgres 127.0.0.1/32 trust\nhost all postgres ::1/128 trust\n'
        cat "$hba"; } >"$hba.new"
      chown --reference="$hba" "$hba.new"; chmod --reference="$hba" "$hba.new"
      mv "$hba.new" "$hba"
    fi
    as_root su postgres -c "psql -qc 'select pg_reload_conf()'" >/dev/null
  fi
  if ! psql -h 127.0.0.1 -U postgres -d test -w -c 'select 1' >/dev/null 2>&1; then
    as_root su postgres -c "psql -qc 'create database test'" >/dev/null
  fi
  psql -h 127.0.0.1 -U postgres -d test -w -c 'select 1' >/dev/null \
    || { log "postgresql: user postgres cannot reach database test on 127.0.0.1"; exit 1; }
  # pg_stat_statements: `python -m bench flow` reads each statement's calls and rows from it.
  # A library loaded at server start only: added to shared_preload_libraries (beside any
  # already there) and the server restarted, once, when it is missing.
  pg() { psql -h 127.0.0.1 -U postgres -d test -w -qtAX "$@"; }
  preload=$(pg -c 'show shared_preload_libraries')
  if [[ ",${preload// /}," != *,pg_stat_statements,* ]]; then
    log "postgresql: loading pg_stat_statements (one restart)"
    pg -c "alter system set shared_preload_libraries = '${preload:+$preload,}pg_stat_statements'"
    datadir=$(pg -c 'show data_directory')
    ver=$(pg -c 'show server_version_num'); ver=$((ver / 10000))
    cluster=$(basename "$datadir")
    as_root pg_ctlcluster --skip-systemctl-redirect "$ver" "$cluster" restart
    wait_port 127.0.0.1 5432 postgresql
  fi
  pg -c 'set client_min_messages = warning' -c 'create extension if not exists pg_stat_statements'
fi

if ! port_open 127.0.0.1 3306; then
  log "starting mariadb"
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
  # mariadbd refuses to run as root; it drops to the mysql user itself
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
  wait_port 127.0.0.1 3306 mariadb
fi
# The tests connect as root with an empty password over TCP. Debian's root@localhost logs in
# by unix socket only, so an empty password is added beside it (the socket login stays).
if command -v mariadb >/dev/null 2>&1; then
  if ! mariadb -h 127.0.0.1 -uroot -e 'select 1' >/dev/null 2>&1; then
    log "mariadb: root may log in over TCP with an empty password"
    as_root mariadb -uroot -e "ALTER USER root@localhost IDENTIFIED VIA mysql_native_password USING PASSWORD('') OR unix_socket; FLUSH PRIVILEGES"
  fi
  mariadb -h 127.0.0.1 -uroot -e 'create database if not exists test' >/dev/null \
    || { log "mariadb: root cannot log in on 127.0.0.1"; exit 1; }
fi
log "services ready: redis 6379, postgresql 5432, mariadb 3306"
