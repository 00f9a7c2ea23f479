#!/usr/bin/env bash
# Scratch PostgreSQL clusters for tests and the demo, run as the postgres user
# (Postgres refuses to run as root).
#   scripts/cluster.sh start NAME PORT [extra postgresql.conf lines...]
#   scripts/cluster.sh stop NAME
#   scripts/cluster.sh psql NAME PORT [psql args...]
set -euo pipefail
BIN=$(pg_config --bindir)
ROOT=${PG_LEASE_SCRATCH:-/var/tmp/pg_lease}
RUNAS=(sudo -u postgres --preserve-env=PGOPTIONS)
[ "$(id -un)" = postgres ] && RUNAS=()

cmd=$1; name=$2
dir=$ROOT/$name
case "$cmd" in
start)
    port=$3; shift 3
    mkdir -p "$ROOT"; chown postgres: "$ROOT"
    if [ -f "$dir/postmaster.pid" ]; then "${RUNAS[@]}" "$BIN/pg_ctl" -D "$dir" -m fast stop >/dev/null 2>&1 || true; fi
    rm -rf "$dir"
    "${RUNAS[@]}" "$BIN/initdb" -D "$dir" -U postgres --auth=trust --no-sync >/dev/null
    {
        echo "port = $port"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$dir'"
        echo "shared_preload_libraries = 'pg_lease'"
        echo "fsync = off"
        echo "max_connections = 100"
        echo "log_min_messages = warning"
        for line in "$@"; do echo "$line"; done
    } | "${RUNAS[@]}" tee -a "$dir/postgresql.conf" >/dev/null
    "${RUNAS[@]}" "$BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w start >/dev/null
    ;;
stop)
    if [ -f "$dir/postmaster.pid" ]; then "${RUNAS[@]}" "$BIN/pg_ctl" -D "$dir" -m fast -w stop >/dev/null; fi
    ;;
psql)
    port=$3; shift 3
    exec psql -h 127.0.0.1 -p "$port" -U postgres "$@"
    ;;
*) echo "usage: $0 start|stop|psql NAME [PORT]" >&2; exit 2 ;;
esac
