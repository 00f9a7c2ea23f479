#!/usr/bin/env bash
# pg_lease's pg_regress suite: the SQL API, its messages and its SQLSTATEs as
# test/regress/sql/<topic>.sql with the psql output it must produce in
# test/regress/expected/<topic>.out, run against a temporary instance that
# preloads pg_lease (test/regress/pg_lease.conf).
#
#   scripts/regress.sh              every topic, in test/regress/schedule's order
#   scripts/regress.sh fence lease  only these topics
#
# pg_lease must be installed into the PostgreSQL whose pg_config is
# $PG_CONFIG (default: scripts/pg.sh pg_config, i.e. PG=15 or PG=18).
# PG_LEASE_REGRESS_PORT: the temporary instance's port (default 63201).
# PG_LEASE_REGRESS_OUT: keep pg_regress's output directory there (results/,
# regression.diffs), e.g. to copy a new results/<topic>.out to expected/;
# by default a temporary directory, kept (and named) only when a test fails.
# initdb refuses to run as root: as root the suite runs as the postgres user.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD/test/regress

PG_CONFIG=${PG_CONFIG:-$(scripts/pg.sh pg_config)}
if ! [ -x "$PG_CONFIG" ] && ! command -v "$PG_CONFIG" >/dev/null; then
    echo "regress.sh: no pg_config at $PG_CONFIG (set PG_CONFIG, or PG=15|18)" >&2
    exit 2
fi
BINDIR=$("$PG_CONFIG" --bindir)
PG_REGRESS=$("$PG_CONFIG" --pkglibdir)/pgxs/src/test/regress/pg_regress
if ! [ -x "$PG_REGRESS" ]; then
    echo "regress.sh: $PG_REGRESS is missing (install the server's development files)" >&2
    exit 2
fi
if ! [ -f "$("$PG_CONFIG" --sharedir)/extension/pg_lease.control" ]; then
    echo "regress.sh: pg_lease is not installed into $("$PG_CONFIG" --sharedir) (cargo pgrx install --pg-config $PG_CONFIG)" >&2
    exit 2
fi
PORT=${PG_LEASE_REGRESS_PORT:-63201}

RUNAS=()
if [ "$(id -u)" = 0 ]; then
    if command -v runuser >/dev/null; then RUNAS=(runuser -u postgres --); else RUNAS=(sudo -u postgres); fi
fi

# Everything pg_regress reads or writes lives in one directory the postgres
# user owns: a copy of test/regress (the checkout need not be readable by
# it), the temporary instance and the results.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pg_lease_regress.XXXXXX")
OUT=${PG_LEASE_REGRESS_OUT:-$WORK/out}
keep=${PG_LEASE_REGRESS_OUT:+yes}
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    if [ -n "$keep" ] && [ "$OUT" = "$WORK/out" ]; then rm -rf "$WORK/instance"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
cp -r "$SRC" "$WORK/in"
mkdir -p "$OUT"
rm -rf "$OUT/results" "$OUT/regression.diffs" "$OUT/regression.out"
if [ "${#RUNAS[@]}" -gt 0 ]; then chown -R postgres: "$WORK" "$OUT"; fi

if [ $# -gt 0 ]; then
    for t in "$@"; do
        [ -f "$SRC/sql/$t.sql" ] || { echo "regress.sh: no test $t (test/regress/sql/$t.sql)" >&2; exit 2; }
    done
    tests=("$@")
else
    tests=(--schedule="$WORK/in/schedule")
fi

# The server inherits this environment: no Rust backtraces in error DETAILs
# (pgrx adds one to errors raised through a Rust panic when RUST_BACKTRACE
# is set), and no libpq or locale settings that would change the output.
unset RUST_BACKTRACE RUST_LIB_BACKTRACE PGOPTIONS PGDATESTYLE PGTZ PGCLIENTENCODING
export LC_ALL=C

echo "pg_regress: $("$PG_CONFIG" --version), port $PORT"
rc=0
"${RUNAS[@]}" "$PG_REGRESS" \
    --bindir="$BINDIR" \
    --temp-instance="$WORK/instance" \
    --temp-config="$WORK/in/pg_lease.conf" \
    --port="$PORT" \
    --no-locale --encoding=UTF8 \
    --dbname=regression \
    --load-extension=pg_lease \
    --inputdir="$WORK/in" \
    --outputdir="$OUT" \
    "${tests[@]}" || rc=$?
if [ $rc -ne 0 ]; then
    if [ -s "$OUT/regression.diffs" ]; then
        echo "== $OUT/regression.diffs"
        cat "$OUT/regression.diffs"
    else
        tail -n 50 "$OUT"/log/*.log >&2 || true
    fi
    keep=yes
    echo "regress.sh: pg_regress failed (exit $rc); its output is kept in $OUT" >&2
fi
exit $rc
