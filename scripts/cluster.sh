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
die() { echo "cluster.sh: $*" >&2; exit 1; }
usage() {
    [ $# -eq 0 ] || echo "cluster.sh: $*" >&2
    # The usage lines at the top of this file.
    echo "usage:" >&2
    sed -n '/^#   scripts\/cluster\.sh /,/^# [^ ]/{/^# [^ ]/d; s/^#//p;}' "$0" >&2
    exit 2
}

# The arguments first, so that a bad call gets its usage whatever else is missing.
[ $# -ge 2 ] || usage
cmd=$1; name=$2
case "$cmd" in
start|init|psql) [ $# -ge 3 ] || usage "$cmd needs NAME PORT" ;;
standby) [ $# -ge 4 ] || usage "standby needs NAME PORT PRIMARY_PORT" ;;
upgrade) [ $# -ge 4 ] || usage "upgrade needs NAME OLD OLD_PG_CONFIG" ;;
stop|crash|kill9|restart|promote) ;;
*) usage "unknown command '$cmd'" ;;
esac
# NAME is a directory under $ROOT that start and standby delete and recreate.
case "$name" in ''|.|..|*/*) usage "NAME must be a plain directory name, not '$name'" ;; esac
case "$cmd" in start|init|psql|standby)
    [[ "$3" =~ ^[0-9]+$ ]] || usage "PORT must be a number, not '$3'" ;;
esac

pg_config=${PG_CONFIG:-pg_config}
command -v "$pg_config" >/dev/null \
    || die "no pg_config '$pg_config': set PG_CONFIG to the pg_config of the PostgreSQL to run (scripts/pg.sh pg_config prints 15's)"
BIN=$("$pg_config" --bindir)
ROOT=${PG_LEASE_SCRATCH:-/var/tmp/pg_lease}
RUNAS=(sudo -u postgres --preserve-env=PGOPTIONS)
if [ "$(id -un)" = postgres ]; then
    RUNAS=()
elif [ "$cmd" != psql ]; then
    # Servers run as the postgres user; root hands the cluster's directories to it.
    [ "$(id -u)" = 0 ] || die "run as root or as postgres (servers run as the postgres user, through sudo from root); not as $(id -un)"
    id postgres >/dev/null 2>&1 || die "no postgres user: install Debian's postgresql-15 (scripts/setup.sh does) or create one"
    command -v sudo >/dev/null || die "sudo is missing: apt-get install sudo (scripts/setup.sh does)"
fi

# With PG_LEASE_FAKETIME_FILE set, servers run under libfaketime and their
# wall clock follows the offset written in that file (e.g. "+30s"), live.
FAKE=()
if [ -n "${PG_LEASE_FAKETIME_FILE:-}" ]; then
    # Debian's faketime package, in this machine's multiarch directory.
    faketime_lib=/usr/lib/$(uname -m)-linux-gnu/faketime/libfaketime.so.1
    [ -f "$faketime_lib" ] \
        || die "PG_LEASE_FAKETIME_FILE needs $faketime_lib: apt-get install faketime (scripts/setup.sh does, on Debian)"
    FAKE=(env LD_PRELOAD="$faketime_lib"
          FAKETIME_TIMESTAMP_FILE="$PG_LEASE_FAKETIME_FILE" FAKETIME_NO_CACHE=1 DONT_FAKE_MONOTONIC=1)
fi

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
    # A fast shutdown that has not finished within pg_ctl's minute (seen once
    # after a chaos run whose server had its clock jumped under libfaketime:
    # every backend and pg_lease's workers had exited, the shutdown
    # checkpoint had not) ends as an immediate one, said on stderr.
    if [ -f "$dir/postmaster.pid" ] && ! "${RUNAS[@]}" "$BIN/pg_ctl" -D "$dir" -m fast -w stop >/dev/null; then
        echo "cluster.sh: $name did not finish a fast shutdown; stopping it immediately" >&2
        "${RUNAS[@]}" "$BIN/pg_ctl" -D "$dir" -m immediate -w stop >/dev/null
    fi
    ;;
crash)
    "${RUNAS[@]}" "$BIN/pg_ctl" -D "$dir" -m immediate -w stop >/dev/null
    ;;
kill9)
    [ -f "$dir/postmaster.pid" ] || die "kill9: no $dir/postmaster.pid (is $name running?)"
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
    case "$state" in
    Z) rm -f "$dir/postmaster.pid" "$dir".sock/.s.PGSQL.* ;;
    gone) ;;
    *) die "kill9: postmaster $pid of $name is still there (state $state) 5 s after SIGKILL" ;;
    esac
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
    [ -x "$4" ] || die "upgrade: OLD_PG_CONFIG $4 is not an executable pg_config"
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
esac
