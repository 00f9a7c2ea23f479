#!/usr/bin/env bash
# `make test`: lint, in-process pgrx tests, then multi-session tests over real
# connections against a scratch cluster with pg_lease preloaded.
# PG=18 (`make test PG=18`) runs all of it against PostgreSQL 18 instead of 15,
# and adds the pg_upgrade 15 -> 18 test (tests/sessions/tests/pg_upgrade.rs); the
# blue/green runbook (tests/sessions/tests/bluegreen.rs) then runs 15 -> 18 instead of 15 -> 15,
# and skips the Citus tests (tests/sessions/tests/citus.rs): Citus 13.2.2 supports 15-17 only.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] \
    || { echo "test: run as root (it installs what it needs and runs its clusters as the postgres user)" >&2; exit 1; }
LOG=$(mktemp)
# Every test runner's output also goes to $LOG, summed up in the last line.
exec > >(tee "$LOG") 2>&1
summary() {
    local rc=${1:-$?}
    awk '/^test result:/ { p += $4; f += $6 } /^# pass / { p += $3 } /^# fail / { f += $3 }
         / passed, [0-9]+ failed$/ && /^chaos:/ { p += $2; f += $4 }
         END { printf "total: %d passed, %d failed\n", p, f + 0 }' "$LOG"
    [ "$rc" -eq 0 ] || echo "make test FAILED (exit $rc)"
    rm -f "$LOG"
}
trap summary EXIT
SCRATCH=${PG_LEASE_SCRATCH:-/var/tmp/pg_lease}
# Ports above Linux's ephemeral range (32768-60999), so that no client
# socket of this busy run can hold one when a test (re)starts a server.
PORT=${PG_LEASE_TEST_PORT:-61001}
export PG_LEASE_PORT_OFFSET=${PG_LEASE_PORT_OFFSET:-6600}

export PG=${PG:-15}
scripts/setup.sh
# The chosen major's pg_config: scripts/cluster.sh and the multi-session tests
# take their binaries (initdb, pg_ctl, psql, pg_dump...) from its --bindir.
PG_CONFIG=$(scripts/pg.sh pg_config)
export PG_CONFIG
read -ra features <<< "$(scripts/pg.sh features)"
echo "== PostgreSQL $PG: $("$PG_CONFIG" --version) ($PG_CONFIG)"

echo "== lint"
scripts/lint-shell.sh
scripts/check-modules.py
cargo fmt --check
cargo clippy --quiet --all-targets "${features[@]}" --features pg_test -- -D warnings
cargo fmt --check --manifest-path tests/sessions/Cargo.toml
cargo clippy --quiet --manifest-path tests/sessions/Cargo.toml --all-targets -- -D warnings

echo "== pgrx tests (in-process)"
mkdir -p "$SCRATCH"; chown postgres: "$SCRATCH"
# The pgrx test cluster is rebuilt from scratch each run.
rm -rf "$SCRATCH/pgrx-data"
cargo pgrx test "pg$PG" --runas postgres --pgdata "$SCRATCH/pgrx-data"

echo "== schema and upgrade scripts"
scripts/check-schema.sh

# pg_lease and the earlier releases' full scripts (so the extension-upgrade
# test can install them) into the PostgreSQL of pg_config $1.
install_into() {
    local pg_config=$1; shift
    cargo pgrx install --pg-config "$pg_config" "$@" >/dev/null
    local version f
    version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
    for f in sql/released/pg_lease--*.sql; do
        [ "$f" = "sql/released/pg_lease--$version.sql" ] || cp "$f" "$("$pg_config" --sharedir)/extension/"
    done
}
echo "== install"
install_into "$PG_CONFIG" "${features[@]}"
if [ "$PG" != 15 ]; then
    # The pg_upgrade and blue/green tests start from a PostgreSQL 15 cluster with pg_lease.
    PG_LEASE_UPGRADE_FROM=${PG_LEASE_UPGRADE_FROM:-$(PG=15 scripts/pg.sh pg_config)}
    export PG_LEASE_UPGRADE_FROM
    echo "== install into PostgreSQL 15 too ($PG_LEASE_UPGRADE_FROM), for the pg_upgrade and blue/green tests"
    install_into "$PG_LEASE_UPGRADE_FROM"
else
    unset PG_LEASE_UPGRADE_FROM   # no older major: pg_upgrade.rs says so and passes, bluegreen.rs runs 15 -> 15
fi

echo "== pg_regress"
scripts/regress.sh

# The Citus tests (tests/sessions/tests/citus.rs, named citus_*) start a
# coordinator and workers of their own; Citus is built from its vendored source.
citus_skip=()
citus_supported=0
citus_unsupported=$(scripts/citus.sh supports) || citus_supported=$?
case "$citus_supported" in
0)
    echo "== Citus (built from $(scripts/citus.sh src), for tests/sessions/tests/citus.rs)"
    scripts/citus.sh install
    ;;
3)
    echo "== Citus tests skipped: $citus_unsupported"
    citus_skip=(--skip citus_)
    ;;
*) exit "$citus_supported" ;;
esac

echo "== multi-session tests (real connections, port $PORT)"
# The default audit: each database's refusals in its own lease.rejected_writes
# (tests/sessions/tests/audit.rs also runs central-table clusters of its own).
scripts/cluster.sh start sessions "$PORT"
trap 'rc=$?; scripts/cluster.sh stop sessions; summary $rc' EXIT
# The audit launcher starts once recovery is over.
n=0
for _ in $(seq 150); do
    n=$(scripts/cluster.sh psql sessions "$PORT" -X -At -c "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_lease audit launcher'")
    [ "$n" = 1 ] && break
    sleep 0.1
done
if [ "$n" != 1 ]; then
    echo "test: no pg_lease audit launcher in the sessions cluster after 150 polls, 15 s and more ($n in pg_stat_activity); its server.log ends:" >&2
    tail -20 "$SCRATCH/sessions/server.log" >&2 || true
    exit 1
fi
PG_LEASE_TEST_PORT=$PORT cargo test --manifest-path tests/sessions/Cargo.toml -- --test-threads=4 "${citus_skip[@]}"

echo "== TypeScript game-server client (node's test runner)"
(cd examples/game-server && npm ci --no-audit --no-fund --loglevel=error && PG_LEASE_TEST_PORT=$PORT npm test)

echo "== chaos (CI-sized: ${PG_LEASE_CHAOS_SECONDS:-45} s)"
cargo run --quiet --release --manifest-path tests/sessions/Cargo.toml --bin chaos -- \
    run --seconds "${PG_LEASE_CHAOS_SECONDS:-45}"

echo "== package (the Dockerfile's build stage)"
make --no-print-directory package >/dev/null
scripts/check-dockerfile.sh
