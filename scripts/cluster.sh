#!/usr/bin/env bash
# Scratch PostgreSQL clusters for tests and the demo, run as the postgres user
# (Postgres refuses to run as root).
#   scripts/cluster.sh start NAME PORT [extra postgresql.conf lines...]
#   scripts/cluster.sh init NAME PORT [extra postgresql.conf lines...]   initdb and configure, not started
#   scripts/cluster.sh stop NAME
#   scripts/cluster.sh psql NAME PORT [psql args...]
#   scripts/cluster.sh crash NAME        pg_ctl stop -m immediate (no shutdown checkpoint)
#   scripts/cluster.sh kill9 NAME        SIGKILL to the postmaster, then its children
#   scripts/cluster.sh restart NAME      start an existing cluster again (after a stop or crash)
#   scripts/cluster.sh standby NAME PORT PRIMARY_PORT   streaming standby via pg_basebackup -R
#   scripts/cluster.sh promote NAME
#   scripts/cluster.sh upgrade NAME OLD OLD_PG_CONFIG   pg_upgrade the stopped cluster OLD (run by the
#                                          binaries of OLD_PG_CONFIG) into NAME (from init), then start NAME
# The binaries are those of $PG_CONFIG (default: the pg_config on PATH), so
# PG_CONFIG=<PostgreSQL 18's pg_config> runs 18 clusters. PG_LEASE_INITDB_ARGS
# adds initdb options (e.g. --no-data-checksums).
set -euo pipefail
BIN=$("${PG_CONFIG:-pg_config}" --bindir)
ROOT=${PG_LEASE_SCRATCH:-/var/tmp/pg_lease}
RUNAS=(sudo -u postgres --preserve-env=PGOPTIONS)
[ "$(id -un)" = postgres ] && RUNAS=()

# With PG_LEASE_FAKETIME_FILE set, servers run under libfaketime and their
# wall clock follows the offset written in that file (e.g. "+30s"), live.
FAKE=()
if [ -n "${PG_LEASE_FAKETIME_FILE:-}" ]; then
    FAKE=(env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1
          FAKETIME_TIMESTAMP_FILE="$PG_LEASE_FAKETIME_FILE" FAKETIME_NO_CACHE=1 DONT_FAKE_MONOTONIC=1)
fi

cmd=$1; name=$2
dir=$ROOT/$name
case "$cmd" in
start|init)
    port=$3; shift 3
    mkdir -p "$ROOT"; chown postgres: "$ROOT"
    if [ -f "$dir/postmaster.pid" ]; then "${RUNAS[@]}" "$BIN/pg_ctl" -D "$dir" -m fast stop >/dev/null 2>&1 || true; fi
    rm -rf "$dir" "$dir.sock"
    mkdir -p "$dir.sock"; chown postgres: "$dir.sock"
    read -ra initdb_args <<< "${PG_LEASE_INITDB_ARGS:-}"
    "${RUNAS[@]}" "$BIN/initdb" -D "$dir" -U postgres --auth=trust --no-sync "${initdb_args[@]}" >/dev/null
    {
        echo "port = $port"
        echo "listen_addresses = '127.0.0.1'"
        echo "unix_socket_directories = '$dir.sock'"
        echo "shared_preload_libraries = 'pg_lease'"
        echo "fsync = off"
        echo "max_connections = 100"
        echo "log_min_messages = warning"
        for line in "$@"; do echo "$line"; done
    } | "${RUNAS[@]}" tee -a "$dir/postgresql.conf" >/dev/null
    [ "$cmd" = init ] || "${RUNAS[@]}" "${FAKE[@]}" "$BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w start >/dev/null
    ;;
stop)
    if [ -f "$dir/postmaster.pid" ]; then "${RUNAS[@]}" "$BIN/pg_ctl" -D "$dir" -m fast -w stop >/dev/null; fi
    ;;
crash)
    "${RUNAS[@]}" "$BIN/pg_ctl" -D "$dir" -m immediate -w stop >/dev/null
    ;;
kill9)
    pid=$(head -1 "$dir/postmaster.pid")
    kill -9 "$pid"
    # Backends notice the postmaster is gone and exit; a new postmaster
    # refuses to start while they still hold shared memory.
    for _ in $(seq 100); do pgrep -P "$pid" >/dev/null || break; sleep 0.1; done
    pkill -9 -P "$pid" 2>/dev/null || true
    # Where PID 1 does not reap orphans, the dead postmaster stays a zombie and
    # its pid file would make the next start believe it is still running.
    for _ in $(seq 50); do
        state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || echo gone)
        [ "$state" = Z ] || [ "$state" = gone ] && break
        sleep 0.1
    done
    if [ "$state" = Z ]; then rm -f "$dir/postmaster.pid" "$dir".sock/.s.PGSQL.*; fi
    ;;
restart)
    "${RUNAS[@]}" "${FAKE[@]}" "$BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w start >/dev/null
    ;;
standby)
    port=$3; primary_port=$4
    rm -rf "$dir" "$dir.sock"
    mkdir -p "$dir.sock"; chown postgres: "$dir.sock"
    "${RUNAS[@]}" "$BIN/pg_basebackup" -h 127.0.0.1 -p "$primary_port" -U postgres -D "$dir" -R -X stream --no-sync
    {
        echo "port = $port"
        echo "unix_socket_directories = '$dir.sock'"
    } | "${RUNAS[@]}" tee -a "$dir/postgresql.conf" >/dev/null
    "${RUNAS[@]}" "${FAKE[@]}" "$BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w start >/dev/null
    ;;
promote)
    "${RUNAS[@]}" "$BIN/pg_ctl" -D "$dir" -w promote >/dev/null
    ;;
upgrade)
    old=$ROOT/$3; old_bin=$("$4" --bindir)
    # pg_upgrade writes its reports into the current directory and runs both
    # servers on Unix sockets only (no TCP port is taken).
    (cd "$ROOT" && "${RUNAS[@]}" "$BIN/pg_upgrade" -b "$old_bin" -B "$BIN" -d "$old" -D "$dir" \
        -p "$(sed -n 's/^port = //p' "$old/postgresql.conf" | tail -1)" \
        -P "$(sed -n 's/^port = //p' "$dir/postgresql.conf" | tail -1)" \
        --socketdir "$dir.sock" >"$dir.pg_upgrade.log" 2>&1) \
        || { cat "$dir.pg_upgrade.log" >&2; exit 1; }
    "${RUNAS[@]}" "${FAKE[@]}" "$BIN/pg_ctl" -D "$dir" -l "$dir/server.log" -w start >/dev/null
    ;;
psql)
    port=$3; shift 3
    exec "$BIN/psql" -h 127.0.0.1 -p "$port" -U postgres "$@"
    ;;
*) echo "usage: $0 start|init|stop|crash|kill9|restart|standby|promote|upgrade|psql NAME [PORT]" >&2; exit 2 ;;
esac
